"""`serval loadtest` as a user runs it: over gRPC with only the gRPC address, and a test whose
requests the server refuses fails at once with the server's reason (never exit 0 on errors)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import RunningServer

pytestmark = pytest.mark.integration

_QUICK = ["--duration", "0.5s", "--warmup", "0s", "-c", "2", "--no-ceiling", "--format", "json"]


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", "loadtest", *args],
                          capture_output=True, text=True, timeout=120)


def test_grpc_needs_only_the_grpc_address(server: RunningServer) -> None:
    done = _loadtest(server.grpc_url, "--grpc", "-m", "linear", *_QUICK)
    assert done.returncode == 0, done.stderr
    step = json.loads(done.stdout)[0]
    assert step["throughput_rps"] > 0 and not step["errors"]


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
def test_refused_requests_fail_with_the_servers_reason(server: RunningServer, tmp_path: Path,
                                                       grpc: bool) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 8],
                                           "data": [0.5] * 8}]}))
    target = server.grpc_url if grpc else f"http://{server.url}"
    done = _loadtest(target, *(["--grpc"] if grpc else []), "-m", "linear",
                     "--input-file", str(bad), *_QUICK)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "refused the test's first request" in lines[0]
    assert "INVALID_ARGUMENT" in lines[0] if grpc else "HTTP 400" in lines[0]
    assert "has no input 'nope'" in lines[0] and "Traceback" not in done.stderr


def test_a_grpc_test_against_the_http_port_says_so(server: RunningServer) -> None:
    done = _loadtest(server.url, "--grpc", "-m", "linear", *_QUICK)
    assert done.returncode != 0
    assert "is this a v2 gRPC port?" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no "Future exception..."


def test_an_unknown_model_over_grpc_is_named(server: RunningServer) -> None:
    done = _loadtest(server.grpc_url, "--grpc", "-m", "missing", *_QUICK)
    assert done.returncode != 0
    assert "model 'missing'" in done.stderr and "NOT_FOUND" in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["http://[::1", "-m", "m"], "Invalid IPv6 URL"),
    (["http://localhost:abc", "-m", "m"], "Port could not be cast to integer"),
    (["ftp://localhost:8000", "-m", "m"], "only http:// is supported, not ftp://"),
    (["localhost", "-m", "m"], "needs a host and a port"),
    (["localhost:1", "-m", "m", "--metadata-url", "http://x:y"], "'--metadata-url'"),
    (["localhost:1", "-m", "m", "-r", "nan"], "--rate 'nan': expected positive numbers"),
    (["localhost:1", "-m", "m", "-r", "inf"], "--rate 'inf': expected positive numbers"),
    (["localhost:1", "-m", "m", "-r", "1e12"], "--rate '1e12': at most 1,000,000"),
    (["localhost:1", "-m", "m", "-c", "1000000000"], "--concurrency '1000000000': at most "
     "10,000"),
    (["localhost:1", "-m", "m", "-c", "2.5"], "expected whole numbers"),
    (["localhost:1", "-m", "m", "--batch", "100000000"], "less than or equal to 65536"),
    (["localhost:1", "-m", "m", "--processes", "100000"], "less than or equal to 256"),
])
def test_bad_arguments_are_one_line_before_any_load(args: list[str], message: str) -> None:
    done = _loadtest(*args, "--no-ceiling")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# Ctrl-C at a terminal reaches a command whose SIGINT is not ignored. A test run started in the
# background by a script (`cmd &` without job control) ignores SIGINT, and every child inherits
# that: the loadtest never saw the signal (the "hang" of some full runs). So the command starts
# with Python's own handler, as at a terminal.
_DUMPABLE = ("import asyncio, faulthandler, runpy, signal, sys\n"
             "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
             "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
             "def tasks(*_):\n"  # what the event loop waits on, if one runs
             "    loop = asyncio._get_running_loop()\n"
             "    for task in asyncio.all_tasks(loop) if loop else ():\n"
             "        task.print_stack(file=sys.stderr)\n"
             "signal.signal(signal.SIGUSR2, tasks)\n"
             "sys.argv[0] = 'serval'\n"
             "runpy.run_module('serval', run_name='__main__')\n")


def test_ctrl_c_stops_a_closed_loop_run_with_one_line(server: RunningServer) -> None:
    import signal
    import urllib.request

    def answered() -> int:
        with urllib.request.urlopen(f"http://{server.url}/v2/models/linear/stats") as r:
            return sum(s["inference_count"] for s in json.load(r)["model_stats"])

    def clients(pid: int) -> int:
        """The loadtest's connections to the server: its clients, once its run has begun
        (the session's server also answers other tests' leftovers, so the count alone could
        rise before this process got that far, and Ctrl-C would land in its start-up)."""
        lines = subprocess.run(["ss", "-tnpH", "state", "established",
                                f"dport = :{server.port}"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        return sum(f"pid={pid}," in line for line in lines)

    before = answered()
    # the command line as `serval`; its event loop's tasks on SIGUSR2, its threads on SIGUSR1
    run = subprocess.Popen([sys.executable, "-c", _DUMPABLE, "loadtest",
                            f"http://{server.url}", "-m", "linear", "--duration", "60s",
                            "--warmup", "0s", "-c", "4", "--no-ceiling"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while clients(run.pid) < 4 or answered() <= before + 50:  # the run is under way
            assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        try:
            _, stderr = run.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            exited = run.poll()
            run.send_signal(signal.SIGUSR2)  # its tasks' stacks, then its threads'
            time.sleep(1)
            run.send_signal(signal.SIGUSR1)
            time.sleep(2)
            run.kill()
            pytest.fail(f"not exited 30 s after SIGINT (exit status {exited}); its tasks and "
                        "threads:\n" + run.communicate()[1][-6000:])
    finally:
        run.kill()
    assert run.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "serval: interrupted", stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr


@pytest.mark.parametrize("command", [["report", "-o", "REPORT"], ["plan", "--slo-p99-ms", "5"]])
def test_report_and_plan_name_a_bad_field_of_a_results_file(tmp_path: Path,
                                                            command: list[str]) -> None:
    from tests.unit.loadtest.test_results import results_doc

    doc = results_doc()
    doc["steps"][0]["p99_ms"] = None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    args = [a.replace("REPORT", str(tmp_path / "r.html")) for a in command]
    done = subprocess.run([sys.executable, "-m", "serval", args[0], str(path), *args[1:]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"serval: {path}: field 'steps.0.p99_ms': "
                                   "Input should be a valid number")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("target", [[], ["--target-rps", "1000"]])
def test_plan_fits_80_columns_when_piped(tmp_path: Path, target: list[str]) -> None:
    import os

    from tests.unit.loadtest.test_results import results_doc

    path = tmp_path / "r.json"
    path.write_text(json.dumps(results_doc()))
    done = subprocess.run([sys.executable, "-m", "serval", "plan", str(path), "--slo-p99-ms",
                           "5", *target], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 80, done.stdout
    for value in ("c6a.large", "100.0", "1.00", "0.2125"):
        assert value in done.stdout, (value, done.stdout)
