"""Pipelines: a composite model made of other models, its steps run through the data plane.

The pipeline computes nothing itself: each step is an ordinary inference on its own model,
through the same per-model path as a client's request (so a shared encoder batches across
every caller). Serving checks the wiring: each step's inputs exist when it runs, and every
declared output is produced. A step's failure reaches the client without the step's name.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from serval.backends.base import ModelMetadata, ModelVersionSpec, ServeContext, Served
from serval.backends.declared import declared_metadata
from serval.errors import (
    BackendError,
    ConfigError,
    DeadlineExceeded,
    EngineRejectedInput,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    ServalError,
    ServerUnavailable,
)
from serval.model_config import PipelineStep
from serval.protocol.dtypes import v2_datatype
from serval.protocol.types import InferRequest, RequestedOutput, TensorDict, TensorSpec

log = logging.getLogger(__name__)


class PipelineBackend:
    """`backend: pipeline`: serves a Pipeline over the steps config.yaml lists."""

    name = "pipeline"

    async def serve(self, spec: ModelVersionSpec, context: ServeContext) -> Served:
        if spec.config.isolation == "process":
            raise ConfigError(f"model '{spec.name}': isolation: process does not apply to a "
                              "pipeline (isolate its steps instead)")
        metadata = declared_metadata(spec, "ensemble")
        steps = tuple(spec.config.steps)
        if not steps:
            raise ConfigError(f"{spec.path.parent}/config.yaml: a pipeline needs 'steps'")
        check_wiring(steps, metadata, str(spec.path.parent / "config.yaml"))
        pipeline = Pipeline(spec.name, metadata, steps, context)
        return Served(pipeline, pipeline)


class Pipeline:
    """The served model and its runner at once: it holds no engine, queue or memory of its
    own; infer walks the steps, each through the context's per-model path."""

    def __init__(self, name: str, metadata: ModelMetadata, steps: tuple[PipelineStep, ...],
                 context: ServeContext) -> None:
        self.name, self._metadata, self.steps, self._context = name, metadata, steps, context

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def memory_bytes(self) -> int:
        return 0

    def unload(self) -> None:
        return None

    queued = 0  # its steps queue at their own models
    running = 0

    def check_capacity(self, deadline_ns: int | None = None) -> None:
        return None  # each step's model admits its own requests

    async def drain(self) -> None:
        return None

    def retire(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def infer(self, inputs: TensorDict, deadline_ns: int | None = None,
                    request: InferRequest | None = None) -> TensorDict:
        """Run the steps in order; a step's error is answered as the pipeline's (in_step)."""
        tensors = dict(inputs)
        waiting = request.waiting_models if request else frozenset()
        for index, step in enumerate(self.steps, start=1):
            if step.model in waiting:  # a BLS call led here from that model's running batch
                raise InvalidInput(
                    f"pipeline '{self.name}' step {index} calls model '{step.model}', which is "
                    "waiting on this request already (it called the pipeline, directly or "
                    "through other models): calling it back would wait forever")
            step_request = InferRequest(
                {step_input: tensors[tensor] for step_input, tensor in step.inputs.items()},
                outputs=[RequestedOutput(output) for output in step.outputs],
                waiting_models=waiting,
            )
            started_ns = time.perf_counter_ns()
            try:
                response = await self._context.run_step(step.model, step.version, step_request,
                                                        deadline_ns)
            except ServalError as exc:
                raise in_step(exc, self.metadata, self.name, index, step) from exc
            finally:
                self._context.record_step(f"{index}:{step.model}",
                                          time.perf_counter_ns() - started_ns)
            for step_output, tensor in step.outputs.items():
                tensors[tensor] = response.outputs[step_output]
        return {spec.name: self._declared(spec, tensors[spec.name])
                for spec in self.metadata.outputs}

    def _declared(self, spec: TensorSpec, array: Any) -> Any:
        """An output of the datatype the pipeline's config declares; else a 500 (the log
        says which): a step's INT32 went out to clients told FP32."""
        try:
            datatype = v2_datatype(array.dtype)
        except (AttributeError, ValueError):
            datatype = type(array).__name__
        if datatype == spec.datatype:
            return array
        error = BackendError(f"pipeline '{self.name}': output '{spec.name}' is {datatype} "
                             f"from its step, its config says {spec.datatype}")
        error.public_message = f"pipeline '{self.name}' failed to run the request"
        raise error


def check_wiring(steps: tuple[PipelineStep, ...], metadata: ModelMetadata, where: str) -> None:
    """Every step input is available when the step runs; every output is produced."""
    available = {spec.name for spec in metadata.inputs}
    for index, step in enumerate(steps):
        missing = sorted(set(step.inputs.values()) - available)
        if missing:
            raise ConfigError(f"{where}: step {index + 1} ('{step.model}') reads {missing}, "
                              "which no pipeline input or earlier step provides")
        available |= set(step.outputs.values())
    unproduced = sorted({spec.name for spec in metadata.outputs} - available)
    if unproduced:
        raise ConfigError(f"{where}: pipeline outputs {unproduced} are produced by no step")


def in_step(exc: ServalError, metadata: ModelMetadata, name: str, index: int,
            step: PipelineStep) -> ServalError:
    """What the client may learn of a step's failure: the pipeline's name and, for an input
    error, which of its own inputs was wrong; never the steps or why they failed inside."""
    where = f"pipeline '{name}' step {index} ('{step.model}')"
    log.info("pipeline step failed", extra={"model": name, "step": where,
                                            "reason": exc.message})
    own = {spec.name for spec in metadata.inputs}
    fed = {step_input: tensor for step_input, tensor in step.inputs.items() if tensor in own}
    if isinstance(exc, EngineRejectedInput):
        inputs = ", ".join(f"'{tensor}'" for tensor in sorted(set(fed.values())))
        what = f"input {inputs}" if inputs else "the request's inputs"
        return InvalidInput(f"pipeline '{name}' cannot compute on the values of {what}: "
                            f"{exc.detail}")
    if isinstance(exc, InvalidInput):
        for step_input, tensor in fed.items():
            prefix = f"input '{step_input}':"
            if exc.message.startswith(prefix):
                return InvalidInput(f"pipeline '{name}': input '{tensor}':"
                                    f"{exc.message[len(prefix):]}")
        exc = BackendError(exc.message)  # the pipeline's wiring, not the client's input
    if isinstance(exc, Overloaded):
        return Overloaded(f"pipeline '{name}' is overloaded; retry shortly", exc.retry_after_s)
    if isinstance(exc, DeadlineExceeded):
        return DeadlineExceeded(f"the request's deadline passed while pipeline '{name}' ran it")
    if isinstance(exc, ModelNotFound | ModelNotReady | ServerUnavailable):
        return ModelNotReady(f"pipeline '{name}' cannot serve now: one of its models is not "
                             "ready")
    error = BackendError(f"{where}: {exc.message}")
    error.public_message = f"pipeline '{name}' failed to run the request"
    return error
