"""Pipeline overhead: `minilm-text` (raw text, tokenised in the server) vs `minilm` (token ids).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/pipeline.py --repository examples/models
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request

SENTENCES = [f"Request number {i} asks how Serval batches {i % 7} concurrent queries."
             for i in range(16)]
GOAL_SHARE = 0.90


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    direct = _direct_items_per_s(args.repository)
    port = servers.free_port()
    command = [*servers.serval_command(args.repository, port, 1, 0), "--allow-python-models"]
    log = Path(tempfile.mkdtemp(prefix="serval-pipeline-")) / "server.log"
    with servers.running(command, port, "/v2/health/ready", log):
        ids = run_closed_loop(servers.HOST, port, _id_requests(), args.clients, args.duration)
        text = run_closed_loop(servers.HOST, port, _text_requests(), args.clients,
                               args.duration)
    share = text.throughput_rps / ids.throughput_rps
    print(f"minilm (token ids) @{args.clients}: {ids.throughput_rps:,.1f} req/s, "
          f"p99 {ids.p99_ms:.0f} ms, errors {ids.errors or 0}")
    print(f"minilm-text (raw text) @{args.clients}: {text.throughput_rps:,.1f} req/s, "
          f"p99 {text.p99_ms:.0f} ms, errors {text.errors or 0}")
    print(f"steps called directly in-process (tokenizers + ONNX Runtime, batch 32): "
          f"{direct:,.1f} items/s; served minilm-text = {text.throughput_rps / direct:.0%} of it")
    print(f"{'PASS' if share >= GOAL_SHARE else 'MISS'}  minilm-text >= 90% of minilm "
          f"({share:.0%}, tokenisation included)")


def _direct_items_per_s(repository: Path, batch: int = 32, seconds: float = 5.0) -> float:
    """The pipeline's two engines called back to back in this process, no server."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(repository / "tokenizer" / "1" / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=32)
    tokenizer.enable_padding(length=32, pad_id=0, pad_token="[PAD]")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(repository / "minilm" / "1" / "model.onnx"), options)
    texts = (SENTENCES * 4)[:batch]
    items, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        encodings = tokenizer.encode_batch(texts)
        session.run(None, {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)})
        items += batch
    return items / (time.perf_counter() - started)


def _id_requests() -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(16):
        ids = rng.integers(1000, 30000, size=32).tolist()
        doc = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 32],
                           "data": ids},
                          {"name": "attention_mask", "datatype": "INT64", "shape": [1, 32],
                           "data": [1] * 16 + [0] * 16}]}
        out.append(_post("minilm", doc))
    return out


def _text_requests() -> list[bytes]:
    return [_post("minilm-text", {"inputs": [{"name": "text", "datatype": "BYTES",
                                              "shape": [1, 1], "data": [s]}]})
            for s in SENTENCES]


def _post(model: str, doc: dict[str, object]) -> bytes:
    return encode_http_request("POST", f"/v2/models/{model}/infer", orjson.dumps(doc),
                               {"Content-Type": "application/json"}, servers.HOST)


if __name__ == "__main__":
    main()
