"""Warm-up requests from a config's samples: shapes, data, and a failure naming the sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import ModelMetadata
from serval.errors import ConfigError
from serval.model_config import WarmupSample
from serval.protocol.types import TensorDict
from serval.repository import data_files
from serval.repository.warmup import run_warmup, warmup_requests

pytestmark = pytest.mark.unit

SAMPLE = WarmupSample.model_validate({
    "name": "w", "batch_size": 3, "count": 2,
    "inputs": {"x": {"datatype": "FP32", "dims": [4], "data": "random"},
               "t": {"datatype": "BYTES", "dims": [1]},
               "i": {"datatype": "INT64", "dims": [2], "data": "zero"}}})


def test_requests_lead_with_the_batch_axis_only_when_batching(tmp_path: Path) -> None:
    [batched] = warmup_requests([SAMPLE], True, tmp_path)
    assert batched.count == 2 and batched.name == "w"
    assert batched.inputs["x"].shape == (3, 4) and batched.inputs["x"].dtype == np.float32
    assert batched.inputs["x"].any()
    assert batched.inputs["t"].tolist() == [[b""]] * 3
    assert not batched.inputs["i"].any() and batched.inputs["i"].dtype == np.int64
    [whole] = warmup_requests([SAMPLE], False, tmp_path)
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


def test_each_sample_runs_its_count_and_a_failure_names_it(tmp_path: Path) -> None:
    model = Counting(fail=False)
    run_warmup(model, [SAMPLE], tmp_path)
    assert model.calls == 2
    with pytest.raises(ConfigError, match="model_warmup 'w' failed: stoll"):
        run_warmup(Counting(fail=True), [SAMPLE], tmp_path)


def _from_files(dims: list[int], datatype: str = "FP32") -> WarmupSample:
    return WarmupSample.model_validate({
        "name": "w", "batch_size": 2,
        "inputs": {"x": {"datatype": datatype, "dims": dims, "data": "file", "file": "x.bin"}}})


def test_data_files_give_one_sample_repeated_over_the_batch(tmp_path: Path) -> None:
    """Triton's input_data_file: raw row-major values, BYTES as 4-byte length + bytes."""
    (tmp_path / "warmup").mkdir()
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "warmup" / "x.bin").write_bytes(values.tobytes())
    [batched] = warmup_requests([_from_files([2, 3])], True, tmp_path)
    np.testing.assert_array_equal(batched.inputs["x"], np.stack([values, values]))
    [whole] = warmup_requests([_from_files([2, 3])], False, tmp_path)
    np.testing.assert_array_equal(whole.inputs["x"], values)
    (tmp_path / "warmup" / "x.bin").write_bytes(b"\x02\x00\x00\x00hi\x00\x00\x00\x00")
    [texts] = warmup_requests([_from_files([2], "BYTES")], True, tmp_path)
    assert texts.inputs["x"].tolist() == [[b"hi", b""]] * 2


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("x.bin", b"\x00" * 20,
     "input_data_file 'x.bin': FP32 shape [2, 3] needs 24 bytes, it has 20 (one sample"),
    ("other.bin", b"", "input_data_file 'x.bin': no such file in the model's warmup/ folder"),
])
def test_a_missing_or_mis_sized_file_is_named(tmp_path: Path, name: str, content: bytes,
                                              expected: str) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / name).write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        warmup_requests([_from_files([2, 3])], True, tmp_path)
    assert str(refused.value).startswith("model_warmup 'w' input 'x': ")
    assert expected in str(refused.value)


def test_a_data_file_outside_the_warmup_folder_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 4)
    (tmp_path / "warmup" / "link.bin").symlink_to(tmp_path / "secret.bin")
    for name in ("../secret.bin", "link.bin", "/etc/hostname"):
        sample = WarmupSample.model_validate({"name": "w", "inputs": {"x": {
            "datatype": "FP32", "dims": [1], "data": "file", "file": name}}})
        with pytest.raises(ConfigError, match="no such file in the model's warmup/ folder"):
            warmup_requests([sample], False, tmp_path)


def test_a_data_file_past_the_bound_is_refused_unread(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_files, "MAX_FILE_BYTES", 16)
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(b"\x00" * 24)  # the right size, too large
    with pytest.raises(ConfigError, match=r"input_data_file 'x\.bin' has 24 bytes; at most 16"):
        warmup_requests([_from_files([2, 3])], True, tmp_path)


@pytest.mark.parametrize(("sample", "refused"), [
    ({"count": 4294967295}, "less than or equal to 1000"),  # Triton's uint32: a load for ever
    ({"batch_size": 2**31 - 1, "inputs": {"x": {"datatype": "FP32", "dims": [16]}}},
     r"has 34359738352 elements \(batch_size x dims\); at most 67108864"),
    ({"inputs": {"x": {"datatype": "FP32", "dims": [2**20, 2**20]}}}, "at most 67108864"),
])
def test_a_warmup_that_would_never_end_or_fill_the_memory_is_refused(
        sample: dict[str, object], refused: str) -> None:
    from pydantic import ValidationError

    document = {"name": "w", "inputs": {"x": {"datatype": "FP32", "dims": [4]}}, **sample}
    with pytest.raises(ValidationError, match=refused):
        WarmupSample.model_validate(document)


def test_a_warmup_batch_past_the_models_max_batch_size_is_refused() -> None:
    from pydantic import ValidationError

    from serval.model_config import ModelConfig

    warmup = [{"name": "w", "batch_size": 9, "inputs": {"x": {"datatype": "FP32", "dims": [4]}}}]
    with pytest.raises(ValidationError, match=r"batch_size 9; the model takes batches of at "
                                              r"most 8 \(max_batch_size\)"):
        ModelConfig.model_validate({"max_batch_size": 8, "warmup": warmup})
    assert ModelConfig.model_validate({"max_batch_size": 9, "warmup": warmup}).warmup
    assert ModelConfig.model_validate({"warmup": warmup}).warmup  # decided at load
