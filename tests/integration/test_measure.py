"""serval loadtest / report / plan against a real server: counts, schedule, errors by kind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from serval.loadtest.open_loop import run_open_loop
from serval.loadtest.runner import LoadtestSpec, prepare_requests
from tests import fixture_models
from tests.conftest import RunningServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DECLARED = """\
backend: python
max_batch_size: 8
inputs:
  - {name: x, datatype: FP32, dims: [4]}
outputs:
  - {name: y, datatype: FP32, dims: [4]}
"""
RAISING = """\
class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        if not inputs["x"].any():  # the server's warm-up sends zeros: let it load
            return {"y": inputs["x"]}
        raise RuntimeError("fails on purpose")
"""
SLEEPING = """\
import time


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        time.sleep(0.6)
        return {"y": inputs["x"]}
"""


@pytest.fixture(scope="module")
def measured(server_factory: Callable[..., RunningServer],
             tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """A server of its own: `linear` (counted), a model that raises, a model that stalls."""
    root = tmp_path_factory.mktemp("measure")
    fixture_models.linear(root)
    for name, code in (("raises", RAISING), ("sleeps", SLEEPING)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.yaml").write_text(DECLARED)
        (root / name / "1" / "model.py").write_text(code)
    return server_factory(root, "--allow-python-models")


def _serval(*args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": str(columns)})


def _loadtest(server: RunningServer, out: Path, *args: str) -> dict[str, Any]:
    run = _serval("loadtest", server.base, "--model", "linear", "--no-ceiling",
                  "-o", str(out), *args)
    assert run.returncode == 0, run.stderr + run.stdout
    return dict(orjson.loads(out.read_bytes()))


def _successes(server: RunningServer, model: str = "linear") -> int:
    with urllib.request.urlopen(f"{server.base}/v2/models/{model}/stats") as reply:
        stats = orjson.loads(reply.read())["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def test_counts_match_the_servers_statistics(measured: RunningServer, tmp_path: Path) -> None:
    before = _successes(measured)
    results = _loadtest(measured, tmp_path / "closed.json", "--concurrency", "1,8",
                        "--rate", "150", "--duration", "0.8", "--warmup", "0.2", "--json")
    after = _successes(measured)
    assert [s["mode"] for s in results["steps"]] == ["closed", "closed", "open"]
    assert all(s["errors"] == {} and s["requests"] > 0 for s in results["steps"])
    # the first request is sent alone before the steps (a check that the server takes it)
    assert results["first_request"] == {"ok": True, "status": "HTTP 200", "reason": ""}
    assert sum(s["answered"] for s in results["steps"]) + 1 == after - before
    step = results["steps"][1]
    assert step["concurrency"] == 8
    assert 0 < step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"] <= step["p999_ms"]
    assert step["cdf_ms"][0][0] == 0.0 and step["cdf_ms"][-1][0] == 100.0


def test_grpc_counts_match_the_servers_statistics(measured: RunningServer,
                                                  tmp_path: Path) -> None:
    before = _successes(measured)
    run = _serval("loadtest", measured.grpc_url, "--grpc", "--metadata-url", measured.base,
                  "--model", "linear", "--rate", "100", "--duration", "1", "--warmup", "0.2",
                  "-o", str(tmp_path / "grpc.json"))
    assert run.returncode == 0, run.stderr + run.stdout
    step = orjson.loads((tmp_path / "grpc.json").read_bytes())["steps"][0]
    assert step["errors"] == {} and step["answered"] + 1 == _successes(measured) - before
    assert step["throughput_rps"] == pytest.approx(100, rel=0.05)
    before = _successes(measured)
    closed = _serval("loadtest", measured.grpc_url, "--grpc", "--metadata-url", measured.base,
                     "--model", "linear", "--concurrency", "2", "--duration", "0.5",
                     "--warmup", "0.1", "-o", str(tmp_path / "grpc-closed.json"))
    assert closed.returncode == 0, closed.stderr + closed.stdout
    step = orjson.loads((tmp_path / "grpc-closed.json").read_bytes())["steps"][0]
    assert step["mode"] == "closed" and step["requests"] > 0 and step["errors"] == {}
    assert step["answered"] + 1 == _successes(measured) - before  # + the first, alone


def test_open_loop_holds_its_schedule(measured: RunningServer) -> None:
    spec = LoadtestSpec(url=measured.base, model="linear")
    requests = prepare_requests(spec)
    result = run_open_loop("127.0.0.1", measured.port, requests, rate_rps=400.0,
                           duration_s=2.0, warmup_s=0.5)
    assert result.errors == {}
    assert result.throughput_rps == pytest.approx(400.0, rel=0.02)
    assert result.requests == pytest.approx(800, abs=4)  # due inside the 2 s window


def test_a_stall_shows_in_open_loop_latency(measured: RunningServer) -> None:
    """Measured from the due time: requests queued behind a 0.6 s call wait for it."""
    spec = LoadtestSpec(url=measured.base, model="sleeps")
    result = run_open_loop("127.0.0.1", measured.port, prepare_requests(spec), rate_rps=5.0,
                           duration_s=1.0, warmup_s=0.0, max_connections=1)
    assert result.requests >= 2 and result.errors == {}
    # with one connection, request k waits for the k before it: p99 far above one call
    assert result.p99_ms > 1500


def test_errors_are_counted_by_kind(measured: RunningServer, tmp_path: Path) -> None:
    failing = _serval("loadtest", measured.base, "--model", "raises", "--no-ceiling",
                      "--concurrency", "2", "--rate", "50", "--duration", "0.5",
                      "--warmup", "0", "-o", str(tmp_path / "raises.json"))
    # a run without a single success fails, on one line with the first answer's reason;
    # its results are written all the same
    assert failing.returncode != 0
    assert re.fullmatch(r"serval: no request succeeded \(errors: http_500 x\d+\); the first "
                        r"answer was HTTP 500: model 'raises': infer\(\) raised RuntimeError: "
                        r"fails on purpose \(request id \w+; details are in the server log\)",
                        failing.stderr.strip())
    steps = orjson.loads((tmp_path / "raises.json").read_bytes())["steps"]
    assert all(s["requests"] == 0 and s["errors"].get("http_500", 0) > 0 for s in steps)
    refused = _serval("loadtest", f"http://127.0.0.1:{free_port()}", "--model", "linear",
                      "--no-ceiling", "--input-file", str(_sample(tmp_path)),
                      "--concurrency", "2", "--rate", "40", "--duration", "0.5",
                      "--warmup", "0", "-o", str(tmp_path / "refused.json"))
    # nothing listening: nothing to measure, said on one line (the generators count refused
    # connections of a server that goes away mid-run: test_loadtest.py)
    assert refused.returncode != 0 and not (tmp_path / "refused.json").exists()
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("serval: HTTP 127.0.0.1:") and "refused" in line
    stalled = _serval("loadtest", measured.base, "--model", "sleeps", "--no-ceiling",
                      "--concurrency", "1", "--duration", "0.5", "--warmup", "0",
                      "--timeout", "0.2", "-o", str(tmp_path / "sleeps.json"))
    assert stalled.returncode != 0  # every request timed out: no success
    assert "no request succeeded (errors: timeout x" in stalled.stderr
    assert "the first answer was timeout" in stalled.stderr
    step = orjson.loads((tmp_path / "sleeps.json").read_bytes())["steps"][0]
    assert step["errors"].get("timeout", 0) >= 1 and step["requests"] == 0


def _sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.json"
    path.write_bytes(orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32",
                                               "shape": [1, 8], "data": [0.5] * 8}]}))
    return path


def test_a_sample_file_is_sent_as_given(measured: RunningServer, tmp_path: Path) -> None:
    results = _loadtest(measured, tmp_path / "sample.json.out", "--input-file",
                        str(_sample(tmp_path)), "--concurrency", "2", "--duration", "0.3",
                        "--warmup", "0")
    assert results["steps"][0]["requests"] > 0 and results["steps"][0]["errors"] == {}


def test_bad_flags_fail_with_one_line(measured: RunningServer) -> None:
    run = _serval("loadtest", measured.base, "--model", "missing", "--no-ceiling")
    assert run.returncode == 2 and "HTTP 404" in run.stderr
    run = _serval("loadtest", measured.base, "--model", "linear", "--concurrency", "a,b")
    assert run.returncode == 2 and "--concurrency" in run.stderr


def test_report_and_plan_from_real_results(measured: RunningServer, tmp_path: Path) -> None:
    from PIL import Image

    runs = []
    for hardware in ("c6a.large", "t3a.xlarge"):
        out = tmp_path / f"{hardware}.json"
        _loadtest(measured, out, "--concurrency", "1,4", "--duration", "0.3", "--warmup", "0",
                  "--hardware", hardware)
        runs.append(out)
    report = _serval("report", *map(str, runs), "-o", str(tmp_path / "report.html"))
    assert report.returncode == 0, report.stderr
    with Image.open(tmp_path / "report.png") as image:
        assert image.format == "PNG" and image.size[0] > 500
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and page.count("<table>") == 2
    # without --label a run is named by its model, protocol and hardware, never hardware alone
    assert "<h2>linear (http) on c6a.large</h2>" in page
    # without -o: report.html here, and never over an existing one
    here = tmp_path / "here"
    here.mkdir()
    for attempt in range(2):
        default = subprocess.run([sys.executable, "-m", "serval", "report", *map(str, runs)],
                                 capture_output=True, text=True, timeout=120, cwd=here)
        if attempt == 0:
            assert default.returncode == 0 and (here / "report.html").is_file()
    assert default.returncode != 0
    assert default.stderr.strip() == ("serval: report.html or report.png exists here; name the "
                                      "report with -o (an existing file given with -o is "
                                      "replaced)")
    plan = _serval("plan", *map(str, runs), "--slo-p99-ms", "1000", "--target-rps", "5000",
                   "--chart", str(tmp_path / "plan.png"))
    assert plan.returncode == 0, plan.stderr
    assert "c6a.large" in plan.stdout and "t3a.xlarge" in plan.stdout
    with Image.open(tmp_path / "plan.png") as image:
        assert image.format == "PNG"


def test_tables_keep_every_value_whole_off_a_terminal(measured: RunningServer,
                                                      tmp_path: Path) -> None:
    """Piped at 80 columns: the table shows each figure whole; json and md carry the rows."""
    runs = []
    for hardware in ("c6a.large", "t3a.xlarge"):
        out = tmp_path / f"{hardware}.json"
        run = _serval("loadtest", measured.base, "--model", "linear", "--no-ceiling",
                      "--concurrency", "1,2", "--duration", "300ms", "--warmup", "0s",
                      "--hardware", hardware, "-o", str(out), "--format", "json", columns=80)
        assert run.returncode == 0, run.stderr
        steps = orjson.loads(out.read_bytes())["steps"]
        rows = orjson.loads(run.stdout)  # progress and verdicts went to stderr
        assert [r["load"] for r in rows] == ["c=1", "c=2"]
        assert [r["throughput_rps"] for r in rows] == [s["throughput_rps"] for s in steps]
        assert [r["requests"] for r in rows] == [s["requests"] for s in steps]
        runs.append(out)
    table = _serval("loadtest", measured.base, "--model", "linear", "--no-ceiling",
                    "--concurrency", "2", "--duration", "0.3", "--warmup", "0",
                    "-o", str(tmp_path / "t.json"), columns=80)
    assert table.returncode == 0, table.stderr
    step = orjson.loads((tmp_path / "t.json").read_bytes())["steps"][0]
    for figure in (f"{step['requests']:,}", f"{step['throughput_rps']:,.1f}",
                   f"{step['p99_ms']:.2f}", f"{step['p999_ms']:.2f}"):
        assert figure in table.stdout, (figure, table.stdout)

    args = [*map(str, runs), "--slo-p99-ms", "1s", "--target-rps", "123456"]
    rows = orjson.loads(_serval("plan", *args, "--format", "json", columns=80).stdout)
    assert {r["hardware"] for r in rows} == {"c6a.large", "t3a.xlarge"}
    shown = _serval("plan", *args, columns=80).stdout
    assert "\u2026" not in shown
    for row in rows:
        assert f"{row['rps_at_slo']:,.1f}" in shown and f"{row['usd_per_month']:,.2f}" in shown
        assert f"{row['usd_per_million']:.4f}" in shown
    md = _serval("plan", *args, "--format", "md", columns=80).stdout.splitlines()
    body = [line for line in md if line.startswith("|")]
    assert body[0].startswith("| model | hardware |") and set(body[1]) <= set("|-:")
    assert len(body) == 2 + len(rows)
    assert all(f"| {row['replicas']} |" in "".join(body) for row in rows)
