"""config.pbtxt -> ModelConfig: the mapping of each field Serval honours, and a load error
naming every field it does not."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from google.protobuf import text_format

from serval.errors import ConfigError
from serval.model_config import ModelConfig
from serval.protocol.grpc import model_config_pb2 as mc
from serval.repository.layout import scan_model
from serval.repository.triton_config import (
    complete,
    parse_json,
    read_pbtxt,
    to_model_config,
    triton_json,
)

pytestmark = pytest.mark.unit

FULL = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1, 2 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 2 ]
  max_queue_delay_microseconds: 1500
  default_queue_policy { default_timeout_microseconds: 20000 max_queue_size: 7
                         allow_timeout_override: true }
}
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]
version_policy: { all: { } }
model_warmup [ { name: "w" batch_size: 2 count: 3
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "in1" } }
} ]
parameters { key: "k" value: { string_value: "v" } }
response_cache { enable: true }
"""


def _map(text: str, folder: Path, name: str = "m") -> ModelConfig:
    (folder / name).mkdir(parents=True, exist_ok=True)
    return to_model_config(text_format.Parse(text, mc.ModelConfig()), folder / name, "cfg")


def test_every_supported_field_maps_onto_serval_settings(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "labels.txt").write_text("cat\ndog\n")
    config = _map(FULL, tmp_path)
    assert config.backend == "onnxruntime" and config.max_batch_size == 8
    assert [(t.name, t.datatype, t.dims, t.reshape) for t in config.inputs] == [
        ("INPUT0", "FP32", [4, 4], [16])]
    assert config.outputs[0].reshape is None
    assert [(t.name, t.datatype, t.dims) for t in config.outputs] == [("OUTPUT0", "BYTES",
                                                                        [-1, 2])]
    batching = config.batching
    assert batching.preferred_batch_sizes == [2, 4] and batching.max_queue_delay_ms == 1.5
    assert batching.default_timeout_ms == 20.0 and batching.max_queue_size == 7
    assert batching.allow_timeout_override
    assert config.instances == 3 and config.device == "cpu"
    assert config.version_policy.all
    assert config.labels == {"OUTPUT0": ["cat", "dog"]}
    assert config.parameters == {"k": "v"}
    assert config.response_cache
    [warmup] = config.warmup
    assert (warmup.name, warmup.batch_size, warmup.count) == ("w", 2, 3)
    assert warmup.inputs["INPUT0"].data == "random" and warmup.inputs["INPUT0"].dims == [16]
    assert (warmup.inputs["INPUT1"].data, warmup.inputs["INPUT1"].file) == ("file", "in1")


def test_a_rate_limiter_loads_unapplied_as_triton_without_rate_limit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        config = _map("instance_group [ { count: 2 rate_limiter { resources [ { name: 'R' "
                      "count: 1 } ] priority: 2 } } ] dynamic_batching { preserve_ordering: "
                      "true }", tmp_path)
    assert config.instances == 2
    assert "instance_group.rate_limiter is not applied" in caplog.text


def test_priority_levels_and_their_queue_policies_map(tmp_path: Path) -> None:
    config = _map("max_batch_size: 8 dynamic_batching { priority_levels: 3 "
                  "default_priority_level: 2 default_queue_policy { max_queue_size: 9 } "
                  "priority_queue_policy { key: 1 value: { max_queue_size: 2 "
                  "default_timeout_microseconds: 5000 allow_timeout_override: true "
                  "timeout_action: DELAY } } }",
                  tmp_path)
    batching = config.batching
    assert (batching.priority_levels, batching.default_priority_level) == (3, 2)
    assert batching.max_queue_size == 9 and not batching.allow_timeout_override
    assert batching.timeout_action == "reject"
    first = batching.priority_queues[1]
    assert (first.max_queue_size, first.default_timeout_ms, first.allow_timeout_override,
            first.timeout_action) == (2, 5.0, True, "delay")
    assert list(batching.priority_queues) == [1]  # other levels follow the default policy


