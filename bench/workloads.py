"""Valid random inputs for a model, pre-encoded as v2 JSON or binary HTTP requests."""

from __future__ import annotations

import numpy as np
import orjson

from serval.loadtest.closed_loop import encode_http_request

NUMPY = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64,
         "INT32": np.int32, "tensor(float)": np.float32, "tensor(int64)": np.int64}
TOKEN_RANGE = 30000  # fits every example vocabulary


def random_tensor(name: str, datatype: str, shape: list[int], rng: np.random.Generator
                  ) -> np.ndarray:
    dtype = NUMPY[datatype]
    if name == "attention_mask":
        return np.ones(shape, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, TOKEN_RANGE, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def random_feed(session: object, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for an onnxruntime session at a batch size (non-batch dims from the model)."""
    feed = {}
    for arg in session.get_inputs():  # type: ignore[attr-defined]
        shape = [batch, *(d if isinstance(d, int) else 1 for d in arg.shape[1:])]
        feed[arg.name] = random_tensor(arg.name, arg.type, shape, rng)
    return feed


def infer_requests(model: str, metadata: dict, binary: bool, count: int, host: str,
                   seed: int = 0) -> list[bytes]:
    """`count` distinct one-item requests for `model`, as complete HTTP/1.1 requests."""
    rng = np.random.default_rng(seed)
    path = f"/v2/models/{model}/infer"
    requests = []
    for _ in range(count):
        tensors = [(spec, random_tensor(spec["name"], spec["datatype"],
                                        [1, *spec["shape"][1:]], rng))
                   for spec in metadata["inputs"]]
        body, headers = (_binary_body if binary else _json_body)(tensors)
        requests.append(encode_http_request("POST", path, body, headers, host))
    return requests


def _json_body(tensors: list[tuple[dict, np.ndarray]]) -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": spec["name"], "datatype": spec["datatype"],
                       "shape": list(array.shape), "data": array.ravel().tolist()}
                      for spec, array in tensors]}
    return orjson.dumps(doc), {"Content-Type": "application/json"}


def _binary_body(tensors: list[tuple[dict, np.ndarray]]) -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": spec["name"], "datatype": spec["datatype"],
                       "shape": list(array.shape),
                       "parameters": {"binary_data_size": array.nbytes}}
                      for spec, array in tensors],
           "parameters": {"binary_data_output": True}}
    header = orjson.dumps(doc)
    body = header + b"".join(array.tobytes() for _, array in tensors)
    return body, {"Content-Type": "application/octet-stream",
                  "Inference-Header-Content-Length": str(len(header))}
