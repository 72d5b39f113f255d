"""`serval loadtest URL --model M`: closed-loop and open-loop load against any KServe v2 server."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from serval.cli.address import address
from serval.cli.command import fail
from serval.cli.duration import seconds
from serval.cli.tables import FORMAT, Cell, Column, OutputFormat, Rows, cell, emit
from serval.loadtest.runner import (
    MAX_BATCH,
    MAX_CLIENTS,
    MAX_RATE_RPS,
    LoadtestSpec,
    run_loadtest,
)
from serval.loadtest.workloads import WorkloadError


def parse_numbers(text: str, flag: str, allow_zero: bool = False,
                  maximum: float | None = None, whole: bool = False) -> list[float]:
    """'1,16,64' -> [1.0, 16.0, 64.0]; a one-line error naming the flag otherwise (also for
    inf, nan, a number past MAXIMUM, a fraction where WHOLE numbers are counts)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fail(f"{flag} {text!r}: expected comma-separated numbers, e.g. 1,16,64")
    if not values or any(not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero)
                         for v in values):
        fail(f"{flag} {text!r}: expected {'non-negative' if allow_zero else 'positive'} "
             "numbers")
    if whole and any(v != int(v) for v in values):
        fail(f"{flag} {text!r}: expected whole numbers")
    if maximum is not None and any(v > maximum for v in values):
        fail(f"{flag} {text!r}: at most {maximum:,.0f} (the most one run sends)")
    return values


def loadtest_command(
    url: str = typer.Argument(..., parser=address, metavar="URL",
                              help="http://host:port (HTTP) or host:port (with --grpc)."),
    model: str = typer.Option(..., "--model", "-m", help="Model to load."),
    grpc: bool = typer.Option(False, "--grpc", help="Use the v2 gRPC API instead of HTTP."),
    concurrency: str = typer.Option(None, "--concurrency", "-c",
                                    help="Closed-loop sweep, e.g. 1,16,64,256,400."),
    rate: str = typer.Option(None, "--rate", "-r", help="Open-loop rates (req/s), e.g. 100,200."),
    duration_s: float = typer.Option("10s", "--duration", parser=seconds, metavar="DURATION",
                                      help="Measured time per step, e.g. 30s, 2m."),
    warmup_s: float = typer.Option("2s", "--warmup", parser=seconds, metavar="DURATION",
                                    help="Unmeasured time before each step."),
    input_file: Path = typer.Option(None, "--input-file",
                                    help="A v2 JSON request (or a list of them) to send."),
    batch: int = typer.Option(1, "--batch", min=1, max=MAX_BATCH,
                              help="Rows per generated request."),
    json_body: bool = typer.Option(False, "--json", help="JSON tensors (default: binary)."),
    processes: int = typer.Option(0, "--processes", min=0, max=256,
                                  help="Generator processes; 0: auto."),
    timeout_s: float = typer.Option("30s", "--timeout", parser=seconds, metavar="DURATION",
                                     help="Per-request timeout."),
    metadata_url: str = typer.Option(None, "--metadata-url", parser=address,
                                     help="HTTP base URL for the model's metadata with --grpc "
                                          "(default: ask the gRPC port)."),
    hardware: str = typer.Option(None, "--hardware", help="Tag results with a catalog name."),
    label: str = typer.Option(None, "--label", help="Name of this run in reports."),
    ceiling: bool = typer.Option(True, "--ceiling/--no-ceiling",
                                 help="Measure the generator's own ceiling first."),
    output: Path = typer.Option(None, "--output", "-o", help="Write results as JSON here."),
    output_format: OutputFormat = FORMAT,
    honour_retry_after: bool = typer.Option(
        False, "--honour-retry-after",
        help="HTTP closed loop: a client answered 429 waits its Retry-After before sending "
             "again (default: at once, a retry storm)."),
) -> None:
    """Measure throughput and latency (p50/p90/p99/p99.9) at each load level."""
    levels = (parse_numbers(concurrency, "--concurrency", maximum=MAX_CLIENTS, whole=True)
              if concurrency else [])
    rates = parse_numbers(rate, "--rate", maximum=MAX_RATE_RPS) if rate else []
    if not levels and not rates:
        levels = [1.0, 16.0, 64.0]
    if duration_s <= 0 or warmup_s < 0 or timeout_s <= 0:
        fail("--duration and --timeout must be > 0, --warmup >= 0")
    try:
        spec = LoadtestSpec(url=url, model=model, protocol="grpc" if grpc else "http",
                            concurrency=tuple(int(c) for c in levels), rates_rps=tuple(rates),
                            duration_s=duration_s, warmup_s=warmup_s, processes=processes,
                            input_file=input_file, batch=batch, binary=not json_body,
                            timeout_s=timeout_s, hardware=hardware, label=label,
                            metadata_url=metadata_url, honour_retry_after=honour_retry_after)
    except WorkloadError as exc:
        fail(str(exc))
    console = Console(stderr=output_format is not OutputFormat.table)
    results = _run(spec, console, ceiling)
    emit(results_rows(results), output_format, console)
    _print_verdicts(console, results)
    if output is not None:
        output.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
        console.print(f"results written to {output}")
    _fail_without_answers(results)