@pytest.mark.parametrize(("text", "backend"), [
    ('platform: "pytorch_libtorch"', "pytorch"), ('backend: "python"', "python"),
    ('backend: "openvino"', "openvino"), ('backend: "onnxruntime"', "onnxruntime"),
    ("", "onnxruntime"),
])
def test_platform_and_backend_names(tmp_path: Path, text: str, backend: str) -> None:
    assert _map(text, tmp_path).backend == backend


def test_without_max_batch_size_the_model_does_not_batch(tmp_path: Path) -> None:
    assert _map('backend: "onnxruntime"', tmp_path).max_batch_size == 0


@pytest.mark.parametrize(("text", "policy"), [
    ("version_policy: { latest: { num_versions: 2 } }", (2, False, None)),
    ("version_policy: { specific: { versions: [1, 3] } }", (None, False, [1, 3])),
    ("", (None, False, None)),
])
def test_version_policies(tmp_path: Path, text: str, policy: tuple[object, ...]) -> None:
    config = _map(text, tmp_path)
    assert (config.version_policy.latest, config.version_policy.all,
            config.version_policy.specific) == policy


def test_an_ensemble_becomes_a_pipeline_of_its_steps(tmp_path: Path) -> None:
    config = _map("""platform: "ensemble"
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "X" value: "IN" }
    output_map { key: "Y" value: "mid" } },
  { model_name: "b" model_version: 2 input_map { key: "X" value: "mid" }
    output_map { key: "Y" value: "OUT" } } ] }""", tmp_path)
    assert config.backend == "pipeline"
    assert [(s.model, s.version, s.inputs, s.outputs) for s in config.steps] == [
        ("a", None, {"X": "IN"}, {"Y": "mid"}), ("b", "2", {"X": "mid"}, {"Y": "OUT"})]


def test_gpu_instances_run_on_that_gpu(tmp_path: Path) -> None:
    config = _map("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 1 ] } ]", tmp_path)
    assert (config.instances, config.device) == (2, "cuda:1")


@pytest.mark.parametrize(("text", "named"), [
    ("sequence_batching { iterative_sequence: true }",
     "field 'sequence_batching.iterative_sequence'"),
    ("dynamic_batching { priority_levels: 2 }",
     "field 'dynamic_batching.default_priority_level' must be within 1..2"),
    ("dynamic_batching { priority_queue_policy { key: 1 value: { max_queue_size: 4 } } }",
     "'dynamic_batching.priority_queue_policy' needs priority_levels"),
    ("backend: 'python' input [ { name: 'x' data_type: TYPE_FP32 dims: [1] "
     "reshape: { shape: [] } } ]", "field 'reshape'"),
    ("input [ { name: 'x' data_type: TYPE_FP32 dims: [1] optional: true } ]",
     "optional inputs are supported for python models only"),
    ("input [ { name: 'x' data_type: TYPE_BF16 dims: [1] } ]", "TYPE_BF16"),
    ("instance_group [ { count: 1 kind: KIND_MODEL } ]", "KIND_MODEL"),
    ("instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]", "one device"),
    ("backend: 'python' model_transaction_policy { decoupled: true } "
     "dynamic_batching { preserve_ordering: true }",
     "'dynamic_batching.preserve_ordering' is not supported for decoupled models"),
    ('model_warmup [ { name: "w" inputs { key: "x" value: { data_type: TYPE_FP32 } } } ]',
     "give zero_data, random_data or input_data_file"),
    ('platform: "tensorrt_plan"', "field 'platform' 'tensorrt_plan'"),
    ('backend: "tensorflow"', "field 'backend' 'tensorflow'"),
    ('platform: "ensemble" backend: "python"', "disagree"),
    ('name: "other"', "field 'name' is 'other'"),
    ('backend: "onnxruntime" default_model_filename: "net.onnx"',
     "field 'default_model_filename'"),
    ('output [ { name: "y" data_type: TYPE_FP32 label_filename: "../x" } ]', "label_filename"),
    ("platform: 'onnxruntime_onnx' model_transaction_policy { decoupled: true }",
     "field 'model_transaction_policy.decoupled' is supported for python models"),
    ("backend: 'python' model_transaction_policy { decoupled: true } model_warmup [ { "
     "name: 'w' inputs { key: 'x' value: { data_type: TYPE_FP32 dims: [1] zero_data: true "
     "} } } ]", "without model_warmup"),
    ("backend: 'python' model_transaction_policy { decoupled: true } "
     "response_cache { enable: true }", "'response_cache' is not supported for decoupled"),
    ("max_batch_size: 4 sequence_batching { } response_cache { enable: true }",
     "response_cache is not supported for sequence models"),
])
def test_what_serval_cannot_honour_is_a_load_error_naming_it(tmp_path: Path, text: str,
                                                             named: str) -> None:
    with pytest.raises(ConfigError, match="cfg: ") as refused:
        _map(text, tmp_path)
    assert named in str(refused.value)


