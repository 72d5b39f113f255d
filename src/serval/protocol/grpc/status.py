"""gRPC status codes, spelled one way: the numbers a call's `grpc-status` trailer carries."""

from __future__ import annotations

import enum


class GrpcStatus(enum.IntEnum):
    """The codes of the gRPC protocol (grpc/doc/statuscodes.md), by their canonical names."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16
