"""The v2 gRPC wire: grpc_service.proto (Triton's field numbers), the protobuf modules generated
from it (`make proto`; never edit them) and the message codec (codec.py)."""
