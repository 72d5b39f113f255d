"""The Ray Serve ingress's path helpers: which model a path names, which requests are safe to
retry."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_model_of_and_retry_safety() -> None:
    from serval.cluster.ray import model_of, retry_safe

    assert model_of("/v2/models/lin0/infer") == "lin0"
    assert model_of("/v2/models/lin0/versions/2/infer") == "lin0"
    assert model_of("/v2/repository/models/clf/load") == "clf"
    assert model_of("/v2/models/stats") == "" and model_of("/v2/health/ready") == ""
    assert retry_safe("/v2/models/lin0/infer") and retry_safe("/v2/health/ready")
    assert not retry_safe("/v2/repository/models/clf/unload")
