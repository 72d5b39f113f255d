"""The import graph of src/serval, read from the source with ast: no import circles, no import up
the layers, tools apart from the server, engines chosen only where the server is built; and the
server runs without grpcio (a test and bench dependency)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "serval"

# Floors, lowest first. A unit (a top-level module or package of serval) may import its own
# modules and units on lower floors only; units on one floor are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("serval", "errors"),  # the package itself (__version__) and the error vocabulary
    ("stats", "protocol", "auth", "http2", "ports", "loop_share"),  # ground types, wire
    # formats, HTTP/2 bits, the loop's ration for work that grows with the models
    ("model_config",),  # a model's settings (over the datatype table)
    ("config", "observability"),  # the server's settings; metrics/logs over stats
    ("backends",),  # engines, behind backends.base
    ("batching",),  # per-model queue over one loaded model
    ("repository",),  # model lifecycle: each loaded version and its batcher
    ("dataplane",),  # the one API the transports call
    ("server",),  # HTTP/1.1 and gRPC transports, the status page, the server builder
    ("cluster", "loadtest", "optimize"),  # scale-out over servers; tools
    ("planner",),  # cost plans and tuning, over loadtest
    ("cli",),  # one module per command
    ("__main__",),  # `python -m serval`
)
# Tools measure and tune a server from outside, over the network, never by importing it.
TOOLS = ("loadtest", "optimize", "planner")
SERVING = ("observability", "backends", "batching", "repository", "dataplane", "server", "cluster")
# Below the server, engines are reached through their interface only (the types, and the check
# of a request against a model's metadata that every engine may assume); the server builder
# picks the concrete ones.
ENGINE_INTERFACE = ("serval.backends", "serval.backends.base", "serval.backends.validation")

# Known breaks, each named and explained; the change that fixes one removes it here (an entry
# that no longer matches a broken rule fails the test).
EXCEPTIONS: dict[tuple[str, str], str] = {}


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module under src/serval by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The serval modules `name` imports anywhere in its source (top level, in functions, under
    TYPE_CHECKING; absolute or relative), with the packages Python runs on the way to them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    found = set()
    for target in targets:
        while target and target not in known:  # `import serval.x.Name` names a module above
            target = target.rpartition(".")[0]
        while target:  # the module and every package above it
            if target != name:
                found.add(target)
            target = target.rpartition(".")[0]
    return found


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    known = modules(src)
    return {name: imports(name, path, known) for name, path in known.items()}


def unit(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def floors() -> dict[str, int]:
    return {name: floor for floor, names in enumerate(LAYERS) for name in names}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), as a path back to itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(start: str) -> None:
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, group) for group in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & group):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    raise AssertionError(f"no circle through {start}")


def broken_rules(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """Every import that goes up or sideways across the floors, from a tool into the serving
    stack, or past the engine interface below the server; by (importer, imported)."""
    floor = floors()
    broken = {}
    for importer, targets in graph.items():
        mine = unit(importer)
        for imported in targets:
            theirs = unit(imported)
            if mine == theirs:
                continue
            if mine not in floor or theirs not in floor:
                unknown = mine if mine not in floor else theirs
                broken[importer, imported] = f"'{unknown}' has no floor in LAYERS"
            elif floor[theirs] >= floor[mine]:
                broken[importer, imported] = (
                    f"{mine} (floor {floor[mine]}) imports {theirs} (floor {floor[theirs]})")
            elif mine in TOOLS and theirs in SERVING:
                broken[importer, imported] = f"the tool {mine} imports {theirs}, part of the server"
            elif (theirs == "backends" and imported not in ENGINE_INTERFACE
                  and floor[mine] < floor["server"]):
                broken[importer, imported] = (
                    f"{mine}, below the server, imports the concrete engine module {imported}")
    return broken


def test_the_import_graph_has_no_circles() -> None:
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_import_breaks_the_layers() -> None:
    broken = broken_rules(import_graph())
    unexpected = sorted(f"{importer} -> {imported}: {why}"
                        for (importer, imported), why in broken.items()
                        if (importer, imported) not in EXCEPTIONS)
    assert not unexpected, "imports that break the layers:\n" + "\n".join(unexpected)
    stale = sorted(edge for edge in EXCEPTIONS if edge not in broken)
    assert stale == [], "these exceptions no longer break a rule: remove them from EXCEPTIONS"


def test_every_unit_has_a_floor() -> None:
    units = {unit(name) for name in modules()}
    assert units == set(floors())


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The same checks on a small tree with one upward import that closes a circle."""
    package = tmp_path / ROOT
    (package / "server").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "stats.py").write_text("def f():\n    from .server import runner\n")
    (package / "server" / "__init__.py").write_text("")
    (package / "server" / "runner.py").write_text("from serval.stats import f\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["serval.server.runner", "serval.stats", "serval.server.runner"]]
    assert broken_rules(graph) == {
        ("serval.stats", "serval.server"): "stats (floor 1) imports server (floor 8)",
        ("serval.stats", "serval.server.runner"): "stats (floor 1) imports server (floor 8)",
    }


def test_the_server_imports_no_grpc_module() -> None:
    """Every module of serval.server imports with grpcio made unimportable, and none loads it."""
    script = (
        "import pkgutil, sys\n"
        "sys.modules['grpc'] = None  # `import grpc` now raises ImportError\n"
        "import serval.server\n"
        "for module in pkgutil.walk_packages(serval.server.__path__, 'serval.server.'):\n"
        "    __import__(module.name)\n"
        "loaded = [m for m in sys.modules if m.startswith('grpc.')]\n"
        "assert sys.modules['grpc'] is None and not loaded, loaded  # only the blocker\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]
