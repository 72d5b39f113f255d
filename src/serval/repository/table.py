"""Which model versions the server knows and which one a request reaches: the registry's
synchronous half (repository/registry.py adds loading, reloads and eviction).

Every version folder a model's policy selects has a ServedModel entry, loaded or not; a
request without a version reaches the newest ready one. Readiness (`not_serving`) is read
from the same entries, so the request path, the health API and the status page agree."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from serval.config import server_default
from serval.errors import ConfigError, InvalidInput, LoadFailed, ModelNotFound
from serval.model_config import VersionPolicy
from serval.repository.layout import ModelDirectory
from serval.repository.names import UNKNOWN_MODEL, cut, public_reason
from serval.repository.served import ModelState, ServedModel
from serval.repository.steps import unready_steps
from serval.repository.store import is_version_name, serving_version
from serval.stats import ModelStats

log = logging.getLogger(__name__)

ModelControl = Literal["all", "lazy", "explicit"]
DEFAULT_CONTROL: ModelControl = server_default("model_control")


class ModelTable:
    """The versions of every model in the repository, by name and version."""

    def __init__(self, root: Path, control: ModelControl) -> None:
        self.root = root
        self.control = control
        self._models: dict[str, dict[str, ServedModel]] = {}
        self._selected: dict[str, tuple[str, ...]] = {}  # versions each policy serves
        self.totals = ModelStats("_all", "")  # every version's metric counters, summed

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The model version; NotFound if unknown. None: the version an unversioned request
        reaches (the newest ready one, else the newest loadable, else the newest), the one rule
        the request path and the status page share."""
        versions = self._models.get(name)
        if not versions:
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{cut(name)}' is not found")
        if not version:  # newest ready, else newest loadable (never a failed one first)
            if len(versions) == 1:
                only = next(iter(versions.values()))
                if only.state is ModelState.READY:
                    return only  # the common case, on every request
            ready = [v for v in versions.values() if v.state is ModelState.READY]
            loadable = [v for v in versions.values()
                        if v.auto_load or v.state is ModelState.LOADING]
            return max(ready or loadable or versions.values(), key=lambda s: int(s.version))
        served = versions.get(version)
        if served is None:
            # (all zeros is < 1; no int(): past 4,300 digits Python refuses to convert)
            if not is_version_name(version) or not version.strip("0"):  # Triton's words
                raise InvalidInput(f"failed to get model version from specified version string "
                                   f"'{cut(version)}', version should be an integral value > 0")
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{cut(name)}' version {cut(version)} is not "
                                f"found; versions: {', '.join(versions)}")
        return served

    def all_models(self) -> list[ServedModel]:
        return [served for versions in self._models.values() for served in versions.values()]

    def model_names(self) -> list[str]:
        return list(self._models)

    def versions_of(self, name: str) -> list[str]:
        return sorted(self._models.get(name, {}), key=int)

    def ready_versions(self, name: str) -> list[str]:
        return [v for v in self.versions_of(name)
                if self._models[name][v].state is ModelState.READY]

    @property
    def resident_bytes(self) -> int:
        return sum(s.memory_bytes for s in self.all_models() if s.state is ModelState.READY)

    def index(self) -> list[dict[str, str]]:
        """Every tracked version: name, version, state and reason (Triton's index format)."""
        return [
            {"name": s.name, "version": s.version, "state": s.state.value, "reason": s.reason}
            for s in self.all_models()
        ]

    def public_reason(self, reason: str) -> str:
        """A failure reason without filesystem paths (repository/names.py)."""
        return public_reason(self.root, reason)

    def unready_steps(self, served: ServedModel) -> list[str]:
        """Why a loaded pipeline cannot serve now ([] for any other model)."""
        return unready_steps(served, self.get)

    def not_serving(self, names: Iterable[str]) -> list[str]:
        """Why these models do not all serve: a model whose policy selects no version, and
        each selected version that is not READY. An evicted version reloads on demand and a
        version loading beside a ready one (a hot swap) still serves, so neither counts; a
        pipeline needs its steps too."""
        problems = []
        for name in names:
            versions = self._models.get(name, {})
            if versions and not self._selected.get(name):  # as Triton: nothing to serve
                reasons = "; ".join(s.reason for s in versions.values())
                problems.append(f"model '{name}' has no version to serve: {reasons}")
                continue
            serving = any(s.state is ModelState.READY for s in versions.values())
            for version in self._selected.get(name, ()):
                served = versions.get(version)
                if served is None or served.state is ModelState.EVICTED or (
                        serving and served.state is ModelState.LOADING):
                    continue
                if served.state is not ModelState.READY:
                    problems.append(f"model '{name}' version {version} is "
                                    f"{served.state.value}: {served.reason}")
                else:
                    problems += [f"model '{name}' {problem}"
                                 for problem in self.unready_steps(served)]
        return problems

    def _track(self, directory: ModelDirectory) -> list[ServedModel]:
        """Entries for the versions the policy serves; returns ready ones it no longer serves."""
        name = directory.name
        versions = self._models.setdefault(name, {})
        try:
            policy = directory.config().version_policy
            pinned = serving_version(directory.path)
            selected = (pinned,) if pinned in directory.versions else policy.select(
                directory.versions)
            problem = "" if selected else _nothing_selected(directory, policy)
            if problem:
                log.warning("model has no version to serve", extra={"model": name,
                                                                     "reason": problem})
        except ConfigError as exc:
            if any(s.state in (ModelState.READY, ModelState.EVICTED) for s in versions.values()):
                # e.g. serving.json or the config caught half rewritten: what serves goes on
                # (the latest version would have served in place of the one pinned)
                raise LoadFailed(f"failed to load '{name}': {self.public_reason(str(exc))}; "
                                 "the versions serving keep serving") from None
            selected, problem = directory.versions[-1:], self.public_reason(str(exc))
            log.warning("model config is invalid", extra={"model": name, "reason": str(exc)})
        self._selected[name] = selected
        for version in selected or (directory.versions[-1:] or ("1",) if problem else ()):
            served = versions.get(version)
            # a version waiting for a load slot is UNAVAILABLE too: its load goes on (a second
            # entry would load the version twice and leak the first); one being retired is
            # replaced
            if served is None or served.retired or (served.state is ModelState.UNAVAILABLE
                                                    and served.loading is None):
                versions[version] = ServedModel(
                    name, version, ModelState.UNAVAILABLE, problem or "not loaded",
                    auto_load=not problem and self.control == "lazy", totals=self.totals)
        return [s for v, s in versions.items() if v not in selected and s.state is
                ModelState.READY]


def _nothing_selected(directory: ModelDirectory, policy: VersionPolicy) -> str:
    """Why a model whose config is valid has no version to serve."""
    if not directory.versions:
        return "the model folder has no version folder (e.g. 1/)"
    chosen = policy.model_dump(exclude_defaults=True) or {"latest": 1}
    return (f"the version policy selects no version folder (version_policy {chosen}; "
            f"version folders: {', '.join(directory.versions)})")
