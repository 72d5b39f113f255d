"""Serval: a fast, cheap KServe v2 inference server."""

__version__ = "0.1.0"
