"""Transports over the data plane (HTTP and gRPC), the one builder that assembles a server,
and the process that runs it."""
