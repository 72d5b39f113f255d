"""A sequence model served: its controls and states checked against the model at load."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from serval.backends.base import ModelVersionSpec
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.errors import ConfigError
from serval.model_config import SequenceControl
from serval.repository.sequences import serve_sequences
from serval.repository.triton_config import load_pbtxt
from serval.stats import ModelStats
from tests import triton_sequence_models

pytestmark = pytest.mark.unit


def test_a_control_the_model_lacks_refuses_the_load(tmp_path: Path) -> None:
    triton_sequence_models.build(tmp_path)
    config = load_pbtxt(tmp_path / "simple_sequence")
    assert config.sequence_batching is not None
    wrong = config.model_copy(update={"sequence_batching": config.sequence_batching.model_copy(
        update={"controls": [SequenceControl(name="GO", kind="start")]})})
    spec = ModelVersionSpec("simple_sequence", "1", tmp_path / "simple_sequence" / "1", wrong)
    model = OnnxRuntimeBackend(cores=1).load(spec)
    with ThreadPoolExecutor(1) as executor, pytest.raises(
            ConfigError, match="control input 'GO' is not a tensor of the model"):
        serve_sequences(model, spec, ModelStats("simple_sequence", "1"), executor)
