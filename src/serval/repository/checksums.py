"""Triton's checksum repository agent: a model's config names files of its folder with their
MD5 (`model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx"
value: "<hex>" } } ] }`, or config.yaml's `file_checksums`), and a version loads only while
every one matches. No other repository agent exists here: naming one is a load error."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from serval.errors import ConfigError
from serval.protocol.grpc import model_config_pb2 as mc

AGENT = "checksum"
_ALGORITHMS = {"MD5": "md5"}
_CHUNK = 1 << 20


def checksum_settings(config: mc.ModelConfig, source: str) -> dict[str, Any]:
    """The config's agents as ModelConfig's `file_checksums` ({} when there are none)."""
    checksums: dict[str, str] = {}
    for agent in config.model_repository_agents.agents:
        if agent.name != AGENT:
            raise ConfigError(f"{source}: field 'model_repository_agents': agent "
                              f"'{agent.name[:80]}' is not available in Serval (only "
                              f"'{AGENT}' is)")
        for key, value in agent.parameters.items():
            algorithm, _, path = key.partition(":")
            if algorithm not in _ALGORITHMS or not path:
                raise ConfigError(f"{source}: checksum agent parameter '{key[:80]}' must be "
                                  "MD5:<file of the model folder>")
            checksums[path] = f"{_ALGORITHMS[algorithm]}:{value.strip().lower()}"
    return {"file_checksums": checksums} if checksums else {}


def verify_checksums(model_dir: Path, checksums: dict[str, str]) -> list[str]:
    """What does not match, one line per file (missing, outside the model folder, or another
    digest); [] when all do."""
    problems = []
    root = model_dir.resolve()
    for name, expected in sorted(checksums.items()):
        algorithm, _, digest = expected.partition(":")
        path = (root / name).resolve()
        if root not in path.parents:
            problems.append(f"{name}: outside the model folder")
        elif not path.is_file():
            problems.append(f"{name}: missing")
        else:
            actual = _digest(path, algorithm)
            if actual != digest:
                problems.append(f"{name}: {algorithm.upper()} is {actual}, the config says "
                                f"{digest}")
    return problems


def _digest(path: Path, algorithm: str) -> str:
    hashed = hashlib.new(algorithm, usedforsecurity=False)
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            hashed.update(chunk)
    return hashed.hexdigest()
