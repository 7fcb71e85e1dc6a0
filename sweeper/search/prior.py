"""What earlier sweeps on the same cluster, GPU and trainer taught, as the prior of a new sweep.

A learned profile (`sweeper.search.learned`) keeps, per sweep, numbers that do not depend on the
model's size: the throughput model's two scales, each knob value's effect on the model's error
(log(measured / calibrated step time) of the layouts with that value, beyond the other values'
effects) and the memory estimate's refit. A new sweep starts from them and its own trials correct
them, each the way its own lesson is learned:

- the scales (`residual.calibrate`): the learned ones are where the fit starts, pulled towards as
  by `CALIBRATION_WEIGHT` measured layouts; each trial of the sweep outweighs them a little more;
- the effects (`EffectPrior`): their sum over a layout's knob values is the prior mean of the
  residual process, which fits what the sweep measures beyond it and interpolates every measured
  layout: a learned number never hides a measurement, it only predicts what is not measured yet.
  Each effect counts as `EFFECT_WEIGHT` measured layouts (fewer if fewer taught it): once the sweep
  has measured n layouts with that value, it keeps weight / (weight + n) of itself, and the
  residual process, which learns the sweep's own effects, has the rest of the say;
- the memory refit (`memfit.refit`): fills what the sweep's own peaks cannot tell yet.

Pure numpy over the plan's columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweeper.estimate.memfit import MemoryFit
from sweeper.estimate.step_time import Calibration, StepTime

# How many measured layouts of the new sweep a learned number counts as, at most (the learned
# number is backed by `trials` layouts of other models; another model shares a trainer's quirk,
# not always its size). After n own layouts it holds weight / (weight + n) of the say.
CALIBRATION_WEIGHT = 2.0
EFFECT_WEIGHT = 2.0
# A sweep's own effects (what it saves, `own_lessons`): each costs as much as this share of the layouts
# with its value being off by it, so an effect is fitted where more than that share are off the same
# way, and left at 0 (the value as the model predicts) where the scales and the other effects explain them.
EFFECT_COST = 0.5
EFFECT_BOUND = 4.0  # in log space: 55x either way; beyond, a layout is broken, not slow

EffectKey = tuple[str, Any]  # (knob, value)


@dataclass(frozen=True)
class LearnedEffect:
    """A knob value's effect on the model's error (log of measured / calibrated step time), and
    how many measured layouts with that value it comes from."""

    log_ratio: float
    trials: int


@dataclass(frozen=True)
class Prior:
    """The combined lessons of earlier sweeps that a new sweep starts from (empty parts: None / {})."""

    calibration: Calibration | None = None
    calibration_trials: int = 0
    effects: Mapping[EffectKey, LearnedEffect] = field(default_factory=dict)
    memory: MemoryFit | None = None
    sources: tuple[str, ...] = ()  # the sweeps it came from, by name

    @property
    def calibration_weight(self) -> float:
        return min(float(self.calibration_trials), CALIBRATION_WEIGHT)


def python_value(v: Any) -> Any:
    """A column's value as plain Python (numpy scalars compare and hash as their value once unwrapped)."""
    return v.item() if isinstance(v, np.generic) else v


class EffectPrior:
    """Per-knob-value effects as the prior mean of a sweep's residual, corrected by its trials.

    Built once over every layout the search may run: per searched knob, each layout's value as an
    index, so the prior mean of a million layouts is a few gathers."""

    def __init__(self, cols: Mapping[str, np.ndarray], rows: np.ndarray, searched: Sequence[str], prior: Prior) -> None:
        self._codes: list[np.ndarray] = []
        keys: list[EffectKey] = []
        for k in searched:
            values = np.unique(cols[k][rows])
            self._codes.append(len(keys) + np.searchsorted(values, cols[k][rows]))
            keys += [(k, python_value(v)) for v in values]
        self.keys = keys
        learned = [prior.effects.get(key) for key in keys]
        self.learned = np.asarray([e is not None for e in learned], dtype=bool)
        self.centre = np.asarray([e.log_ratio if e is not None else 0.0 for e in learned])
        self.weight = np.asarray([min(float(e.trials), EFFECT_WEIGHT) if e is not None else 0.0 for e in learned])
        self.beta = self.centre.copy()  # nothing measured yet: the learned effects whole

    @property
    def active(self) -> bool:
        """Whether any learned effect applies to this sweep's values."""
        return bool(self.learned.any())

    def onehot(self, index: np.ndarray) -> np.ndarray:
        """Layouts (positions among the rows given at construction) as one-hot rows over the keys."""
        x = np.zeros((len(index), len(self.keys)))
        for codes in self._codes:
            x[np.arange(len(index)), codes[index]] = 1.0
        return x

    def measured(self, index: np.ndarray) -> None:
        """The sweep measured the layouts at `index` (positions): each learned effect keeps
        weight / (weight + n) of itself, n the measured layouts with its value."""
        n = self.onehot(np.asarray(index, dtype=int)).sum(axis=0)
        with np.errstate(invalid="ignore"):  # 0 / 0 where nothing was learned: no effect
            self.beta = np.where(self.learned, self.centre * self.weight / (self.weight + n), 0.0)

    def mean(self, index: np.ndarray) -> np.ndarray:
        """The prior mean of the residual at layouts `index`: the sum of their values' learned effects."""
        out = np.zeros(len(index))
        for codes in self._codes:
            out += self.beta[codes[index]]
        return out


