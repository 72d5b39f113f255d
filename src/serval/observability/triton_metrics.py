"""Triton's metric names, for dashboards, alerts and autoscalers written against Triton
(`serve --triton-metrics`): the per-model `nv_inference_*` counters and pending-request gauge,
the response cache's `nv_cache_*` per model, and `nv_cpu_*`, each with Triton's names, types,
labels (model, version; a failure's reason) and units (microseconds). They are read from the
same statistics as Triton's statistics extension, as Triton reads its own.

A failure's reason is Triton's: REJECTED (overload, a queue timeout, a model not ready),
CANCELED (the client went away), BACKEND (the model failed), OTHER (the request was invalid).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serval.observability.exposition import ModelView, escape, number
from serval.stats import Duration

REASONS = {"overloaded": "REJECTED", "deadline_exceeded": "REJECTED",
           "model_not_ready": "REJECTED", "unavailable": "REJECTED", "cancelled": "CANCELED",
           "backend_error": "BACKEND"}  # any other error: OTHER

# (name, type, help, one model's value) in Triton's order
Family = tuple[str, str, str, Callable[[ModelView], float]]
FAMILIES: tuple[Family, ...] = (
    ("nv_inference_request_success", "counter",
     "Number of successful inference requests, all batch sizes",
     lambda m: m.stats.success.count),
    ("nv_inference_count", "counter",
     "Number of inferences performed (does not include cached requests)",
     lambda m: m.stats.inference_count),
    ("nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)",
     lambda m: m.stats.execution_count),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model.",
     lambda m: m.pending_requests),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda m: _us(m.stats.success)),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda m: _us(m.stats.queue)),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda m: _us(m.stats.compute_input)),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached "
     "requests)", lambda m: _us(m.stats.compute_infer)),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)", lambda m: _us(m.stats.compute_output)),
)
FAILURE = ("nv_inference_request_failure", "Number of failed inference requests, all batch "
           "sizes")
CACHE: tuple[Family, ...] = (
    ("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model",
     lambda m: m.stats.cache_hit.count),
    ("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model",
     lambda m: m.stats.cache_miss.count),
    ("nv_cache_hit_duration_per_model", "counter",
     "Total cache hit duration per model, in microseconds", lambda m: _us(m.stats.cache_hit)),
    ("nv_cache_miss_duration_per_model", "counter",
     "Total cache miss (insert + lookup) duration per model, in microseconds",
     lambda m: _us(m.stats.cache_miss)),
)


def _us(duration: Duration) -> int:
    return duration.ns // 1000


def render_triton(models: Sequence[ModelView]) -> str:
    """Triton's per-model families for these models (model="…",version="…" series)."""
    out: list[str] = []
    add = out.append
    pairs = [f'model="{escape(m.stats.name)}",version="{escape(m.stats.version)}"'
             for m in models]
    for family, kind, documentation, value in FAMILIES[:1]:
        _family(add, family, kind, documentation, value, models, pairs)
    add(f"# HELP {FAILURE[0]} {FAILURE[1]}\n# TYPE {FAILURE[0]} counter\n")
    for model in models:
        failures = dict.fromkeys(("BACKEND", "CANCELED", "OTHER", "REJECTED"), 0)  # as Triton
        for outcome, count in model.stats.outcomes.items():
            if outcome != "success":
                failures[REASONS.get(outcome, "OTHER")] += count
        name, version = escape(model.stats.name), escape(model.stats.version)
        for reason, count in failures.items():
            add(f'{FAILURE[0]}{{model="{name}",reason="{reason}",version="{version}"}} '
                f"{number(count)}\n")
    for family, kind, documentation, value in FAMILIES[1:]:
        _family(add, family, kind, documentation, value, models, pairs)
    cached = [i for i, model in enumerate(models)
              if model.stats.cache_hit.count or model.stats.cache_miss.count]
    if cached:
        cached_models, cached_pairs = [models[i] for i in cached], [pairs[i] for i in cached]
        for family, kind, documentation, value in CACHE:
            _family(add, family, kind, documentation, value, cached_models, cached_pairs)
    return "".join(out)


def _family(add: Callable[[str], None], family: str, kind: str, documentation: str,
            value: Callable[[ModelView], float], models: Sequence[ModelView],
            pairs: Sequence[str]) -> None:
    add(f"# HELP {family} {documentation}\n# TYPE {family} {kind}\n")
    for model, labels in zip(models, pairs, strict=True):
        add(f"{family}{{{labels}}} {number(value(model))}\n")


class CpuCollector(Collector):
    """nv_cpu_utilization (the host's busy share of CPU time since the last scrape, 0.0-1.0,
    from /proc/stat) and nv_cpu_memory_{total,used}_bytes (from /proc/meminfo), as Triton's
    CPU metrics; nothing where /proc is not there."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._last: tuple[int, int] | None = self._cpu_times()

    def collect(self) -> list[Metric]:
        metrics: list[Metric] = []
        times = self._cpu_times()
        if times is not None:
            busy, total = times
            last_busy, last_total = self._last or (0, 0)
            span = total - last_total
            share = (busy - last_busy) / span if span > 0 else 0.0
            self._last = times
            metrics.append(GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate "
                                             "[0.0 - 1.0]", min(1.0, max(0.0, share))))
        memory = self._memory()
        if memory is not None:
            total_bytes, available_bytes = memory
            metrics.append(GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory "
                                             "(RAM), in bytes", total_bytes))
            metrics.append(GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory "
                                             "(RAM), in bytes", total_bytes - available_bytes))
        return metrics

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs: idle and iowait are not busy."""
        try:
            with open(os.path.join(self.proc, "stat"), "rb") as file:
                fields = [int(v) for v in file.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = sum(fields[3:5])
        return sum(fields) - idle, sum(fields)

    def _memory(self) -> tuple[int, int] | None:
        """(MemTotal, MemAvailable) in bytes."""
        values: dict[bytes, int] = {}
        try:
            with open(os.path.join(self.proc, "meminfo"), "rb") as file:
                for line in file:
                    key, _, rest = line.partition(b":")
                    if key in (b"MemTotal", b"MemAvailable"):
                        values[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        if len(values) < 2:
            return None
        return values[b"MemTotal"], values[b"MemAvailable"]

