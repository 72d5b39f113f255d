"""KServe v2 / Triton GRPCInferenceService on Serval's own HTTP/2 server, over the data plane."""
