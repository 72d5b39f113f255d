"""`--quantize int8-auto`: the INT8 recipe chosen by measured parity and speed.

Dynamic INT8 with per-channel weights is the fastest recipe on CPUs without VNNI (measured on
`minilm`: ~2x FP32 at batch 32, where static QDQ gained ~1.6x), but on short inputs it can move
a few rows too far: `minilm`'s worst shipped sentence ("Ok.") fell to cosine 0.96. What costs
accuracy is where the activations have outliers: the embedding lookups and the down-projections
(a MatMul from a wider to a narrower width, e.g. a transformer's second feed-forward layer).
So the candidates keep progressively more of those in FP32, from none to all; each is
quantized and checked against the original on the parity data; those that pass are timed in
interleaved rounds, and the fastest wins (within 5% of it, the one with the fewest FP32 nodes,
then the most accurate; none passing: the most accurate, reported as failing, never published).

With calibration data, every node INT8 is also tried after activation smoothing at a few
alphas (`smooth.py`), and as static QDQ. On `minilm` smoothing at 0.7 kept the worst sentence
at 0.987 with no node in FP32, where keeping nodes in FP32 cost ~6% of the speed per node;
static QDQ was the most accurate (0.996) but no faster than FP32 on the fused graph, where the
quantizer reaches only the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serval.optimize.deps import require
from serval.optimize.parity import ParityResult
from serval.optimize.quantize import QuantizeOptions, QuantizeResult, quantize
from serval.optimize.samples import Feeds
from serval.optimize.smooth import targets

AUTO = "int8-auto"
TIE = 0.05  # timings this close are one speed on a shared machine
EMBEDDING_OPS = ("Gather", "EmbedLayerNormalization")
ALPHAS = (0.5, 0.6, 0.7, 0.8)  # smoothing strengths tried (measured best on minilm: 0.6-0.7)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One recipe: INT8 (dynamic unless said) with these nodes kept in FP32, after smoothing
    at alpha."""

    name: str
    kept: tuple[str, ...]
    alpha: float | None = None
    mode: str = "int8-dynamic"


@dataclass(frozen=True, slots=True)
class Trial:
    candidate: Candidate
    path: Path
    result: QuantizeResult
    parity: ParityResult
    items_per_s: float | None  # timed only when parity holds

    @property
    def worst_cosine(self) -> float | None:
        """The lowest row's cosine over every output that has one."""
        return min((o.min_cosine for o in self.parity.outputs if o.min_cosine is not None),
                   default=None)

    def as_dict(self) -> dict[str, Any]:
        return {"recipe": self.candidate.name, "kept_fp32": len(self.candidate.kept),
                "mode": self.candidate.mode, "smooth_alpha": self.candidate.alpha,
                "passed": self.parity.passed,
                "mean_cosine": min((o.mean_cosine for o in self.parity.outputs
                                    if o.mean_cosine is not None), default=None),
                "worst_cosine": self.worst_cosine, "items_per_s": self.items_per_s}


def candidates(source: Path, alphas: tuple[float, ...] = (),
               static: bool = False) -> list[Candidate]:
    """From every node quantized (as is, smoothed at each alpha where smoothing has a node to
    reach, static QDQ if asked) to embeddings and every down-projection kept FP32."""
    model = require("onnx").load(str(source))
    if not targets(model):
        alphas = ()  # each would be the unsmoothed model again
    weights = {w.name: tuple(w.dims) for w in model.graph.initializer}
    embeddings = tuple(n.name for n in model.graph.node if n.op_type in EMBEDDING_OPS)
    down = [n.name for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1
            and len(weights.get(n.input[1], ())) == 2
            and weights[n.input[1]][0] > weights[n.input[1]][1]]
    found = [Candidate("every node INT8", ())]
    found += [Candidate(f"every node INT8, smoothed (alpha {alpha:g})", (), alpha)
              for alpha in alphas]
    if static:
        found.append(Candidate("every node INT8, static QDQ (calibrated)", (),
                               mode="int8-static"))
    if embeddings:
        found.append(Candidate("embeddings FP32", embeddings))
    for count in sorted({math.ceil(len(down) * share) for share in (1 / 3, 1 / 2, 1)} - {0}):
        found.append(Candidate(f"embeddings and {count} of {len(down)} down-projections FP32",
                               embeddings + tuple(down[:count])))
    return found


def search(source: Path, work: Path, base: QuantizeOptions,
           verify: Callable[[Path], ParityResult],
           time_all: Callable[[list[Path]], list[float]],
           calibration: Feeds | None = None) -> tuple[Trial, list[Trial]]:
    """Every candidate quantized and verified; those that pass timed together (`time_all`:
    items/s per path, in interleaved rounds); the chosen trial and all of them. `base` carries
    the user's per-channel and exclusions, and the one alpha to smooth at if the user chose it;
    smoothed and static recipes are tried only with calibration data."""
    alphas = () if calibration is None else (base.smooth,) if base.smooth is not None else ALPHAS
    made = []
    for index, candidate in enumerate(candidates(source, alphas, calibration is not None)):
        path = work / f"int8-auto-{index}.onnx"
        options = QuantizeOptions(candidate.mode, base.per_channel,
                                  tuple(dict.fromkeys((*base.exclude_nodes, *candidate.kept))),
                                  base.exclude_ops, base.keep_io_types, base.reduce_range,
                                  candidate.alpha)
        made.append((candidate, path, quantize(source, path, options, calibration),
                     verify(path)))
    passing = [path for _, path, _, checked in made if checked.passed]
    speeds = dict(zip(passing, time_all(passing), strict=True)) if passing else {}
    trials = [Trial(candidate, path, result, checked, speeds.get(path))
              for candidate, path, result, checked in made]
    return choose(trials), trials


def choose(trials: list[Trial]) -> Trial:
    """The fastest passing trial; within TIE of it, the one with the fewest nodes kept in FP32
    (the smaller file, and what the recipes' order predicts is fastest), then the one whose
    worst row moved least. None passing: the most accurate, the last."""
    passing = [t for t in trials if t.items_per_s is not None]
    if not passing:
        return trials[-1]
    best = max(t.items_per_s or 0.0 for t in passing)
    tied = [t for t in passing if (t.items_per_s or 0.0) >= best * (1 - TIE)]
    return min(tied, key=lambda t: (len(t.candidate.kept),
                                    math.inf if t.worst_cosine is None else -t.worst_cosine))
