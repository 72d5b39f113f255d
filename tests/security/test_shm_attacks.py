"""System shared memory under a careless or hostile client, on a real server: windows whose
sizes disagree with their tensors' shapes are refused for what they are, before any byte of
them is read; sizes that are not integers and outputs asked for twice are named."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import triton_examples
from tests.conftest import RunningServer
from tests.integration.http_helpers import call
from tests.security.conftest import Factory

pytestmark = pytest.mark.integration
TAG = f"_serval_shm_attacks_{os.getpid()}"
HUGE_BYTES = 256 * 1024 * 1024  # more than the default receive budget (192 MiB)


@pytest.fixture(scope="module")
def server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root: Path = tmp_path_factory.mktemp("shm-attacks")
    return server_factory(triton_examples.build(root))


@pytest.fixture
def sparse_object() -> Iterator[str]:
    """A 256 MiB object that holds no memory (never written): its key."""
    key = "/huge" + TAG
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, HUGE_BYTES)
        yield key
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + key)


def test_a_window_larger_than_its_shape_is_refused_for_its_size(
        server: RunningServer, sparse_object: str) -> None:
    """A 64-byte tensor given a 256 MiB window: the answer names the 64 bytes its shape
    needs (before: that the server holds no 256 MiB copy, as if the copy were the point)."""
    client = httpclient.InferenceServerClient(server.url)
    client.register_system_shared_memory("huge", sparse_object, HUGE_BYTES)
    try:
        first, second = (httpclient.InferInput(n, [1, 16], "INT32")
                         for n in ("INPUT0", "INPUT1"))
        first.set_shared_memory("huge", HUGE_BYTES)
        second.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple", [first, second])
        assert str(caught.value.status()) == "400"
        assert (f"input 'INPUT0': INT32 shape [1, 16] needs 64 bytes, shared_memory_byte_size "
                f"is {HUGE_BYTES}") in caught.value.message()
    finally:
        client.unregister_system_shared_memory("huge")


def test_a_size_that_is_not_an_integer_is_named_for_what_it_is(
        server: RunningServer, sparse_object: str) -> None:
    """"64" (a string) and 64.0 are not the integer 64, and the error must not print them as
    if they were."""
    register = "/v2/systemsharedmemory/region/typed/register"
    for sent, shown in (('"64"', "got '64' (a string)"), ("64.0", "got 64.0 (a float)"),
                        ("true", "got True (a boolean)")):
        reply = call(server.url, "POST", register,
                     f'{{"key": "{sparse_object}", "byte_size": {sent}}}'.encode())
        assert reply.status == 400 and shown in reply.error, (sent, reply.error)
    client = httpclient.InferenceServerClient(server.url)
    client.register_system_shared_memory("typed", sparse_object, 64)
    try:
        body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "parameters": {
            "shared_memory_region": "typed", "shared_memory_byte_size": "64"}}
            for n in ("INPUT0", "INPUT1")]}
        reply = call(server.url, "POST", "/v2/models/simple/infer", orjson.dumps(body))
        assert reply.status == 400
        assert "'shared_memory_byte_size' must be a non-negative integer, got '64' (a " \
               "string)" in reply.error
    finally:
        client.unregister_system_shared_memory("typed")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_an_output_asked_for_twice_is_refused(server: RunningServer, sparse_object: str,
                                              transport: str) -> None:
    """OUTPUT0 into two places of a region: the answer could name only one of them (before,
    both were written and the answer named the last)."""
    module = httpclient if transport == "http" else grpcclient
    client = module.InferenceServerClient(server.url if transport == "http"
                                          else server.grpc_url)
    client.register_system_shared_memory("twice", sparse_object, 128)
    try:
        inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        outputs = [module.InferRequestedOutput("OUTPUT0") for _ in range(2)]
        for index, output in enumerate(outputs):
            output.set_shared_memory("twice", 64, offset=64 * index)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple", inputs, outputs=outputs)
        assert str(caught.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
        assert "output 'OUTPUT0' is asked for more than once" in caught.value.message()
    finally:
        client.unregister_system_shared_memory("twice")


def test_a_posix_semaphore_is_not_a_region(server: RunningServer) -> None:
    """sem_open keeps its semaphores in /dev/shm as sem.<name>, plain files the server's user
    may write: registered as a region, an output written into one would corrupt the lock of
    whatever process of that user holds it (the server's own Python models included)."""
    name = "sem.serval" + TAG
    fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 32)  # a sem_t's size
        client = httpclient.InferenceServerClient(server.url)
        for key in (name, "/" + name):
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("lock", key, 32)
            assert str(caught.value.status()) == "400"
            assert "names a POSIX semaphore (sem.*)" in caught.value.message()
        assert client.get_system_shared_memory_status() == []
    finally:
        os.close(fd)
        os.unlink("/dev/shm/" + name)
