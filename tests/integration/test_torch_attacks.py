"""TorchScript models given inputs their config lets through (-1 dims, any integer ids) but
their program cannot compute on, against a real server: the sender gets a 400 saying why,
without the TorchScript source or file paths, and the requests batched with it are answered."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import RunningServer
from tests.integration.http_helpers import infer

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
Factory = Callable[..., RunningServer]

# max_batch_size 2 and a long delay: two single-row requests always run as one batch
CONFIG = """\
backend: pytorch
max_batch_size: {batch}
batching: {{max_queue_delay_ms: 10000}}
inputs: [{{name: X, datatype: {datatype}, dims: [-1]}}]
outputs: [{{name: Y, datatype: {out_datatype}, dims: {out}}}]
"""


class Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class ArgMax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(dim=1)  # int64


def _save(root: Path, name: str, module: torch.nn.Module, config: str) -> None:
    folder = root / name / "1"
    folder.mkdir(parents=True)
    torch.jit.script(module).save(str(folder / "model.pt"))
    (root / name / "config.yaml").write_text(config)


@pytest.fixture(scope="module")
def server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("torch-attacks")
    _save(root, "embed", Embed(), CONFIG.format(batch=2, datatype="INT64", out="[-1, 4]",
                                                out_datatype="FP32"))
    one = {"batch": 1, "out": "[2]", "out_datatype": "FP32"}
    _save(root, "linear", Linear(), CONFIG.format(datatype="FP32", **one))
    _save(root, "wrong_dtype", Linear(), CONFIG.format(datatype="FP64", **one))
    as_int = {"batch": 1, "out": "[]", "out_datatype": "INT32", "datatype": "FP32"}
    _save(root, "argmax", ArgMax(), CONFIG.format(**as_int))
    _save(root, "float_as_int", Linear(), CONFIG.format(**{**as_int, "out": "[2]"}))
    return server_factory(root)


def _ids(values: list[int]) -> dict[str, object]:
    return {"inputs": [{"name": "X", "datatype": "INT64", "shape": [1, len(values)],
                        "data": values}]}


def test_ids_outside_the_table_fail_only_their_own_request_of_the_batch(
        server: RunningServer) -> None:
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(infer, server.url, "embed", _ids([1, 99]))
        good = pool.submit(infer, server.url, "embed", _ids([1, 2]))
        bad_reply, good_reply = bad.result(timeout=60), good.result(timeout=60)
    assert good_reply.status == 200, good_reply.body
    assert good_reply.json()["outputs"][0]["shape"] == [1, 2, 4]
    assert bad_reply.status == 400, bad_reply.body
    error = bad_reply.json()["error"]
    assert "index out of range" in error
    assert "/" not in error and "forward" not in error  # no TorchScript source, no paths


def test_a_size_the_program_cannot_take_is_a_400_naming_it(server: RunningServer) -> None:
    reply = infer(server.url, "linear", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]})
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert "shapes cannot be multiplied (1x3 and 4x2)" in error
    assert "/" not in error
    ok = infer(server.url, "linear", {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]})
    assert ok.status == 200, ok.body


def test_a_config_whose_dtype_the_program_refuses_stays_a_server_error(
        server: RunningServer) -> None:
    reply = infer(server.url, "wrong_dtype", {"inputs": [
        {"name": "X", "datatype": "FP64", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]})
    assert reply.status == 500, reply.body  # the config's fault, not the client's


def test_an_output_of_another_datatype_than_declared_is_not_served(
        server: RunningServer) -> None:
    for model, made in (("argmax", "int64"), ("float_as_int", "float32")):
        reply = infer(server.url, model, {"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 5.0, 3.0, 2.0]}]})
        assert reply.status == 500, reply.body
        assert f"output 'Y' is {made}, its config declares INT32" in server.log()
