"""A load test from start to end: requests prepared once, then one step per load level.

Closed-loop steps hold `concurrency` clients busy; open-loop steps send a fixed `rate`. Each step
is a StepResult from the generators (closed_loop, open_loop, grpc_closed_loop, grpc_open_loop);
the whole run becomes one JSON document (`RESULTS_FORMAT`) that report and plan read back
(results.load_results).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from serval.loadtest import workloads
from serval.loadtest.results import RESULTS_FORMAT
from serval.loadtest.stats import StepResult
from serval.protocol.types import TensorSpec

REQUEST_SETS = 16  # distinct pre-encoded requests, sent round-robin
BOUND_SHARE = 0.7  # a step above this share of the generator's ceiling may be limited by it
# the most one run may ask for: far past what one generator machine sends, short of what
# allocates the machine's memory away before the first request (a client, a pending request
# and an encoded row each hold memory)
MAX_CLIENTS = 10_000
MAX_RATE_RPS = 1_000_000.0
MAX_BATCH = 65_536


@dataclass(frozen=True)
class LoadtestSpec:
    """Everything a run needs; built by the CLI from its flags (or by tune)."""

    url: str  # http://host:port (HTTP) or host:port (gRPC)
    model: str
    protocol: str = "http"  # http or grpc
    concurrency: tuple[int, ...] = ()
    rates_rps: tuple[float, ...] = ()
    duration_s: float = 10.0
    warmup_s: float = 2.0
    processes: int = 0  # 0: choose from the load level
    input_file: Path | None = None
    batch: int = 1
    binary: bool = True
    timeout_s: float = 30.0
    hardware: str | None = None
    label: str | None = None
    metadata_url: str | None = None  # HTTP base URL for metadata when testing over gRPC
    honour_retry_after: bool = False  # HTTP closed loop: a 429'd client waits Retry-After

    def __post_init__(self) -> None:
        if any(not 1 <= c <= MAX_CLIENTS for c in self.concurrency):
            raise workloads.WorkloadError(f"concurrency must be 1 to {MAX_CLIENTS:,} clients")
        if any(not 0 < r <= MAX_RATE_RPS for r in self.rates_rps):
            raise workloads.WorkloadError(f"rates must be above 0 and at most "
                                          f"{MAX_RATE_RPS:,.0f} req/s")
        if not 1 <= self.batch <= MAX_BATCH:
            raise workloads.WorkloadError(f"batch must be 1 to {MAX_BATCH:,} rows")

    def host_port(self) -> tuple[str, int]:
        try:
            parts = urlsplit(self.url if "//" in self.url else f"//{self.url}")
            port = parts.port
        except ValueError:  # '[::1', 'host:abc', a port past 65535
            port = None
        if parts.scheme not in ("", "http") or not parts.hostname or not port:
            raise workloads.WorkloadError(f"URL {self.url!r}: expected host:port or "
                                          "http://host:port")
        return parts.hostname, port

    def levels(self) -> list[tuple[str, float]]:
        """(mode, level) per step: closed-loop concurrencies first, then open-loop rates."""
        return ([("closed", float(c)) for c in self.concurrency]
                + [("open", r) for r in self.rates_rps])


def prepare_requests(spec: LoadtestSpec) -> list[bytes]:
    """The pre-encoded requests: from the sample file, else generated from the metadata."""
    host, _ = spec.host_port()
    if spec.input_file is not None:
        feeds = workloads.sample_feeds(spec.input_file)
    else:
        feeds = workloads.generated_feeds(model_inputs(spec), spec.batch, REQUEST_SETS)
    if spec.protocol == "grpc":
        return workloads.grpc_requests(spec.model, feeds)
    return workloads.http_requests(spec.model, feeds, spec.binary, host)


def model_inputs(spec: LoadtestSpec) -> list[TensorSpec]:
    """The model's inputs: over HTTP (the URL, or --metadata-url), or over gRPC itself."""
    host, port = spec.host_port()
    if spec.protocol == "grpc" and spec.metadata_url is None:
        from serval.loadtest.probe import grpc_model_inputs

        return grpc_model_inputs(host, port, spec.model, spec.timeout_s)
    return workloads.model_inputs(spec.metadata_url or f"http://{host}:{port}", spec.model)