def test_a_field_the_schema_lacks_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("max_batch_size: 8\nfoo: 1\n")
    with pytest.raises(ConfigError, match='no field named "foo"'):
        read_pbtxt(tmp_path / "config.pbtxt")


def test_the_json_form_has_every_field_and_integers_as_numbers() -> None:
    config = complete(text_format.Parse(FULL, mc.ModelConfig()), "m", "onnxruntime")
    form = triton_json(config)
    assert form["name"] == "m" and form["backend"] == "onnxruntime"
    assert form["input"][0]["dims"] == [4, 4] and form["input"][0]["format"] == "FORMAT_NONE"
    assert form["input"][0]["reshape"] == {"shape": [16]}
    assert form["dynamic_batching"]["max_queue_delay_microseconds"] == 1500
    queue = form["dynamic_batching"]["default_queue_policy"]
    assert queue["default_timeout_microseconds"] == 20000
    assert form["model_warmup"][0]["inputs"]["INPUT0"]["dims"] == [16]
    unfilled = complete(mc.ModelConfig(), "m", "pipeline")
    assert (unfilled.platform, unfilled.version_policy.latest.num_versions) == ("ensemble", 1)


def test_config_pbtxt_wins_over_config_yaml_and_says_so(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text("max_batch_size: 4\n")
    (tmp_path / "m" / "config.pbtxt").write_text("max_batch_size: 8\n")
    directory = scan_model(tmp_path, "m")
    assert directory is not None
    with caplog.at_level(logging.WARNING):
        config = directory.config()
    assert config.max_batch_size == 8 and config.triton is not None
    assert "config.pbtxt" in caplog.text and "config.yaml" in caplog.text
    assert directory.config({"max_batch_size": 2}).max_batch_size == 2  # an override on top


def test_the_folders_warned_about_are_bounded(tmp_path: Path) -> None:
    """Each load from files has a folder of its own: one remembered per such load, for
    ever, grew the server's memory with every load that sent both config files."""
    from serval.repository import triton_config

    for index in range(triton_config._MAX_WARNED + 10):
        folder = tmp_path / f"m{index}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.yaml").write_text("max_batch_size: 4\n")
        (folder / "config.pbtxt").write_text("max_batch_size: 8\n")
        assert triton_config.load_pbtxt(folder).max_batch_size == 8
        assert len(triton_config._WARNED_BOTH) <= triton_config._MAX_WARNED


def test_the_json_form_reads_back_into_the_same_config() -> None:
    config = complete(text_format.Parse(FULL, mc.ModelConfig()), "m", "onnxruntime")
    assert parse_json(triton_json(config), "override") == config
    with pytest.raises(ConfigError, match=r'override: .*"foo"'):
        parse_json({"foo": 1}, "override")
