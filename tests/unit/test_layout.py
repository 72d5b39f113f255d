"""tests/unit mirrors src/serval: tests/unit/<package>/test_<module>.py tests
src/serval/<package>/<module>.py, so a module's unit tests are found by its path."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

UNIT = Path(__file__).resolve().parent
SOURCE = UNIT.parent.parent / "src" / "serval"

# Test modules that test no single module of src/serval, and why.
ELSEWHERE = {
    "test_layout.py": "this check: the layout of tests/unit itself",
    "test_deploy_artifacts.py": "the files under deploy/ (Dockerfile, Kubernetes, Ray Serve)",
    "test_deploy_cluster.py": "deploy/k8s/cluster: Serval nodes behind HAProxy on Kubernetes",
    "test_layers.py": "the import graph of src/serval as a whole, and no grpc in the server",
    "test_doc_tables.py": "bench/doc_tables.py: the docs' tables rendered from bench output",
    "test_make_serve.py": "the Makefile's serve target and pyproject's extras",
}


def _test_modules() -> list[Path]:
    return sorted(UNIT.rglob("test_*.py"))


def _module_of(test: Path) -> Path | None:
    """The src/serval module `test` is named for: test_<module>.py, or test_<module>_<aspect>.py
    where a module's tests are split by aspect (test_rest_codec_properties.py)."""
    package = SOURCE / test.parent.relative_to(UNIT)
    words = test.stem.removeprefix("test_").split("_")
    for end in range(len(words), 0, -1):
        candidate = package / ("_".join(words[:end]) + ".py")
        if candidate.is_file():
            return candidate
    return None


def test_every_test_module_names_a_module_of_its_package() -> None:
    strays = [str(test.relative_to(UNIT)) for test in _test_modules()
              if _module_of(test) is None
              and str(test.relative_to(UNIT)) not in ELSEWHERE]
    assert strays == [], (
        "tests/unit/<package>/test_<module>.py must name a module of src/serval/<package>/ "
        f"(or be listed in ELSEWHERE with the reason): {strays}")


def test_every_folder_is_a_package_of_src_and_of_tests() -> None:
    for folder in sorted({test.parent for test in _test_modules()}):
        relative = folder.relative_to(UNIT)
        assert (SOURCE / relative / "__init__.py").is_file(), f"src/serval/{relative} is no package"
        # without __init__.py two test modules of one name (cluster/test_config.py and
        # test_config.py) would collide in pytest's rootdir import mode
        assert (folder / "__init__.py").is_file(), f"tests/unit/{relative} lacks __init__.py"


def test_the_exceptions_exist_and_every_test_module_is_marked_unit() -> None:
    assert {name for name in ELSEWHERE if not (UNIT / name).is_file()} == set()
    unmarked = [str(test.relative_to(UNIT)) for test in _test_modules()
                if "pytestmark = pytest.mark.unit" not in test.read_text()]
    assert unmarked == [], f"unit tests must carry the unit marker: {unmarked}"