def _fail_without_answers(results: dict[str, Any]) -> None:
    """Exit non-zero when no request of the whole run was answered with success (a CI job
    must not pass on a test that measured only errors)."""
    if any(step["answered"] for step in results["steps"]):
        return
    errors: dict[str, int] = {}
    for step in results["steps"]:
        for kind, count in step["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    seen = ", ".join(f"{kind} x{count}" for kind, count in sorted(errors.items())) or "none"
    first = results.get("first_request") or {}
    said = f"; the first answer was {first['status']}: {first['reason']}" if first.get(
        "reason") else ""
    fail(f"no request succeeded (errors: {seen}){said}")


def _run(spec: LoadtestSpec, console: Console, ceiling: bool) -> dict[str, Any]:
    ceiling_rps = None
    try:
        spec.host_port()
        if ceiling and spec.protocol == "http":
            from serval.loadtest.ceiling import measure_ceiling

            with console.status("measuring the generator's ceiling (trivial endpoint)..."):
                ceiling_rps = measure_ceiling(processes=max(1, spec.processes))
            console.print(f"generator ceiling: {ceiling_rps:,.0f} req/s against a trivial "
                          "endpoint on this machine")
        with _progress(console, spec) as (before, after):
            return run_loadtest(spec, ceiling_rps, on_step=after, before_step=before)
    except WorkloadError as exc:
        fail(str(exc))


@contextmanager
def _progress(console: Console, spec: LoadtestSpec) -> Iterator[Any]:
    """A live bar per step that fills with wall time, a line per finished step."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                        console=console, transient=False)
    total_s = spec.warmup_s + spec.duration_s
    ticking: dict[str, Any] = {}

    def tick(task: Any, started: float, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            progress.update(task, completed=min(total_s, time.monotonic() - started))

    def before(mode: str, level: float) -> None:
        what = f"concurrency {level:g}" if mode == "closed" else f"rate {level:g}/s"
        task = progress.add_task(f"{spec.model} {what}", total=total_s, note="running")
        stop = threading.Event()
        thread = threading.Thread(target=tick, args=(task, time.monotonic(), stop), daemon=True)
        thread.start()
        ticking.update(task=task, stop=stop, thread=thread)

    def after(mode: str, level: float, step: dict[str, Any]) -> None:
        ticking["stop"].set()
        ticking["thread"].join()
        errors = sum(step["errors"].values())
        progress.update(ticking["task"], completed=total_s,
                        note=f"{step['throughput_rps']:,.0f} req/s  p99 "
                             f"{step['p99_ms']:.2f} ms  errors {errors}")

    with progress:
        yield before, after


def _title(results: dict[str, Any]) -> str:
    """The run's label and where it ran; the model and protocol once (the default label holds
    them already)."""
    label, model = results["label"], results["model"]
    named = label if model in label else f"{label}: {model} ({results['protocol']})"
    return f"{named} at {results['url']}"


def results_rows(results: dict[str, Any]) -> Rows:
    """One row per step: offered load, requests, throughput, latency percentiles, errors."""
    rows = Rows([Column("load", "load"), Column("requests", "requests", True),
                 Column("throughput_rps", "req/s", True), Column("p50_ms", "p50 ms", True),
                 Column("p90_ms", "p90 ms", True), Column("p99_ms", "p99 ms", True),
                 Column("p999_ms", "p99.9 ms", True), Column("errors", "errors")],
                title=_title(results))
    for step in results["steps"]:
        load = (f"c={step['concurrency']}" if step["mode"] == "closed"
                else f"{step['offered_rps']:g}/s")
        errors = ", ".join(f"{k} {v}" for k, v in step["errors"].items()) or "0"
        rows.add(cell(load), cell(step["requests"], "{:,}"),
                 cell(step["throughput_rps"], "{:,.1f}"), cell(step["p50_ms"], "{:.2f}"),
                 cell(step["p90_ms"], "{:.2f}"), cell(step["p99_ms"], "{:.2f}"),
                 cell(step["p999_ms"], "{:.2f}"), Cell(step["errors"], errors))
    return rows


def _print_verdicts(console: Console, results: dict[str, Any]) -> None:
    """Say where the generator itself, or the server on an open-loop step, is the limit."""
    ceiling_rps = results.get("generator_ceiling_rps")
    for step in results["steps"]:
        if step["generator_bound"]:
            console.print(f"[yellow]warning[/]: {step['throughput_rps']:,.0f} req/s is "
                          f"{step['throughput_rps'] / ceiling_rps:.0%} of the generator's "
                          f"ceiling ({ceiling_rps:,.0f}): the generator may be the bottleneck")
        offered = step["offered_rps"]
        if offered and step["throughput_rps"] < 0.98 * offered:
            console.print(f"rate {offered:g}/s: achieved {step['throughput_rps']:,.1f} req/s "
                          f"({step['throughput_rps'] / offered:.1%}): the server did not keep up")
    if ceiling_rps:
        best = max((s["throughput_rps"] for s in results["steps"]), default=0.0)
        console.print(f"generator ceiling {ceiling_rps:,.0f} req/s = "
                      f"{ceiling_rps / max(best, 1e-9):.1f}x the best step's throughput")
