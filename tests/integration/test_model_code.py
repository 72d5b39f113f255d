"""A Python model's own failures, served for real: sys.exit() and KeyboardInterrupt in its
load, infer or unload fail that load or request (the server goes on, and still stops on its
signal), and what infer() raises reaches the client as the model's own error, the log as one
line."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration

CONFIG = """\
backend: python
max_batch_size: 8
inputs:
  - {name: x, datatype: FP32, dims: [4]}
outputs:
  - {name: y, datatype: FP32, dims: [4]}
"""

MODELS = {
    "ok": "class Model:\n    def load(self, ctx): pass\n"
          "    def infer(self, inputs): return {'y': inputs['x']}\n",
    "exit_infer": "import sys\nclass Model:\n    def load(self, ctx): pass\n"
                  "    def infer(self, inputs): sys.exit(5)\n",
    "interrupt_infer": "class Model:\n    def load(self, ctx): pass\n"
                       "    def infer(self, inputs): raise KeyboardInterrupt()\n",
    "exit_load": "import sys\nclass Model:\n    def load(self, ctx): sys.exit(3)\n"
                 "    def infer(self, inputs): return inputs\n",
    "interrupt_load": "class Model:\n    def load(self, ctx): raise KeyboardInterrupt()\n"
                      "    def infer(self, inputs): return inputs\n",
    "exit_import": "import sys\nsys.exit(4)\n",
    "exit_unload": "import sys\nclass Model:\n    def load(self, ctx): pass\n"
                   "    def infer(self, inputs): return {'y': inputs['x']}\n"
                   "    def unload(self): sys.exit(6)\n",
    "raises": "class Model:\n    def load(self, ctx): pass\n"
              "    def infer(self, inputs): raise ValueError('bad x: ' + 'q' * 5000)\n",
    "wrong_outputs": "class Model:\n    def load(self, ctx): pass\n"
                     "    def infer(self, inputs): return {'zzz': inputs['x']}\n",
    "exit_stream": "import sys\nclass Model:\n    def load(self, ctx): pass\n"
                   "    def infer(self, inputs):\n        yield {'y': inputs['x']}\n"
                   "        sys.exit(7)\n",
}
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("model_code")
    for name, source in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.yaml").write_text(CONFIG)
        (root / name / "1" / "model.py").write_text(source)
    return server_factory(root, "--allow-python-models", "--model-control", "explicit")


def _load(server: RunningServer, name: str) -> tuple[int, str]:
    reply = call(server.url, "POST", f"/v2/repository/models/{name}/load")
    return reply.status, (reply.error if reply.status != 200 else "")


def _alive(server: RunningServer) -> None:
    assert server.process.poll() is None, server.log()
    assert _load(server, "ok") == (200, "")
    assert infer(server.url, "ok", X).status == 200


@pytest.mark.parametrize(("model", "raised"), [
    ("exit_infer", "SystemExit(5)"), ("interrupt_infer", "KeyboardInterrupt")])
def test_exit_in_infer_fails_the_request_only(server: RunningServer, model: str,
                                              raised: str) -> None:
    assert _load(server, model) == (200, "")
    reply = infer(server.url, model, X)
    assert reply.status == 500 and f"infer() raised {raised}" in reply.error
    _alive(server)


@pytest.mark.parametrize(("model", "raised"), [
    ("exit_load", "SystemExit(3)"), ("interrupt_load", "KeyboardInterrupt"),
    ("exit_import", "SystemExit(4)")])
def test_exit_in_load_fails_the_load(server: RunningServer, model: str, raised: str) -> None:
    status, error = _load(server, model)
    assert status == 400 and raised in error
    _alive(server)


def test_exit_in_unload_does_not_stop_the_server(server: RunningServer) -> None:
    assert _load(server, "exit_unload") == (200, "")
    assert call(server.url, "POST", "/v2/repository/models/exit_unload/unload").status == 200
    _alive(server)
    assert "model's unload() failed" in server.log()


def test_exit_in_a_streaming_model_fails_its_stream(server: RunningServer) -> None:
    assert _load(server, "exit_stream") == (200, "")
    reply = call(server.url, "POST", "/v2/models/exit_stream/generate_stream",
                 b'{"x": [1, 2, 3, 4]}')
    assert b"SystemExit(7)" in reply.body, reply.body
    _alive(server)


def test_a_raising_model_answers_with_its_own_error(server: RunningServer) -> None:
    assert _load(server, "raises") == (200, "")
    reply = infer(server.url, "raises", X)
    assert reply.status == 500
    assert "model 'raises': infer() raised ValueError: bad x: qqq" in reply.error
    assert len(reply.error) < 600 and "Traceback" not in reply.error
    assert "/serval/" not in reply.error
    log = server.log()
    assert "infer() raised ValueError" in log
    assert "batcher.py" not in log and "Traceback" not in log  # one line, no traceback


def test_wrong_outputs_are_named_to_the_client(server: RunningServer) -> None:
    assert _load(server, "wrong_outputs") == (200, "")
    reply = infer(server.url, "wrong_outputs", X)
    assert reply.status == 500
    assert "infer() must return a dict with ['y'], got ['zzz']" in reply.error


def test_the_server_still_stops_on_sigint(server_factory: Callable[..., RunningServer],
                                          tmp_path: Path) -> None:
    (tmp_path / "ok" / "1").mkdir(parents=True)
    (tmp_path / "ok" / "config.yaml").write_text(CONFIG)
    (tmp_path / "ok" / "1" / "model.py").write_text(MODELS["ok"])
    stopped = server_factory(tmp_path, "--allow-python-models")
    assert infer(stopped.url, "ok", X).status == 200
    stopped.process.send_signal(signal.SIGINT)
    assert stopped.process.wait(timeout=30) == 0
