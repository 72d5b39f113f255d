"""/metrics' per-model families: Serval's hand-written exposition vs prometheus_client's.

Both render the same random busy models (--models, the --top-k busiest with their own series
plus the summed rest, as the server does); the library's version is what Serval ran before
(its MetricFamily classes and generate_latest). Prints each one's median milliseconds per
render over --rounds, the ratio, and checks the two texts are equal. A render runs on the
event loop: its time is how long every request waits at each scrape.

    .venv/bin/python bench/metrics_render.py [--models 300] [--top-k 100] [--rounds 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serval.observability.exposition import ModelView
from serval.observability.metrics import ModelGauges, ModelSeries
from serval.stats import ModelStats

LABELS = ["model", "version"]


class LibraryReference(Collector):
    """The per-model families as prometheus_client's classes build them (what Serval's
    collector did before the hand-written exposition)."""

    def __init__(self, models: Sequence[ModelView]) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("serval_requests", "Inference requests by outcome",
                                       labels=[*LABELS, "outcome"])
        simple = [
            CounterMetricFamily("serval_inferences", "Batch rows computed (items)",
                                labels=LABELS),
            CounterMetricFamily("serval_executions", "Engine runs", labels=LABELS),
            GaugeMetricFamily("serval_model_memory_bytes", "Memory held by the loaded model",
                              labels=LABELS),
            GaugeMetricFamily("serval_model_ready", "1 when the model serves (the summed "
                              "rest: how many of them serve)", labels=LABELS),
            GaugeMetricFamily("serval_pending_requests", "Requests queued, not yet computing",
                              labels=LABELS),
            GaugeMetricFamily("serval_running_batches", "Batches the engine is computing now",
                              labels=LABELS)]
        steps = CounterMetricFamily("serval_pipeline_step_duration_seconds",
                                    "Time pipelines spent in each step", labels=[*LABELS, "step"])
        hits = CounterMetricFamily("serval_response_cache_hits", "Requests answered from the "
                                   "response cache", labels=LABELS)
        misses = CounterMetricFamily("serval_response_cache_misses", "Cacheable requests the "
                                     "model had to run", labels=LABELS)
        histograms = {
            "request_seconds": HistogramMetricFamily(
                "serval_request_duration_seconds", "Time in the data plane per request",
                labels=LABELS),
            "queue_seconds": HistogramMetricFamily(
                "serval_queue_duration_seconds", "Time a request waited in the batch queue",
                labels=LABELS),
            "compute_seconds": HistogramMetricFamily(
                "serval_compute_duration_seconds", "Time of one batch: merge, engine run, split",
                labels=LABELS),
            "batch_size": HistogramMetricFamily("serval_batch_size", "Rows per engine run",
                                                labels=LABELS)}
        for model in self.models:
            stats = model.stats
            labels = [stats.name, stats.version]
            for outcome, count in sorted(stats.outcomes.items()):
                requests.add_metric([*labels, outcome], count)
            values = [stats.inference_count, stats.execution_count, model.memory_bytes,
                      int(model.ready), model.pending_requests, model.running_batches]
            for family, value in zip(simple, values, strict=True):
                family.add_metric(labels, value)
            for attribute, family in histograms.items():
                hist = getattr(stats, attribute)
                family.add_metric(labels, hist.cumulative(), hist.sum)
            for step, duration in stats.steps.items():
                steps.add_metric([*labels, step], duration.ns * 1e-9)
            if stats.cache_hit.count or stats.cache_miss.count:
                hits.add_metric(labels, stats.cache_hit.count)
                misses.add_metric(labels, stats.cache_miss.count)
        yield from (requests, *simple, steps, hits, misses, *histograms.values())


def library_text(models: Sequence[ModelView]) -> str:
    """The families of `models` as prometheus_client writes them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LibraryReference(models))
    return generate_latest(registry).decode()


def busy_models(count: int, seed: int = 1) -> tuple[list[ModelGauges], ModelStats]:
    """`count` models with a few dozen requests and batches each, and their totals."""
    rng = random.Random(seed)
    totals = ModelStats("_all", "")
    models = []
    for index in range(count):
        stats = ModelStats(f"tenant{index:05d}", "1", totals)
        for _ in range(rng.randint(1, 50)):
            stats.record_request(rng.choice(["success", "success", "INVALID_ARGUMENT"]),
                                 rng.randint(10_000, 10_000_000))
            stats.record_queue(rng.randint(1_000, 1_000_000))
            stats.record_execution(rng.randint(1, 64), 1, 1_000, 20_000, 1_000)
        models.append(ModelGauges(stats, 1_000, 1, 0, 0))
    return models, totals


def _median_ms(render: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        render()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=300)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    models, totals = busy_models(args.models)
    series = ModelSeries(lambda: models, totals, args.top_k)
    shown = series.bounded()
    if series.render() != library_text(shown):
        raise SystemExit("the two renders differ")
    ours = _median_ms(series.render, args.rounds)
    library = _median_ms(lambda: library_text(series.bounded()), args.rounds)
    print(f"{args.models} busy models, {len(shown)} series sets, "
          f"{len(series.render()) / 1e3:.0f} kB; median of {args.rounds} renders")
    print(f"  prometheus_client: {library:7.1f} ms")
    print(f"  serval:            {ours:7.1f} ms  ({library / ours:.1f}x faster, same text)")
    triton = ModelSeries(lambda: models, totals, args.top_k, triton=True)
    both = _median_ms(triton.render, args.rounds)
    print(f"  serval with --triton-metrics (nv_* too): {both:.1f} ms "
          f"({both / ours:.2f}x, {len(triton.render()) / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
