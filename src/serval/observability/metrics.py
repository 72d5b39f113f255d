"""Prometheus metrics, read at scrape time: the per-model series from ModelStats (top_k of them,
the rest summed; their text is written by exposition.py) and the server-wide collectors."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from serval.observability.exposition import ModelView, render_models
from serval.observability.triton_metrics import render_triton
from serval.stats import Histogram, ModelStats


@dataclass(frozen=True, slots=True)
class ModelGauges:
    """One model version's counters plus what is true of it right now (a ModelView); for
    model="_other", the sum over the versions it stands for (`ready`: how many are ready)."""

    stats: ModelStats
    memory_bytes: int
    ready: int
    pending_requests: int
    running_batches: int


@dataclass(frozen=True, slots=True)
class RegistryGauges:
    """Server-wide model residency: loads, evictions, bytes held and the budget."""

    loads: int
    evictions: int
    resident_bytes: int
    budget_bytes: int | None
    hits: int
    misses: int
    load_seconds: Histogram
    cache_capacity: int = 0  # the response cache (0: none)
    cache_bytes: int = 0
    cache_entries: int = 0
    cache_evictions: int = 0


@dataclass(frozen=True, slots=True)
class TransportGauges:
    """The server's guards, both transports together: connections, the receive budget and
    requests in flight."""

    connections_open: int
    connections_limit: int
    closed: dict[str, int]  # connections the server closed, by guard ("write stall", ...)
    budget_held_bytes: int
    budget_bytes: int
    budget_refusals: int
    inflight: int = 0
    inflight_limit: int = 0
    inflight_refusals: int = 0
    send_backlog_bytes: int = 0


class TransportMetricsCollector(Collector):
    """What the HTTP/1.1 and HTTP/2 guards and the in-flight limit hold and refuse: what an
    attack or an overload shows up as."""

    def __init__(self, read: Callable[[], TransportGauges]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        gauges = self._read()
        yield GaugeMetricFamily("serval_connections_open", "Open client connections, HTTP "
                                "and gRPC together", gauges.connections_open)
        yield GaugeMetricFamily("serval_connections_limit", "The connection limit "
                                "(--max-connections)", gauges.connections_limit)
        closed = CounterMetricFamily("serval_connections_closed", "Connections the server "
                                     "closed for a guard (timeouts, floods, the limit)",
                                     labels=["reason"])
        for reason, count in sorted(gauges.closed.items()):
            closed.add_metric([reason], count)
        yield closed
        yield GaugeMetricFamily("serval_receive_budget_held_bytes", "Bytes of requests held "
                                "now, server-wide", gauges.budget_held_bytes)
        yield GaugeMetricFamily("serval_receive_budget_bytes", "The receive budget "
                                "(--receive-budget-mb)", gauges.budget_bytes)
        yield CounterMetricFamily("serval_receive_budget_refusals", "Requests refused (429 / "
                                  "RESOURCE_EXHAUSTED) because the budget was full",
                                  gauges.budget_refusals)
        yield GaugeMetricFamily("serval_send_backlog_bytes", "Bytes of answers written but "
                                "not yet taken by clients whose connections stalled (bounded "
                                "by the receive budget's size)", gauges.send_backlog_bytes)
        yield GaugeMetricFamily("serval_inflight_requests", "Inference requests in flight "
                                "now, server-wide", gauges.inflight)
        yield GaugeMetricFamily("serval_inflight_limit", "The in-flight limit "
                                "(--max-inflight)", gauges.inflight_limit)
        yield CounterMetricFamily("serval_inflight_refusals", "Requests refused (429 / "
                                  "RESOURCE_EXHAUSTED) at the in-flight limit, before any "
                                  "model's queue", gauges.inflight_refusals)


class RegistryMetricsCollector(Collector):
    """Model loads, evictions and resident bytes against the memory budget."""

    def __init__(self, read: Callable[[], RegistryGauges]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        gauges = self._read()
        yield CounterMetricFamily("serval_model_loads", "Model version loads", gauges.loads)
        yield CounterMetricFamily("serval_model_evictions", "Versions evicted to fit the budget",
                                  gauges.evictions)
        yield GaugeMetricFamily("serval_resident_bytes", "Bytes held by loaded models",
                                gauges.resident_bytes)
        yield CounterMetricFamily("serval_model_cache_hits",
                                  "Requests that found their model loaded", gauges.hits)
        yield CounterMetricFamily("serval_model_cache_misses",
                                  "Requests that waited for a model load", gauges.misses)
        load = HistogramMetricFamily("serval_model_load_duration_seconds",
                                     "Time to load, warm up and admit a model version")
        load.add_metric([], gauges.load_seconds.cumulative(), gauges.load_seconds.sum)
        yield load
        if gauges.budget_bytes is not None:
            yield GaugeMetricFamily("serval_memory_budget_bytes", "The memory budget",
                                    gauges.budget_bytes)
        if gauges.cache_capacity:
            yield GaugeMetricFamily("serval_response_cache_capacity_bytes",
                                    "The response cache's size", gauges.cache_capacity)
            yield GaugeMetricFamily("serval_response_cache_bytes",
                                    "Bytes held by cached results", gauges.cache_bytes)
            yield GaugeMetricFamily("serval_response_cache_entries", "Cached results",
                                    gauges.cache_entries)
            yield CounterMetricFamily("serval_response_cache_evictions",
                                      "Cached results evicted to make room",
                                      gauges.cache_evictions)


OTHER_MODELS = "_other"


class ModelSeries:
    """The per-model families of /metrics, rendered when Prometheus scrapes (exposition.py
    writes them: the library took ~0.7 ms of the event loop per model).

    Cardinality stays bounded with thousands of models: the `top_k` busiest versions get
    their own series, all others are summed into model="_other".
    """

    def __init__(self, models: Callable[[], Sequence[ModelView]], totals: ModelStats,
                 top_k: int, triton: bool = False) -> None:
        self._models = models
        self._totals = totals  # every model's counters summed as they are recorded
        self.top_k = top_k
        self.triton = triton  # Triton's nv_* families too (triton_metrics.py)

    def bounded(self) -> list[ModelView]:
        """The top_k busiest versions, plus `_other` = totals less them: O(K) histogram work."""
        models = self._models()
        if len(models) <= self.top_k:
            return list(models)
        top = heapq.nlargest(self.top_k, models, key=lambda m: m.stats.requests)
        chosen = {id(m) for m in top}
        rest = [m for m in models if id(m) not in chosen]
        other = self._totals.minus([m.stats for m in top], OTHER_MODELS)
        return [*top, ModelGauges(
            other, sum(m.memory_bytes for m in rest), sum(1 for m in rest if m.ready),
            sum(m.pending_requests for m in rest), sum(m.running_batches for m in rest))]

    def render(self) -> str:
        models = self.bounded()
        return render_models(models) + (render_triton(models) if self.triton else "")


class Exposition:
    """/metrics' text: the per-model families, then the other collectors' (server-wide,
    few lines) through prometheus_client."""

    def __init__(self, models: ModelSeries, *collectors: Collector) -> None:
        self.models = models
        self.registry = build_registry(*collectors)

    def render(self) -> bytes:
        return self.models.render().encode() + generate_latest(self.registry)


def build_registry(*collectors: Collector) -> CollectorRegistry:
    """A registry with Serval's collectors plus process, platform and GC metrics."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
