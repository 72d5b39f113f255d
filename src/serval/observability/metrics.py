"""Prometheus metrics, defined once here and read from ModelStats at scrape time."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from serval.stats import Histogram, ModelStats

LABELS = ["model", "version"]


class ModelView(Protocol):
    """What the collector reads of a model version (the registry's entries provide it)."""

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


class ModelMetricsCollector(Collector):
    """Turns models' counters into metric families when Prometheus scrapes.

    Cardinality stays bounded with thousands of models: the `top_k` busiest versions get
    their own series, all others are summed into model="_other".
    """

    def __init__(self, models: Callable[[], Sequence[ModelView]], totals: ModelStats,
                 top_k: int) -> None:
        self._models = models
        self._totals = totals  # every model's counters summed as they are recorded
        self.top_k = top_k

    def _bounded(self) -> list[ModelView]:
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

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "serval_requests", "Inference requests by outcome", labels=[*LABELS, "outcome"]
        )
        inferences = CounterMetricFamily(
            "serval_inferences", "Batch rows computed (items)", labels=LABELS
        )
        executions = CounterMetricFamily("serval_executions", "Engine runs", labels=LABELS)
        memory = GaugeMetricFamily(
            "serval_model_memory_bytes", "Memory held by the loaded model", labels=LABELS
        )
        ready = GaugeMetricFamily("serval_model_ready", "1 when the model serves (the "
                                  "summed rest: how many of them serve)", labels=LABELS)
        pending = GaugeMetricFamily(
            "serval_pending_requests", "Requests queued, not yet computing", labels=LABELS
        )
        running = GaugeMetricFamily(
            "serval_running_batches", "Batches the engine is computing now", labels=LABELS
        )
        histograms = {
            "request_seconds": _histogram("serval_request_duration_seconds",
                                          "Time in the data plane per request"),
            "queue_seconds": _histogram("serval_queue_duration_seconds",
                                        "Time a request waited in the batch queue"),
            "compute_seconds": _histogram("serval_compute_duration_seconds",
                                          "Time of one batch: merge, engine run, split"),
            "batch_size": _histogram("serval_batch_size", "Rows per engine run"),
        }
        cache_hits = CounterMetricFamily(
            "serval_response_cache_hits", "Requests answered from the response cache",
            labels=LABELS)
        cache_misses = CounterMetricFamily(
            "serval_response_cache_misses", "Cacheable requests the model had to run",
            labels=LABELS)
        steps = CounterMetricFamily(
            "serval_pipeline_step_duration_seconds", "Time pipelines spent in each step",
            labels=[*LABELS, "step"])
        for model in self._bounded():
            stats = model.stats
            labels = [stats.name, stats.version]
            for outcome, count in sorted(stats.outcomes.items()):
                requests.add_metric([*labels, outcome], count)
            inferences.add_metric(labels, stats.inference_count)
            executions.add_metric(labels, stats.execution_count)
            memory.add_metric(labels, model.memory_bytes)
            ready.add_metric(labels, int(model.ready))
            pending.add_metric(labels, model.pending_requests)
            running.add_metric(labels, model.running_batches)
            for attribute, family in histograms.items():
                _add_histogram(family, labels, getattr(stats, attribute))
            for step, duration in stats.steps.items():
                steps.add_metric([*labels, step], duration.ns * 1e-9)
            if stats.cache_hit.count or stats.cache_miss.count:  # models that use the cache
                cache_hits.add_metric(labels, stats.cache_hit.count)
                cache_misses.add_metric(labels, stats.cache_miss.count)
        yield from (requests, inferences, executions, memory, ready, pending, running, steps,
                    cache_hits, cache_misses, *histograms.values())


def build_registry(*collectors: Collector) -> CollectorRegistry:
    """A registry with Serval's collectors plus process, platform and GC metrics."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def _histogram(name: str, documentation: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, labels=LABELS)


def _add_histogram(family: HistogramMetricFamily, labels: list[str], hist: Histogram) -> None:
    family.add_metric(labels, hist.cumulative(), hist.sum)
