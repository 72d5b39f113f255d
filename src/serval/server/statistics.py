"""Triton's statistics extension over both transports, built a slice of models at a time.

Every model (`/v2/models/stats`, gRPC ModelStatistics with no name) is thousands of entries on
a large repository (~400 bytes each): the answer is built CHUNK models at a time with the event
loop free between slices, so a client asking for it again and again cannot hold health probes
and other requests behind it. Over HTTP the slices go out as they are made, at the pace the
client reads (`statistics_chunks`), so a client that asks on many connections and reads
nothing holds a write buffer each, not a whole document (4 MB for 10,000 models). The gRPC
answer is built as messages directly (json_format.ParseDict took ~1 s of the loop for 10,000).
Each slice is charged to the loop's share for work over every model (loop_share.py), so many
clients asking at once take about a tenth of the loop, not all of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from serval.dataplane import DataPlane
from serval.protocol.grpc import grpc_service_pb2 as pb

CHUNK = 128  # models per slice: ~1-2 ms of the loop each
_PROTO_FIELDS = frozenset(pb.ModelStatistics.DESCRIPTOR.fields_by_name)


def statistics_json(dataplane: DataPlane, name: str, version: str | None = None) -> bytes:
    """One model's statistics document (its few versions), Triton's JSON form."""
    return orjson.dumps(dataplane.statistics(name, version))


async def statistics_chunks(dataplane: DataPlane) -> AsyncGenerator[bytes, None]:
    """Every model's statistics document, in pieces that join to it (Triton's JSON form).
    Each model's figures are read when its slice is made; each slice is charged to the
    loop's share for such work (loop_share.py)."""
    models = list(dataplane.registry.all_models())
    opening = b'{"model_stats":['
    for start in range(0, len(models), CHUNK):
        if start:
            await asyncio.sleep(0)
        async with dataplane.loop_share.turn():
            entries = b",".join(orjson.dumps(served.stats.as_triton_dict())
                                for served in models[start:start + CHUNK])
        yield (opening if not start else b",") + entries
    yield (opening if not models else b"") + b"]}"


async def statistics_message(dataplane: DataPlane, name: str | None = None,
                             version: str | None = None) -> pb.ModelStatisticsResponse:
    """The statistics as gRPC's ModelStatisticsResponse."""
    if name:
        entries = dataplane.statistics(name, version)["model_stats"]
        return pb.ModelStatisticsResponse(model_stats=[_message(e) for e in entries])
    messages = []
    models = list(dataplane.registry.all_models())
    for start in range(0, len(models), CHUNK):
        if start:
            await asyncio.sleep(0)
        async with dataplane.loop_share.turn():
            messages += [_message(served.stats.as_triton_dict())
                         for served in models[start:start + CHUNK]]
    return pb.ModelStatisticsResponse(model_stats=messages)


def _message(entry: dict[str, Any]) -> pb.ModelStatistics:
    """One model_stats entry as its message (what the proto lacks, pipeline_steps, left out)."""
    return pb.ModelStatistics(**{key: value for key, value in entry.items()
                                 if key in _PROTO_FIELDS})
