"""System shared memory on a real server, over REST and gRPC alike: register / status /
unregister, tensors in and out of regions (alone or beside tensors in the request), every
mistake a precise 400 / INVALID_ARGUMENT, CUDA shared memory refused, the extension switched
off, token scopes, objects released on unregister and at exit, and a client shrinking its
object under the server never bringing it down."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests import triton_examples
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration
TAG = f"_serval_test_{os.getpid()}"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
CUDA_TEXT = "CUDA shared memory is not supported on this server"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_examples.build(tmp_path_factory.mktemp("shm-models"))


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository)


@pytest.fixture
def region() -> Iterator[Any]:
    """A 256-byte object holding A then B (64 bytes each), then room for outputs."""
    handle = shm.create_shared_memory_region("region", "/region" + TAG, 256)
    shm.set_shared_memory_region(handle, [A, B])
    yield handle
    shm.destroy_shared_memory_region(handle)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[Any]:
    module = httpclient if request.param == "http" else grpcclient
    triton = module.InferenceServerClient(server.url if module is httpclient else
                                          server.grpc_url)
    triton.unregister_system_shared_memory()
    yield triton
    triton.unregister_system_shared_memory()


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _refused(call_it: Callable[[], Any], *words: str, code: str = "INVALID_ARGUMENT") -> None:
    """The call fails with 400 (REST) or `code` (gRPC), naming every one of `words`."""
    with pytest.raises(InferenceServerException) as caught:
        call_it()
    status, message = str(caught.value.status()), caught.value.message()
    assert status in ("400", f"StatusCode.{code}"), (status, message)
    for word in words:
        assert word in message, (word, message)
    assert "/dev/shm" not in message and "Traceback" not in message


def _status(client: Any, name: str = "") -> dict[str, dict[str, int | str]]:
    """Status in one shape for both transports: name -> {key, offset, byte_size}."""
    answer = client.get_system_shared_memory_status(name)
    if _module(client) is httpclient:
        return {r["name"]: {k: r[k] for k in ("key", "offset", "byte_size")} for r in answer}
    return {n: {"key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for n, r in answer.regions.items()}


def _inputs(client: Any, in_shm: tuple[bool, bool]) -> list[Any]:
    module = _module(client)
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for index, (tensor, data) in enumerate(zip(inputs, (A, B), strict=True)):
        if in_shm[index]:
            tensor.set_shared_memory("shm", 64, offset=64 * index)
        else:
            tensor.set_data_from_numpy(data)
    return inputs


def _output(client: Any, name: str, size: int | None = None, offset: int = 128) -> Any:
    module = _module(client)
    output = (module.InferRequestedOutput(name, binary_data=True) if module is httpclient
              else module.InferRequestedOutput(name))
    if size is not None:
        output.set_shared_memory("shm", size, offset=offset)
    return output


def test_the_extension_is_listed(client: Any) -> None:
    metadata = client.get_server_metadata()
    extensions = (metadata["extensions"] if isinstance(metadata, dict)
                  else list(metadata.extensions))
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" not in extensions


def test_register_status_unregister(client: Any, region: Any) -> None:
    client.register_system_shared_memory("a", "/region" + TAG, 128)
    client.register_system_shared_memory("b", "region" + TAG, 64, offset=64)
    assert _status(client) == {"a": {"key": "/region" + TAG, "offset": 0, "byte_size": 128},
                               "b": {"key": "region" + TAG, "offset": 64, "byte_size": 64}}
    assert list(_status(client, "b")) == ["b"]
    client.unregister_system_shared_memory("a")
    client.unregister_system_shared_memory("a")  # not registered (any more): nothing to do
    assert list(_status(client)) == ["b"]
    _refused(lambda: client.get_system_shared_memory_status("a"),
             "Unable to find system shared memory region: 'a'")
    client.unregister_system_shared_memory()
    assert _status(client) == {}


@pytest.mark.parametrize("in_shm", [(True, True), (True, False), (False, True)],
                         ids=["both", "first", "second"])
def test_inputs_from_and_outputs_to_a_region(client: Any, region: Any,
                                             in_shm: tuple[bool, bool]) -> None:
    """Tensors in shared memory beside tensors in the request, in and out."""
    client.register_system_shared_memory("shm", "/region" + TAG, 256)
    result = client.infer("simple", _inputs(client, in_shm),
                          outputs=[_output(client, "OUTPUT0", 64), _output(client, "OUTPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)  # sent in the answer
    written = shm.get_contents_as_numpy(region, np.int32, [1, 16], offset=128)
    np.testing.assert_array_equal(written, A + B)
    output0 = result.get_output("OUTPUT0")
    parameters = (output0["parameters"] if isinstance(output0, dict) else
                  {k: v.string_param or v.int64_param for k, v in output0.parameters.items()})
    assert parameters == {"shared_memory_region": "shm", "shared_memory_byte_size": 64,
                          "shared_memory_offset": 128}


def test_register_mistakes_are_named(client: Any, region: Any) -> None:
    key = "/region" + TAG
    client.register_system_shared_memory("shm", key, 64)
    _refused(lambda: client.register_system_shared_memory("shm", key, 64),
             "'shm' is already registered")
    _refused(lambda: client.register_system_shared_memory("x", "/../etc/passwd", 64),
             "is not valid", "one name")
    _refused(lambda: client.register_system_shared_memory("x", "/absent" + TAG, 64),
             "names no object")
    _refused(lambda: client.register_system_shared_memory("x", key, 200, offset=100),
             "offset 100 + byte_size 200", "(256 bytes)")
    assert list(_status(client)) == ["shm"]


def test_infer_mistakes_are_named(client: Any, region: Any) -> None:
    client.register_system_shared_memory("shm", "/region" + TAG, 256)
    module = _module(client)
    wrong = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    wrong[0].set_shared_memory("nowhere", 64)
    wrong[1].set_shared_memory("shm", 64)
    _refused(lambda: client.infer("simple", wrong),
             "Unable to find system shared memory region: 'nowhere'")
    wrong[0].set_shared_memory("shm", 60)
    _refused(lambda: client.infer("simple", wrong), "INPUT0", "needs 64 bytes",
             "shared_memory_byte_size is 60")
    wrong[0].set_shared_memory("shm", 64, offset=224)
    _refused(lambda: client.infer("simple", wrong), "INPUT0", "offset 224",
             "past the end of region 'shm' (256 bytes)")
    _refused(lambda: client.infer("simple", _inputs(client, (True, True)),
                                  outputs=[_output(client, "OUTPUT0", 32)]),
             "output 'OUTPUT0' needs 64 bytes; shared_memory_byte_size is 32")
    _refused(lambda: client.infer("simple", _inputs(client, (True, True)),
                                  outputs=[_output(client, "OUTPUT0", 64, offset=250)]),
             "output 'OUTPUT0'", "past the end of region 'shm'")


def test_data_beside_shared_memory_is_refused_over_rest(server: RunningServer,
                                                        region: Any) -> None:
    triton = httpclient.InferenceServerClient(server.url)
    triton.register_system_shared_memory("mix", "/region" + TAG, 256)
    params = {"shared_memory_region": "mix", "shared_memory_byte_size": 64}
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
                        "data": A.ravel().tolist(), "parameters": params},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
                        "parameters": {**params, "shared_memory_offset": 64}}]}
    reply = call(server.url, "POST", "/v2/models/simple/infer", orjson.dumps(body))
    assert reply.status == 400
    assert "shared memory region 'mix'; it must carry neither 'data'" in reply.error
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"] = {"shared_memory_region": "mix"}
    reply = call(server.url, "POST", "/v2/models/simple/infer", orjson.dumps(body))
    assert reply.status == 400
    assert "needs both 'shared_memory_region' and 'shared_memory_byte_size'" in reply.error
    reply = call(server.url, "POST", "/v2/systemsharedmemory/region/x/register", b"[1]")
    assert reply.status == 400 and "register request body must be" in reply.error
    assert call(server.url, "GET", "/v2/systemsharedmemory/region/x/register").status == 405
    triton.unregister_system_shared_memory()


def test_contents_beside_shared_memory_are_refused_over_grpc(server: RunningServer,
                                                             region: Any) -> None:
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    triton.register_system_shared_memory("shm", "/region" + TAG, 256)
    inputs = _inputs(triton, (True, True))
    inputs[0]._get_tensor().contents.int_contents.extend(A.ravel().tolist())
    _refused(lambda: triton.infer("simple", inputs),
             "input 'INPUT0' takes its data from shared memory region 'shm'")
    triton.unregister_system_shared_memory()


def test_cuda_shared_memory_is_refused(client: Any) -> None:
    client.unregister_cuda_shared_memory()  # what Triton's examples call first: no-op
    status = client.get_cuda_shared_memory_status()
    assert (status == [] if isinstance(status, list) else len(status.regions) == 0)
    _refused(lambda: client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64), CUDA_TEXT,
             code="UNIMPLEMENTED")


def test_a_server_without_shared_memory_says_so(
        server_factory: Callable[..., RunningServer], repository: Path, region: Any) -> None:
    off = server_factory(repository, "--no-shared-memory")
    for triton in (httpclient.InferenceServerClient(off.url),
                   grpcclient.InferenceServerClient(off.grpc_url)):
        _refused(lambda t=triton: t.register_system_shared_memory("r", "/region" + TAG, 64),
                 "shared memory is off on this server")
        _refused(lambda t=triton: t.infer("simple", _inputs(t, (True, True))),
                 "--shared-memory turns it on")
        metadata = triton.get_server_metadata()
        extensions = (metadata["extensions"] if isinstance(metadata, dict)
                      else metadata.extensions)
        assert "system_shared_memory" not in extensions


def _maps(server: RunningServer) -> str:
    """What the server holds open or mapped."""
    fds = Path(f"/proc/{server.process.pid}/fd")
    links = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed while looking
            links.append(os.readlink(fd))
    return Path(f"/proc/{server.process.pid}/maps").read_text() + "\n".join(links)


def test_objects_go_on_unregister_and_at_exit(
        server_factory: Callable[..., RunningServer], repository: Path, region: Any) -> None:
    own = server_factory(repository)
    triton = httpclient.InferenceServerClient(own.url)
    triton.register_system_shared_memory("r", "/region" + TAG, 64)
    assert "region" + TAG in _maps(own)
    triton.unregister_system_shared_memory("r")
    assert "region" + TAG not in _maps(own)
    triton.register_system_shared_memory("r", "/region" + TAG, 64)
    triton.register_system_shared_memory("s", "/region" + TAG, 64, offset=64)
    assert own.stop() == 0
    assert '"msg":"shared memory released","regions":2' in own.log()


def test_tokens_that_may_infer_may_use_regions(
        server_factory: Callable[..., RunningServer], repository: Path, region: Any,
        tmp_path: Path) -> None:
    from tests.integration.test_auth import _token
    tokens_file = tmp_path / "tokens.yaml"
    reader, inferrer = _token(tokens_file, "read"), _token(tokens_file, "infer:simple")
    secured = server_factory(repository, "--auth-tokens", str(tokens_file))
    path = "/v2/systemsharedmemory/region/r/register"
    body = orjson.dumps({"key": "/region" + TAG, "offset": 0, "byte_size": 64})
    assert call(secured.url, "POST", path, body).status == 401
    denied = call(secured.url, "POST", path, body, {"Authorization": f"Bearer {reader}"})
    assert denied.status == 403 and "may not use shared memory" in denied.error
    assert call(secured.url, "POST", path, body,
                {"Authorization": f"Bearer {inferrer}"}).status == 200
    triton = grpcclient.InferenceServerClient(secured.grpc_url)
    _refused(lambda: triton.get_system_shared_memory_status(
        headers={"authorization": f"Bearer {reader}"}), "may not use shared memory",
        code="PERMISSION_DENIED")
    status = triton.get_system_shared_memory_status(
        headers={"authorization": f"Bearer {inferrer}"})
    assert list(status.regions) == ["r"]


def test_grpc_streams_take_shared_memory_too(server: RunningServer, region: Any) -> None:
    import queue
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    triton.register_system_shared_memory("shm", "/region" + TAG, 256)
    answers: queue.Queue[Any] = queue.Queue()
    triton.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        triton.async_stream_infer("simple", _inputs(triton, (True, True)),
                                  outputs=[_output(triton, "OUTPUT0", 64),
                                           _output(triton, "OUTPUT1")])
        result, error = answers.get(timeout=30)
    finally:
        triton.stop_stream()
        triton.unregister_system_shared_memory()
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [1, 16],
                                                            offset=128), A + B)


def test_an_object_shrunk_under_the_server_never_brings_it_down(
        server_factory: Callable[..., RunningServer], repository: Path, region: Any) -> None:
    """A client truncates its object and grows it back, over and over, while its requests
    read from it: each answer is a sum (of whatever bytes the object held as it was read) or
    a 400 saying the region is short, and the server lives. (Reading a mapping past its
    object's end raises SIGBUS and kills the process.)"""
    own = server_factory(repository)
    triton = httpclient.InferenceServerClient(own.url)
    triton.register_system_shared_memory("shm", "/region" + TAG, 256)
    path = Path("/dev/shm") / ("region" + TAG)
    stop = threading.Event()

    def shrink_and_grow() -> None:
        with path.open("r+b") as handle:
            while not stop.is_set():
                os.ftruncate(handle.fileno(), 0)
                os.ftruncate(handle.fileno(), 256)
                handle.seek(0)
                handle.write(A.tobytes() + B.tobytes())
                handle.flush()

    thread = threading.Thread(target=shrink_and_grow)
    thread.start()
    answered = refused = 0
    try:
        for _ in range(300):
            try:
                result = triton.infer("simple", _inputs(triton, (True, True)))
            except InferenceServerException as exc:
                assert str(exc.status()) == "400", exc.message()
                assert "region 'shm'" in exc.message()
                refused += 1
            else:
                assert result.as_numpy("OUTPUT0").shape == (1, 16)
                answered += 1
    finally:
        stop.set()
        thread.join()
    assert refused and answered
    assert triton.is_server_live()
