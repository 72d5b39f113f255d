"""The trace extension: settings (global, per model, cleared), sampling, and the files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from serval.errors import InvalidInput
from serval.observability import trace as trace_module
from serval.observability.trace import DEFAULTS, Tracer

pytestmark = pytest.mark.unit


def _on(tmp_path: Path, **settings: Any) -> Tracer:
    return Tracer(tmp_path / "trace.json", {"trace_level": ["TIMESTAMPS"], **settings})


def _take(tracer: Tracer, model: str, requests: int) -> list[int]:
    """Run `requests` requests of `model` through the tracer; the ids of those it traced."""
    ids = []
    for n in range(requests):
        trace = tracer.start(model, n)
        if trace is not None:
            trace.batched(n, n, n, n, n)
            tracer.finish(trace, n + 1)
            ids.append(trace.id)
    return ids


def test_defaults_are_off_and_name_the_file(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path / "t.json")
    assert tracer.settings() == {**DEFAULTS, "trace_file": str(tmp_path / "t.json")}
    assert not tracer.active and tracer.start("m", 0) is None


def test_every_nth_request_is_traced_until_the_count_runs_out(tmp_path: Path) -> None:
    tracer = _on(tmp_path, trace_rate="3", trace_count="2")
    assert tracer.active
    assert len(_take(tracer, "m", 20)) == 2
    assert tracer.settings()["trace_count"] == "0"
    tracer.update(None, {"trace_count": "-1"})
    assert len(_take(tracer, "m", 9)) == 3


def test_a_model_overrides_some_settings_and_follows_the_rest(tmp_path: Path) -> None:
    tracer = _on(tmp_path, trace_rate="100")
    assert tracer.update("m", {"trace_rate": "1"})["trace_rate"] == "1"
    assert tracer.settings("m")["trace_level"] == ["TIMESTAMPS"]  # from the global ones
    assert tracer.settings()["trace_rate"] == "100"
    assert len(_take(tracer, "m", 5)) == 5 and _take(tracer, "other", 5) == []
    tracer.update(None, {"trace_level": "OFF"})
    assert tracer.settings("m")["trace_level"] == ["OFF"] and not tracer.active
    tracer.update("m", {"trace_level": ["TIMESTAMPS"]})
    assert tracer.active and len(_take(tracer, "m", 3)) == 3
    tracer.update("m", {"trace_rate": None})  # back to the global rate
    assert tracer.settings("m")["trace_rate"] == "100"
    tracer.update("m", {})  # no settings: the model's are all cleared
    assert tracer.settings("m") == tracer.settings() and not tracer.active


def test_a_global_null_restores_the_default(tmp_path: Path) -> None:
    tracer = _on(tmp_path, trace_rate="7")
    assert tracer.update(None, {"trace_rate": None, "trace_level": None}) == {
        **DEFAULTS, "trace_file": str(tmp_path / "trace.json")}


@pytest.mark.parametrize(("changes", "named"), [
    ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "OFF cannot be combined"),
    ({"trace_level": "LOUD"}, "must be OFF or TIMESTAMPS, got 'LOUD'"),
    ({"trace_rate": "0"}, "'trace_rate' must be an integer >= 1, got '0'"),
    ({"trace_rate": "1e3"}, "'trace_rate' must be an integer"),
    ({"trace_count": "-2"}, "'trace_count' must be an integer >= -1"),
    ({"trace_rate": "\uff11\uff12"}, "'trace_rate' must be an integer"),  # full-width 12
    ({"trace_rate": "\u00b2"}, "'trace_rate' must be an integer"),  # superscript 2: was a 500
    ({"trace_count": "--5"}, "'trace_count' must be an integer"),  # was a 500
    ({"trace_rate": "1" * 19}, "'trace_rate' must be an integer"),
    ({"log_frequency": ["1", "2"]}, "'log_frequency' takes one value, got 2"),
    ({"trace_rate": True}, "must be a string or a list of strings"),
    ({"trace_rate": {"a": 1}}, "must be a string or a list of strings"),
    ({"trace_mode": "opentelemetry"}, "'trace_mode' must be 'triton'"),
    ({"trace_file": "/etc/cron.d/x"}, "'trace_file' cannot be changed over the API"),
    ({"trace_sample": "1"}, "unknown trace setting 'trace_sample'"),
])
def test_a_bad_setting_is_named_and_nothing_changes(tmp_path: Path, changes: dict[str, Any],
                                                    named: str) -> None:
    tracer = _on(tmp_path)
    before = tracer.settings()
    with pytest.raises(InvalidInput, match=named):
        tracer.update(None, {"trace_rate": "5", **changes})
    assert tracer.settings() == before


def test_tracing_without_a_file_is_refused() -> None:
    with pytest.raises(InvalidInput, match="--trace-file"):
        Tracer(None, {"trace_level": ["TIMESTAMPS"]})
    assert Tracer(None).update(None, {"trace_rate": "5"})["trace_rate"] == "5"


def test_traces_are_written_every_log_frequency_then_the_rest_at_close(tmp_path: Path) -> None:
    tracer = _on(tmp_path, trace_rate="1", log_frequency="2")
    _take(tracer, "m", 5)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["trace.json.0", "trace.json.1"]
    tracer.close()
    first = orjson.loads((tmp_path / "trace.json.0").read_bytes())
    assert [t["id"] for t in first] == [1, 2]
    assert [s["name"] for s in first[0]["timestamps"]] == [
        "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    assert [t["id"] for t in orjson.loads((tmp_path / "trace.json.2").read_bytes())] == [5]


def test_without_log_frequency_one_file_at_close(tmp_path: Path) -> None:
    tracer = _on(tmp_path, trace_rate="2")
    _take(tracer, "m", 6)
    assert not list(tmp_path.iterdir())
    tracer.close()
    assert len(orjson.loads((tmp_path / "trace.json").read_bytes())) == 3


def test_what_waits_and_what_is_written_are_bounded(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "MAX_BUFFERED", 4)
    tracer = _on(tmp_path, trace_rate="1")
    _take(tracer, "m", 10)
    tracer.close()
    assert len(orjson.loads((tmp_path / "trace.json").read_bytes())) == 4
    monkeypatch.setattr(trace_module, "MAX_WRITTEN_BYTES", 2 * 4096)
    tracer = Tracer(tmp_path / "small.json", {"trace_level": "TIMESTAMPS", "trace_rate": "1",
                                              "log_frequency": "1"})
    _take(tracer, "m", 10)
    written = sorted(tmp_path.glob("small.json.*"))
    assert 0 < len(written) < 10
    assert sum(p.stat().st_size for p in written) <= 2 * 4096


def test_many_small_files_count_their_disk_blocks_and_are_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """log_frequency 1 writes a file of ~400 bytes per trace, and each takes a 4 KiB block and
    an inode: the byte limit counted 400, so 1 GiB of traces was ~10 GiB of disk in 2.6
    million files. Each file is charged its whole blocks now, and the files are counted."""
    monkeypatch.setattr(trace_module, "MAX_WRITTEN_BYTES", 3 * 4096)
    tracer = _on(tmp_path, trace_rate="1", log_frequency="1")
    _take(tracer, "m", 10)
    written = sorted(tmp_path.glob("trace.json.*"))
    assert len(written) == 3
    assert sum(p.stat().st_size for p in written) < 4096
    monkeypatch.setattr(trace_module, "MAX_WRITTEN_BYTES", 1 << 30)
    monkeypatch.setattr(trace_module, "MAX_FILES", 5)
    tracer = Tracer(tmp_path / "many.json", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                             "log_frequency": "1"})
    _take(tracer, "m", 10)
    assert len(list(tmp_path.glob("many.json.*"))) == 5
