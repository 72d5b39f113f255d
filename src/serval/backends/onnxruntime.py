"""The ONNX Runtime engine: sessions sized to the cores, metadata read from the model file."""

from __future__ import annotations

import logging
import queue
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from serval.backends.base import (
    BackendOptions,
    LoadedModel,
    ModelMetadata,
    ModelVersionSpec,
    resolve_max_batch_size,
)
from serval.backends.engine import EngineBackend
from serval.backends.probe import ENGINE_BOUND_MS, fastest_call_ms, zeros_batch1
from serval.backends.validation import same_dims
from serval.errors import ConfigError, EngineRejectedInput
from serval.model_config import ModelConfig, OnnxRuntimeConfig
from serval.protocol.dtypes import from_onnx_type
from serval.protocol.types import TensorDict, TensorSpec

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
# Below this file size an op is too small for a second thread to pay off, and each extra
# intra-op thread is an OS thread per session (10,000 models would mean 10,000 threads).
SMALL_MODEL_BYTES = 2 * 1024 * 1024
# What a session holds beyond its weights (graph, kernels, arena), measured here as RSS growth
# per loaded 426 KB model: 879 KiB. Counted so a memory budget bounds the real RSS.
SESSION_OVERHEAD_BYTES = 460 * 1024
# Spinning (idle intra-op threads busy-wait for the next parallel section) saves a thread wake-up
# per op: ~1.5 ms per minilm call (5.7 -> 5.1 ms at batch 1) and 4 points of served throughput
# at 64 clients. It costs the event loop the core it spins on: `lstm` (0.5 ms calls, thousands of
# requests/s to parse) served 0.61 of its ceiling with it, 0.71 without. So `allow_spinning`
# unset means: on where one batch-1 call takes at least this long (measured once at load).
SPIN_MIN_CALL_MS = ENGINE_BOUND_MS
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OnnxRuntimeBackend(EngineBackend):
    """Loads model.onnx files; cores is what this process may use for engine threads."""

    name = "onnxruntime"

    def __init__(self, cores: int) -> None:
        self.cores = max(1, cores)

    @classmethod
    def from_options(cls, options: BackendOptions) -> OnnxRuntimeBackend:
        return cls(options.cores)

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        model_file = spec.path / MODEL_FILE
        if not model_file.is_file():
            raise ConfigError(f"{model_file}: model file not found")
        small = model_file.stat().st_size < SMALL_MODEL_BYTES
        threads = self._intra_threads(spec.config, small)
        spinning = spec.config.onnxruntime.allow_spinning
        sessions = [self._session(model_file, spec.config, threads, bool(spinning))
                    for _ in range(spec.config.instances)]
        if spinning is None and threads > 1 and not spec.config.device.startswith("cuda"):
            call_ms = batch1_call_ms(sessions[0])
            if call_ms >= SPIN_MIN_CALL_MS:
                log.info("intra-op spinning on: one batch-1 call takes %.1f ms", call_ms,
                         extra={"model": spec.name, "version": spec.version})
                sessions.clear()  # never two copies of the weights at once
                sessions = [self._session(model_file, spec.config, threads, True)
                            for _ in range(spec.config.instances)]
        metadata = read_metadata(sessions[0], spec.config, str(model_file))
        size_bytes = (model_file.stat().st_size + SESSION_OVERHEAD_BYTES) * len(sessions)
        return OnnxModel(sessions, metadata, size_bytes, spec.config.onnxruntime.run_entries)

    def _session(self, model_file: Any, config: ModelConfig, threads: int,
                 spinning: bool) -> Any:
        import onnxruntime as ort

        options = session_options(config.onnxruntime, threads, spinning)
        providers = execution_providers(config, ort.get_available_providers())
        return ort.InferenceSession(str(model_file), sess_options=options, providers=providers)

    def _intra_threads(self, config: ModelConfig, small: bool) -> int:
        if config.onnxruntime.intra_op_threads is not None:
            return config.onnxruntime.intra_op_threads
        return 1 if small else max(1, self.cores // config.instances)


class OnnxModel:
    """One or more sessions of the same file; each concurrent run takes a free session."""

    def __init__(self, sessions: list[Any], metadata: ModelMetadata, size_bytes: int,
                 run_entries: Mapping[str, str] | None = None) -> None:
        self._metadata = metadata
        self._size_bytes = size_bytes
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for session in sessions:
            self._free.put(session)
        self._output_names = [spec.name for spec in metadata.outputs]
        self._string_inputs = {s.name for s in metadata.inputs if s.datatype == "BYTES"}
        self._run_options = quiet_run_options(run_entries)

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        feed = {name: _engine_array(name, array, self._string_inputs)
                for name, array in inputs.items()}
        session = self._free.get()
        try:
            results = session.run(self._output_names, feed, self._run_options)
        except Exception as exc:
            if type(exc).__name__ == "InvalidArgument" or _UNPARSED_STRING.search(str(exc)):
                raise rejected_input(str(exc)) from exc  # the input values' fault
            raise  # a real engine failure: the batcher answers 500, the log keeps the cause
        finally:
            self._free.put(session)
        return dict(zip(self._output_names, results, strict=True))

    def memory_bytes(self) -> int:
        return self._size_bytes

    def unload(self) -> None:
        while not self._free.empty():
            self._free.get_nowait()


def quiet_run_options(entries: Mapping[str, str] | None = None) -> Any:
    """Runs whose failures ONNX Runtime does not print itself: a client sending bad token ids
    would otherwise write an ERROR line per request to stderr. Serval logs real failures (with
    the same engine message) and answers input errors with 400. `entries`: run config keys."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # FATAL only
    for key, value in (entries or {}).items():
        options.add_run_config_entry(key, value)
    return options


_OP = re.compile(r"running (\w+) node")
_STATUS = re.compile(r"Status Message: (.*)", re.DOTALL)
_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# a Cast from a string tensor whose text is not a number: C++'s std::sto* threw (a
# RUNTIME_EXCEPTION, where every other input fault is INVALID_ARGUMENT)
_UNPARSED_STRING = re.compile(
    r"running Cast node\..*Status Message: sto(?:i|l|ll|ul|ull|f|d|ld)$", re.DOTALL)


def rejected_input(engine_message: str) -> EngineRejectedInput:
    """ONNX Runtime's INVALID_ARGUMENT, which input values cause (an index out of range, a
    shape an op cannot take), as a 400 naming the problem; node names and paths left out."""
    op = _OP.search(engine_message)
    status = _STATUS.search(engine_message)
    detail = (status.group(1) if status else _PREFIX.sub("", engine_message)).strip()
    detail = detail.split("\n", 1)[0].replace(" Please fix either the inputs/outputs or the "
                                               "model.", "")[:300]
    where = f" ({op.group(1)})" if op else ""
    if _UNPARSED_STRING.search(engine_message):
        detail = "a string element is not a number it can read (or is out of its type's range)"
    message = f"the model cannot compute on these input values{where}: {detail}"
    if op and op.group(1) == "Gather" and "out of data bounds" in detail:
        message += "; token ids and other indices must lie within the model's table " \
                   "(e.g. its vocabulary)"
    return EngineRejectedInput(message, detail)


def session_options(config: OnnxRuntimeConfig, intra_threads: int, spinning: bool) -> Any:
    """SessionOptions from config and the chosen thread count and spinning."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_threads
    parallel = config.execution_mode == "parallel"  # ONNX Runtime's parallel needs 2+ threads
    options.inter_op_num_threads = config.inter_op_threads or (
        max(2, intra_threads) if parallel else 1)
    options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if parallel
                              else ort.ExecutionMode.ORT_SEQUENTIAL)
    if config.memory_arena is not None:
        options.enable_cpu_mem_arena = config.memory_arena
    if config.memory_pattern is not None:
        options.enable_mem_pattern = config.memory_pattern
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _OPT_LEVELS[config.graph_optimization_level]
    )
    spin = "1" if spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    for key, value in config.session_entries.items():  # the config's own go last: they win
        options.add_session_config_entry(key, value)
    return options


