"""Warm-up requests from a config's samples: shapes, data, and a failure naming the sample."""

from __future__ import annotations

import numpy as np
import pytest

from serval.backends.base import ModelMetadata
from serval.config import WarmupSample
from serval.errors import ConfigError
from serval.protocol.types import TensorDict
from serval.repository.warmup import run_warmup, warmup_requests

pytestmark = pytest.mark.unit

SAMPLE = WarmupSample.model_validate({
    "name": "w", "batch_size": 3, "count": 2,
    "inputs": {"x": {"datatype": "FP32", "dims": [4], "data": "random"},
               "t": {"datatype": "BYTES", "dims": [1]},
               "i": {"datatype": "INT64", "dims": [2], "data": "zero"}}})


def test_requests_lead_with_the_batch_axis_only_when_batching() -> None:
    [batched] = warmup_requests([SAMPLE], batching=True)
    assert batched.count == 2 and batched.name == "w"
    assert batched.inputs["x"].shape == (3, 4) and batched.inputs["x"].dtype == np.float32
    assert batched.inputs["x"].any()
    assert batched.inputs["t"].tolist() == [[b""]] * 3
    assert not batched.inputs["i"].any() and batched.inputs["i"].dtype == np.int64
    [whole] = warmup_requests([SAMPLE], batching=False)
    assert whole.inputs["x"].shape == (4,)


class Counting:
    def __init__(self, fail: bool) -> None:
        self.calls, self.fail = 0, fail
        self.metadata = ModelMetadata("test", (), (), 8)

    def infer(self, inputs: TensorDict) -> TensorDict:
        self.calls += 1
        if self.fail:
            raise RuntimeError("stoll")
        return {}

    def memory_bytes(self) -> int:
        return 0

    def unload(self) -> None:
        return None


def test_each_sample_runs_its_count_and_a_failure_names_it() -> None:
    model = Counting(fail=False)
    run_warmup(model, [SAMPLE])
    assert model.calls == 2
    with pytest.raises(ConfigError, match="model_warmup 'w' failed: stoll"):
        run_warmup(Counting(fail=True), [SAMPLE])
