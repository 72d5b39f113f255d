"""Per-model config.yaml: defaults, validation, and errors that name the file and the field."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from serval.config import ServerConfig, check_node_name
from serval.errors import ConfigError
from serval.model_config import ModelConfig, load_model_config

pytestmark = pytest.mark.unit


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "model" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_valid_config_is_read_in_full(tmp_path: Path) -> None:
    path = write(tmp_path, """
backend: onnxruntime
max_batch_size: 16
instances: 2
device: "cuda:1"
batching:
  max_queue_delay_ms: 2.5
  preferred_batch_sizes: [8, 4, 8]
onnxruntime:
  intra_op_threads: 3
  graph_optimization_level: basic
  allow_spinning: true
""")
    config = load_model_config(path)
    assert config.max_batch_size == 16
    assert config.instances == 2
    assert config.device == "cuda:1"
    assert config.batching.max_queue_delay_ms == 2.5
    assert config.batching.preferred_batch_sizes == [4, 8]
    assert config.onnxruntime.intra_op_threads == 3
    assert config.onnxruntime.inter_op_threads is None
    assert config.onnxruntime.graph_optimization_level == "basic"
    assert config.onnxruntime.allow_spinning is True


def test_missing_file_means_all_defaults(tmp_path: Path) -> None:
    config = load_model_config(tmp_path / "absent" / "config.yaml")
    assert config == ModelConfig()
    assert config.max_batch_size is None
    assert config.instances == 1
    assert config.device == "cpu"
    assert config.batching.max_queue_delay_ms == 0.0


@pytest.mark.parametrize("text", ["", "# only a comment\n", "~\n"])
def test_empty_file_means_all_defaults(tmp_path: Path, text: str) -> None:
    assert load_model_config(write(tmp_path, text)) == ModelConfig()


def test_max_batch_size_zero_disables_batching(tmp_path: Path) -> None:
    assert load_model_config(write(tmp_path, "max_batch_size: 0\n")).max_batch_size == 0


@pytest.mark.parametrize(("text", "fragment"), [
    ("max_batch_size: [1,\n", "not valid YAML"),
    ("a: b: c\n", "not valid YAML"),
    ("- 1\n- 2\n", "must be a YAML mapping"),
    ("42\n", "must be a YAML mapping"),
])
def test_unreadable_yaml_names_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_model_config(path)
    assert str(path) in str(caught.value)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("text", "field"), [
    ("max_batchsize: 4\n", "max_batchsize"),
    ("batching:\n  max_delay: 1\n", "batching.max_delay"),
    ("max_batch_size: lots\n", "max_batch_size"),
    ("instances: [1]\n", "instances"),
    ("batching: 5\n", "batching"),
    ("batching:\n  max_queue_delay_ms: soon\n", "batching.max_queue_delay_ms"),
    ("onnxruntime:\n  allow_spinning: maybe\n", "onnxruntime.allow_spinning"),
    ("instances: 0\n", "instances"),
    ("instances: 65\n", "instances"),
    ("max_batch_size: -1\n", "max_batch_size"),
    ("batching:\n  max_queue_delay_ms: -0.5\n", "batching.max_queue_delay_ms"),
    ("batching:\n  preferred_batch_sizes: [4, 0]\n", "batching.preferred_batch_sizes"),
    ("onnxruntime:\n  intra_op_threads: 0\n", "onnxruntime.intra_op_threads"),
    ("onnxruntime:\n  graph_optimization_level: max\n", "onnxruntime.graph_optimization_level"),
    ("device: tpu\n", "device"),
    ("device: 'cuda:x'\n", "device"),
    ("backend: tensorrt\n", "backend"),
])
def test_invalid_setting_names_the_file_and_the_field(tmp_path: Path, text: str, field: str
                                                      ) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_model_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert f"field '{field}'" in message


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({}, ("3",)),
        ({"latest": 2}, ("2", "3")),
        ({"all": True}, ("1", "2", "3")),
        ({"specific": [1, 3, 9]}, ("1", "3")),
    ],
)
def test_version_policy_selects_versions(policy: dict[str, object],
                                         expected: tuple[str, ...]) -> None:
    from serval.model_config import VersionPolicy

    assert VersionPolicy.model_validate(policy).select(("1", "2", "3")) == expected


def test_version_policy_takes_one_choice(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version_policy:\n  latest: 2\n  all: true\n")
    with pytest.raises(ConfigError, match="choose one of latest, all, specific"):
        load_model_config(path)


def test_config_override_is_validated_like_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("max_batch_size: 8\n")
    assert load_model_config(path, {"max_batch_size": 4}).max_batch_size == 4
    with pytest.raises(ConfigError, match="instances"):
        load_model_config(path, {"instances": 0})


def test_node_names_are_checked(tmp_path: Path) -> None:
    for name in ("node-1", "a", "10.0.0.7:8000", "n_1.rack.dc", "x" * 64):
        assert ServerConfig(repository=tmp_path, node_name=name).resolved_node_name() == name
    for name in ("", "x" * 65, "two words", "n\r\nset-cookie: a", "ünï", "a/b"):
        with pytest.raises(ValidationError, match="1 to 64 characters"):
            ServerConfig(repository=tmp_path, node_name=name)


def test_no_node_name_is_the_host_name_when_it_is_a_valid_one(tmp_path: Path) -> None:
    host = socket.gethostname()
    config = ServerConfig(repository=tmp_path)
    try:
        check_node_name(host)
    except ValueError:
        with pytest.raises(ConfigError, match="--node-name"):
            config.resolved_node_name()
    else:
        assert config.resolved_node_name() == host


def test_the_agent_port_is_a_port_of_its_own(tmp_path: Path) -> None:
    assert ServerConfig(repository=tmp_path, agent_port=9000).agent_port == 9000
    for port in (8000, 8001):
        with pytest.raises(ValidationError, match="also the HTTP or gRPC port"):
            ServerConfig(repository=tmp_path, agent_port=port)
    with pytest.raises(ValidationError):
        ServerConfig(repository=tmp_path, drain_delay_s=-1)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("h2_stream_window_bytes", 2**31, "at most 2,147,483,647 (HTTP/2's largest window)"),
    ("h2_connection_window_bytes", 2**40, "at most 2,147,483,647"),
    ("h2_max_header_list_bytes", 2**32, "an HTTP/2 SETTINGS value"),
    ("max_message_bytes", 2**32, "a gRPC message's 4-byte length"),
    ("header_timeout_s", float("inf"), "must be a finite number"),
    ("body_timeout_s", float("nan"), "must be a finite number"),
])
def test_transport_limits_refuse_values_the_protocols_cannot_carry(
        field: str, value: float, message: str) -> None:
    from serval.config import LimitError, TransportLimits

    with pytest.raises(LimitError, match=re.escape(message)) as caught:
        TransportLimits(**{field: value})
    assert caught.value.field == field
    TransportLimits(h2_stream_window_bytes=2**31 - 1, h2_connection_window_bytes=2**31 - 1)
