"""One tuning trial: a temporary `serval serve` with one configuration, measured at the SLO.

The model is copied into a temporary repository (version folders linked, not copied) with the
trial's config.yaml, served by a subprocess on free loopback ports, and driven by the loadtest
engine at rising concurrency until p99 passes the SLO.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from serval.loadtest.runner import LoadtestSpec, prepare_requests, run_step
from serval.loadtest.server_process import running
from serval.ports import free_port


@dataclass(frozen=True)
class TrialConfig:
    """The knobs a trial sets; None keeps what the model's own config.yaml says."""

    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    max_batch_size: int | None = None
    max_queue_delay_ms: float | None = None
    instances: int | None = None
    workers: int = 1
    version: str | None = None  # a precision variant (version folder); None: the default

    def describe(self) -> str:
        items = [f"{k}={v}" for k, v in vars(self).items()
                 if v is not None and not (k == "workers" and v == 1)]
        return " ".join(items) or "default"


@dataclass(frozen=True)
class TrialResult:
    """Throughput at the SLO (0 when even one client misses it) and where it was found."""

    config: TrialConfig
    rps_at_slo: float
    p99_ms: float
    concurrency: int
    error: str | None = None


def model_config(base: dict[str, Any], trial: TrialConfig) -> dict[str, Any]:
    """The model's config.yaml with the trial's knobs applied."""
    config = yaml.safe_load(yaml.safe_dump(base)) or {}
    if trial.max_batch_size is not None:
        config["max_batch_size"] = trial.max_batch_size
    if trial.max_queue_delay_ms is not None:
        config.setdefault("batching", {})["max_queue_delay_ms"] = trial.max_queue_delay_ms
    if trial.instances is not None:
        config["instances"] = trial.instances
    for key in ("intra_op_threads", "inter_op_threads"):
        if getattr(trial, key) is not None:
            config.setdefault("onnxruntime", {})[key] = getattr(trial, key)
    if trial.version is not None:
        config["version_policy"] = {"specific": [int(trial.version)]}
    return config


@contextlib.contextmanager
def temporary_server(model_dir: Path, trial: TrialConfig) -> Iterator[str]:
    """Serve the model alone with the trial's config; yields http://127.0.0.1:PORT."""
    base = yaml.safe_load((model_dir / "config.yaml").read_text()) \
        if (model_dir / "config.yaml").exists() else {}
    with tempfile.TemporaryDirectory(prefix="serval-tune-") as tmp:
        target = Path(tmp) / "repo" / model_dir.name
        target.mkdir(parents=True)
        for entry in model_dir.iterdir():
            if entry.name != "config.yaml":
                os.symlink(entry.resolve(), target / entry.name)
        (target / "config.yaml").write_text(yaml.safe_dump(model_config(base, trial)))
        port = free_port()
        # not strict: a model that fails its load fails the trial at its first request,
        # not after the ready wait's timeout
        command = [sys.executable, "-m", "serval", "serve", "--repository", str(target.parent),
                   "--http-port", str(port), "--grpc-port", "0", "--workers",
                   str(trial.workers), "--log-level", "warning", "--no-strict-readiness"]
        if trial.workers > 1:  # a trial measures what the refusal of engine-bound models guesses
            command.append("--force-workers")
        with running(command, port, "/v2/health/ready", Path(tmp) / "server.log"):
            yield f"http://127.0.0.1:{port}"


def run_trial(model_dir: Path, trial: TrialConfig, slo_p99_ms: float,
              concurrency: tuple[int, ...], duration_s: float, warmup_s: float) -> TrialResult:
    """Start the server, ramp the concurrency while p99 meets the SLO, keep the best step."""
    try:
        with temporary_server(model_dir, trial) as url:
            spec = LoadtestSpec(url=url, model=model_dir.name, duration_s=duration_s,
                                warmup_s=warmup_s, timeout_s=max(5.0, slo_p99_ms / 100))
            return _ramp(spec, trial, slo_p99_ms, concurrency)
    except (RuntimeError, ValueError, OSError) as exc:
        return TrialResult(trial, 0.0, 0.0, 0, error=str(exc))


def _ramp(spec: LoadtestSpec, trial: TrialConfig, slo_p99_ms: float,
          concurrency: tuple[int, ...]) -> TrialResult:
    requests = prepare_requests(spec)
    best = TrialResult(trial, 0.0, 0.0, 0)
    for level in concurrency:
        step = run_step(replace(spec, concurrency=(level,)), requests, "closed", float(level))
        if step.failed or step.p99_ms > slo_p99_ms:
            break
        if step.throughput_rps > best.rps_at_slo:
            best = TrialResult(trial, step.throughput_rps, step.p99_ms, level)
    return best
