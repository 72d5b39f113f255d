"""The zoo's stateful model: `lstm_step`, the `lstm` (same weights) fed one token per request,
its hidden and cell states kept by the server between steps (config.yaml sequence_batching,
implicit state), checked equal to the whole-sequence `lstm` run at once."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

OPSET = 17
HIDDEN = 256
MAX_ABS = 1e-5
CONFIG = f"""# lstm_step: the lstm one token at a time: INT64 token id [B,1] -> probabilities
# over 50 classes after this token; h and c ([{HIDDEN}] each) are implicit state the server
# keeps per sequence (a request's parameters sequence_id / sequence_start / sequence_end)
backend: onnxruntime
max_batch_size: 64
sequence_batching:
  strategy: direct
  max_sequence_idle_ms: 10000
  states:
    - {{input_name: h_in, output_name: h_out, datatype: FP32, dims: [{HIDDEN}]}}
    - {{input_name: c_in, output_name: c_out, datatype: FP32, dims: [{HIDDEN}]}}
"""


class LstmStep(nn.Module):
    """One timestep of the zoo's LstmClassifier, sharing its embedding, LSTM and head."""

    def __init__(self, whole: nn.Module) -> None:
        super().__init__()
        self.embed, self.lstm, self.head = whole.embed, whole.lstm, whole.head

    def forward(self, token_id: torch.Tensor, h_in: torch.Tensor, c_in: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _, (h, c) = self.lstm(self.embed(token_id), (h_in.unsqueeze(0), c_in.unsqueeze(0)))
        return torch.softmax(self.head(h[0]), dim=-1), h[0], c[0]


def export_step(whole: nn.Module, path: Path) -> None:
    step = LstmStep(whole).eval()
    example = (torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, HIDDEN),
               torch.zeros(2, HIDDEN))
    names_in, names_out = ["token_id", "h_in", "c_in"], ["probabilities", "h_out", "c_out"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, example, str(path), input_names=names_in,
                          output_names=names_out, opset_version=OPSET,
                          dynamic_axes={n: {0: "batch"} for n in names_in + names_out},
                          do_constant_folding=True, dynamo=False)


def run_steps(step: ort.InferenceSession, ids: np.ndarray) -> np.ndarray:
    """The step model over whole sequences [B,T], h and c carried here: the last answer."""
    h = np.zeros((ids.shape[0], HIDDEN), np.float32)
    c = np.zeros_like(h)
    probabilities = np.zeros(0, np.float32)
    for t in range(ids.shape[1]):
        probabilities, h, c = step.run(None, {"token_id": ids[:, t:t + 1], "h_in": h, "c_in": c})
    return probabilities


def check_step(step_file: Path, whole_file: Path, seq_len: int) -> float:
    """Max abs difference of the step-wise run against the whole-sequence model."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    step = ort.InferenceSession(str(step_file), options, providers=["CPUExecutionProvider"])
    whole = ort.InferenceSession(str(whole_file), options, providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(5).integers(0, 100_000, (5, seq_len), dtype=np.int64)
    (want,) = whole.run(["probabilities"], {"input_ids": ids})
    diff = float(np.abs(run_steps(step, ids) - want).max())
    if diff > MAX_ABS:
        raise RuntimeError(f"lstm_step: step-wise run differs from lstm by {diff:.1e}")
    return diff


def write_lstm_step(out: Path, whole: nn.Module, seq_len: int, force: bool = False) -> str:
    """Build `lstm_step` beside `lstm` (which must exist) unless present."""
    target = out / "lstm_step"
    if (target / "1").is_dir() and not force:
        return "lstm_step exists, skipped (--force rebuilds)"
    staging = Path(tempfile.mkdtemp(prefix=".zoo-lstm_step-", dir=out))
    try:
        (staging / "1").mkdir()
        export_step(whole, staging / "1" / "model.onnx")
        diff = check_step(staging / "1" / "model.onnx", out / "lstm" / "1" / "model.onnx",
                          seq_len)
        (staging / "config.yaml").write_text(CONFIG)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return f"lstm_step  {seq_len} steps == lstm whole: max|d|={diff:.1e}"
