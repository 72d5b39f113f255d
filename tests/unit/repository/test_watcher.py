"""What makes the watcher reload a model: its folder's signature."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from serval.repository import watcher
from serval.repository.layout import version_signature
from serval.repository.registry import ModelRegistry
from serval.repository.watcher import model_signature

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("config", ["config.yaml", "config.pbtxt", "serving.json"])
def test_an_edited_config_changes_the_signature(tmp_path: Path, config: str) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / config).write_text("")
    os.utime(tmp_path / config, (1_000, 1_000))
    before = model_signature(tmp_path)
    os.utime(tmp_path / config, (2_000, 2_000))
    assert model_signature(tmp_path) != before


def test_a_new_version_folder_changes_the_signature(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    before = model_signature(tmp_path)
    (tmp_path / "2").mkdir()
    assert model_signature(tmp_path) != before


def test_a_file_renamed_into_a_version_folder_changes_the_signature(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    os.utime(tmp_path / "1", (1_000, 1_000))
    before = model_signature(tmp_path)
    (tmp_path / "model.onnx.new").write_bytes(b"weights")
    (tmp_path / "model.onnx.new").rename(tmp_path / "1" / "model.onnx")
    assert model_signature(tmp_path) != before


def test_a_versions_signature_is_its_files_and_its_models_config(tmp_path: Path) -> None:
    (tmp_path / "1" / "sub").mkdir(parents=True)
    (tmp_path / "1" / "sub" / "weights.bin").write_bytes(b"abc")
    (tmp_path / "config.yaml").write_text("max_batch_size: 8\n")
    signature = version_signature(tmp_path, "1")
    assert [name for name, _, _ in signature] == ["1/sub/weights.bin", "config.yaml"]
    (tmp_path / "serving.json").write_text('{"version": "1"}')  # picks versions: not part
    (tmp_path / "2").mkdir()  # another version: not part
    assert version_signature(tmp_path, "1") == signature
    (tmp_path / "1" / "sub" / "weights.bin").write_bytes(b"abcd")  # in place, same folder
    changed = version_signature(tmp_path, "1")
    assert changed != signature
    os.utime(tmp_path / "config.yaml", (5_000, 5_000))
    assert version_signature(tmp_path, "1") != changed


def test_the_watcher_looks_at_the_repository_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A look at 10,000 model folders takes ~0.4 s of file system calls: never on the loop."""
    looks: list[bool] = []
    real = watcher._signatures

    def signatures(root: Path) -> dict[str, watcher.Signature]:
        looks.append(threading.current_thread() is threading.main_thread())
        return real(root)

    monkeypatch.setattr(watcher, "_signatures", signatures)
    (tmp_path / "m" / "1").mkdir(parents=True)

    async def main() -> None:
        registry = ModelRegistry(tmp_path, {}, control="explicit")
        task = asyncio.create_task(watcher.watch_repository(registry, 0.001))
        while len(looks) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert looks[:3] == [False, False, False]


def test_a_file_rewritten_in_place_changes_the_signature(tmp_path: Path) -> None:
    """As Triton's poll: `cp new.onnx repo/m/1/model.onnx` changes no folder's time."""
    (tmp_path / "1" / "sub").mkdir(parents=True)
    weights = tmp_path / "1" / "sub" / "weights.bin"
    weights.write_bytes(b"abc")
    os.utime(weights, (1_000, 1_000))
    for folder in (tmp_path / "1" / "sub", tmp_path / "1"):
        os.utime(folder, (1_000, 1_000))
    before = model_signature(tmp_path)
    weights.write_bytes(b"abd")
    for folder in (tmp_path / "1" / "sub", tmp_path / "1"):
        os.utime(folder, (1_000, 1_000))  # only the file's own time moved
    assert model_signature(tmp_path) != before


def test_a_labels_file_edited_changes_the_signature(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    os.utime(tmp_path / "labels.txt", (1_000, 1_000))
    before = model_signature(tmp_path)
    os.utime(tmp_path / "labels.txt", (2_000, 2_000))
    assert model_signature(tmp_path) != before


def test_links_that_loop_or_dangle_do_not_stop_a_look(tmp_path: Path) -> None:
    """A link pointing at itself raises ELOOP on stat: the look goes on and the model's
    other changes still show."""
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "loop").symlink_to("loop")
    (model / "1" / "loop").symlink_to("loop")
    (model / "1" / "gone").symlink_to("nowhere")
    before = watcher._signatures(tmp_path)
    assert set(before) == {"m"}
    (model / "2").mkdir()
    assert watcher._signatures(tmp_path)["m"] != before["m"]
    assert version_signature(model, "1") == ()


def test_the_poll_goes_on_when_the_repository_cannot_be_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository folder moved away for a while (an unmounted volume): the poll logs it,
    keeps what it saw, and reloads a change made once the folder is back."""
    root = tmp_path / "repo"
    (root / "m" / "1").mkdir(parents=True)
    looks: list[str] = []
    real = watcher._signatures

    def signatures(path: Path) -> dict[str, watcher.Signature]:
        try:
            found = real(path)
        except OSError:
            looks.append("failed")
            raise
        looks.append("read")
        return found

    monkeypatch.setattr(watcher, "_signatures", signatures)
    reloads: list[str] = []

    class Registry(ModelRegistry):
        async def load(self, name: str, override: object = None) -> None:
            reloads.append(name)

    async def until(done: Callable[[], bool], task: asyncio.Task[None]) -> None:
        while not done():
            assert not task.done(), "the poll stopped"
            await asyncio.sleep(0.001)

    async def main() -> None:
        registry = Registry(root, {}, control="all")
        task = asyncio.create_task(watcher.watch_repository(registry, 0.001))
        await until(lambda: "read" in looks, task)
        root.rename(tmp_path / "away")
        await until(lambda: "failed" in looks, task)
        (tmp_path / "away").rename(root)
        (root / "m" / "2").mkdir()
        await until(lambda: bool(reloads), task)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert reloads == ["m"]


@pytest.mark.parametrize("folder", ["warmup", "initial_state"])
def test_an_edited_data_file_changes_both_signatures(tmp_path: Path, folder: str) -> None:
    """A load reads warm-up samples and initial states: rewriting one in place reloads the
    model, under the poll and on a load request, as an edited config does."""
    (tmp_path / "1").mkdir()
    (tmp_path / folder).mkdir()
    sample = tmp_path / folder / "input0"
    sample.write_bytes(b"\0" * 4)
    for path in (sample, tmp_path / folder):
        os.utime(path, (1_000, 1_000))
    polled, loaded = model_signature(tmp_path), version_signature(tmp_path, "1")
    assert [name for name, _, _ in loaded] == [f"{folder}/input0"]
    sample.write_bytes(b"\1" * 4)
    os.utime(tmp_path / folder, (1_000, 1_000))  # only the file's own time moved
    assert model_signature(tmp_path) != polled
    assert version_signature(tmp_path, "1") != loaded
