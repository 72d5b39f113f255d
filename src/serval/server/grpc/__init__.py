"""KServe v2 / Triton GRPCInferenceService over grpc.aio, a thin adapter over the data plane."""
