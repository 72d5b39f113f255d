"""System shared memory on a server with tokens: a client's regions are its own. Another
token that may infer (on the same model, even) must not read a region's bytes through a
model, write its outputs into it, unregister it or see it in the status; an admin sees all."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests import triton_examples
from tests.conftest import RunningServer
from tests.integration.test_auth import _token
from tests.security.conftest import Factory

pytestmark = pytest.mark.integration
TAG = f"_serval_tenants_{os.getpid()}"
SECRET = np.arange(100, 116, dtype=np.int32).reshape(1, 16)
ZEROS = np.zeros((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def tenants(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[RunningServer, dict[str, str]]:
    root: Path = tmp_path_factory.mktemp("tenants")
    triton_examples.build(root / "models")
    tokens_file = root / "tokens.yaml"
    tokens = {"alice": _token(tokens_file, "infer:simple*"),
              "bob": _token(tokens_file, "infer:simple"),
              "admin": _token(tokens_file, "admin")}
    return server_factory(root / "models", "--auth-tokens", str(tokens_file)), tokens


@pytest.fixture
def alices_object() -> Iterator[Any]:
    """128 bytes: SECRET, then room for an output."""
    handle = shm.create_shared_memory_region("secret", "/secret" + TAG, 128)
    shm.set_shared_memory_region(handle, [SECRET])
    yield handle
    shm.destroy_shared_memory_region(handle)


def _client(server: RunningServer, transport: str) -> Any:
    if transport == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _headers(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def _names(client: Any, secret: str) -> list[str]:
    answer = client.get_system_shared_memory_status(headers=_headers(secret))
    return sorted(r["name"] for r in answer) if isinstance(answer, list) else sorted(
        answer.regions)


def _infer(client: Any, secret: str, input_in_shm: bool, output_in_shm: bool) -> Any:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    first, second = (module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1"))
    if input_in_shm:
        first.set_shared_memory("secret", 64)
    else:
        first.set_data_from_numpy(ZEROS)
    second.set_data_from_numpy(ZEROS)
    output = module.InferRequestedOutput("OUTPUT0")
    if output_in_shm:
        output.set_shared_memory("secret", 64, offset=64)
    return client.infer("simple", [first, second], outputs=[output], headers=_headers(secret))


def _not_found(call_it: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call_it()
    assert str(caught.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "Unable to find system shared memory region: 'secret'" in caught.value.message()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_another_token_cannot_reach_a_clients_region(
        tenants: tuple[RunningServer, dict[str, str]], alices_object: Any,
        transport: str) -> None:
    server, tokens = tenants
    client = _client(server, transport)
    alice, bob = tokens["alice"], tokens["bob"]
    client.register_system_shared_memory("secret", "/secret" + TAG, 128,
                                         headers=_headers(alice))
    try:
        _infer(client, alice, input_in_shm=True, output_in_shm=True)  # hers to use
        assert shm.get_contents_as_numpy(alices_object, np.int32, [1, 16], offset=64
                                         ).tolist() == SECRET.tolist()
        assert _names(client, bob) == []
        _not_found(lambda: client.get_system_shared_memory_status(
            "secret", headers=_headers(bob)))
        _not_found(lambda: _infer(client, bob, input_in_shm=True, output_in_shm=False))
        _not_found(lambda: _infer(client, bob, input_in_shm=False, output_in_shm=True))
        client.unregister_system_shared_memory("secret", headers=_headers(bob))
        client.unregister_system_shared_memory(headers=_headers(bob))  # all of bob's: none
        assert _names(client, alice) == ["secret"]
        assert _names(client, tokens["admin"]) == ["secret"]
        assert shm.get_contents_as_numpy(alices_object, np.int32, [1, 16], offset=64
                                         ).tolist() == SECRET.tolist()
    finally:
        client.unregister_system_shared_memory(headers=_headers(tokens["admin"]))
    assert _names(client, alice) == []


def test_one_token_cannot_take_every_region(
        tenants: tuple[RunningServer, dict[str, str]], alices_object: Any) -> None:
    """A token holds at most 64 of the server's 256 regions: the others' stay to be had."""
    server, tokens = tenants
    client = httpclient.InferenceServerClient(server.url)
    alice = _headers(tokens["alice"])
    try:
        for index in range(64):
            client.register_system_shared_memory(f"r{index}", "/secret" + TAG, 64,
                                                 headers=alice)
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("r64", "/secret" + TAG, 64, headers=alice)
        assert str(caught.value.status()) == "400"
        assert "a token may hold at most 64 shared memory regions" in caught.value.message()
        client.register_system_shared_memory("bobs", "/secret" + TAG, 64,
                                             headers=_headers(tokens["bob"]))
        assert _names(client, tokens["bob"]) == ["bobs"]
        assert len(_names(client, tokens["alice"])) == 64
    finally:
        client.unregister_system_shared_memory(headers=_headers(tokens["admin"]))


def test_a_grpc_stream_reaches_its_own_tokens_regions_only(
        tenants: tuple[RunningServer, dict[str, str]], alices_object: Any) -> None:
    """Each stream request is served as the stream's token: the owner's request reads her
    region, another token's stream finds no such region."""
    import queue
    server, tokens = tenants
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory("secret", "/secret" + TAG, 128,
                                         headers=_headers(tokens["alice"]))
    try:
        for who, expected in (("alice", None), ("bob", "Unable to find system shared "
                                                       "memory region: 'secret'")):
            answers: queue.Queue[Any] = queue.Queue()
            stream = grpcclient.InferenceServerClient(server.grpc_url)
            stream.start_stream(callback=lambda result, error, answers=answers:
                                answers.put((result, error)), headers=_headers(tokens[who]))
            try:
                first, second = (grpcclient.InferInput(n, [1, 16], "INT32")
                                 for n in ("INPUT0", "INPUT1"))
                first.set_shared_memory("secret", 64)
                second.set_data_from_numpy(ZEROS)
                stream.async_stream_infer("simple", [first, second])
                result, error = answers.get(timeout=30)
            finally:
                stream.stop_stream()
            if expected is None:
                assert error is None, error
                assert result.as_numpy("OUTPUT0").tolist() == SECRET.tolist()
            else:
                assert error is not None and expected in str(error), (result, error)
    finally:
        client.unregister_system_shared_memory(headers=_headers(tokens["admin"]))
