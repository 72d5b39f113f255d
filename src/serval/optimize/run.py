"""The `serval optimize` pipeline: convert, optimize the graph, quantize, verify parity against
the original, measure before and after, write the report, and publish only if parity holds."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serval.errors import ConfigError
from serval.optimize import convert, graph, measure, parity, quantize, report, samples, search
from serval.optimize.samples import DEFAULT_SEQUENCE, Feeds, InputSpec

PARITY_CHUNK = 256
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Request:
    """Everything the command line can ask for."""

    source: str
    out: Path
    inputs: list[convert.TensorArg] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    optimize_graph: bool = False
    transformer: bool | None = None
    num_heads: int = 0
    hidden_size: int = 0
    quantize: quantize.QuantizeOptions | None = None
    calibration: Path | None = None
    samples: Path | None = None
    text_tokenizer: Path | None = None
    parity_items: int = 256
    sequence: int = DEFAULT_SEQUENCE
    thresholds: parity.Thresholds = field(default_factory=parity.Thresholds)
    measure: bool = True
    measure_duration_s: float = 2.0
    threads: int | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """The written model and report, and whether parity held."""

    model: Path
    report: dict[str, Any]
    passed: bool


def run(request: Request, progress: Progress = lambda _: None) -> Outcome:
    """Run every requested step; outputs land in request.out (a folder it made is removed
    again when the source cannot be converted)."""
    made = not request.out.exists()
    request.out.mkdir(parents=True, exist_ok=True)
    try:
        return _run(request, progress)
    except ConfigError:
        if made and not any(request.out.iterdir()):
            request.out.rmdir()
        raise


def _run(request: Request, progress: Progress) -> Outcome:
    steps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=".serval-optimize-", dir=request.out) as work_dir:
        work = Path(work_dir)
        progress("converting")
        converted = convert.convert(request.source, work / "converted.onnx", request.inputs,
                                    request.output_names)
        steps.append({"step": "convert", "from": converted.kind,
                      "bytes": converted.path.stat().st_size})
        specs = samples.input_specs(converted.path)
        current = converted.path
        if request.optimize_graph:
            progress("optimizing the graph")
            result = graph.optimize_graph(current, work / "graph.onnx",
                                          transformer=request.transformer,
                                          num_heads=request.num_heads,
                                          hidden_size=request.hidden_size)
            steps.append({"step": "optimize-graph", **asdict(result)})
            current = work / "graph.onnx"
        feeds, inputs_kind = _parity_inputs(request, specs)
        checked: parity.ParityResult | None = None  # int8-auto verified its choice already
        calibration, calibration_kind = _calibration(request, specs)
        if request.quantize and request.quantize.mode == search.AUTO:
            progress("quantizing (int8-auto: trying recipes)")
            chosen, trials = search.search(
                current, work, request.quantize,
                lambda path: _verify(converted.reference, path, feeds, request.thresholds),
                lambda paths: measure.interleaved_throughput(paths, feeds,
                                                             threads=request.threads),
                calibration)
            steps.append({"step": "quantize", **asdict(chosen.result), "mode": search.AUTO,
                          "recipe": chosen.candidate.name,
                          "calibration": calibration_kind
                          or "none: no smoothed or static recipes",
                          "search": [trial.as_dict() for trial in trials]})
            current, checked = chosen.path, chosen.parity
        elif request.quantize:
            progress(f"quantizing ({request.quantize.mode})")
            quantized = quantize.quantize(current, work / "quantized.onnx", request.quantize,
                                          calibration)
            steps.append({"step": "quantize", **asdict(quantized),
                          "calibration": calibration_kind if calibration else ""})
            current = work / "quantized.onnx"
        final = request.out / "model.onnx"
        shutil.copyfile(current, final)
        if checked is None:
            progress("verifying parity")
            checked = _verify(converted.reference, final, feeds, request.thresholds)
        cost = _measure(request, converted.path, final, feeds, progress)
    doc = {
        "source": request.source, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                              time.gmtime()),
        "model": str(final), "steps": steps,
        "parity": {"reference": converted.reference_name,
                   "inputs": {"kind": inputs_kind, "items": samples.rows(feeds)},
                   **checked.to_dict()},
        "measure": cost,
    }
    report.write(doc, request.out)
    return Outcome(final, doc, checked.passed)


def _calibration(request: Request, specs: list[InputSpec]) -> tuple[Feeds | None, str]:
    """Static INT8 and smoothing read real data: the user's, or the shipped sentences' odd
    lines (parity checks every line)."""
    wanted = request.quantize is not None and (
        request.quantize.mode in ("int8-static", search.AUTO)
        or request.quantize.smooth is not None)
    if not wanted:
        return None, ""
    if request.calibration:
        return samples.load_samples(request.calibration, specs), str(request.calibration)
    if request.text_tokenizer:
        texts = samples.sentences()[1::2]  # odd lines; parity uses every line
        return (samples.sentence_inputs(request.text_tokenizer, specs, texts, request.sequence),
                f"{len(texts)} shipped sentences")
    return None, ""


def _parity_inputs(request: Request, specs: list[InputSpec]) -> tuple[Feeds, str]:
    if request.samples:
        return samples.load_samples(request.samples, specs), str(request.samples)
    if request.text_tokenizer:
        texts = samples.sentences()
        return (samples.sentence_inputs(request.text_tokenizer, specs, texts, request.sequence),
                "shipped sentences")
    feeds = samples.random_inputs(specs, request.parity_items, request.seed + 1,
                                  request.sequence)
    return feeds, "random valid inputs from the model's metadata"


def _verify(reference: convert.Reference, model: Path, feeds: Feeds,
            thresholds: parity.Thresholds) -> parity.ParityResult:
    session: Any = measure.serving_session(model, threads=0)
    names = [o.name for o in session.get_outputs()]
    want: dict[str, list[np.ndarray]] = {}
    got: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for start in range(0, samples.rows(feeds), PARITY_CHUNK):
        chunk = samples.take(feeds, slice(start, start + PARITY_CHUNK))
        for name, value in reference(chunk).items():
            want.setdefault(name, []).append(np.asarray(value))
        for name, value in zip(names, session.run(names, chunk), strict=True):
            got[name].append(value)
    return parity.compare({k: np.concatenate(v) for k, v in want.items()},
                          {k: np.concatenate(v) for k, v in got.items()}, thresholds)


def _measure(request: Request, before: Path, after: Path, feeds: Feeds,
             progress: Progress) -> dict[str, Any]:
    if not request.measure:
        return {}
    progress("measuring before and after")
    kwargs = {"duration_s": request.measure_duration_s, "threads": request.threads}
    return {"before": asdict(measure.measure(before, feeds, **kwargs)),  # type: ignore[arg-type]
            "after": asdict(measure.measure(after, feeds, **kwargs))}  # type: ignore[arg-type]
