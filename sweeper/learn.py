"""What a finished trial teaches about the others: memory order after an OOM, calibrations.

Pure numpy over the plan's columns. An OOM at one layout implies an OOM at every layout that
differs only by asking for more memory in a monotone knob (bigger micro-batch, less
checkpointing, no sequence parallel, a kernel that keeps the s x s scores, the eager norm),
with the parallel degrees, sharding and schedule equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sweeper.hardware import GIB
from sweeper.knobs import KNOBS
from sweeper.layout import Columns
from sweeper.memory import SCORE_KERNELS
from sweeper.perfmodel import Calibration, StepTime, calibrate
from sweeper.plan import Plan

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


@dataclass
class Learning:
    """What the finished trials of a sweep taught about the untried layouts of its plan.

    Three lessons, each in one method: an OOM excludes every layout that needs at least as much
    memory (`learn_oom`); measured step times refit the throughput model (`learn_step_time`);
    measured device peaks rescale the memory estimate (`learn_peak`).
    """

    plan: Plan
    excluded: dict[int, str] = field(default_factory=dict)  # candidate rows ruled out, and why
    measured: dict[int, float] = field(default_factory=dict)  # plan row -> measured step time (s)
    peaks: dict[int, float] = field(default_factory=dict)  # plan row -> measured peak GiB (devices with memory)
    calibration: Calibration = field(default_factory=Calibration)

    def __post_init__(self) -> None:
        self.pred_mfu: np.ndarray = self.model.mfu

    @property
    def model(self) -> StepTime:
        """The plan's (uncalibrated) throughput model, which the calibration rescales."""
        return self.plan.throughput

    def learn_oom(self, oom_row: int, untried: Sequence[int]) -> None:
        rows = np.asarray(untried, dtype=int)
        if rows.size == 0:
            return
        for r in rows[needs_at_least(self.plan.cols, rows, oom_row)]:
            self.excluded[int(r)] = f"needs at least the memory of a layout that ran out of memory (plan row {oom_row})"

    def learn_step_time(self, row: int, step_time_s: float) -> None:
        self.measured[row] = step_time_s
        rows = list(self.measured)
        model = self.model
        self.calibration = calibrate(model, rows, [self.measured[r] for r in rows])
        scale = model.total / np.maximum(
            self.calibration.compute_scale * model.compute + self.calibration.comm_scale * model.comm, 1e-12)
        self.pred_mfu = model.mfu * scale

    def learn_peak(self, row: int, peak_gib: float, untried: Sequence[int]) -> None:
        """The memory-learning hook: measured peaks above the estimate exclude what would no longer fit."""
        self.peaks[row] = peak_gib
        mem = self.plan.memory
        tensors = (mem.total - mem.overhead) / GIB
        rows = list(self.peaks)
        k = memory_scale([float(tensors[r]) for r in rows], [self.peaks[r] for r in rows])
        if k <= 1.0:
            return
        over = (tensors * k + mem.overhead / GIB) * GIB > mem.capacity_bytes
        for r in untried:
            if over[r]:
                self.excluded[r] = f"measured peaks run {k:.2f}x the estimate: this layout would not fit"
