"""`serval optimize`: convert, optimize, quantize, verify parity, measure, report, publish."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from serval.cli.command import fail
from serval.errors import ConfigError

# quantize.MODES and search.AUTO, without importing onnx here
MODES = ("int8-auto", "int8-dynamic", "int8-static", "fp16")
SOURCE_HELP = ("A .onnx file, a TorchScript file (.pt), a pickled scikit-learn model (.pkl, "
               ".joblib) or module:factory returning a torch nn.Module.")


def optimize_command(
    source: str = typer.Argument(..., help=SOURCE_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for model.onnx and report.*"),
    inputs: list[str] = typer.Option([], "--input", help="torch/sklearn input NAME:DTYPE:DIM..."
                                     " (dims without the batch axis), once per input."),
    output_names: list[str] = typer.Option([], "--output-name", help="torch output names."),
    optimize_graph: bool = typer.Option(False, "--optimize-graph",
                                        help="Offline graph optimization (transformer fusions "
                                             "for BERT-like models)."),
    num_heads: int = typer.Option(0, help="Attention heads (default: read from the graph)."),
    hidden_size: int = typer.Option(0, help="Hidden size (default: read from the graph)."),
    quantize: str = typer.Option(None, "--quantize", help="int8-auto (the fastest INT8 recipe "
                                 "that passes the gate) | int8-dynamic | int8-static | fp16"),
    per_channel: bool = typer.Option(True, help="INT8 weights with one scale per output "
                                     "channel (default); --no-per-channel: one per tensor."),
    exclude_nodes: list[str] = typer.Option([], "--exclude-node",
                                            help="Keep this node in full precision."),
    exclude_ops: list[str] = typer.Option([], "--exclude-op",
                                          help="Keep every node of this op type (e.g. Softmax) "
                                               "in full precision."),
    smooth: float = typer.Option(None, "--smooth", metavar="ALPHA",
                                 help="INT8: move activation outliers into the weights first "
                                      "(SmoothQuant) at this strength, between 0 and 1 (e.g. "
                                      "0.7); reads calibration data. int8-auto tries 0.5-0.8."),
    keep_io_types: bool = typer.Option(True, help="FP16: keep FP32 inputs and outputs."),
    calibration: Path = typer.Option(None, help="Calibration data for int8-static and "
                                     "smoothing: .npz or a folder."),
    samples: Path = typer.Option(None, help="Parity inputs: .npz or a folder of .npz."),
    text_tokenizer: Path = typer.Option(None, help="tokenizer.json: use the shipped sentences "
                                                   "for calibration and parity."),
    parity_items: int = typer.Option(256, help="Random parity inputs when no samples given."),
    sequence: int = typer.Option(32, help="Length of free (non-batch) axes in generated inputs."),
    min_cosine: float = typer.Option(0.99, help="Parity gate: mean cosine per output row."),
    worst_cosine: float = typer.Option(None, help="Parity gate: the lowest row's cosine."),
    min_top1: float = typer.Option(0.99, help="Parity gate: top-1 agreement (classifiers)."),
    max_abs: float = typer.Option(None, help="Parity gate: max absolute error."),
    max_sum_error: float = typer.Option(0.01, help="Parity gate: probability rows sum to 1."),
    measure: bool = typer.Option(True, help="Measure size, latency and throughput."),
    publish: Path = typer.Option(None, "--publish", help="Publish to this model repository."),
    model: str = typer.Option(None, "--model", "-m", help="Model name to publish as."),
    note: str = typer.Option("", help="Stored in the published manifest."),
) -> None:
    """Make a model cheaper and prove it still answers the same; publish only if it does."""
    if publish is not None and not model:
        fail("--publish needs --model NAME")
    if quantize is not None and quantize not in MODES:
        fail(f"--quantize {quantize!r}: expected one of {', '.join(MODES)}")
    try:
        from serval.optimize import convert, parity, run
        from serval.optimize import quantize as quant
        from serval.optimize import report as report_module
        from serval.optimize import smooth as smoothing
        from serval.repository import store

        if smooth is not None:
            smoothing.check(smooth, quantize)

        request = run.Request(
            source=source, out=out, inputs=[convert.parse_input(i) for i in inputs],
            output_names=output_names, optimize_graph=optimize_graph, num_heads=num_heads,
            hidden_size=hidden_size,
            quantize=quant.QuantizeOptions(quantize, per_channel, tuple(exclude_nodes),
                                           tuple(exclude_ops), keep_io_types, smooth=smooth)
            if quantize else None,
            calibration=calibration, samples=samples, text_tokenizer=text_tokenizer,
            parity_items=parity_items, sequence=sequence,
            thresholds=parity.Thresholds(min_cosine, min_top1, max_abs, max_sum_error,
                                         worst_cosine),
            measure=measure)
        console = Console(stderr=True)
        with console.status("serval optimize") as status:
            outcome = run.run(request, lambda step: status.update(f"serval optimize: {step}"))
        typer.echo(report_module.markdown(outcome.report))
        if not outcome.passed:
            fail(f"parity failed, nothing published: {outcome.report['parity']['failures'][0]}",
                  code=1)
        if publish is not None:
            version = store.publish(outcome.model, publish, model, report=outcome.report,
                                    note=note or f"serval optimize {source}")
            typer.echo(f"published {model} version {version} (report in its manifest.json)")
    except ConfigError as exc:
        fail(str(exc))
