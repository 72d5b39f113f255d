"""Generated protobuf and gRPC modules for the v2 GRPCInferenceService (see `make proto`)."""
