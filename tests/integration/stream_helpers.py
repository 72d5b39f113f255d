"""A gRPC stream (ModelStreamInfer) asked once with tritonclient, its responses collected."""

from __future__ import annotations

import threading
from typing import Any

import tritonclient.grpc as grpcclient


def stream_responses(grpc_url: str, model: str, inputs: list[Any], count: int,
                     timeout_s: float = 60.0) -> list[Any]:
    """The first `count` responses (results, or errors) of one request on a new stream."""
    answers: list[Any] = []
    done = threading.Event()

    def collect(result: Any, error: Any) -> None:
        answers.append(error or result)
        if len(answers) == count:
            done.set()

    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=collect)
    try:
        client.async_stream_infer(model, inputs)
        assert done.wait(timeout_s), f"{len(answers)} of {count} responses in {timeout_s} s"
    finally:
        client.close()
    return answers
