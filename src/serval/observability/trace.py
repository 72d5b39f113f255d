"""Triton's trace extension: sampled requests' timestamps, written as JSON to a trace file.

Settings (`GET/POST /v2[/models/NAME]/trace/setting`, gRPC `TraceSetting`) are global, and a
model may override any of them; what it does not set follows the global value. Every value is
a string, or a list of strings for `trace_level`:

- `trace_level`: ["OFF"] or ["TIMESTAMPS"] (TENSORS is refused: not traced by Serval);
- `trace_rate`: every Nth request (per model with its own settings, else counted globally);
- `trace_count`: traces still to take, counted down as they are taken; -1: no limit;
- `log_frequency`: write the file every N traces as `FILE.0`, `FILE.1`, ...; 0: at shutdown;
- `trace_file`: set at start (`--trace-file`) only: a network client must not choose where
  the server writes; `trace_mode`: "triton" only.

A null value clears the setting (a model's: back to the global one; a global one: back to its
default); a model POST without settings clears all of that model's. Traces waiting to be written
are bounded (MAX_BUFFERED), and so is what one server writes (MAX_WRITTEN_BYTES, each file
charged whole disk blocks, and MAX_FILES: a client that may change settings must not fill the
disk, nor its inodes with `log_frequency` 1); beyond either, traces are dropped and counted in
the log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from serval.errors import InvalidInput, shown

# ASCII digits: str.isdigit() also takes full-width and superscript digits (int() fails on
# the latter: a 500), and lstrip("-") took "--5"
_INTEGER = re.compile(r"-?[0-9]{1,18}")
log = logging.getLogger(__name__)

Value = str | list[str]
DEFAULTS: dict[str, Value] = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000",
                              "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}
MAX_BUFFERED = 10_000
MAX_WRITTEN_BYTES = 1 << 30
MAX_FILES = 10_000  # FILE.N files one server writes
BLOCK_BYTES = 4096  # what the smallest file takes of a disk
_MINIMUM = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}


@dataclass(slots=True)
class Trace:
    """One sampled request's timestamps (perf_counter ns), named as Triton names them."""

    id: int
    model_name: str
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    model_version: str = ""  # known once a version has it (registry.acquire)

    def mark(self, name: str, ns: int) -> None:
        self.timestamps.append((name, ns))

    def batched(self, queued_ns: int, started_ns: int, inputs_ns: int, outputs_ns: int,
                done_ns: int) -> None:
        """The queue's and the engine's part, from the batch the request ran in."""
        self.timestamps += [("QUEUE_START", queued_ns), ("COMPUTE_START", started_ns),
                            ("COMPUTE_INPUT_END", inputs_ns), ("COMPUTE_OUTPUT_START", outputs_ns),
                            ("COMPUTE_END", done_ns)]