def own_lessons(
    model: StepTime, cols: Mapping[str, np.ndarray], rows: np.ndarray, step_s: np.ndarray, searched: Sequence[str]
) -> tuple[Calibration, dict[EffectKey, LearnedEffect]]:
    """What one sweep's measured layouts say on their own (no learned prior: what is saved must not
    count an earlier sweep twice): the model's two scales and each searched knob value's effect,
    fitted together.

    log(step) = log(compute_scale * compute + comm_scale * comm) + the effects of the layout's values,
    with `residual.calibrate`'s robust (soft-L1) loss and priors on the scales, and an L1 penalty on
    the effects: an effect costs what `EFFECT_COST` of the layouts with its value cost if all were off
    by it, so it is fitted where most of them are, and what most layouts do is the norm (a level
    shared by every layout is the scales', nearly free). Fitted apart, a quirk of a
    third to a half of the measured layouts tilts the scales (compute up, communication down) and
    the effects then carry the tilt to the next model as small effects of every value. Sparse, the
    fit says what a quirk is, one value several times off, with the rest at 0 and the scales where
    the other layouts put them; values that every measured layout had together share it equally
    (the sweep cannot tell which it was). One-hot values are not identifiable one by one (a constant
    moves between knobs freely), which the penalty settles too: no effect where none is needed."""
    from scipy.optimize import least_squares

    from sweeper.search.residual import CALIBRATION_SPREAD, LEVEL_PRIOR, SCALE_BOUNDS, SCALE_PRIOR

    rows = np.asarray(rows, dtype=int)
    if rows.size == 0:
        return Calibration(), {}
    keys = EffectPrior(cols, rows, searched, Prior())
    x = keys.onehot(np.arange(rows.size))
    log_y = np.log(np.asarray(step_s, dtype=float))
    compute, comm = model.compute[rows], model.comm[rows]
    k, counts = x.shape[1], x.sum(axis=0)

    def loss(p: np.ndarray) -> np.ndarray:
        t = np.exp(p[0]) * compute + np.exp(p[1]) * comm
        r = (log_y - np.log(np.maximum(t, 1e-12)) - x @ p[2:]) / CALIBRATION_SPREAD
        scales = [(p[1] - p[0]) / SCALE_PRIOR, (p[0] + p[1]) / (2 * LEVEL_PRIOR)]
        # 1/2 f^2 per term: soft L1 of the data (|r| - 1 far out); |effect| / spread (smoothed at 0) times
        # EFFECT_COST times the layouts with the value
        sparse = np.sqrt(2 * EFFECT_COST * counts / CALIBRATION_SPREAD * np.sqrt(p[2:] ** 2 + 1e-4))
        return np.concatenate([np.sign(r) * np.sqrt(2 * (np.sqrt(1 + r**2) - 1)), scales, sparse])

    lo, hi = np.log(SCALE_BOUNDS)
    bounds = ([lo, lo, *[-EFFECT_BOUND] * k], [hi, hi, *[EFFECT_BOUND] * k])
    p = least_squares(loss, np.zeros(k + 2), bounds=bounds).x
    effects = {key: LearnedEffect(float(np.round(b, 4)), int(n)) for key, b, n in zip(keys.keys, p[2:], counts)}
    return Calibration(float(np.exp(p[0])), float(np.exp(p[1])), int(rows.size)), effects
