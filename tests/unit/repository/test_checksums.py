"""Triton's checksum repository agent: the config's MD5s of model files, checked before a load;
any other agent is refused by name."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from google.protobuf import text_format

from serval.errors import ConfigError
from serval.protocol.grpc import model_config_pb2 as mc
from serval.repository.checksums import checksum_settings, verify_checksums

pytestmark = pytest.mark.unit


def _settings(text: str) -> dict[str, object]:
    return checksum_settings(text_format.Parse(text, mc.ModelConfig()), "cfg")


def test_the_checksum_agents_parameters_become_file_checksums() -> None:
    assert _settings('model_repository_agents { agents [ { name: "checksum" parameters [ '
                     '{ key: "MD5:1/model.onnx" value: "ABCDEF" }, '
                     '{ key: "MD5:labels.txt" value: "0123" } ] } ] }') == {
        "file_checksums": {"1/model.onnx": "md5:abcdef", "labels.txt": "md5:0123"}}
    assert _settings("max_batch_size: 4") == {}


@pytest.mark.parametrize(("text", "named"), [
    ('model_repository_agents { agents [ { name: "relocation" } ] }',
     "agent 'relocation' is not available in Serval (only 'checksum' is)"),
    ('model_repository_agents { agents [ { name: "checksum" parameters { key: "SHA1:1/m" '
     'value: "00" } } ] }', "parameter 'SHA1:1/m' must be MD5:<file of the model folder>"),
    ('model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:" '
     'value: "00" } } ] }', "parameter 'MD5:' must be"),
])
def test_what_the_agent_cannot_do_is_named(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match="cfg: ") as refused:
        _settings(text)
    assert named in str(refused.value)


def test_each_file_is_checked_and_each_mismatch_named(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"weights")
    (tmp_path / "secret").write_bytes(b"x")
    (model / "1" / "link").symlink_to(tmp_path / "secret")
    good = hashlib.md5(b"weights", usedforsecurity=False).hexdigest()
    assert verify_checksums(model, {"1/model.onnx": f"md5:{good}"}) == []
    assert verify_checksums(model, {
        "1/model.onnx": "md5:00", "1/gone.bin": f"md5:{good}", "../secret": "md5:00",
        "1/link": "md5:00"}) == [
        "../secret: outside the model folder", "1/gone.bin: missing",
        "1/link: outside the model folder",
        f"1/model.onnx: MD5 is {good}, the config says 00"]
