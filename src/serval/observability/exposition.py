"""The per-model families of /metrics, written straight to text.

prometheus_client builds a Sample tuple and a label dict, sorts and escapes the labels and
formats the value for every line: ~5 us a line, ~90 lines a model, so 100 busy models held the
event loop ~70 ms at every scrape. Here each model's label text is built once per render
(escaped, in the sorted order the library writes: le, model, outcome, step, version), each
histogram's `le` labels once per bucket layout, and a line is one f-string. The output is
byte for byte what `generate_latest` writes for the same families (tests/unit/observability/
test_exposition.py checks it against the library on random counters); bench/metrics_render.py
measures both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol, cast

from prometheus_client import utils

from serval.stats import Histogram, ModelStats


class ModelView(Protocol):
    """What the exposition reads of a model version (the registry's entries provide it)."""

    @property
    def stats(self) -> ModelStats: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def ready(self) -> int: ...  # True when it serves; for the summed rest, how many serve
    @property
    def pending_requests(self) -> int: ...
    @property
    def running_batches(self) -> int: ...


go_float = cast(Callable[[float], str], utils.floatToGoString)  # Go's float text, as exposed


def escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def number(value: float) -> str:
    """A sample value as prometheus_client writes it (3 -> '3.0', 1234567 -> '1.234567e+06')."""
    if type(value) is int and -1_000_000 < value < 1_000_000:
        return f"{value}.0"
    return go_float(value)


@lru_cache(maxsize=16)
def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """The `le="..."` label of each bucket of a layout, +Inf last."""
    return (*(f'le="{bound!r}"' for bound in bounds), 'le="+Inf"')  # as Histogram.cumulative


def _header(name: str, kind: str, documentation: str) -> str:
    documentation = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"


# (name, type, help, one model's value) of the one-sample-a-model families, in /metrics order
Simple = tuple[str, str, str, Callable[[ModelView], int]]
SIMPLE: tuple[Simple, ...] = (
    ("serval_inferences_total", "counter", "Batch rows computed (items)",
     lambda m: m.stats.inference_count),
    ("serval_executions_total", "counter", "Engine runs", lambda m: m.stats.execution_count),
    ("serval_model_memory_bytes", "gauge", "Memory held by the loaded model",
     lambda m: m.memory_bytes),
    ("serval_model_ready", "gauge", "1 when the model serves (the summed rest: how many of "
     "them serve)", lambda m: int(m.ready)),
    ("serval_pending_requests", "gauge", "Requests queued, not yet computing",
     lambda m: m.pending_requests),
    ("serval_running_batches", "gauge", "Batches the engine is computing now",
     lambda m: m.running_batches),
)
REQUESTS = ("serval_requests_total", "Inference requests by outcome")
STEPS = ("serval_pipeline_step_duration_seconds_total", "Time pipelines spent in each step")
CACHE = (("serval_response_cache_hits_total", "Requests answered from the response cache",
          "cache_hit"),
         ("serval_response_cache_misses_total", "Cacheable requests the model had to run",
          "cache_miss"))
HISTOGRAMS = (  # (name, help, ModelStats attribute)
    ("serval_request_duration_seconds", "Time in the data plane per request",
     "request_seconds"),
    ("serval_queue_duration_seconds", "Time a request waited in the batch queue",
     "queue_seconds"),
    ("serval_compute_duration_seconds", "Time of one batch: merge, engine run, split",
     "compute_seconds"),
    ("serval_batch_size", "Rows per engine run", "batch_size"),
)


def render_models(models: Sequence[ModelView]) -> str:
    """The per-model families for these models (each a model="…",version="…" series)."""
    out: list[str] = []
    add = out.append
    names = [f'model="{escape(m.stats.name)}"' for m in models]
    versions = [f'version="{escape(m.stats.version)}"' for m in models]
    pairs = [f"{name},{version}" for name, version in zip(names, versions, strict=True)]

    add(_header(REQUESTS[0], "counter", REQUESTS[1]))
    for model, name, version in zip(models, names, versions, strict=True):
        for outcome, count in sorted(model.stats.outcomes.items()):
            add(f'{REQUESTS[0]}{{{name},outcome="{escape(outcome)}",{version}}} '
                f"{number(count)}\n")
    for family, kind, documentation, value in SIMPLE:
        add(_header(family, kind, documentation))
        for model, labels in zip(models, pairs, strict=True):
            add(f"{family}{{{labels}}} {number(value(model))}\n")
    add(_header(STEPS[0], "counter", STEPS[1]))
    for model, name, version in zip(models, names, versions, strict=True):
        for step, duration in model.stats.steps.items():
            add(f'{STEPS[0]}{{{name},step="{escape(step)}",{version}}} '
                f"{go_float(duration.ns * 1e-9)}\n")
    cached = [(model, labels) for model, labels in zip(models, pairs, strict=True)
              if model.stats.cache_hit.count or model.stats.cache_miss.count]
    for family, documentation, attribute in CACHE:
        add(_header(family, "counter", documentation))
        for model, labels in cached:
            add(f"{family}{{{labels}}} {number(getattr(model.stats, attribute).count)}\n")
    for family, documentation, attribute in HISTOGRAMS:
        add(_header(family, "histogram", documentation))
        for model, labels in zip(models, pairs, strict=True):
            _histogram(add, family, labels, getattr(model.stats, attribute))
    return "".join(out)


def _histogram(add: Callable[[str], None], family: str, labels: str, hist: Histogram) -> None:
    running = 0
    for le, count in zip(_le_labels(hist.bounds), hist.counts, strict=True):
        running += count
        add(f"{family}_bucket{{{le},{labels}}} {number(running)}\n")
    add(f"{family}_count{{{labels}}} {number(running)}\n")
    add(f"{family}_sum{{{labels}}} {go_float(hist.sum)}\n")
