"""`triton_python_backend_utils` for Triton Python-backend models served by Serval: tensors,
requests, responses, errors, the auto-complete config helper and the datatype helpers.

Models import it as `import triton_python_backend_utils as pb_utils`; the python backend makes
that name resolve to this module before it imports a model.py (backends/triton_python.py).
Decoupled models get a response sender per request (InferenceResponseSender); a model runs
other models with InferenceRequest(model_name=..., ...).exec() (BLS, backends/bls.py); DLPack
is not provided.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from serval.backends import bls
from serval.backends.triton_autocomplete import ModelConfig as ModelConfig  # pb_utils.ModelConfig
from serval.protocol.dtypes import DATATYPES

_log = logging.getLogger("serval.backends.triton_model")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

# Triton's DataType enum: TYPE_BOOL = 1 ... TYPE_STRING = 13, the order of Serval's table.
_CODE_OF_CONFIG: dict[str, int] = {dt.config: code for code, dt in enumerate(DATATYPES, 1)}
_NUMPY_OF_CODE: dict[int, type[Any]] = {code: dt.numpy.type
                                        for code, dt in enumerate(DATATYPES, 1)}
TRITON_STRING_TO_NUMPY: dict[str, type[Any]] = {
    dt.config: (bool if dt.name == "BOOL" else dt.numpy.type) for dt in DATATYPES}


class TritonModelException(Exception):
    """What a model raises to fail the whole batch."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class TritonError:
    """An error for one response (InferenceResponse(error=...)): fails that request only."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message, self._code = str(message), code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class Tensor:
    """A named numpy array: a request's input or a response's output."""

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        array = np.asarray(numpy_array)
        if array.dtype.kind in ("U", "V"):
            raise TritonModelException(
                f"tensor '{name}': numpy dtype {array.dtype} is not supported; use np.object_ "
                "(bytes elements) for strings")
        if triton_dtype is not None:
            wanted = triton_to_numpy_type(triton_dtype)
            if wanted is None:
                raise TritonModelException(f"tensor '{name}': unknown Triton dtype {triton_dtype}")
            if array.dtype != wanted:
                array = array.view(wanted)
        self._name = name
        self._array = array
        self._triton_dtype = numpy_to_triton_type(array.dtype)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int | None:
        return self._triton_dtype

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={self.shape()})"


class InferenceRequest:
    """One client request as execute() receives it, or one the model makes to run another
    model of the server (business logic scripting: exec(), async_exec())."""

    def __init__(self, inputs: Sequence[Tensor] = (), request_id: str = "",
                 correlation_id: int | str = 0,
                 requested_output_names: Sequence[str] = (),
                 parameters: str | dict[str, Any] = "{}", model_name: str | bytes = "",
                 model_version: int = -1, flags: int = 0,
                 response_sender: InferenceResponseSender | None = None, timeout: int = 0,
                 preferred_memory: Any = None, trace: Any = None) -> None:
        if isinstance(model_name, bytes):  # as read from a BYTES input
            model_name = model_name.decode("utf-8", errors="replace")
        self._sender = response_sender
        self._timeout_us = timeout
        self._inputs = list(inputs)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._requested_output_names = list(requested_output_names)
        self._parameters = (parameters if isinstance(parameters, str)
                            else json.dumps(parameters))
        self._model_name, self._model_version, self._flags = model_name, model_version, flags

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def parameters(self) -> str:
        """The request's parameters as a JSON object string."""
        return self._parameters

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def is_cancelled(self) -> bool:
        return self._sender is not None and self._sender.is_cancelled()

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model (business logic scripting): its response, with the
        outputs or the error (never raised); with `decoupled`, an iterator of the model's
        responses as they come (ResponseIterator)."""
        channel = bls.current()
        if channel is None:
            error = InferenceResponse(error=TritonError(
                "business logic scripting runs only inside execute()", TritonError.UNAVAILABLE))
            return iter([error]) if decoupled else error
        version = None if self._model_version in (-1, None) else str(self._model_version)
        call_id = channel.start(
            self._model_name, version, {t.name(): t.as_numpy() for t in self._inputs},
            self._requested_output_names or None, json.loads(self._parameters or "{}"),
            self._timeout_us, decoupled)
        if decoupled:
            return ResponseIterator(channel, call_id)
        return _response(channel.next(call_id)[0])

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """exec() on a thread, awaitable from an `async def execute` (with `decoupled`, the
        iterator once the call is under way)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise TritonModelException("async_exec() needs an `async def execute`") from None
        return loop.run_in_executor(None, self.exec, decoupled)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for decoupled models: set model_transaction_policy "
                "{ decoupled: true } in the model's config")
        return self._sender


