"""Small real models for the `serval optimize` tests: torch factories (`tests.optimize_models:
tiny_mlp`), a pickled scikit-learn pipeline, a tiny BERT exported to ONNX; the MLP's input
argument and two readers of an ONNX file (its op types, its outputs under ONNX Runtime)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from serval.optimize import convert, samples

MLP_INPUT = [convert.parse_input("x:float32:16")]


class TinyClassifier(nn.Module):
    """Linear 16 -> 64 -> ReLU -> 10, softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(x), dim=-1)


def tiny_mlp() -> nn.Module:
    """A classifier that INT8 quantizes faithfully."""
    torch.manual_seed(0)
    return TinyClassifier().eval()


def outlier_mlp() -> nn.Module:
    """The same classifier with one huge weight per layer: per-tensor INT8 scales are set by the
    outlier, every other weight rounds to zero, and the quantized model's argmax collapses."""
    module = tiny_mlp()
    with torch.no_grad():
        for layer in (module.layers[0], module.layers[2]):
            layer.weight[0, 0] = 1e4
    return module


def not_a_module() -> str:
    return "not a module"


def sklearn_pipeline(path: Path) -> Path:
    """StandardScaler + LogisticRegression on 6 features, 3 classes, pickled to path."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    path.write_bytes(pickle.dumps(pipeline))
    return path


class _LastHidden(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]


def tiny_bert(path: Path) -> Path:
    """A 2-layer BERT (hidden 64, 4 heads, vocab 500) exported as the zoo exports MiniLM."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=64, attn_implementation="eager")
    model = _LastHidden(BertModel(config)).eval()
    ids = torch.randint(1, 500, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    names = ["input_ids", "attention_mask", "last_hidden_state"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids, mask), str(path), input_names=names[:2],
                          output_names=names[2:3],
                          dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names},
                          opset_version=17, do_constant_folding=True, dynamo=False)
    return path


def op_types(path: Path) -> list[str]:
    """The op type of every node of the ONNX graph at `path`, in graph order."""
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def run_onnx(path: Path, feeds: samples.Feeds) -> list[np.ndarray]:
    """Every output of the ONNX model at `path` for `feeds`, on ONNX Runtime's CPU provider."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
