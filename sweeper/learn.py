"""What a finished trial teaches about the others: memory order after an OOM, calibrations.

Pure numpy over the plan's columns. An OOM at one layout implies an OOM at every layout that
differs only by asking for more memory in a monotone knob (bigger micro-batch, less
checkpointing, no sequence parallel, a kernel that keeps the s x s scores, the eager norm),
with the parallel degrees, sharding and schedule equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sweeper.knobs import KNOBS
from sweeper.layout import Columns
from sweeper.memory import SCORE_KERNELS

# How much memory a knob value asks for, in a partial order (None: comparable only with itself).
_CKPT_LEVEL = {"full": 0, "selective": 1, "ffn": 1, "none": 2}
MONOTONE = ("micro_batch_size", "activation_checkpointing", "sequence_parallel", "attention", "rmsnorm")


def _level(cols: Columns, knob: str) -> np.ndarray:
    v = cols[knob]
    if knob == "micro_batch_size":
        return v.astype(float)
    if knob == "activation_checkpointing":
        return np.vectorize(_CKPT_LEVEL.get, otypes=[float])(v)
    if knob == "sequence_parallel":
        return (~v.astype(bool)).astype(float)  # no SP keeps more
    if knob == "attention":
        return np.isin(v, SCORE_KERNELS).astype(float)
    if knob == "rmsnorm":
        return (v == "eager").astype(float)
    raise KeyError(knob)


def needs_at_least(cols: Columns, rows: np.ndarray, ref: int) -> np.ndarray:
    """Mask over `rows`: layouts that need at least the memory of layout `ref` (itself included)."""
    mask = np.ones(len(rows), dtype=bool)
    for k in KNOBS:
        if k in MONOTONE:
            continue
        mask &= cols[k][rows] == cols[k][ref]
    for k in MONOTONE:
        lv = _level(cols, k)
        mask &= lv[rows] >= lv[ref]
        if k == "activation_checkpointing":
            # ffn and selective are not ordered between themselves
            both_mid = (lv[rows] == 1) & (lv[ref] == 1)
            mask &= ~both_mid | (cols[k][rows] == cols[k][ref])
    return mask


def memory_scale(predicted_gib: Sequence[float], measured_gib: Sequence[float]) -> float:
    """How much the estimate under-predicts measured peaks (median ratio), never below 1.

    Only upward: a layout the plan pruned stays pruned, but an estimate found too low
    prunes more of what is left.
    """
    ratios = [m / p for p, m in zip(predicted_gib, measured_gib) if p > 0 and m and m > 0]
    return max(1.0, float(np.median(ratios))) if len(ratios) >= 2 else 1.0
