"""Load overrides: which config form a client sent, file paths kept inside the model's folder,
files written privately; and the registry reloading a served model with an override (real ONNX
Runtime), keeping the serving version when the override fails, forgetting it on unload."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import numpy as np
import pytest

from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.errors import InvalidInput, LoadFailed, ModelNotReady
from serval.repository.overrides import (
    LoadOverride,
    check_files,
    config_form,
    prepare_override,
    write_files,
)
from serval.repository.registry import ModelRegistry
from serval.repository.served import ModelState
from tests import fixture_models

pytestmark = pytest.mark.unit


def test_config_yaml_settings_stay_serval_settings() -> None:
    assert config_form("m", {"max_batch_size": 4}) == ({"max_batch_size": 4}, None)
    assert config_form("m", {"batching": {"max_queue_delay_ms": 1}})[1] is None
    settings, triton = config_form("m", {"max_batch_size": "many"})  # reported as a field
    assert settings == {"max_batch_size": "many"} and triton is None


def test_triton_json_form_is_read_with_the_schema() -> None:
    triton_config = {"name": "m", "platform": "onnxruntime_onnx", "max_batch_size": 2,
                     "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [8]}]}
    settings, triton = config_form("m", triton_config)
    assert settings is None and triton is not None and triton.max_batch_size == 2
    _, nested = config_form("m", {"version_policy": {"latest": {"num_versions": 1}}})
    assert nested is not None and nested.version_policy.latest.num_versions == 1
    _, camel = config_form("m", {"maxBatchSize": 3})  # MessageToJson's field names
    assert camel is not None and camel.max_batch_size == 3
    with pytest.raises(InvalidInput, match=r"failed to load 'm': parameter 'config': .*nope"):
        config_form("m", {"name": "m", "nope": 1})


@pytest.mark.parametrize(("config", "named"), [
    ({"onnxruntime": {"session_entries": {"ep.context_file_path": "/etc/x"}}},
     "onnxruntime.session_entries"),
    ({"onnxruntime": {"run_entries": {"memory.enable_memory_arena_shrinkage": "cpu:0"}}},
     "onnxruntime.run_entries"),
    ({"onnxruntime": {"execution_providers": [
        ["TensorrtExecutionProvider", {"trt_engine_cache_path": "/etc"}]]}},
     "TensorrtExecutionProvider option 'trt_engine_cache_path'"),
    ({"name": "m", "platform": "onnxruntime_onnx", "optimization": {"execution_accelerators": {
        "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": {
            "trt_extra_plugin_lib_paths": "/tmp/evil.so"}}]}}},
     "tensorrt parameter 'trt_extra_plugin_lib_paths'"),
])
def test_a_load_request_may_not_name_files_for_the_engine(config: dict[str, object],
                                                          named: str) -> None:
    """As the logging extension's log_file: a network client never picks the server's files
    (an engine cache written anywhere, a plugin library loaded from anywhere)."""
    with pytest.raises(InvalidInput) as refused:
        prepare_override("m", config, {})
    assert named in str(refused.value) and "may name files on the server" in str(refused.value)
    safe = {"onnxruntime": {"execution_providers": [
        ["CUDAExecutionProvider", {"device_id": "0"}], "CPUExecutionProvider"]}}
    assert prepare_override("m", safe, {}) is not None


@pytest.mark.parametrize(("key", "expected"), [
    ("file:1/../../x", "may not contain '..'"), ("file:/etc/passwd", "must be relative"),
    ("file:", "must be relative"), ("file:1//model.onnx", "empty parts"),
    ("file:1/./model.onnx", "may not contain"), ("file:1\\model.onnx", "must be relative"),
    ("file:C:/x", "must be relative"), ("config.pbtxt", "named 'file:<version>/<path>'"),
])
def test_paths_that_leave_the_model_folder_are_refused(key: str, expected: str) -> None:
    with pytest.raises(InvalidInput, match=f"failed to load 'm': parameter .*{expected}"):
        check_files("m", {key: b"x"}, 1024)


def test_files_are_bounded_and_cannot_collide() -> None:
    assert check_files("m", {"file:1/model.onnx": b"x", "file:labels.txt": b"a"}, 2) == {
        PurePosixPath("1/model.onnx"): b"x", PurePosixPath("labels.txt"): b"a"}
    with pytest.raises(InvalidInput, match="hold 3 bytes; at most 2"):
        check_files("m", {"file:1/a": b"xyz"}, 2)
    with pytest.raises(InvalidInput, match="another parameter puts files inside it"):
        check_files("m", {"file:1/a": b"", "file:1/a/b": b""}, 2)
    with pytest.raises(InvalidInput, match=r"does not start with '\.' or '_'"):
        check_files("..", {"file:1/a": b""}, 2)


def test_a_name_in_a_path_past_255_bytes_is_the_clients_400() -> None:
    for key in ("file:1/" + "a" * 256, "file:" + "\u00e9" * 128 + "/model.onnx"):
        with pytest.raises(InvalidInput, match="a file or folder name in the path is longer "
                                               "than 255 bytes"):
            check_files("m", {key: b"x"}, 1024)
    assert check_files("m", {"file:1/" + "a" * 255: b"x"}, 1024)


def test_a_name_the_file_system_refuses_is_the_clients_400_and_a_full_disk_the_servers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput) as caught:  # past check_files: what the file system says
        write_files("m", {PurePosixPath("1", "a" * 300): b"x"})
    assert caught.value.message == ("failed to load 'm': its files could not be written: a "
                                    "file name or path is too long for the server's file system")

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "open", full)
    with pytest.raises(ModelNotReady, match="could not be written: No space left on device"):
        write_files("m", {PurePosixPath("1", "model.onnx"): b"x"})


def test_files_need_a_config_and_are_written_privately(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="parameter 'config' must accompany"):
        prepare_override("m", None, {"file:1/model.onnx": b"x"})
    assert prepare_override("m", None, {}) is None
    folder = write_files("m", {PurePosixPath("1/model.onnx"): b"onnx"})
    override = LoadOverride(settings={}, folder=folder)
    try:
        assert folder.name == "m" and (folder / "1" / "model.onnx").read_bytes() == b"onnx"
        assert folder.parent.stat().st_mode & 0o777 == 0o700
        directory = override.directory(tmp_path, "m")
        assert directory is not None and directory.versions == ("1",)
    finally:
        override.discard()
    assert not folder.parent.exists()


# --- the registry under overrides, on real ONNX Runtime ----------------------------------------


def _registry(root: Path) -> ModelRegistry:
    return ModelRegistry(root, {"onnxruntime": OnnxRuntimeBackend(cores=1)}, control="all")


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def _batch_limit(registry: ModelRegistry, name: str) -> int:
    served = registry.get(name)
    assert served.state is ModelState.READY and served.model is not None
    return served.model.metadata.max_batch_size


def test_a_config_override_reloads_a_served_model_until_unload(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path, "m", config="max_batch_size: 8\n")
    rows = np.zeros((2, 8), dtype=np.float32)

    async def main() -> None:
        registry = _registry(tmp_path)
        try:
            await registry.start()
            async with registry.acquire("m") as old:  # in flight across the swap
                swap = asyncio.create_task(registry.load("m", {"max_batch_size": 4}))
                await asyncio.wait_for(_until(lambda: registry.get("m") is not old), 30)
                assert _batch_limit(registry, "m") == 4
                assert old.runner is not None and not swap.done()  # old waits for its request
                assert list(await old.runner.infer({"x": rows})) == ["probabilities"]
            await asyncio.wait_for(swap, 30)
            assert old.state is ModelState.UNAVAILABLE and old.model is None
            await registry.unload("m")
            await registry.load("m")
            assert _batch_limit(registry, "m") == 8  # the folder's config again
        finally:
            await registry.close()

    asyncio.run(main())


def test_a_failed_override_keeps_the_serving_version_and_its_override(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path, "m", config="max_batch_size: 8\n")
    model = (tmp_path / "m" / "1" / "model.onnx").read_bytes()

    async def main() -> None:
        registry = _registry(tmp_path)
        try:
            await registry.start()
            await registry.load("m", {"max_batch_size": 2})
            garbage = prepare_override("m", {"max_batch_size": 4}, {"file:1/model.onnx": b"no"})
            assert garbage is not None and garbage.folder is not None
            with pytest.raises(LoadFailed, match="failed to load 'm': version 1: load "):
                await registry.load("m", garbage)
            assert not garbage.folder.exists()
            assert _batch_limit(registry, "m") == 2
            new = prepare_override("n", {"max_batch_size": 3}, {"file:1/model.onnx": model})
            await registry.load("n", new)  # a model the repository does not have
            assert _batch_limit(registry, "n") == 3
        finally:
            await registry.close()

    asyncio.run(main())
