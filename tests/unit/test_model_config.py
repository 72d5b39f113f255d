"""config.yaml as ModelConfig: a file that cannot be read as text is a ConfigError naming the
problem, and every number is bounded by the Triton model_config.proto field it is served in."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from serval.errors import ConfigError
from serval.model_config import INT32_MAX, MAX_CONFIG_BYTES, load_model_config

pytestmark = pytest.mark.unit


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_model_config(path)


def test_a_config_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"max_batch_size: 8\n# \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not UTF-8 text \(byte 0xff at offset 20"):
        load_model_config(path)


def test_a_config_that_is_a_folder_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"config\.yaml: is a folder; it must be a file"):
        load_model_config(tmp_path / "config.yaml")


@pytest.mark.parametrize("text", [
    f"max_batch_size: {INT32_MAX + 1}",
    "max_batch_size: 99999999999999999999999",
    f"batching: {{preferred_batch_sizes: [4, {INT32_MAX + 1}]}}",
    "batching: {max_queue_size: 4294967296}",
    "batching: {default_timeout_ms: .inf}",
    "batching: {default_priority_level: 1001}",
    "version_policy: {latest: 4294967296}",
    "version_policy: {specific: [9223372036854775808]}",
    "onnxruntime: {intra_op_threads: 100000}",
    "onnxruntime: {inter_op_threads: 1025}",
    "inputs: [{name: x, datatype: FP32, dims: [9223372036854775808]}]",
    "inputs: [{name: x, datatype: FP32, dims: [2], reshape: [9223372036854775808]}]",
    "warmup: [{name: w, batch_size: 2147483648, inputs: {}}]",
    "warmup: [{name: w, count: 4294967296, inputs: {}}]",
    "warmup: [{name: w, inputs: {x: {datatype: FP32, dims: [-1]}}}]",
    "sequence_batching: {max_sequence_idle_ms: .inf}",
    "sequence_batching: {max_candidate_sequences: 2147483648}",
    "sequence_batching: {states: [{input_name: a, output_name: b, datatype: FP32, "
    "dims: [9223372036854775808]}]}",
])
def test_numbers_beyond_their_proto_field_are_refused(tmp_path: Path, text: str) -> None:
    field = text.split(":")[0]
    with pytest.raises(ConfigError, match=f"field '{field}"):
        _load(tmp_path, text)


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    config = _load(tmp_path, f"max_batch_size: {INT32_MAX}\n"
                             "onnxruntime: {intra_op_threads: 1024, inter_op_threads: 1024}\n")
    assert config.max_batch_size == INT32_MAX  # type: ignore[attr-defined]


def test_a_config_that_is_a_pipe_is_refused_at_once(tmp_path: Path) -> None:
    """A config.yaml that is a named pipe blocked the reading thread (the event loop) until
    some process wrote to it; it is refused without waiting. (The writer below ends the
    wait an old reader would be stuck in, so this fails rather than hangs there.)"""
    pipe = tmp_path / "config.yaml"
    os.mkfifo(pipe)
    refused: list[BaseException] = []

    def read() -> None:
        try:
            load_model_config(pipe)
        except ConfigError as exc:
            refused.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # stuck opening the pipe: give it a writer, then an end
        with open(pipe, "w") as writer:
            writer.write("max_batch_size: 4\n")
        reader.join(5)
    assert [str(exc) for exc in refused] == [f"{pipe}: is not a regular file"]


def test_a_config_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("max_batch_size: 4\n" + "#" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"is larger than {MAX_CONFIG_BYTES} bytes"):
        load_model_config(config)
    config.write_text("max_batch_size: 4\n" + "#" * (MAX_CONFIG_BYTES - 100) + "\n")
    assert load_model_config(config).max_batch_size == 4
