"""What earlier sweeps on the same cluster, GPU and trainer taught, as the prior of a new sweep.

A learned profile (`sweeper.learned_profile`) keeps, per sweep, numbers that do not depend on the
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

from sweeper.memfit import MemoryFit
from sweeper.perfmodel import Calibration

# How many measured layouts of the new sweep a learned number counts as, at most (the learned
# number is backed by `trials` layouts of other models; another model shares a trainer's quirk,
# not always its size). After n own layouts it holds weight / (weight + n) of the say.
CALIBRATION_WEIGHT = 2.0
EFFECT_WEIGHT = 2.0
# A sweep's own effects (what it saves): a weak ridge towards 0, so that a value measured once
# with others is not given the whole of a layout's error alone.
OWN_RIDGE = 0.5

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

    def is_empty(self) -> bool:
        return self.calibration is None and not self.effects and self.memory is None


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


def ridge(x: np.ndarray, y: np.ndarray, centre: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """argmin |y - x b|^2 + sum(weight * (b - centre)^2): each coefficient's prior counts as `weight` observations."""
    a = x.T @ x + np.diag(weight)
    return np.linalg.solve(a, x.T @ y + weight * centre)


def own_effects(
    cols: Mapping[str, np.ndarray], rows: np.ndarray, log_ratio: np.ndarray, searched: Sequence[str]
) -> dict[EffectKey, LearnedEffect]:
    """What one sweep's measured layouts say of each searched knob value, on their own (no learned
    prior: what is saved must not count an earlier sweep twice). A weak ridge (`OWN_RIDGE`) towards
    0 shares a layout's error between its values until other layouts tell them apart; the errors are
    taken from their median, so a quirk of a few values is theirs, not a level spread over all."""
    rows = np.asarray(rows, dtype=int)
    if rows.size == 0:
        return {}
    effects = EffectPrior(cols, rows, searched, Prior())
    x = effects.onehot(np.arange(rows.size))
    y = np.asarray(log_ratio, dtype=float)
    y = y - np.median(y)  # the level is the scales' (the calibration's); the effects say how layouts differ
    n = len(effects.keys)
    beta = ridge(x, y, np.zeros(n), np.full(n, OWN_RIDGE))
    counts = x.sum(axis=0)
    return {key: LearnedEffect(float(b), int(n)) for key, b, n in zip(effects.keys, beta, counts) if n > 0}
