"""HAProxy as a child process (master-worker: a reload re-reads the config without dropping a
connection) and its runtime API (the stats socket): the servers' states and counters."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serval.errors import ConfigError

STOP_GRACE_S = 30.0
SOFT_STOP_RESEND_S = 0.5


def haproxy_binary() -> str:
    """The installed haproxy; a ConfigError saying how to get it otherwise."""
    found = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
        None)
    if found is None:
        raise ConfigError("HAProxy is not installed: `make setup` installs Debian's haproxy "
                          "(or apt-get install haproxy)")
    return found


def check_config(path: Path) -> None:
    """`haproxy -c`: a ConfigError with HAProxy's own first complaint when the file is bad."""
    done = subprocess.run([haproxy_binary(), "-c", "-f", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if "ALERT" in ln]
        raise ConfigError("HAProxy refused the generated configuration: "
                          + (lines[0] if lines else done.stderr.strip()[:200]))


class HaproxyProcess:
    """haproxy -W (master-worker) in the foreground of a child process."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, preexec: Callable[[], None] | None = None) -> None:
        check_config(self.config)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [haproxy_binary(), "-W", "-db", "-f", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=preexec)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def reload(self) -> None:
        """Re-read the config: a new worker takes the listening sockets, the old one finishes
        the connections it holds (up to hard-stop-after)."""
        check_config(self.config)
        if self.process is not None:
            self.process.send_signal(signal.SIGUSR2)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop listening, let open requests finish (up to grace_s), then end. The soft stop
        (SIGUSR1) is sent again each SOFT_STOP_RESEND_S until the proxy ends: a master that has
        just started drops it while it re-executes itself into wait mode (measured: half of
        the stops sent right after the proxy answered were lost, each then waiting out the
        whole grace before a hard kill)."""
        if self.process is None or self.process.poll() is not None:
            return
        deadline = time.monotonic() + grace_s
        while True:
            self.process.send_signal(signal.SIGUSR1)  # soft stop
            left = deadline - time.monotonic()
            try:
                self.process.wait(timeout=max(0.0, min(SOFT_STOP_RESEND_S, left)))
                return
            except subprocess.TimeoutExpired:
                if left <= SOFT_STOP_RESEND_S:
                    break
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass(frozen=True)
class ServerStat:
    """One server line of `show stat`: a node as one backend sees it."""

    backend: str
    name: str
    address: str
    status: str  # UP, DOWN, DRAIN, MAINT, no check...
    weight: int
    in_flight: int  # requests being served now (scur)
    queued: int  # waiting in the proxy for this node (qcur)
    requests: int  # total sent to it (stot)
    errors: int  # connection + response errors
    retries: int
    redispatches: int


class RuntimeApi:
    """HAProxy's runtime API on its stats socket (a unix socket path)."""

    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        self.path, self.timeout_s = str(path), timeout_s

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(self.path)
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def servers(self) -> list[ServerStat]:
        """Every server of every backend (no frontends, no backend totals)."""
        text = self.command("show stat").lstrip("# ")
        rows = []
        for row in csv.DictReader(io.StringIO(text)):
            if row.get("svname") in (None, "FRONTEND", "BACKEND"):
                continue
            rows.append(ServerStat(
                row["pxname"], row["svname"], row.get("addr", ""), row.get("status", ""),
                _int(row.get("weight")), _int(row.get("scur")), _int(row.get("qcur")),
                _int(row.get("stot")), _int(row.get("econ")) + _int(row.get("eresp")),
                _int(row.get("wretr")), _int(row.get("wredis"))))
        return rows

    def wait_ready(self, timeout_s: float) -> bool:
        """Until the socket answers (the proxy is up) or timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self.command("show info")
                return True
            time.sleep(0.05)
        return False


def _int(value: str | None) -> int:
    return int(value) if value and value.isascii() and value.isdigit() else 0
