"""The server users write by hand: FastAPI + uvicorn + ONNX Runtime, one engine call per request.

Every model of a repository (`<name>/1/model.onnx`) gets one InferenceSession (intra-op threads =
cores, defaults otherwise). The infer route is a plain sync `def` taking the v2 JSON body as a
dict (FastAPI reads and parses it, then runs the route in its thread pool); outputs go back as
v2 JSON lists. No batching, no binary tensors: the baseline Serval is measured against.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI, HTTPException

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
V2_NAMES = {np.dtype(dtype): name for name, dtype in DTYPES.items()}


def build_app(repository: Path) -> FastAPI:
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    sessions = {
        model_dir.name: ort.InferenceSession(str(model_dir / "1" / "model.onnx"), options)
        for model_dir in sorted(repository.iterdir()) if (model_dir / "1" / "model.onnx").exists()
    }
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v2/models/{name}/infer")
    def infer(name: str, request: dict[str, Any]) -> dict[str, Any]:
        session = sessions.get(name)
        if session is None:
            raise HTTPException(404, f"unknown model {name}")
        feed = {
            item["name"]: np.asarray(item["data"], dtype=DTYPES[item["datatype"]])
            .reshape(item["shape"])
            for item in request["inputs"]
        }
        names = [output.name for output in session.get_outputs()]
        results = session.run(names, feed)
        return {
            "model_name": name,
            "outputs": [
                {"name": n, "datatype": V2_NAMES[r.dtype], "shape": list(r.shape),
                 "data": r.ravel().tolist()}
                for n, r in zip(names, results, strict=True)
            ],
        }

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.repository), host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
