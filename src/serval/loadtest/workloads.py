"""Requests for a load test: inputs from a sample file or from the model's v2 metadata, pre-encoded.

Everything here talks to the server over its public v2 API (GET /v2/models/M), so it works
against Serval, Triton, MLServer or KServe alike.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from serval.loadtest.http_client import encode_http_request
from serval.protocol.dtypes import NUMERIC_DATATYPES, numpy_dtype, v2_datatype
from serval.protocol.types import TensorSpec

TOKEN_RANGE = 30000  # integer inputs: ids valid for common vocabularies
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


class WorkloadError(ValueError):
    """The model or the sample file cannot give valid requests (the message says why)."""


def fetch_json(base_url: str, path: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """GET a v2 JSON document; WorkloadError naming the URL when it cannot be had."""
    url = base_url.rstrip("/") + path
    try:
        with _DIRECT.open(url, timeout=timeout_s) as reply:
            return dict(orjson.loads(reply.read()))
    except urllib.error.HTTPError as exc:
        raise WorkloadError(f"GET {url}: HTTP {exc.code}{_reason(exc)}") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise WorkloadError(f"GET {url}: {exc}") from None


def _reason(exc: urllib.error.HTTPError) -> str:
    """': <the server's error>' from a v2 error body (a model's load error), else ''."""
    try:
        error = orjson.loads(exc.read(4096)).get("error")
    except (OSError, ValueError, AttributeError):
        return ""
    return f": {' '.join(error.split())}" if isinstance(error, str) and error.strip() else ""


def model_inputs(base_url: str, model: str) -> list[TensorSpec]:
    """The model's inputs from GET /v2/models/M."""
    meta = fetch_json(base_url, f"/v2/models/{model}")
    specs = [TensorSpec(i["name"], i["datatype"], tuple(int(d) for d in i["shape"]))
             for i in meta.get("inputs", [])]
    if not specs:
        raise WorkloadError(f"model {model!r}: metadata lists no inputs")
    return specs


def generated_feeds(specs: list[TensorSpec], batch: int, count: int, seed: int = 0
                    ) -> list[dict[str, np.ndarray]]:
    """`count` random input sets: the first free axis is the batch, other free axes are 1."""
    rng = np.random.default_rng(seed)
    return [{spec.name: _random_tensor(spec, batch, rng) for spec in specs}
            for _ in range(count)]


def _random_tensor(spec: TensorSpec, batch: int, rng: np.random.Generator) -> np.ndarray:
    if spec.datatype not in NUMERIC_DATATYPES:
        raise WorkloadError(f"input {spec.name!r}: cannot generate {spec.datatype} data; "
                            "give a sample file with --input-file")
    dims = list(spec.shape)
    if dims and dims[0] < 0:
        dims[0] = batch
    shape = [d if d > 0 else 1 for d in dims]
    dtype = numpy_dtype(spec.datatype)
    if spec.name == "attention_mask":
        return np.ones(shape, dtype=dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        high = min(TOKEN_RANGE, int(np.iinfo(dtype).max))
        return rng.integers(0, high, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def sample_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """Input sets from a v2 JSON request body, or a JSON list of them."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise WorkloadError(f"{path}: not a readable JSON file: {exc}") from None
    bodies = doc if isinstance(doc, list) else [doc]
    feeds = [_feed_from_body(path, body) for body in bodies]
    if not feeds:
        raise WorkloadError(f"{path}: holds no request")
    return feeds


def _feed_from_body(path: Path, body: Any) -> dict[str, np.ndarray]:
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or not inputs:
        raise WorkloadError(f"{path}: expected a v2 request {{\"inputs\": [...]}}")
    feed = {}
    for tensor in inputs:
        try:
            dtype = _numeric_dtype(tensor["datatype"])
            feed[tensor["name"]] = np.asarray(tensor["data"], dtype=dtype).reshape(
                tensor["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"{path}: input {tensor.get('name', '?')!r} needs name, "
                                f"datatype (one of {', '.join(NUMERIC_DATATYPES)}), shape and data "
                                f"that fit: {exc}") from None
    return feed


def http_requests(model: str, feeds: list[dict[str, np.ndarray]], binary: bool,
                  host: str) -> list[bytes]:
    """One complete HTTP/1.1 infer request per input set (binary tensors or JSON)."""
    path = f"/v2/models/{model}/infer"
    encode = _binary_body if binary else _json_body
    return [encode_http_request("POST", path, *encode(feed), host=host) for feed in feeds]


def _numeric_dtype(datatype: str) -> np.dtype:
    if datatype not in NUMERIC_DATATYPES:
        raise ValueError(f"{datatype} is not a numeric datatype")
    return numpy_dtype(datatype)


def _json_body(feed: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": name, "datatype": v2_datatype(array.dtype),
                       "shape": list(array.shape), "data": array.ravel().tolist()}
                      for name, array in feed.items()]}
    return orjson.dumps(doc), {"Content-Type": "application/json"}


def _binary_body(feed: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": name, "datatype": v2_datatype(array.dtype),
                       "shape": list(array.shape),
                       "parameters": {"binary_data_size": array.nbytes}}
                      for name, array in feed.items()],
           "parameters": {"binary_data_output": True}}
    header = orjson.dumps(doc)
    body = header + b"".join(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
                             for a in feed.values())
    return body, {"Content-Type": "application/octet-stream",
                  "Inference-Header-Content-Length": str(len(header))}


def grpc_requests(model: str, feeds: list[dict[str, np.ndarray]]) -> list[bytes]:
    """Serialized v2 ModelInferRequests (raw_input_contents), one per input set."""
    from serval.protocol.grpc import grpc_service_pb2 as pb

    out = []
    for feed in feeds:
        request = pb.ModelInferRequest(model_name=model)
        for name, array in feed.items():
            request.inputs.add(name=name, datatype=v2_datatype(array.dtype), shape=array.shape)
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
        out.append(request.SerializeToString())
    return out
