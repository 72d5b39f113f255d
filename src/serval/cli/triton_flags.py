"""`serval serve` under a tritonserver command line: Triton's flags that serve's own options do
not take as written, rewritten onto them before the command line is parsed, so a deployment's
`tritonserver --model-repository=/models --strict-model-config=false --log-verbose=1 ...`
works as `serval serve ...` unchanged. (Triton's names that serve takes as they are:
--model-repository, --model-control-mode, --repository-poll-secs, --load-model,
--http-port, --grpc-port, --metrics-port, --cache-config, --trace-config,
--exit-timeout-secs.)

Triton's options take a value (`--flag=value` or `--flag value`); booleans are true/false
(1/0, on/off, yes/no). A flag with no use on this server (GPU memory pools, thread counts) is
taken and named on stderr as ignored; a value that is not one Triton takes fails with one
line, as any bad flag does.
"""

from __future__ import annotations

from collections.abc import Callable

_TRUE, _FALSE = ("true", "1", "on", "yes"), ("false", "0", "off", "no")

# Triton flags that change nothing here, with why (one line each on stderr)
IGNORED = {
    "--strict-model-config": "configs are completed from the model",
    "--disable-auto-complete-config": "configs are completed from the model",
    "--exit-on-error": "a failed model is UNAVAILABLE",
    "--allow-metrics": "/metrics is always on",
    "--allow-gpu-metrics": "no GPU metrics here",
    "--allow-cpu-metrics": "see --triton-metrics",
    "--metrics-interval-ms": "read when scraped",
    "--metrics-config": "latencies are histograms",
    "--id": "see --node-name",
    "--log-format": "logs are JSON lines",
    "--log-file": "logs go to stderr",
    "--pinned-memory-pool-byte-size": "no GPU pools",
    "--cuda-memory-pool-byte-size": "no GPU pools",
    "--cuda-virtual-address-size": "no GPU pools",
    "--min-supported-compute-capability": "no GPU checks",
    "--buffer-manager-thread-count": "no such threads",
    "--http-thread-count": "see --workers",
    "--grpc-infer-allocation-pool-size": "no such pool",
    "--model-load-retry-count": "retried on demand",
    "--backend-directory": "built in",
    "--backend-config": "set per model",
    "--repoagent-directory": "built in",
    "--host-policy": "no host policies",
    "--rate-limit": "not applied",
    "--rate-limit-resource": "not applied",
    "--cache-directory": "built in",
}
NO_VALUE = {"--disable-auto-complete-config"}  # Triton flags that take no value
BOOLEAN = {"--strict-model-config", "--exit-on-error", "--allow-metrics", "--allow-gpu-metrics",
           "--allow-cpu-metrics"}  # ignored, their values checked all the same


def _bool(flag: str, value: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{flag} takes true or false (Triton's flag), got {value!r}")


def _log_verbose(flag: str, value: str) -> list[str]:
    try:
        level = int(value)
    except ValueError:
        raise ValueError(f"{flag} takes a verbosity number (Triton's flag), got "
                         f"{value!r}") from None
    return ["--log-level", "debug"] if level > 0 else []


def _quiet(level: str) -> Callable[[str, str], list[str]]:
    """--log-info=false and its kin: log no lower than `level`."""
    return lambda flag, value: [] if _bool(flag, value) else ["--log-level", level]


# Triton flags that map onto serve's own: flag -> (flag, value) -> serve's arguments
MAPPED: dict[str, Callable[[str, str], list[str]]] = {
    "--model-store": lambda flag, value: ["--model-repository", value],
    "--strict-readiness": lambda flag, value: (
        ["--strict-readiness"] if _bool(flag, value) else ["--no-strict-readiness"]),
    "--allow-grpc": lambda flag, value: [] if _bool(flag, value) else ["--grpc-port", "0"],
    "--log-verbose": _log_verbose,
    "--log-info": _quiet("warning"),
    "--log-warning": _quiet("error"),
    "--log-error": lambda flag, value: [],  # errors are always logged
    "--model-load-thread-count": lambda flag, value: ["--max-concurrent-loads", value],
}
ADDRESSES = ("--http-address", "--grpc-address", "--metrics-address")  # one --host here
TRITON = {*IGNORED, *MAPPED, *ADDRESSES, "--allow-http"}  # every flag rewritten here


def translate(args: list[str]) -> tuple[list[str], list[str]]:
    """serve's arguments with Triton's flags rewritten; and the notes for stderr (a flag
    ignored). ValueError (one line) for a value Triton would not take, or an HTTP service
    turned off, which this server cannot do."""
    out: list[str] = []
    notes: list[str] = []
    hosts: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        flag, equals, value = arg.partition("=")
        own_flag = flag == "--strict-readiness" and not equals and not _next_is_bool(args, i)
        if flag not in TRITON or own_flag:
            out.append(arg)  # serve's own, as written (its --strict-readiness flag too)
            continue
        if not equals and flag not in NO_VALUE:
            if i >= len(args):
                raise ValueError(f"{flag} takes a value (Triton's flag)")
            value = args[i]
            i += 1
        if flag in IGNORED:
            if flag in BOOLEAN:
                _bool(flag, value)
            notes.append(f"ignoring {flag} ({IGNORED[flag]})")
        elif flag == "--allow-http":
            if not _bool(flag, value):
                raise ValueError("--allow-http=false: this server always serves HTTP (its "
                                 "health, metrics and API); leave the flag out")
        elif flag in ADDRESSES:
            hosts[flag] = value
        else:
            out += MAPPED[flag](flag, value)
    if len(set(hosts.values())) > 1:
        raise ValueError(f"{', '.join(f'{k}={v}' for k, v in hosts.items())}: this server "
                         "listens on one address (--host) for every port")
    if hosts:
        out += ["--host", next(iter(hosts.values()))]
    return out, notes


def _next_is_bool(args: list[str], i: int) -> bool:
    return i < len(args) and args[i].strip().lower() in (*_TRUE, *_FALSE)