class ResponseIterator:
    """exec(decoupled=True)'s answer: the called model's responses, each as it comes, the last
    one possibly without outputs (the final flag alone), as in Triton; one response for a
    model that is not decoupled. cancel() stops the call: its last response is then an error
    of code CANCELLED."""

    def __init__(self, channel: bls.ChildChannel, call_id: int) -> None:
        self._channel, self._id = channel, call_id
        self._done = self._cancelled = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        answer, self._done = self._channel.next(self._id)
        if self._cancelled and answer == bls.CANCELLED_TEXT:
            return InferenceResponse(error=TritonError(answer, TritonError.CANCELLED))
        return _response(answer)

    def cancel(self) -> None:
        if not self._done and not self._cancelled:
            self._cancelled = True
            self._channel.cancel(self._id)

    def __del__(self) -> None:
        if not self._done:  # left before its last response: stop it, ignore the rest
            self._channel.cancel(self._id)
            self._channel.drop(self._id)


def _response(answer: bls.Answer) -> InferenceResponse:
    if isinstance(answer, str):
        return InferenceResponse(error=TritonError(answer))
    return InferenceResponse([Tensor(name, array) for name, array in answer.items()])


class InferenceResponseSender:
    """A decoupled request's responses: send() any number of times, from any thread, the
    last one with flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL (a response, or None alone)."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None],
                 is_cancelled: Callable[[], bool]) -> None:
        self._deliver, self._is_cancelled = deliver, is_cancelled
        self._lock = threading.Lock()  # one send at a time, in order
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed.")
            if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
                raise TritonModelException("Unable to send response. Unsupported flag provided.")
            if response is None and flags == 0:
                raise TritonModelException("Inference Response object must be provided when "
                                           "the response flags is set to zero.")
            if response is not None and not isinstance(response, InferenceResponse):
                raise TritonModelException(f"send() takes a pb_utils.InferenceResponse, not a "
                                           f"{type(response).__name__}")
            self._closed = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
            self._deliver(response, self._closed)

    def is_cancelled(self) -> bool:
        return self._is_cancelled()

    @property
    def closed(self) -> bool:
        return self._closed


class InferenceResponse:
    """What execute() returns for one request: output tensors, or an error."""

    def __init__(self, output_tensors: Sequence[Tensor] | None = None,
                 error: TritonError | None = None, parameters: Any = None) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list | tuple):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class Logger:
    """pb_utils.Logger: a model's log lines go to Serval's log."""

    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message)


# lookups ---------------------------------------------------------------------------------------

def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str
                              ) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t["name"] == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# datatypes -------------------------------------------------------------------------------------

def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """'TYPE_FP32' -> np.float32 (TYPE_STRING -> np.object_)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type[Any] | None:
    """Triton's DataType code (TYPE_FP32 = 11) -> the numpy type; None for an unknown code."""
    return _NUMPY_OF_CODE.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A numpy dtype or type -> Triton's DataType code; None when Triton has none."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("S", "O"):
        return _CODE_OF_CONFIG["TYPE_STRING"]
    for code, dt in enumerate(DATATYPES, 1):
        if dt.numpy == dtype.newbyteorder("<") or dt.numpy == dtype:
            return code
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """BYTES elements as Triton lays them out: each a 4-byte little-endian length, then its
    bytes, in C order (str elements UTF-8 encoded); None for a tensor of another dtype."""
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    parts = []
    for item in input_tensor.flat:
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """serialize_byte_tensor's bytes back to a 1-D object array of bytes."""
    items, offset, view = [], 0, memoryview(encoded_tensor)
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        items.append(bytes(view[offset:offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)
