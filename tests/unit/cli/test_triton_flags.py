"""A tritonserver command line rewritten onto serve's options."""

from __future__ import annotations

import pytest

from serval.cli.triton_flags import IGNORED, translate

pytestmark = pytest.mark.unit


def test_a_typical_triton_deployment_line() -> None:
    args, notes = translate([
        "--model-repository=/models", "--strict-model-config=false", "--log-verbose=1",
        "--allow-gpu-metrics", "false", "--http-port=8000", "--strict-readiness=false",
        "--model-load-thread-count", "4", "--pinned-memory-pool-byte-size=268435456"])
    assert args == ["--model-repository=/models", "--log-level", "debug", "--http-port=8000",
                    "--no-strict-readiness", "--max-concurrent-loads", "4"]
    assert notes == ["ignoring --strict-model-config (configs are completed from the model)",
                     "ignoring --allow-gpu-metrics (no GPU metrics here)",
                     "ignoring --pinned-memory-pool-byte-size (no GPU pools)"]


def test_serves_own_flags_pass_untouched() -> None:
    own = ["--repository", "r", "--strict-readiness", "--grpc-port", "0", "--log-level", "info",
           "--no-strict-readiness", "--host", "0.0.0.0"]
    assert translate(own) == (own, [])


@pytest.mark.parametrize(("triton", "serval"), [
    (["--allow-grpc=false"], ["--grpc-port", "0"]),
    (["--allow-grpc=true"], []),
    (["--strict-readiness", "true"], ["--strict-readiness"]),
    (["--strict-readiness=0"], ["--no-strict-readiness"]),
    (["--log-verbose=0"], []),
    (["--log-info=false"], ["--log-level", "warning"]),
    (["--log-warning=false"], ["--log-level", "error"]),
    (["--model-store=/m"], ["--model-repository", "/m"]),
    (["--http-address=10.0.0.1", "--grpc-address", "10.0.0.1"], ["--host", "10.0.0.1"]),
    (["--disable-auto-complete-config", "--http-port=1"], ["--http-port=1"]),
    (["--allow-http=true"], []),
])
def test_each_mapped_flag(triton: list[str], serval: list[str]) -> None:
    assert translate(triton)[0] == serval


@pytest.mark.parametrize(("triton", "says"), [
    (["--allow-http=false"], "always serves HTTP"),
    (["--strict-model-config=maybe"], "takes true or false"),
    (["--log-verbose=lots"], "takes a verbosity number"),
    (["--log-verbose"], "takes a value"),
    (["--http-address=a", "--grpc-address=b"], "one address"),
])
def test_values_triton_would_not_take_fail_in_one_line(triton: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        translate(triton)
    assert "\n" not in str(caught.value)


def test_every_ignored_flag_is_named_on_stderr_with_why() -> None:
    for flag in IGNORED:
        args = [flag] if flag == "--disable-auto-complete-config" else [flag, "true"]
        rest, notes = translate(args)
        assert rest == [] and notes == [f"ignoring {flag} ({IGNORED[flag]})"]
