"""What the throughput model got wrong, learned from measured step times: a Gaussian process over
the layout's knobs of log(measured / predicted step time), and the expected improvement it gives.

The analytic step time (`sweeper.perfmodel`) is the prior: with nothing measured every layout is
predicted at the model's time, uncertain by `PRIOR_SIGMA` in log space. Each measured layout moves
the prediction of its neighbours (layouts that share most knob values) by the same share, so one
slow layout lowers the odds of the layouts like it and one fast one raises them. A global offset
(the model's constant error, as the mean residual) is removed before the fit, so the process
learns only how the error varies between layouts.

Pure numpy and scikit-learn over the plan's columns; features are built once for the searched
candidates, so scoring a million candidates is a few vectorised passes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

from sweeper.knobs import KNOBS

# How far off the model may be before anything is measured (in log space: 0.2 = about 20 %, the
# spread of the throughput model's error on public step times); a 40x quirk is far outside it,
# and the fitted amplitude (from MIN_FIT points on) grows to it.
PRIOR_SIGMA = 0.2
MIN_SIGMA = 0.15  # the model is never trusted closer than this away from what was measured
LENGTH_SCALE = 0.8  # in feature units: one knob value changed (one-hot distance 1.4) keeps ~20 % correlation
MIN_FIT = 6  # measured layouts before the kernel's amplitude and length scales are fitted
NOISE = 0.03**2
PRIOR_WEIGHT = 1.0  # how many measured neighbours the prior chance to run counts as  # repeat-to-repeat noise of a measured step time (a few %), in log space squared


def features(cols: dict[str, np.ndarray], rows: np.ndarray, searched: Sequence[str]) -> np.ndarray:
    """One row of features per layout: numeric knobs as log2 scaled to [0, 1], the others one-hot."""
    out = []
    for k in searched:
        v = cols[k][rows]
        if KNOBS[k].kind is int:
            every = np.log2(np.maximum(cols[k].astype(float), 1.0))
            lo, span = float(every.min()), float(np.ptp(every)) or 1.0
            out.append(((np.log2(np.maximum(v.astype(float), 1.0)) - lo) / span)[:, None])
        else:
            values = np.unique(cols[k])
            out.append((v[:, None] == values[None, :]).astype(float))
    return np.hstack(out) if out else np.zeros((len(rows), 1))


class Residual:
    """A Gaussian process of log(measured / predicted step time) over a fixed set of layouts."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x  # features of every layout the search may run, in the search's row order
        self.gp: GaussianProcessRegressor | None = None
        self.offset = 0.0
        self._tuned_at = 0  # points of the last hyperparameter fit (0: never fitted)

    def fit(self, index: np.ndarray, log_ratio: np.ndarray) -> None:
        """Fit to measured layouts (positions in `x`) and their log(measured / predicted)."""
        y = np.asarray(log_ratio, dtype=float)
        if y.size == 0:
            self.gp, self.offset, self._tuned_at = None, 0.0, 0
            return
        self.offset = float(np.mean(y))
        d = self.x.shape[1]
        kernel = ConstantKernel(PRIOR_SIGMA**2, (MIN_SIGMA**2, 2.0**2)) * Matern(
            length_scale=np.full(d, LENGTH_SCALE), length_scale_bounds=(0.3, 20.0), nu=2.5
        ) + WhiteKernel(NOISE, (1e-4, 0.1))
        # a few points cannot tell a length scale or an amplitude: the prior's, until MIN_FIT points;
        # then fitted again each time the points double, the last fit's kept in between (fast)
        refit = y.size >= MIN_FIT and y.size >= 2 * self._tuned_at
        if self.gp is not None and not refit and self._tuned_at:
            kernel = self.gp.kernel_
        gp = GaussianProcessRegressor(
            kernel, normalize_y=False, optimizer="fmin_l_bfgs_b" if refit else None, n_restarts_optimizer=0
        )
        with warnings.catch_warnings():  # bounds hit by a fit to a few points: the bound is the answer
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(self.x[np.asarray(index, dtype=int)], y - self.offset)
        self.gp = gp
        if refit:
            self._tuned_at = int(y.size)

    def predict(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of log(true / predicted step time) at layouts `index`."""
        if self.gp is None:
            return np.zeros(len(index)), np.full(len(index), PRIOR_SIGMA)
        mean, std = self.gp.predict(self.x[index], return_std=True)
        return mean + self.offset, np.maximum(std, 1e-6)


def ok_chance(x: np.ndarray, index: np.ndarray, prior: np.ndarray, seen: np.ndarray, ran: np.ndarray) -> np.ndarray:
    """The chance each layout at `index` runs: its prior chance (to fit the card), moved towards what
    the layouts like it did (`seen` positions, `ran` 1 or 0), each weighted by the kernel's correlation.

    A kernel-weighted average with the prior counted as PRIOR_WEIGHT observations: two failed
    neighbours that share every knob but one pull a layout's chance well below its prior, while
    far-away failures leave it as it was. Failures no formula predicts (crashes, layouts a trainer
    refuses) cluster in knob values this way."""
    if seen.size == 0:
        return prior
    d = np.sqrt(((x[index][:, None, :] - x[seen][None, :, :]) ** 2).sum(axis=2)) / LENGTH_SCALE
    w = (1 + np.sqrt(5) * d + 5 * d**2 / 3) * np.exp(-np.sqrt(5) * d)  # Matern 5/2, as the process's kernel
    return (PRIOR_WEIGHT * prior + w @ ran) / (PRIOR_WEIGHT + w.sum(axis=1))


def expected_speedup(log_time: np.ndarray, sigma: np.ndarray, best_time: float) -> np.ndarray:
    """E[max(1/T - 1/best, 0)] * best for log T ~ N(log_time, sigma^2): the expected improvement in
    speed (1/step time, proportional to MFU) over the best measured, as a share of it."""
    m, s = -np.asarray(log_time) + np.log(best_time), np.asarray(sigma)  # log(speed / best speed)
    return np.exp(m + s**2 / 2) * ndtr((m + s**2) / s) - ndtr(m / s)
