"""Many concurrent requests: each gets its own rows back, and batches really form."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http.aio as triton_aio
from tritonclient.http import InferInput, InferRequestedOutput

from tests.conftest import RunningServer
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration

CLIENTS = 128


async def _fire(url: str, inputs: list[np.ndarray], binary: bool) -> list[np.ndarray]:
    client = triton_aio.InferenceServerClient(url, conn_limit=CLIENTS)
    try:
        async def one(x: np.ndarray) -> np.ndarray:
            infer_input = InferInput("x", list(x.shape), "FP32")
            infer_input.set_data_from_numpy(x, binary_data=binary)
            result = await client.infer(
                "heavy", [infer_input], outputs=[InferRequestedOutput("y", binary_data=binary)]
            )
            return result.as_numpy("y")

        return list(await asyncio.gather(*(one(x) for x in inputs)))
    finally:
        await client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_concurrent_requests_get_their_own_answers(
    server: RunningServer, fixture_repository: Path, binary: bool
) -> None:
    rng = np.random.default_rng(11)
    rows = rng.integers(1, 4, size=CLIENTS)  # requests of 1..3 rows each
    inputs = [rng.standard_normal((int(n), 384)).astype(np.float32) for n in rows]
    before = _stats(server)
    answers = asyncio.run(_fire(server.url, inputs, binary))
    session = ort.InferenceSession(str(fixture_repository / "heavy/1/model.onnx"))
    for x, answer in zip(inputs, answers, strict=True):
        np.testing.assert_allclose(answer, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    after = _stats(server)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == int(rows.sum())
    assert executions < CLIENTS, "no batching happened under 128 concurrent requests"


def _stats(server: RunningServer) -> dict[str, int]:
    stats = call(server.url, "GET", "/v2/models/heavy/stats").json()["model_stats"][0]
    return {"inference_count": stats["inference_count"],
            "execution_count": stats["execution_count"]}
