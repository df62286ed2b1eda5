"""Serving: inference latency under an SLO, and export for serving (torch.export, ONNX, Triton)."""
