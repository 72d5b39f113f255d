"""The `intent-labels` Python model of the intent pipeline: class scores -> label text.

Copied into examples/models/intent-labels/1/model.py by `make models`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABELS = ("greeting", "farewell", "order", "cancel", "refund", "shipping", "account", "other")


class Model:
    """The highest-scoring intent's name, as BYTES, one per row."""

    def load(self, ctx: Any) -> None:
        self.labels = np.array([label.encode() for label in LABELS], dtype=object)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        best = inputs["scores"].argmax(axis=1)
        return {"label": self.labels[best].reshape(-1, 1)}
