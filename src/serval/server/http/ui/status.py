"""The status page's JSON: server summary, a searchable page of models, one model's detail.

A sampler task reads the registry once a second (never the request path): per-version windows
of recent counters, server-wide totals, and state changes (loads, evictions, swaps) as events.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from serval import __version__
from serval.errors import ConfigError, InvalidInput, ModelNotFound, shown
from serval.observability.window import POINTS_PER_SECOND, Rates, VersionWindow
from serval.repository.store import history

if TYPE_CHECKING:
    from serval.repository.registry import ModelRegistry
    from serval.repository.served import ServedModel

SAMPLE_INTERVAL_S = 1.0
EVENTS_PER_MODEL = 20
EVENTS_SERVER = 50
SORT_KEYS = ("name", "requests_per_s", "p99_ms", "resident_bytes", "state")
MAX_PER_PAGE = 500


@dataclass(frozen=True, slots=True)
class Event:
    """A version changed state (loaded, evicted, retired, failed) between two samples."""

    t_unix: float
    model: str
    version: str
    state: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"t": round(self.t_unix, 3), "model": self.model, "version": self.version,
                "state": self.state, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class PageQuery:
    """What the model table asks for; parse() answers bad values with a precise 400."""

    search: str = ""
    state: str = ""
    sort: str = "name"
    descending: bool = False
    page: int = 1
    per_page: int = 50

    @classmethod
    def parse(cls, params: dict[str, str]) -> PageQuery:
        unknown = set(params) - {"q", "state", "sort", "order", "page", "per_page"}
        if unknown:
            raise InvalidInput(f"unknown query parameter(s) {', '.join(sorted(unknown))}; "
                               "expected q, state, sort, order, page, per_page")
        sort = params.get("sort", "name")
        if sort not in SORT_KEYS:
            raise InvalidInput(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
        order = params.get("order", "desc" if sort != "name" and sort != "state" else "asc")
        if order not in ("asc", "desc"):
            raise InvalidInput(f"order must be asc or desc, got {order!r}")
        state = params.get("state", "").upper()
        if state not in ("", "READY", "LOADING", "UNAVAILABLE", "EVICTED"):
            raise InvalidInput(f"state must be READY, LOADING, UNAVAILABLE or EVICTED, "
                               f"got {params['state']!r}")
        return cls(params.get("q", "").strip(), state, sort, order == "desc",
                   _int_param(params, "page", 1, 1, 10**9),
                   _int_param(params, "per_page", 50, 1, MAX_PER_PAGE))


class ServerStatus:
    """Samples the registry once a second and answers the status documents."""

    def __init__(self, registry: ModelRegistry, clock: Any = time.monotonic) -> None:
        self.registry = registry
        self._clock = clock
        self.started_t_s = clock()
        self._epoch_offset_s = time.time() - self.started_t_s
        self._windows: dict[ServedModel, VersionWindow] = {}  # by identity
        self._totals = VersionWindow(registry.totals, self.started_t_s)
        self._events: dict[str, deque[Event]] = {}
        self._server_events: deque[Event] = deque(maxlen=EVENTS_SERVER)
        self._sampled_t_s = float("-inf")

    async def run(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        """Sample forever (cancel to stop)."""
        while True:
            self.sample()
            await asyncio.sleep(interval_s)

    def sample(self) -> None:
        """One look at every version: which moved, chart points for the busiest, state changes."""
        now = self._clock()
        previous, self._sampled_t_s = self._sampled_t_s, now
        first = previous == float("-inf")
        moved: list[tuple[int, VersionWindow]] = []
        visited = 0
        windows = self._windows
        for served in self.registry.all_models():
            visited += 1
            window = windows.get(served)
            if window is None:
                window = windows[served] = VersionWindow(served.stats, now)
            elif (requests := window.poll(now, previous)) > 0:
                moved.append((requests, window))
            if window.state is not served.state:
                window.state = served.state
                if not first:
                    self._note_event(served, now)
        for _, window in heapq.nlargest(POINTS_PER_SECOND, moved, key=itemgetter(0)):
            window.add_point(now)
        self._totals.poll(now, previous)
        self._totals.add_point(now)
        if visited != len(windows):  # versions the registry no longer tracks
            for gone in windows.keys() - set(self.registry.all_models()):
                del windows[gone]

    def _note_event(self, served: ServedModel, now: float) -> None:
        event = Event(now + self._epoch_offset_s, served.name, served.version,
                      served.state.value, served.reason)
        self._events.setdefault(served.name, deque(maxlen=EVENTS_PER_MODEL)).append(event)
        self._server_events.append(event)

    def _fresh(self) -> None:
        """Sample now if the sampler is not running (or lags): answers never go stale."""
        if self._clock() - self._sampled_t_s >= SAMPLE_INTERVAL_S:
            self.sample()

    # documents -------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Uptime, recent throughput and latency, errors, memory, loads/evictions, model counts."""
        self._fresh()
        registry, totals = self.registry, self._totals
        by_state: dict[str, int] = {}
        names = set()
        for served in registry.all_models():
            by_state[served.state.value] = by_state.get(served.state.value, 0) + 1
            names.add(served.name)
        live = registry.totals
        requests, successes = live.requests, live.outcomes.get("success", 0)  # 429s too
        return {
            "server": {"name": "serval", "version": __version__, "pid": os.getpid(),
                       "uptime_s": round(self._clock() - self.started_t_s, 1),
                       "model_control": registry.control},
            "recent": self._rates(totals.recent(self._clock())),
            "requests_total": requests, "errors_total": requests - successes,
            "resident_bytes": registry.resident_bytes,
            "memory_budget_bytes": registry.memory_budget_bytes,
            "process_resident_bytes": process_resident_bytes(),
            "loads": registry.loads, "evictions": registry.evictions,
            "cache_hits": registry.hits, "cache_misses": registry.misses,
            "models": {"names": len(names), "versions": sum(by_state.values()),
                       "by_state": by_state},
            "series": [p.as_dict(self._epoch_offset_s) for p in totals.series(float("-inf"))],
            "events": [e.as_dict() for e in reversed(self._server_events)],
        }

    def models_page(self, query: PageQuery) -> dict[str, Any]:
        """One page of the model table, filtered and sorted on the server."""
        self._fresh()
        groups: dict[str, list[ServedModel]] = {}
        needle = query.search.casefold()
        for served in self.registry.all_models():
            if needle in served.name.casefold():
                groups.setdefault(served.name, []).append(served)
        if query.state:
            groups = {name: versions for name, versions in groups.items()
                      if self.registry.get(name).state.value == query.state}
        names = sorted(groups)
        if query.sort != "name":
            key = self._sort_key(query.sort, self._clock())
            names.sort(key=lambda name: key(groups[name]), reverse=query.descending)
        elif query.descending:
            names.reverse()
        start = (query.page - 1) * query.per_page
        return {"total": len(names), "page": query.page, "per_page": query.per_page,
                "pages": max(1, -(-len(names) // query.per_page)), "sort": query.sort,
                "order": "desc" if query.descending else "asc",
                "models": [self._row(name, groups[name])
                           for name in names[start:start + query.per_page]]}

    def _sort_key(self, sort: str, now: float) -> Callable[[list[ServedModel]], Any]:
        """Only what the sort needs, for every matching model (a p99 costs more than a rate)."""
        if sort == "requests_per_s":
            return lambda versions: sum(self._window(s).recent_requests_per_s(now)
                                        for s in versions)
        if sort == "resident_bytes":
            return lambda versions: sum(s.memory_bytes for s in versions)
        if sort == "state":
            return lambda versions: self.registry.get(versions[0].name).state.value
        return lambda versions: _sort_value(self._row(versions[0].name, versions)["p99_ms"])

    def model_detail(self, name: str) -> dict[str, Any]:
        """Versions (with the repository's history), recent series, batch sizes, events."""
        self._fresh()
        versions = [self.registry.get(name, v) for v in self.registry.versions_of(name)]
        if not versions:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        history = _repository_history(self.registry, name)
        since = self._clock() - 120
        batch_sizes: dict[int, int] = {}
        for served in versions:
            for size, batch in served.stats.batches.items():
                batch_sizes[size] = batch_sizes.get(size, 0) + batch.compute_infer.count
        return {
            **self._row(name, versions),
            "versions": [{**self._version(served), **history.get(served.version, {})}
                         for served in versions],
            "series": [{"version": served.version,
                        "points": [p.as_dict(self._epoch_offset_s) for p in
                                   self._window(served).series(since)]}
                       for served in versions],
            "batch_sizes": [{"batch_size": size, "executions": count}
                            for size, count in sorted(batch_sizes.items())],
            "events": [e.as_dict() for e in reversed(self._events.get(name, ()))],
        }

    # pieces ----------------------------------------------------------------------------------

    def _window(self, served: ServedModel) -> VersionWindow:
        window = self._windows.get(served)
        return VersionWindow(served.stats, self._clock()) if window is None else window

    def _row(self, name: str, versions: list[ServedModel]) -> dict[str, Any]:
        """A table row: the version unversioned requests reach (the registry's rule, whether
        or not it is ready), its state, and recent figures of every version."""
        serving = self.registry.get(name)
        now = self._clock()
        recents = [r for r in (self._window(s).recent(now) for s in versions) if r is not None]
        executions = sum(r.executions for r in recents)
        batch = sum((r.batch_mean or 0) * r.executions for r in recents)
        p99s = [r.p99_ms for r in recents if r.p99_ms is not None]
        p50s = [r.p50_ms for r in recents if r.p50_ms is not None and r.requests]
        return {
            "name": name, "serving_version": serving.version,
            "state": serving.state.value, "reason": serving.reason,
            "versions": len(versions), "resident_bytes": sum(s.memory_bytes for s in versions),
            "requests_per_s": round(sum(r.requests_per_s for r in recents), 3),
            "errors_per_s": round(sum(r.errors_per_s for r in recents), 3),
            "p50_ms": round(max(p50s), 4) if p50s else None,
            "p99_ms": round(max(p99s), 4) if p99s else None,
            "batch_mean": round(batch / executions, 3) if executions else None,
            "requests_total": sum(s.stats.requests for s in versions),
        }

    def _version(self, served: ServedModel) -> dict[str, Any]:
        recent = self._window(served).recent(self._clock())
        return {"version": served.version, "state": served.state.value, "reason": served.reason,
                "resident_bytes": served.memory_bytes, "in_flight": served.in_flight,
                "queued": served.pending_requests,
                "requests_total": served.stats.requests,
                "recent": self._rates(recent)}

    def _rates(self, rates: Rates | None) -> dict[str, Any]:
        if rates is None:
            return {"requests_per_s": 0.0, "errors_per_s": 0.0, "inferences_per_s": 0.0,
                    "p50_ms": None, "p99_ms": None, "batch_mean": None, "queue_ms": None,
                    "compute_ms": None, "seconds": 0.0}
        doc = rates.as_dict(self._epoch_offset_s)
        del doc["t"], doc["requests"]
        return {**doc, "seconds": round(rates.seconds, 2)}


def process_resident_bytes() -> int | None:
    """This process's resident set (Linux /proc), None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _repository_history(registry: ModelRegistry, name: str) -> dict[str, dict[str, Any]]:
    """Publish time, note and pin of each version folder (manifests written by `repo publish`)."""
    try:
        records = history(registry.root, name)
    except (ConfigError, OSError):
        return {}
    return {r.version: {"published_at": r.created_at, "note": r.source,
                        "repository_serving": r.serving} for r in records}


def _int_param(params: dict[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = params.get(key)
    if raw is None:
        return default
    # ASCII digits only: int() would also take full-width digits, " 12" and "1_2"
    value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 19 else low - 1
    if not low <= value <= high:
        raise InvalidInput(f"{key} must be an integer from {low} to {high}, got "
                           f"{shown(raw, 80)}")
    return value


def _sort_value(value: Any) -> tuple[int, Any]:
    return (0, 0) if value is None else (1, value)