def auto_processes(spec: LoadtestSpec, mode: str, level: float) -> int:
    """Generator processes: as asked, else one per 128 clients or 8,000 req/s, up to the CPUs.

    On two cores or fewer one process outruns two (it shares the cores with the server).
    """
    if spec.processes > 0:
        return spec.processes
    if (os.cpu_count() or 1) <= 2:
        return 1
    per_process = level / 128 if mode == "closed" else level / 8000
    return max(1, min(os.cpu_count() or 1, int(per_process + 0.999)))


def run_step(spec: LoadtestSpec, requests: list[bytes], mode: str, level: float) -> StepResult:
    """One load level with the generator for this protocol and mode."""
    host, port = spec.host_port()
    processes = auto_processes(spec, mode, level)
    args = (spec.duration_s, spec.warmup_s, processes)
    if spec.protocol == "grpc":
        if mode == "closed":
            from serval.loadtest.grpc_closed_loop import run_grpc_closed_loop

            return run_grpc_closed_loop(f"{host}:{port}", requests, int(level), *args)
        from serval.loadtest.grpc_open_loop import run_grpc_open_loop

        return run_grpc_open_loop(f"{host}:{port}", requests, level, *args, spec.timeout_s)
    if mode == "closed":
        from serval.loadtest.closed_loop import run_closed_loop

        return run_closed_loop(host, port, requests, int(level), *args, spec.timeout_s,
                               honour_retry_after=spec.honour_retry_after)
    from serval.loadtest.open_loop import run_open_loop

    return run_open_loop(host, port, requests, level, *args, spec.timeout_s)


def step_json(mode: str, result: StepResult, ceiling_rps: float | None) -> dict[str, Any]:
    """One step as the results file stores it."""
    bound = bool(ceiling_rps and result.throughput_rps >= BOUND_SHARE * ceiling_rps)
    return {"mode": mode,
            "concurrency": result.concurrency if mode == "closed" else None,
            "offered_rps": result.offered_rps if mode == "open" else None,
            "requests": result.requests, "answered": result.answered,
            "throughput_rps": result.throughput_rps,
            "p50_ms": result.p50_ms, "p90_ms": result.p90_ms, "p99_ms": result.p99_ms,
            "p999_ms": result.p999_ms, "mean_ms": result.mean_ms, "errors": result.errors,
            "cdf_ms": result.cdf_ms, "generator_bound": bound}


def run_loadtest(spec: LoadtestSpec, ceiling_rps: float | None = None,
                 on_step: Callable[[str, float, dict[str, Any]], None] | None = None,
                 before_step: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    """Every step of the spec in order; the results document."""
    requests = prepare_requests(spec)
    from serval.loadtest.probe import check_first_request

    first = check_first_request(spec.protocol, *spec.host_port(), requests[0], spec.timeout_s)
    steps = []
    for mode, level in spec.levels():
        if before_step is not None:
            before_step(mode, level)
        step = step_json(mode, run_step(spec, requests, mode, level), ceiling_rps)
        steps.append(step)
        if on_step is not None:
            on_step(mode, level, step)
    info = {k: v for k, v in asdict(spec).items() if k not in ("concurrency", "rates_rps")}
    info["input_file"] = str(spec.input_file) if spec.input_file else None
    return {"format": RESULTS_FORMAT, **info,
            "label": spec.label or default_label(spec),
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "generator_ceiling_rps": ceiling_rps, "first_request": first.as_dict(),
            "steps": steps}


def default_label(spec: LoadtestSpec) -> str:
    """A run's name in reports without --label: its model and protocol, and its hardware tag
    when it has one (several models measured on one machine must not share a name)."""
    base = f"{spec.model} ({spec.protocol})"
    return f"{base} on {spec.hardware}" if spec.hardware else base

