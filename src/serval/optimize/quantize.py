"""Step 3: INT8 dynamic, INT8 static (QDQ, calibrated, per-channel), or FP16, with named nodes
(or every node of named op types, e.g. the final Softmax) kept in full precision; INT8 after
activation smoothing (`smooth.py`) when asked."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serval.errors import ConfigError
from serval.optimize import smooth
from serval.optimize.deps import require
from serval.optimize.samples import Feeds, rows, take

MODES = ("int8-dynamic", "int8-static", "fp16")
CALIBRATION_BATCH = 8


@dataclass(frozen=True, slots=True)
class QuantizeOptions:
    """How to quantize: mode, per-channel weights, nodes/op types to keep, FP16 IO types."""

    mode: str
    per_channel: bool = True  # per-tensor INT8 cost MiniLM 0.03 of cosine on the sentences
    exclude_nodes: tuple[str, ...] = ()
    exclude_ops: tuple[str, ...] = ()
    keep_io_types: bool = True
    reduce_range: bool = False
    smooth: float | None = None  # activation smoothing's alpha (INT8 only; needs calibration)


@dataclass(frozen=True, slots=True)
class QuantizeResult:
    """What was done: mode, format, nodes kept in full precision, calibration items."""

    mode: str
    format: str
    excluded_nodes: tuple[str, ...]
    calibration_items: int
    smoothing: str = ""


def quantize(source: Path, out: Path, options: QuantizeOptions,
             calibration: Feeds | None = None) -> QuantizeResult:
    """Write the quantized model to out."""
    if options.mode not in MODES:
        raise ConfigError(f"--quantize {options.mode!r}: expected one of {', '.join(MODES)}")
    onnx = require("onnx")
    model = onnx.load(str(source))
    excluded = _excluded(model, options)
    if options.smooth is None:
        return _quiet(source, out, options, excluded, model, calibration)
    smooth.check(options.smooth, options.mode)
    smoothed = out.with_name(f"{out.stem}.smoothed.onnx")
    try:
        done = smooth.smooth(source, smoothed, calibration, options.smooth, excluded)
        result = _quiet(smoothed, out, options, excluded, model, calibration)
    finally:
        smoothed.unlink(missing_ok=True)
    return replace(result, smoothing=done.describe(), calibration_items=done.calibration_items)


def _quiet(source: Path, out: Path, options: QuantizeOptions, excluded: tuple[str, ...],
           model: Any, calibration: Feeds | None) -> QuantizeResult:
    root = logging.getLogger()  # the quantizer warns through the root logger
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        return _quantize(source, out, options, excluded, model, calibration)
    finally:
        root.setLevel(level)


def _quantize(source: Path, out: Path, options: QuantizeOptions, excluded: tuple[str, ...],
              model: Any, calibration: Feeds | None) -> QuantizeResult:
    onnx = require("onnx")
    if options.mode == "fp16":
        return _fp16(model, out, options, excluded)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}  # fused contrib ops lack inferred types
    if options.mode == "int8-dynamic":
        quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8,
                         per_channel=options.per_channel, reduce_range=options.reduce_range,
                         nodes_to_exclude=list(excluded), extra_options=extra)
        return QuantizeResult(options.mode, "QOperator (integer ops, dynamic activations)",
                              excluded, 0)
    if calibration is None or rows(calibration) == 0:
        raise ConfigError("--quantize int8-static needs calibration data: --calibration PATH "
                          "(.npz or a folder of .npz), or --text-tokenizer for text models")
    return _static(source, out, options, excluded, calibration, extra)


def _excluded(model: Any, options: QuantizeOptions) -> tuple[str, ...]:
    names = {node.name for node in model.graph.node}
    unknown = [n for n in options.exclude_nodes if n not in names]
    if unknown:
        raise ConfigError(f"--exclude-node {unknown[0]!r}: no node of that name in the model")
    by_op = [n.name for n in model.graph.node if n.op_type in options.exclude_ops]
    if options.exclude_ops and not by_op:
        raise ConfigError(f"--exclude-op {', '.join(options.exclude_ops)}: the model has no "
                          "node of that type")
    return tuple(dict.fromkeys([*options.exclude_nodes, *by_op]))


def _static(source: Path, out: Path, options: QuantizeOptions, excluded: tuple[str, ...],
            calibration: Feeds, extra: dict[str, Any]) -> QuantizeResult:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.batches = iter(take(calibration, slice(i, i + CALIBRATION_BATCH))
                                for i in range(0, rows(calibration), CALIBRATION_BATCH))

        def get_next(self) -> Feeds | None:
            return next(self.batches, None)

    quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=options.per_channel, reduce_range=options.reduce_range,
                    nodes_to_exclude=list(excluded), calibrate_method=CalibrationMethod.MinMax,
                    extra_options=extra)
    return QuantizeResult(options.mode, "QDQ (per-channel weights)" if options.per_channel
                          else "QDQ (per-tensor weights)", excluded, rows(calibration))


def _fp16(model: Any, out: Path, options: QuantizeOptions,
          excluded: tuple[str, ...]) -> QuantizeResult:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(model, keep_io_types=options.keep_io_types,
                                         node_block_list=list(excluded) or None)
    onnx = require("onnx")
    onnx.save(converted, str(out))
    io = "FP32 inputs/outputs" if options.keep_io_types else "FP16 inputs/outputs"
    return QuantizeResult("fp16", f"FP16 weights and compute ({io})", excluded, 0)