class Tracer:
    """The trace settings and the traces taken under them."""

    def __init__(self, trace_file: Path | None = None,
                 initial: Mapping[str, Any] | None = None) -> None:
        self._file = str(trace_file) if trace_file else ""
        self._global: dict[str, Value] = {**DEFAULTS, "trace_file": self._file}
        self._models: dict[str, dict[str, Value]] = {}
        self._seen: dict[str | None, int] = {}  # requests since the last trace, per counter
        self._buffer: list[dict[str, Any]] = []
        self._file_index = 0
        self._next_id = 1
        self._dropped = 0
        self._written = 0  # disk bytes of traces this server wrote (MAX_WRITTEN_BYTES)
        self._files = 0  # files it wrote (MAX_FILES)
        self.active = False  # some settings trace: the request path asks start() only then
        if initial:
            self.update(None, initial)

    def settings(self, model: str | None = None) -> dict[str, Value]:
        if model is None:
            return dict(self._global)
        return {**self._global, **self._models.get(model, {})}

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Value]:
        """Apply `changes` to the global settings or one model's; all of them or none (the
        first bad one is named). Answers the settings as they now are."""
        own = dict(self._global if model is None else self._models.get(model, {}))
        if model is not None and not changes:
            own.clear()
        for name, value in changes.items():
            if name not in DEFAULTS:
                raise InvalidInput(f"unknown trace setting '{name[:64]}'; the settings are "
                                   f"{', '.join(DEFAULTS)}")
            if value is None or value == []:
                if model is None:
                    own[name] = self._file if name == "trace_file" else DEFAULTS[name]
                else:
                    own.pop(name, None)
            else:
                own[name] = self._checked(name, value)
        effective = own if model is None else {**self._global, **own}
        if effective["trace_level"] != ["OFF"] and not self._file:
            raise InvalidInput("tracing needs a trace file, and this server has none: start "
                               "serval with --trace-file PATH")
        if model is None:
            self._global = own
        elif own:
            self._models[model] = own
        else:
            self._models.pop(model, None)
        self._seen.pop(model, None)
        self.active = any(self.settings(m)["trace_level"] != ["OFF"]
                          for m in [None, *self._models])
        return self.settings(model)

    def start(self, model: str, received_ns: int) -> Trace | None:
        """A new trace, REQUEST_START at `received_ns`, if this request of `model` is
        sampled; else None."""
        own = self._models.get(model)
        settings = self._global if own is None else {**self._global, **own}
        if settings["trace_level"] == ["OFF"] or settings["trace_count"] == "0":
            return None
        counter = None if own is None else model
        seen = self._seen.get(counter, 0) + 1
        if seen < int(str(settings["trace_rate"])):
            self._seen[counter] = seen
            return None
        self._seen[counter] = 0
        count = int(str(settings["trace_count"]))
        if count > 0:
            holder = own if own is not None and "trace_count" in own else self._global
            holder["trace_count"] = str(count - 1)
        trace = Trace(self._next_id, model, [("REQUEST_START", received_ns)])
        self._next_id += 1
        return trace

    def finish(self, trace: Trace, end_ns: int) -> None:
        """Keep a finished trace (REQUEST_END at `end_ns`); write the file when log_frequency
        traces are waiting."""
        trace.mark("REQUEST_END", end_ns)
        version = trace.model_version
        if len(self._buffer) >= MAX_BUFFERED:
            self._dropped += 1
            if self._dropped == 1:
                log.warning("trace buffer full (%d traces): traces are dropped until it is "
                            "written; set log_frequency", MAX_BUFFERED)
            return
        self._buffer.append({
            "id": trace.id, "model_name": trace.model_name,
            "model_version": int(version) if version.isascii() and version.isdigit() else version,
            "timestamps": [{"name": name, "ns": ns} for name, ns in trace.timestamps]})
        frequency = int(str(self.settings(trace.model_name)["log_frequency"]))
        if frequency and len(self._buffer) >= frequency:
            self._write(f"{self._file}.{self._file_index}")
            self._file_index += 1

    def close(self) -> None:
        """At shutdown: what is still waiting goes to the file (FILE, or FILE.N where
        traces were written every log_frequency)."""
        if self._buffer:
            self._write(f"{self._file}.{self._file_index}" if self._file_index else self._file)

    def _write(self, path: str) -> None:
        traces, self._buffer = self._buffer, []
        data = orjson.dumps(traces)
        disk_bytes = -(-len(data) // BLOCK_BYTES) * BLOCK_BYTES  # a file takes whole blocks
        if self._written + disk_bytes > MAX_WRITTEN_BYTES or self._files >= MAX_FILES:
            self._dropped += len(traces)
            log.warning("%d traces not written: this server has written %d files, %d bytes "
                        "of disk, of traces (its limits: %d files, %d bytes)", len(traces),
                        self._files, self._written, MAX_FILES, MAX_WRITTEN_BYTES)
            return
        try:
            Path(path).write_bytes(data)
            self._written += disk_bytes
            self._files += 1
        except OSError as exc:
            log.error("could not write %d traces: %s", len(traces), exc.strerror)
        if self._dropped:
            log.warning("%d traces were dropped while the buffer was full", self._dropped)
            self._dropped = 0

    def _checked(self, name: str, value: Any) -> Value:
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
            raise InvalidInput(f"trace setting '{name}' must be a string or a list of strings, "
                               f"got {shown(value)}")
        texts = [str(v) for v in values]
        if name == "trace_level":
            return _level(texts)
        if len(texts) != 1:
            raise InvalidInput(f"trace setting '{name}' takes one value, got {len(texts)}")
        text = texts[0]
        if name == "trace_file":
            if text != self._file:
                raise InvalidInput("trace setting 'trace_file' cannot be changed over the API "
                                   "(a client must not choose where the server writes); start "
                                   "serval with --trace-file PATH")
        elif name == "trace_mode":
            if text != "triton":
                raise InvalidInput(f"trace setting 'trace_mode' must be 'triton' (Serval writes "
                                   f"Triton's JSON traces), got {shown(text)}")
        else:
            low = _MINIMUM[name]
            if not _INTEGER.fullmatch(text) or int(text) < low:
                raise InvalidInput(f"trace setting '{name}' must be an integer >= {low}, got "
                                   f"{shown(text)}")
            text = str(int(text))
        return text


def _level(levels: list[str]) -> list[str]:
    for level in levels:
        if level == "TENSORS":
            raise InvalidInput("trace level TENSORS is not supported by this server; Serval "
                               "traces TIMESTAMPS")
        if level not in ("OFF", "TIMESTAMPS"):
            raise InvalidInput(f"trace level must be OFF or TIMESTAMPS, got {shown(level)}")
    if "OFF" in levels and len(set(levels)) > 1:
        raise InvalidInput("trace level OFF cannot be combined with another level")
    return sorted(set(levels))

