"""What the registry lends a backend serving one model version (backends.base.ServeContext):
an engine loaded, warmed up and batched; a pipeline's steps run through the data plane."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from serval.backends.base import Engine, ModelCaller, ModelVersionSpec, Served
from serval.batching.batcher import Batcher
from serval.batching.priority import queue_rule
from serval.errors import ConfigError
from serval.model_config import MODEL_CONFIG_FILE
from serval.protocol.types import InferRequest, InferResponse
from serval.repository.bls_caller import LoopCaller
from serval.repository.declared import as_declared
from serval.repository.response_cache import ResponseCache
from serval.repository.routes import StepRouter
from serval.repository.sequences import serve_sequences
from serval.repository.served import ServedModel
from serval.repository.triton_config import PBTXT_FILE
from serval.repository.warmup import run_warmup


class VersionContext:
    """One version's ServeContext: its statistics, the shared engine pool, the step router."""

    __slots__ = ("_cache", "_config_source", "_executor", "_served", "_steps")

    def __init__(self, served: ServedModel, executor: ThreadPoolExecutor,
                 steps: StepRouter, config_source: Callable[[str], str] = str,
                 cache: ResponseCache | None = None) -> None:
        self._served, self._executor, self._steps = served, executor, steps
        self._config_source = config_source  # where a config file's settings came from
        self._cache = cache  # told when the version calls other models

    async def batch_engine(self, engine: Engine, spec: ModelVersionSpec) -> Served:
        """The engine's model, loaded off the loop, warmed up only when its config asks
        (Triton's model_warmup; a failed warm-up refuses the load), and batched on the shared
        engine pool."""
        model = await asyncio.to_thread(engine.load, spec)
        try:
            config_file = PBTXT_FILE if spec.config.triton is not None else MODEL_CONFIG_FILE
            model = as_declared(model, spec.config,
                                self._config_source(f"{spec.path.parent}/{config_file}"))
        except ConfigError:
            model.unload()
            raise
        if spec.config.warmup:
            try:
                await asyncio.to_thread(run_warmup, model, spec.config.warmup,
                                        spec.path.parent)
            except ConfigError:
                model.unload()
                raise
        if spec.config.sequence_batching is not None:
            return serve_sequences(model, spec, self._served.stats, self._executor)
        batching = spec.config.batching
        return Served(model, Batcher(
            model, self._served.stats, instances=spec.config.instances,
            max_queue_delay_ms=batching.max_queue_delay_ms,
            max_queue_size=batching.max_queue_size,
            preferred_batch_sizes=tuple(batching.preferred_batch_sizes),
            default_timeout_ms=batching.default_timeout_ms,
            allow_timeout_override=batching.allow_timeout_override,
            delay_on_timeout=batching.timeout_action == "delay",
            priority_levels=batching.priority_levels,
            default_priority_level=batching.default_priority_level,
            priority_rules={level: queue_rule(rule.max_queue_size, rule.default_timeout_ms,
                                              rule.allow_timeout_override,
                                              rule.timeout_action == "delay")
                            for level, rule in batching.priority_queues.items()},
            executor=self._executor,
        ))

    async def run_step(self, model: str, version: str | None, request: InferRequest,
                       deadline_ns: int | None) -> InferResponse:
        return await self._steps.run(model, version, request, deadline_ns)

    def record_step(self, step: str, duration_ns: int) -> None:
        self._served.stats.record_step(step, duration_ns)

    def model_caller(self) -> ModelCaller:
        """A thread's way onto this event loop's data plane (Triton's BLS), for this version's
        engine threads."""
        return LoopCaller(asyncio.get_running_loop(), self._steps, self._served.name,
                          self._calls_others)

    def _calls_others(self) -> bool:
        """On the loop, at a BLS call: the response cache learns this version is a composite
        (False while it warms up, before it has a load number)."""
        served = self._served
        if self._cache is None or not served.load_number:
            return False
        self._cache.calls_others((served.name, served.version, served.load_number))
        return True
