"""The KServe v2 (Open Inference Protocol) types and wire codecs."""
