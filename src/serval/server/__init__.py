"""Transports over the data plane (HTTP now) and the process that runs them."""
