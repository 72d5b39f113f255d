"""`serval optimize`: convert to ONNX, optimize the graph, quantize, prove parity, measure, report."""
