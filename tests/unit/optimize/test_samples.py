"""Generated inputs for `serval optimize`: ids inside the embedding table, prefix masks, the
shipped sentences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serval.optimize import samples
from tests import optimize_models

pytestmark = pytest.mark.unit


def test_generated_ids_stay_inside_the_embedding_table(tmp_path: Path) -> None:
    bert = optimize_models.tiny_bert(tmp_path / "bert.onnx")
    specs = {s.name: s for s in samples.input_specs(bert)}
    assert specs["input_ids"].int_high == 500
    feeds = samples.random_inputs(list(specs.values()), 64, seed=0, sequence=16)
    assert feeds["input_ids"].max() < 500 and feeds["input_ids"].shape == (64, 16)
    mask = feeds["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1} and (mask[:, 0] == 1).all()
    assert (np.diff(mask, axis=1) <= 0).all()  # prefix masks: ones, then zeros


def test_shipped_sentences_are_a_few_hundred_distinct_lines() -> None:
    texts = samples.sentences()
    assert len(texts) >= 250 and len(set(texts)) == len(texts)
