"""The shared-memory REST routes without a server: paths, methods, register bodies, CUDA."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from serval.errors import InvalidInput
from serval.protocol.shared_memory import SharedMemoryRegistry
from serval.server.http.shm_routes import is_shared_memory_path, shared_memory_route

pytestmark = pytest.mark.unit


@pytest.fixture
def regions(tmp_path: Path) -> SharedMemoryRegistry:
    (tmp_path / "obj").write_bytes(bytes(64))
    return SharedMemoryRegistry(tmp_path)


def _route(regions: SharedMemoryRegistry | None, method: str, path: str,
           body: bytes = b"") -> tuple[int, bytes]:
    status, reply, _ = shared_memory_route(regions, method, path.strip("/").split("/"), body)
    return status, reply


def test_paths_methods_and_round_trip(regions: SharedMemoryRegistry) -> None:
    assert is_shared_memory_path(["systemsharedmemory", "status"])
    assert not is_shared_memory_path(["models", "x"])
    body = orjson.dumps({"key": "/obj", "offset": 0, "byte_size": 32})
    assert _route(regions, "POST", "systemsharedmemory/region/a/register", body)[0] == 200
    assert _route(regions, "POST", "systemsharedmemory/region/b/register",
                  orjson.dumps({"key": "obj", "byte_size": 8}))[0] == 200  # offset: 0
    status, reply = _route(regions, "GET", "systemsharedmemory/region/a/status")
    assert (status, orjson.loads(reply)) == (200, [
        {"name": "a", "key": "/obj", "offset": 0, "byte_size": 32}])
    assert _route(regions, "POST", "systemsharedmemory/region/a/unregister")[0] == 200
    assert _route(regions, "POST", "systemsharedmemory/unregister")[0] == 200
    assert orjson.loads(_route(regions, "GET", "systemsharedmemory/status")[1]) == []


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "systemsharedmemory/region/a/register", 405),
    ("POST", "systemsharedmemory/status", 405),
    ("POST", "systemsharedmemory/register", 404),  # register needs a region's name
    ("POST", "systemsharedmemory/region//register", 404),
    ("GET", "systemsharedmemory/region/a/b/status", 404),
    ("GET", "systemsharedmemory", 404),
])
def test_other_paths_and_methods_are_404_or_405(regions: SharedMemoryRegistry, method: str,
                                                path: str, status: int) -> None:
    assert _route(regions, method, path)[0] == status


@pytest.mark.parametrize(("body", "message"), [
    (b"", "register request body is not valid JSON"),
    (b"[]", "register request body must be a JSON object"),
    (b'{"byte_size": 4}', "needs 'key'"),
    (b'{"key": "/obj"}', "needs 'byte_size'"),
    (b'{"key": 5, "byte_size": 4}', "'key' must be a string"),
    (b'{"key": "/obj", "byte_size": "4"}', "'byte_size' must be an integer"),
])
def test_register_bodies_are_checked(regions: SharedMemoryRegistry, body: bytes,
                                     message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _route(regions, "POST", "systemsharedmemory/region/a/register", body)


def test_cuda_is_refused_but_its_empty_status_and_unregister_answer() -> None:
    assert _route(None, "GET", "cudasharedmemory/status") == (200, b"[]")
    assert _route(None, "POST", "cudasharedmemory/unregister")[0] == 200
    assert _route(None, "POST", "cudasharedmemory/region/g/unregister")[0] == 200
    for method, path in (("POST", "cudasharedmemory/region/g/register"),
                         ("GET", "cudasharedmemory/region/g/status")):
        with pytest.raises(InvalidInput, match="CUDA shared memory is not supported on this "
                                               "server"):
            _route(None, method, path, b"{}")


def test_switched_off_it_says_how() -> None:
    with pytest.raises(InvalidInput, match="shared memory is off on this server"):
        _route(None, "GET", "systemsharedmemory/status")
