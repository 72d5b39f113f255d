"""How many serving processes: `--workers N` or `auto`, checked against what the models cost.

More workers pay where a request's cost is HTTP and JSON (each worker parses on its own core);
they cost where it is the engine: each worker holds its own copy of every model with 1/N of
the engine threads, and the requests split between workers form smaller batches. Measured on
this 2-core box (bench/engine_bound.py and bench/serving.py, one run each): `minilm` (a 5.6 ms
batch-1 call) with 2 workers answered one client at p50 10.4 ms against 5.6 ms, and 64 clients
at 0.96 of the engine's ceiling against 0.98; `lstm` (0.6 ms) went from 0.65 to 0.76 of its
ceiling with 2 workers, `mlp` (0.04 ms) to 2.0x. So before workers start, the supervisor loads
each model once with all the cores and times one batch-1 call on zeros (backends/probe.py): at
ENGINE_BOUND_MS or more a model is engine-bound.

- `auto`: one worker per usable core where every timed model is HTTP-bound, else one.
- `N > 1` with an engine-bound model: refused with the reason, unless `--force-workers`.
- Not timed (no worker check): `--workers 1`, lazy or explicit model control (nothing loads at
  start), more than MAX_TIMED_MODELS models, and models that take strings or their requests one
  by one (Python models). `auto` then keeps one worker and says why.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from serval.backends.cores import usable_cores
from serval.backends.probe import ENGINE_BOUND_MS, batch1_infer_ms
from serval.config import MAX_WORKERS, ServerConfig
from serval.errors import ConfigError
from serval.server.build import build_model_registry

log = logging.getLogger(__name__)

MAX_TIMED_MODELS = 64  # past this, timing every model would double a long start


@dataclass(frozen=True)
class WorkerChoice:
    count: int
    why: str


def resolve_workers(config: ServerConfig) -> ServerConfig:
    """`config` with `workers` a number, chosen or checked as the module says; ConfigError
    where N > 1 would serve an engine-bound model slower."""
    choice = choose_workers(config, usable_cores())
    if choice.why:
        log.info("workers", extra={"workers": choice.count, "why": choice.why})
    return config.model_copy(update={"workers": choice.count})


def choose_workers(config: ServerConfig, cores: int) -> WorkerChoice:
    requested = config.workers
    if requested == 1:
        return WorkerChoice(1, "")
    if requested == "auto" and config.http_port == 0:
        return WorkerChoice(1, "auto: 1 worker (--http-port 0: workers share one fixed port)")
    untimed = _why_untimed(config)
    if untimed:
        if requested == "auto":
            return WorkerChoice(1, f"auto: 1 worker ({untimed}; models not timed)")
        return WorkerChoice(int(requested), f"not checked for engine-bound models ({untimed})")
    timed = time_models(config, cores)
    bound = sorted((ms, name) for name, ms in timed.items() if ms >= ENGINE_BOUND_MS)
    if requested == "auto":
        if bound:
            return WorkerChoice(1, f"auto: 1 worker: {_name_bound(bound)}")
        count = max(1, min(cores, MAX_WORKERS))
        return WorkerChoice(count, f"auto: {count} worker{'s' * (count > 1)} (one per usable "
                                   f"core; every timed model is HTTP-bound: a batch-1 call "
                                   f"under {ENGINE_BOUND_MS:g} ms)")
    if bound and not config.force_workers:
        raise ConfigError(
            f"--workers {requested} would serve {_name_bound(bound)} slower than one worker: "
            f"each worker gets 1/{requested} of the load (smaller batches, no more "
            f"throughput) and, on the CPU, runs a call on 1/{requested} of the engine threads "
            f"(a request takes longer). Serve engine-bound models with --workers 1 (or auto; "
            f"--workers is for HTTP-bound models), or pass --force-workers (on a GPU, several "
            f"workers can pay where one item per request keeps one event loop busy)")
    return WorkerChoice(int(requested), "checked: no engine-bound model" if not bound else
                        f"--force-workers: {_name_bound(bound)}")


def _why_untimed(config: ServerConfig) -> str:
    if config.model_control != "all":
        return f"--model-control {config.model_control} loads nothing at start"
    count = sum(1 for entry in config.repository.iterdir()
                if entry.is_dir() and not entry.name.startswith("."))
    if count > MAX_TIMED_MODELS:
        return f"{count} models, more than the {MAX_TIMED_MODELS} timed at start"
    return ""


def _name_bound(bound: list[tuple[float, str]]) -> str:
    slowest = bound[::-1][:3]
    names = ", ".join(f"{name} ({ms:.1f} ms)" for ms, name in slowest)
    more = f" and {len(bound) - 3} more" if len(bound) > 3 else ""
    return (f"engine-bound model{'s' if len(bound) > 1 else ''} {names}{more} (a batch-1 call "
            f"takes {ENGINE_BOUND_MS:g} ms or more)")


def time_models(config: ServerConfig, cores: int) -> dict[str, float]:
    """Each model's serving version loaded with `cores` engine threads, one batch-1 call timed
    (ms, the slowest version per name), then every engine released; models that cannot be
    timed that way are left out."""
    return asyncio.run(_time_models(config.model_copy(update={"workers": 1}), cores))


async def _time_models(config: ServerConfig, cores: int) -> dict[str, float]:
    registry = build_model_registry(config, cores)
    await registry.start()
    try:
        timed: dict[str, float] = {}
        for served in registry.all_models():
            if not served.ready or served.model is None:
                continue  # failed loads; a pipeline's steps are models of their own
            ms = await asyncio.to_thread(batch1_infer_ms, served.model)
            if ms > 0:
                timed[served.name] = max(ms, timed.get(served.name, 0.0))
        return timed
    finally:
        await registry.close()
