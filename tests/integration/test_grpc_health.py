"""grpc.health.v1.Health on the gRPC port (as Triton answers it): what Kubernetes' `grpc`
probes, grpc_health_probe and grpc's client-side health checking call. A real grpcio client;
the messages are written and read here byte for byte from the protocol's definition (field 1:
the service name; field 1: the status, SERVING = 1, NOT_SERVING = 2)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests import fixture_models
from tests.conftest import RunningServer

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"


def _request(service: str) -> bytes:
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name if name else b""


def _check(server: RunningServer, service: str = "") -> bytes:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(CHECK, request_serializer=None, response_deserializer=None)
        return bytes(call(_request(service), timeout=10))


def _watch(channel: grpc.Channel, service: str = "") -> Iterator[bytes]:
    stream = channel.unary_stream(WATCH, request_serializer=None, response_deserializer=None)
    return iter(stream(_request(service), timeout=60))


@pytest.fixture(scope="module")
def served(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
           ) -> RunningServer:
    root = tmp_path_factory.mktemp("health")
    fixture_models.add_sub(root)
    return server_factory(root)


def test_a_ready_server_is_serving_for_the_whole_server_and_the_inference_service(
        served: RunningServer) -> None:
    assert _check(served) == SERVING
    assert _check(served, "inference.GRPCInferenceService") == SERVING


def test_any_service_name_gets_the_servers_status_as_triton_answers(
        served: RunningServer) -> None:
    """Triton answers every Check with its readiness, whatever the service: a probe set up
    against it with a service name passes here too."""
    assert _check(served, "triton") == SERVING


def test_a_server_whose_model_does_not_serve_is_not_serving(
        server_factory: Factory, tmp_path: Path) -> None:
    """Strict readiness (the default): a model that should serve and does not."""
    fixture_models.add_sub(tmp_path)
    fixture_models.corrupt(tmp_path)
    server = server_factory(tmp_path)
    assert _check(server) == NOT_SERVING
    assert _check(server, "inference.GRPCInferenceService") == NOT_SERVING


def test_watch_says_serving_then_not_serving_when_the_server_drains_then_ends(
        server_factory: Factory, tmp_path: Path) -> None:
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--drain-delay-s", "3")
    with grpc.insecure_channel(server.grpc_url) as channel:
        updates = _watch(channel)
        assert next(updates) == SERVING
        named = _watch(channel, "triton")
        assert next(named) == SERVING
        server.process.send_signal(signal.SIGTERM)
        assert next(updates) == NOT_SERVING  # while it drains (still answering)
        assert list(updates) == []  # and the call ends, OK, when the server stops
        assert next(named) == NOT_SERVING
        assert list(named) == []
    assert server.process.wait(timeout=30) == 0
