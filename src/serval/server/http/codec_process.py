"""REST bodies too large to code on the event loop: JSON tensors coded in a helper process.

orjson and numpy hold the GIL while they parse, convert and write, so a thread would not free
the loop: 13.6 MB of JSON numbers held it 0.27 s to decode, and 4M float outputs asked for
as JSON 0.31 s to encode, while every other request and health probe waited. A body whose
JSON part is over LARGE_JSON_BYTES is therefore decoded, and an answer with more than
LARGE_JSON_ELEMENTS elements to write as JSON is encoded, in one helper process (spawned at
the first such request, replaced if it dies): the loop pays only for handing the bytes over
and back. Requests wait their turn for it (the receive budget bounds what waits).

BYTES tensors are the exception: their elements are Python objects, made one by one
(~1 us each), and a million of them pickled back would hold the GIL again. A body with many
BYTES elements is decoded, and an answer with many encoded, on a thread (their Python loop
lets go of the GIL, so the event loop goes on); from the helper, BYTES inputs come back as
their wire bytes, unpacked on a thread. Everything smaller, and fixed-size binary tensors,
are coded on the loop as before. (A compressed body is inflated on a thread, app.py: zlib
lets go of the GIL.)
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from serval.errors import ServerUnavailable
from serval.protocol.bytes_tensor import decode_bytes_elements, encode_bytes_elements
from serval.protocol.rest_codec import decode_request, encode_response, json_elements
from serval.protocol.types import InferRequest, InferResponse

LARGE_JSON_BYTES = 1 << 20  # ~20 ms of the loop to decode
LARGE_JSON_ELEMENTS = 1 << 18  # ~20 ms of the loop to encode
INLINE_BYTES_ELEMENTS = 1 << 14  # BYTES elements coded on the loop (~1 us each in Python)
INLINE_BYTES_BODY = 4 * INLINE_BYTES_ELEMENTS
T = TypeVar("T")


class CodecProcess:
    """The helper process, started on first need."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def decode(self, body: bytes, header_length: int | None) -> InferRequest:
        if len(body) <= INLINE_BYTES_BODY:  # most requests: nothing more to judge
            return decode_request(body, header_length)
        json_bytes = len(body) if header_length is None else min(header_length, len(body))
        if json_bytes > LARGE_JSON_BYTES:
            request, packed = await self._run(_decode_packed, body, header_length)
            if packed:  # BYTES come back as their wire bytes: unpacked on a thread
                await asyncio.to_thread(_unpack, request, packed)
            return request
        if body.find(b'"BYTES"', 0, json_bytes) >= 0:
            return await asyncio.to_thread(decode_request, body, header_length)
        return decode_request(body, header_length)

    async def encode(self, response: InferResponse, request: InferRequest
                     ) -> tuple[bytes, int | None]:
        outputs = response.outputs.values()
        if sum(array.size for array in outputs) <= INLINE_BYTES_ELEMENTS:  # most answers
            return encode_response(response, request)
        if any(array.dtype == object and array.size > INLINE_BYTES_ELEMENTS
               for array in outputs):
            return await asyncio.to_thread(encode_response, response, request)
        if json_elements(response, request) <= LARGE_JSON_ELEMENTS:
            return encode_response(response, request)
        asked = InferRequest({}, request.outputs, binary_output=request.binary_output)
        return await self._run(encode_response, response, asked)  # not the inputs, nor a trace

    async def _run(self, work: Callable[..., T], *args: object) -> T:
        pool = self._started()
        try:
            future = pool.submit(work, *args)
        except BrokenProcessPool:  # it died while idle: this request starts a fresh one
            pool = self._replaced(pool)
            future = pool.submit(work, *args)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._replaced(pool)
            raise ServerUnavailable("the server's JSON coding process stopped while coding "
                                    "this request; retry") from None

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _replaced(self, broken: ProcessPoolExecutor) -> ProcessPoolExecutor:
        broken.shutdown(wait=False, cancel_futures=True)
        if self._pool is broken:
            self._pool = None
        return self._started()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _decode_packed(body: bytes, header_length: int | None
                   ) -> tuple[InferRequest, dict[str, tuple[bytes, tuple[int, ...]]]]:
    """In the helper: decode_request, with BYTES inputs as their wire bytes and shape (a
    million objects unpickled would hold the server's GIL; bytes are one copy), each left
    an empty placeholder where it stood."""
    request = decode_request(body, header_length)
    packed = {}
    for name, array in request.inputs.items():
        if array.dtype == object:
            packed[name] = (encode_bytes_elements(array), array.shape)
            request.inputs[name] = array[:0]
    return request, packed


def _unpack(request: InferRequest, packed: dict[str, tuple[bytes, tuple[int, ...]]]) -> None:
    for name, (raw, shape) in packed.items():
        request.inputs[name] = decode_bytes_elements(
            memoryview(raw), math.prod(shape), name).reshape(shape)