def batch1_call_ms(session: Any) -> float:
    """One batch-1 call of a session on zeros, in ms (backends/probe.py); 0.0 where it cannot
    run on such an input (string inputs, a shape it refuses)."""
    feed = zeros_batch1([_tensor_spec(arg) for arg in session.get_inputs()])
    if feed is None:
        return 0.0
    options = quiet_run_options()
    return fastest_call_ms(lambda: session.run(None, feed, options))


def execution_providers(config: ModelConfig, available: list[str]) -> list[Any]:
    """Providers for the configured device: CUDA first when asked for and present."""
    if config.onnxruntime.execution_providers:
        wanted = config.onnxruntime.execution_providers
        missing = [name for name in (p if isinstance(p, str) else p[0] for p in wanted)
                   if name not in available]
        if missing:
            raise ConfigError(f"execution providers {missing} are not available; have {available}")
        return list(wanted)
    if config.device.startswith("cuda"):
        if "CUDAExecutionProvider" not in available:
            raise ConfigError(f"device '{config.device}' asked for, but CUDA is not available")
        device_id = int(config.device.partition(":")[2] or 0)
        return [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def read_metadata(session: Any, config: ModelConfig, source: str) -> ModelMetadata:
    """Inputs/outputs from the session; max_batch_size from config or the free batch axis."""
    inputs = tuple(_tensor_spec(arg) for arg in session.get_inputs())
    outputs = tuple(_tensor_spec(arg) for arg in session.get_outputs())
    max_batch_size = resolve_max_batch_size(config.max_batch_size, inputs + outputs, source)
    named = same_dims(((arg.name, arg.shape) for arg in session.get_inputs()),
                      batched=max_batch_size > 0)
    return ModelMetadata("onnxruntime_onnx", inputs, outputs, max_batch_size,
                         same_dims=named)


def _tensor_spec(arg: Any) -> TensorSpec:
    shape = tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in arg.shape)
    return TensorSpec(arg.name, from_onnx_type(arg.type), shape)


def _engine_array(name: str, array: np.ndarray, string_inputs: set[str]) -> np.ndarray:
    if name in string_inputs:
        as_str: np.ndarray = np.vectorize(_to_str, otypes=[object])(array)
        return as_str
    return array


def _to_str(element: object) -> str:
    return element.decode("utf-8", errors="replace") if isinstance(element, bytes) else str(element)
