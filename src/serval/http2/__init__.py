"""HTTP/2 framing and HPACK, shared by the gRPC server and the gRPC load generator."""
