"""`serval optimize`: convert to ONNX, optimize, quantize, prove parity, measure, report."""
