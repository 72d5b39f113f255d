"""Bearer tokens with scopes on a real server: 401 vs 403, open health checks, gRPC too."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def _token(tokens: Path, *scopes: str) -> str:
    args = [arg for scope in scopes for arg in ("--scope", scope)]
    result = subprocess.run([sys.executable, "-m", "serval", "token", "create", "--tokens-file",
                             str(tokens), "--name", "-".join(scopes), *args],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.strip()


@pytest.fixture(scope="module")
def secured(server_factory: Callable[..., RunningServer],
            tmp_path_factory: pytest.TempPathFactory) -> tuple[RunningServer, dict[str, str]]:
    root = tmp_path_factory.mktemp("secured")
    fixture_models.linear(root)
    fixture_models.add_sub(root)
    tokens_file = root.parent / f"{root.name}-tokens.yaml"
    tokens = {"read": _token(tokens_file, "read"), "infer": _token(tokens_file, "infer:lin*"),
              "admin": _token(tokens_file, "admin")}
    assert all(secret not in tokens_file.read_text() for secret in tokens.values())
    return server_factory(root, "--auth-tokens", str(tokens_file), "--repository-api"), tokens


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _grpc_bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}  # gRPC metadata keys are lower case


def test_health_stays_open_everything_else_needs_a_token(
    secured: tuple[RunningServer, dict[str, str]]
) -> None:
    server, tokens = secured
    assert call(server.url, "GET", "/v2/health/ready").status == 200
    missing = call(server.url, "GET", "/v2/models/linear")
    assert missing.status == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert call(server.url, "GET", "/v2/models/linear", headers=_bearer("forged")).status == 401
    assert call(server.url, "GET", "/metrics").status == 401
    assert call(server.url, "GET", "/metrics", headers=_bearer(tokens["read"])).status == 200
    with grpc.insecure_channel(server.grpc_url) as channel:  # grpc.health.v1 too (probes)
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"", timeout=30) == b"\x08\x01"  # SERVING
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="linear"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_scopes_decide_403(secured: tuple[RunningServer, dict[str, str]]) -> None:
    server, tokens = secured
    assert infer(server.url, "linear", X, _bearer(tokens["infer"])).status == 200
    denied = infer(server.url, "add_sub", X, _bearer(tokens["infer"]))
    assert denied.status == 403 and "may not infer on model 'add_sub'" in denied.error
    assert infer(server.url, "linear", X, _bearer(tokens["read"])).status == 403
    assert call(server.url, "GET", "/v2/models/linear",
                headers=_bearer(tokens["infer"])).status == 200  # may read what it may run
    load = "/v2/repository/models/linear/load"
    assert call(server.url, "POST", load, headers=_bearer(tokens["read"])).status == 403
    assert call(server.url, "POST", load, headers=_bearer(tokens["admin"])).status == 200


def test_generate_needs_infer_and_settings_need_admin_to_change(
        secured: tuple[RunningServer, dict[str, str]]) -> None:
    server, tokens = secured
    body = b'{"x": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]}'
    for action in ("generate", "generate_stream"):
        path = f"/v2/models/linear/{action}"
        assert call(server.url, "POST", path, body).status == 401
        assert call(server.url, "POST", path, body, _bearer(tokens["read"])).status == 403
        assert call(server.url, "POST", path, body, _bearer(tokens["infer"])).status == 200
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/linear/trace/setting"):
        assert call(server.url, "GET", path).status == 401
        assert call(server.url, "GET", path, headers=_bearer(tokens["read"])).status == 200
        assert call(server.url, "POST", path, b"{}", _bearer(tokens["read"])).status == 403
        assert call(server.url, "POST", path, b"{}", _bearer(tokens["admin"])).status == 200


def test_authorization_then_the_model_then_the_body(
    secured: tuple[RunningServer, dict[str, str]]
) -> None:
    """An empty body: 401 without a token, 403 out of scope, 404 for an unknown model in
    scope, and only then 400 for the body itself; the same order over gRPC."""
    server, tokens = secured
    may_run_lin = _bearer(tokens["infer"])  # infer:lin*
    assert call(server.url, "POST", "/v2/models/nope/infer", b"").status == 401
    assert call(server.url, "POST", "/v2/models/nope/infer", b"", may_run_lin).status == 403
    unknown = call(server.url, "POST", "/v2/models/linx/infer", b"", may_run_lin)
    assert unknown.status == 404
    assert "Request for unknown model: 'linx' is not found" in unknown.error
    assert call(server.url, "POST", "/v2/models/linear/infer", b"", may_run_lin).status == 400
    metadata = tuple(_grpc_bearer(tokens["infer"]).items())
    cases = [("nope", (), grpc.StatusCode.UNAUTHENTICATED),
             ("nope", metadata, grpc.StatusCode.PERMISSION_DENIED),
             ("linx", metadata, grpc.StatusCode.NOT_FOUND),
             ("linear", metadata, grpc.StatusCode.INVALID_ARGUMENT)]
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for model, sent, code in cases:
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(service_pb2.ModelInferRequest(model_name=model), metadata=sent,
                                timeout=30)
            assert caught.value.code() == code, (model, caught.value.details())


def test_tritonclient_with_tokens(secured: tuple[RunningServer, dict[str, str]]) -> None:
    server, tokens = secured
    x = np.ones((1, 8), dtype=np.float32)
    http = triton.InferenceServerClient(server.url)
    http_input = triton.InferInput("x", [1, 8], "FP32")
    http_input.set_data_from_numpy(x)
    result = http.infer("linear", [http_input], headers=_bearer(tokens["infer"]))
    assert result.as_numpy("probabilities").shape == (1, 4)
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_url)
    grpc_input = triton_grpc.InferInput("x", [1, 8], "FP32")
    grpc_input.set_data_from_numpy(x)
    assert grpc_client.is_server_live()  # open without a token
    result = grpc_client.infer("linear", [grpc_input], headers=_grpc_bearer(tokens["infer"]))
    assert result.as_numpy("probabilities").shape == (1, 4)
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpc_client.infer("linear", [grpc_input])
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
        grpc_client.get_model_metadata("add_sub", headers=_grpc_bearer(tokens["infer"]))


def test_unknown_scopes_are_refused(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "serval", "token", "create", "--tokens-file",
                             str(tmp_path / "t.yaml"), "--scope", "root"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown scope 'root'" in result.stderr


@pytest.mark.parametrize(("scopes", "message"), [
    ("admin", "scopes must be a list, such as [admin]"),
    ('"infer:*"', "scopes must be a list"),
    ("[admn]", "unknown scope 'admn'"),
    ("[read, 5]", "unknown scope '5'"),
])
def test_a_hand_edited_tokens_file_with_bad_scopes_stops_the_server(
        tmp_path: Path, scopes: str, message: str) -> None:
    """Such a token granted nothing, silently (`scopes: admin` read as a, d, m, i, n): the
    operator met 403s with no word of why."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"tokens:\n  - name: ops\n    sha256: '{'0' * 64}'\n    scopes: {scopes}\n")
    result = subprocess.run([sys.executable, "-m", "serval", "serve", "-r", str(tmp_path),
                             "--auth-tokens", str(tokens)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "token 'ops'" in result.stderr and message in result.stderr
