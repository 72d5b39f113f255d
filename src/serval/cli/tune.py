"""`serval tune --repository DIR --model M --slo-p99-ms X`: search the model's serving config."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from serval.cli.command import fail
from serval.cli.duration import milliseconds, seconds
from serval.cli.loadtest import parse_numbers
from serval.config import MAX_WORKERS
from serval.loadtest.runner import MAX_CLIENTS
from serval.model_config import MAX_THREADS

if TYPE_CHECKING:
    from serval.planner.tuner import Search, SearchSpace


MAX_INSTANCES = 64  # config.yaml's bound (model_config.ModelConfig.instances)
# what serve and config.yaml accept (a trial beyond them only fails)
BOUNDS = {"--threads": (0, MAX_THREADS), "--inter-op-threads": (0, MAX_THREADS),
          "--instances": (1, MAX_INSTANCES), "--workers": (1, MAX_WORKERS),
          "--concurrency": (1, MAX_CLIENTS)}


def _knob(text: str, flag: str, configured: Any, cast: type = int) -> tuple[Any, ...]:
    """Configured value first (None: the model's own default), then the other candidates."""
    values = [cast(v) for v in _numbers(text, flag)] if text else []
    return (configured, *[v for v in dict.fromkeys(values) if v != configured])


def _numbers(text: str, flag: str) -> list[float]:
    """A flag's comma-separated values, each within what serving it accepts (one line if not)."""
    bounds = BOUNDS.get(flag)
    values = parse_numbers(text, flag, allow_zero=True, whole=bounds is not None)
    if bounds is not None and any(not bounds[0] <= v <= bounds[1] for v in values):
        fail(f"{flag} {text!r}: expected {bounds[0]} to {bounds[1]:,}")
    return values


def tune_command(
    repository: Path = typer.Option(..., "--repository", "-r", help="Model repository."),
    model: str = typer.Option(..., "--model", "-m", help="Model to tune."),
    slo_p99_ms: float = typer.Option(..., "--slo-p99-ms", parser=milliseconds,
                                      metavar="DURATION",
                                      help="Latency target: p99 (a bare number is ms)."),
    budget_s: float = typer.Option("10m", "--budget", parser=seconds, metavar="DURATION",
                                    help="Time for the search, e.g. 90s, 10m."),
    threads: str = typer.Option("1,2", "--threads", help="ONNX Runtime intra-op threads."),
    inter_op: str = typer.Option("", "--inter-op-threads", help="Inter-op threads to try."),
    max_batch: str = typer.Option("1,8,32,128", "--max-batch", help="max_batch_size values."),
    delay: str = typer.Option("0,2,5", "--queue-delay-ms", help="Batch queue delays (ms)."),
    instances: str = typer.Option("1,2", "--instances", help="Model instances."),
    workers: str = typer.Option("1,2", "--workers", help="Server worker processes."),
    concurrency: str = typer.Option("1,4,16,64", "--concurrency",
                                    help="Clients ramped in each trial until p99 > SLO."),
    trial_duration_s: float = typer.Option("3s", "--trial-duration", parser=seconds,
                                            metavar="DURATION", help="Time per step."),
    trial_warmup_s: float = typer.Option("1s", "--trial-warmup", parser=seconds,
                                          metavar="DURATION", help="Warm-up per step."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the best config; write none."),
) -> None:
    """Start temporary servers, search the configuration, write the best config.yaml."""
    from serval.planner.trial import TrialConfig, TrialResult, model_config, run_trial
    from serval.planner.tuner import Search, SearchSpace, tune, verdict
    from serval.repository.store import is_version_name

    if not 0 < slo_p99_ms < math.inf:
        fail(f"--slo-p99-ms {slo_p99_ms:g}: expected a latency above 0")
    for flag, text in (("--threads", threads), ("--inter-op-threads", inter_op),
                       ("--max-batch", max_batch), ("--queue-delay-ms", delay),
                       ("--instances", instances), ("--workers", workers),
                       ("--concurrency", concurrency)):
        if text:
            _numbers(text, flag)  # every flag checked before the model is read
    model_dir = repository / model
    if not model_dir.is_dir():
        fail(f"model folder '{model_dir}' does not exist")
    config_path = model_dir / "config.yaml"
    try:
        base = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    except yaml.YAMLError as exc:
        fail(f"{config_path}: not valid YAML: {exc}")
    base = base or {}
    ort, batching = base.get("onnxruntime", {}), base.get("batching", {})
    versions = sorted((p.name for p in model_dir.iterdir()
                       if p.is_dir() and is_version_name(p.name)), key=int)
    space = SearchSpace({
        "intra_op_threads": _knob(threads, "--threads", ort.get("intra_op_threads")),
        "inter_op_threads": _knob(inter_op, "--inter-op-threads", ort.get("inter_op_threads")),
        "max_batch_size": _knob(max_batch, "--max-batch", base.get("max_batch_size")),
        "max_queue_delay_ms": _knob(delay, "--queue-delay-ms",
                                    float(batching.get("max_queue_delay_ms", 0.0)), float),
        "instances": _knob(instances, "--instances", base.get("instances", 1)),
        "workers": _knob(workers, "--workers", 1),
        "version": (None, *versions[:-1]),  # other version folders: precision variants
    })
    levels = tuple(int(c) for c in _numbers(concurrency, "--concurrency"))
    console = Console()

    def measure(config: TrialConfig) -> TrialResult:
        return run_trial(model_dir, config, slo_p99_ms, levels, trial_duration_s,
                         trial_warmup_s)

    def show(phase: str, result: TrialResult) -> None:
        number = len(search.trials)
        what = (f"[red]failed: {result.error}[/]" if result.error else
                f"{result.rps_at_slo:9,.1f} req/s at SLO (c={result.concurrency}, "
                f"p99 {result.p99_ms:.2f} ms)" if result.rps_at_slo else "SLO not met")
        console.print(f"trial {number:2d} {escape(f'[{phase}]'):10s} "
                      f"{escape(result.config.describe()):60s} {what}")

    search = Search(measure, budget_s, show)
    console.print(f"tuning {model} for p99 <= {slo_p99_ms:g} ms within {budget_s:g} s")
    default, best = tune(space, search)
    if best.rps_at_slo <= 0:
        _say_if_cut_short(console, space, search, budget_s)
        fail(_none_met(search, slo_p99_ms), code=1)
    console.print(verdict(default, best))
    partial = _say_if_cut_short(console, space, search, budget_s)
    unwritten = "dry run" if dry_run else "the search was cut short" if partial else None
    _finish(console, config_path, model_config(base, best.config), best.config.workers,
            unwritten)


def _none_met(search: Search, slo_p99_ms: float) -> str:
    """Why no configuration came out: every trial failed (the first one's reason, a load
    error when the model cannot load), or none met the SLO."""
    errors = [r.error for r in search.trials.values() if r.error]
    if len(search.trials) == 1 and errors:
        return f"the model failed as configured, so nothing else was tried: {errors[0]}"
    if len(errors) == len(search.trials):
        return f"every trial failed, no config.yaml: {errors[0]}"
    return (f"no configuration met p99 <= {slo_p99_ms:g} ms, even at the lowest concurrency; "
            "no config.yaml (try a looser --slo-p99-ms)")


def _say_if_cut_short(console: Console, space: SearchSpace, search: Search,
                      budget_s: float) -> bool:
    """Say when the budget ended the search early; True when it ended before every knob was
    tried (then nothing is written: the result would claim more than was searched)."""
    from serval.planner.tuner import untried

    if search.cut_in is None:
        return False
    never = untried(space, search)
    if not never:
        console.print(f"[yellow]note[/]: the {budget_s:g} s budget ended the hill-climb after "
                      f"{len(search.trials)} trials; every knob was swept")
        return False
    console.print(f"[yellow]warning[/]: the {budget_s:g} s budget ran out after "
                  f"{len(search.trials)} trials, before {', '.join(never)} were tried; not "
                  "written (give a longer --budget, or fix those knobs with their flags)")
    return True


def _finish(console: Console, path: Path, config: dict[str, Any], workers: int,
            unwritten: str | None) -> None:
    """Print the best config; write it unless `unwritten` says why not."""
    text = yaml.safe_dump(config, sort_keys=False)
    console.print(f"best config.yaml{f' ({unwritten}, not written)' if unwritten else ''}:"
                  f"\n{text}")
    if workers > 1:
        console.print(f"serve it with --workers {workers}")
    if unwritten is None:
        if path.exists():
            path.with_suffix(".yaml.bak").write_text(path.read_text())
        path.write_text(text)
        console.print(f"written to {path}" + (" (previous in config.yaml.bak)"
                                                if path.with_suffix(".yaml.bak").exists()
                                                else ""))
