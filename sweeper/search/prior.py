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

import math
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
# The largest effect a learned number may claim, in log space: 10x either way. A knob value the model
# is 10x off on is broken, not slow; a sweep's own fit stops there, and a learned profile that says
# more (a file edited, or written by something else) is refused as implausible and said, never used.
EFFECT_BOUND = math.log(10.0)

# The learned effects' trust is a slope with a prior of 1 worth this much evidence (in log space
# squared): a step time's noise (0.1) squared times 4, so two layouts that differ by less than the
# noise neither confirm nor refute an effect; a learned difference of 0.3 that the trials show the
# other way drops the trust to 0.
TRUST_PRIOR = 0.04
TRUST_FLOOR = 0.1  # a trust below this is a contradiction: the sweep then runs exactly as without it

EffectKey = tuple[str, Any]  # (knob, value)


@dataclass(frozen=True)
class LearnedEffect:
    """A knob value's effect on the model's error (log of measured / calibrated step time), and
    how many measured layouts with that value it comes from."""

    log_ratio: float
    trials: int
    sweeps: int = 1  # how many sweeps taught it


@dataclass(frozen=True)
class Prior:
    """The combined lessons of earlier sweeps that a new sweep starts from (empty parts: None / {})."""

    calibration: Calibration | None = None
    calibration_trials: int = 0
    effects: Mapping[EffectKey, LearnedEffect] = field(default_factory=dict)
    memory: MemoryFit | None = None
    sources: tuple[str, ...] = ()  # the sweeps it came from, by name
    origins: tuple[str, ...] = ()  # the same sweeps, each with its date and where it ran
    refused: tuple[str, ...] = ()  # learned numbers left out as implausible, each with why

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
        self.trust = 1.0  # how far this sweep's own trials bear the learned effects out (`weigh`)

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
        """The prior mean of the residual at layouts `index`: the sum of their values' learned effects,
        as far as this sweep's trials bear them out (`trust`)."""
        out = np.zeros(len(index))
        for codes in self._codes:
            out += self.beta[codes[index]]
        return self.trust * out

    def weigh_measured(self, model: StepTime, measured: Mapping[int, float], pos: np.ndarray) -> float:
        """`weigh` on the measured step times (plan row -> s), against the model calibrated on them alone;
        `pos`: each plan row's position among the layouts given at construction."""
        from sweeper.search.residual import calibrate

        rows = np.asarray(list(measured), dtype=np.int64)
        times = np.asarray([measured[int(r)] for r in rows])
        own = calibrate(model, rows.tolist(), times.tolist())
        model_s = np.maximum(own.compute_scale * model.compute[rows] + own.comm_scale * model.comm[rows], 1e-12)
        return self.weigh(pos[rows], np.log(times / model_s))

    def weigh(self, index: np.ndarray, own_log_ratio: np.ndarray) -> float:
        """How far the sweep's own measured layouts (`index`, their log(measured / model calibrated on
        them alone)) bear the learned effects out: the slope of how they differ from one another on how
        the learned effects say they differ, with a prior slope of 1 (`TRUST_PRIOR`), in [0, 1].

        1 while nothing contradicts them (one layout cannot: its level is the scales'); 0 once the
        trials differ the other way or not at all where the effects say they differ: the sweep then
        runs as without them (its scales' prior weighed by the same trust)."""
        if len(index) < 2:
            return self.trust
        learned = np.zeros(len(index))
        for codes in self._codes:
            learned += self.centre[codes[np.asarray(index, dtype=int)]]
        lc = learned - learned.mean()
        rc = np.asarray(own_log_ratio, dtype=float) - float(np.mean(own_log_ratio))
        slope = float(np.clip((rc @ lc + TRUST_PRIOR) / (lc @ lc + TRUST_PRIOR), 0.0, 1.0))
        self.trust = slope if slope >= TRUST_FLOOR else 0.0  # contradicted: none of its say left
        return self.trust


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
    # tolerances of 1e-6, not scipy's 1e-8: the smoothed L1 terms make the last digits take thousands
    # of steps (10 s for a sweep of 10 layouts, after every trial), for changes below the 4 decimals kept
    p = least_squares(loss, np.zeros(k + 2), bounds=bounds, ftol=1e-6, xtol=1e-6, gtol=1e-6).x
    effects = {key: LearnedEffect(float(np.round(b, 4)), int(n)) for key, b, n in zip(keys.keys, p[2:], counts)}
    return Calibration(float(np.exp(p[0])), float(np.exp(p[1])), int(rows.size)), effects
