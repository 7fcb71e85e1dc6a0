"""What the throughput model got wrong, learned from measured step times: its two scales refitted
robustly (`calibrate`), and a Gaussian process over the layout's knobs of what is left,
log(measured / calibrated step time).

The analytic step time (`sweeper.estimate.step_time`) is the prior: with nothing measured every layout is
predicted at the model's time, uncertain by `PRIOR_SIGMA` in log space. Each measured layout moves
the prediction of its neighbours (layouts that share most knob values) by the same share, so one
slow layout lowers the odds of the layouts like it and one fast one raises them; a linear term
over the same features (`EFFECT_SIGMA`) carries each knob's effect, as a trend, to values nothing
near has measured. The features add the number of micro-batches per step (`DERIVED`). A global offset
(the model's constant error, as the mean residual) is removed before the fit, so the process
learns only how the error varies between layouts.

The compute and communication scales are fitted in log space with a soft-L1 loss and a weak prior
at 1: a trainer quirk (one layout 4-40x slower than the model says) is an outlier that the
residual process learns where it is, instead of a least-squares fit that drags both scales, and
every layout's prediction with them, towards it.

Pure numpy and scikit-learn over the plan's columns; features are built once for the searched
candidates, so scoring a million candidates is a few vectorised passes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.step_time import Calibration, StepTime
from sweeper.knobs import KNOBS

if TYPE_CHECKING:
    # scikit-learn and scipy.optimize are imported where a fit runs: they cost `sweep run` about 2 s of
    # CPU at start, and a sweep that never measures a trial (a dry run, `best`, `status`) never fits
    from sklearn.gaussian_process import GaussianProcessRegressor

# How far off the model may be before anything is measured (in log space: 0.2 = about 20 %, the
# spread of the throughput model's error on public step times); a 40x quirk is far outside it,
# and the fitted amplitude (from MIN_FIT points on) grows to it.
PRIOR_SIGMA = 0.2
MIN_SIGMA = 0.15  # the model is never trusted closer than this away from what was measured
LENGTH_SCALE = 0.8  # in feature units: one knob value changed (one-hot distance 1.4) keeps ~20 % correlation
MIN_FIT = 6  # measured layouts before the kernel's amplitude and length scales are fitted
NOISE = 0.03**2  # repeat-to-repeat noise of a measured step time (a few %), in log space squared
PRIOR_WEIGHT = 1.0  # how many measured neighbours the prior chance to run counts as
# The scales' fit: residuals beyond ~CALIBRATION_SPREAD (log space) count linearly, not squared (soft
# L1). The log of comm_scale / compute_scale has a prior N(0, SCALE_PRIOR^2): the model's split of a
# step between compute and communication is known roughly, so one point cannot tilt it far alone;
# their common level (a trainer or cluster uniformly slower than the model) is nearly free.
CALIBRATION_SPREAD = 0.1
SCALE_PRIOR = 2.0
LEVEL_PRIOR = 3.0
SCALE_BOUNDS = (0.2, 5.0)  # as step_time.calibrate's: beyond, the model is wrong, not its scale
# Per-knob effects beside the kernel's neighbourhoods: a linear term over the same features (a
# Bayesian ridge: each one-hot knob value and each log2 degree gets an effect, shrunk towards 0 with
# this prior sigma in log space). A Matern process reverts to the prior away from what ran, so
# pp=4 and pp=8 measured 10x and 20x slow said nothing of pp=1; the trend does (benchmarks/
# search_public.py, tuned cells: 12/15 within 5 trials without, 13-14/15 with; the held-out 7/10 both).
EFFECT_SIGMA = 0.3
# The linear term's intercept, in units of EFFECT_SIGMA (prior sigma 0.9 in log space): the level of
# the measured layouts is the intercept's, so the effects carry only how layouts differ (without
# it, a feature equal at every measured layout stands in for the level and moves the others).
# Of 0, 1 and 3, 3 did best on the tuned cells (14/15; the held-out cells 7/10 with each).
EFFECT_INTERCEPT = 3.0
# Derived sizes the step time depends on that no single knob is: per-micro-batch costs (a
# schedule's Python, a pipeline engine's exchange, a stall per micro-batch) follow the number of
# micro-batches per step, which the micro-batch size, tp, pp and cp set together.
DERIVED = ("grad_accum",)


def features(
    cols: dict[str, np.ndarray], rows: np.ndarray, searched: Sequence[str], extra: np.ndarray | None = None
) -> np.ndarray:
    """One row of features per layout: numeric knobs and the `DERIVED` sizes that vary as log2 scaled
    to [0, 1], the other knobs one-hot; `extra` (one row per layout of `rows`) appended as given."""
    out = [] if extra is None else [np.asarray(extra, dtype=float).reshape(len(rows), -1)]
    derived = [k for k in DERIVED if k in cols and np.unique(cols[k][rows]).size > 1]
    for k in [*searched, *derived]:
        v = cols[k][rows]
        if k in derived or KNOBS[k].kind is int:
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
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, DotProduct, Matern, WhiteKernel

        self.offset = float(np.mean(y))
        d = self.x.shape[1]
        kernel = ConstantKernel(PRIOR_SIGMA**2, (MIN_SIGMA**2, 2.0**2)) * Matern(
            length_scale=np.full(d, LENGTH_SCALE), length_scale_bounds=(0.3, 20.0), nu=2.5
        ) + WhiteKernel(NOISE, (1e-4, 0.1))
        kernel = kernel + ConstantKernel(EFFECT_SIGMA**2, (1e-4, 2.0**2)) * DotProduct(
            sigma_0=EFFECT_INTERCEPT, sigma_0_bounds="fixed"
        )
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


def calibrate(
    pred: StepTime,
    rows: Sequence[int],
    measured_step_s: Sequence[float],
    *,
    prior: Calibration | None = None,
    prior_weight: float = 0.0,
) -> Calibration:
    """The compute and communication scales that fit measured step times, robust to a quirk.

    Minimises, over the log of both scales, the soft-L1 loss of log(measured / calibrated step
    time) (scale `CALIBRATION_SPREAD`) plus the scales' prior; a point or two fit closely, a few
    points several times off the rest hardly move the scales (scipy's `least_squares`).

    `prior` (a learned profile's scales): each scale is pulled towards it as by `prior_weight`
    measured layouts that sat exactly on it, so the sweep's own trials outweigh it as they come
    (after n of them it holds prior_weight / (prior_weight + n) of the say); with nothing
    measured, the scales are the prior's.
    """
    centre = np.log([prior.compute_scale, prior.comm_scale]) if prior is not None else np.zeros(2)
    pull = np.sqrt(prior_weight) if prior is not None else 0.0
    if not len(rows):
        return Calibration(prior.compute_scale, prior.comm_scale, 0) if prior is not None else Calibration()
    idx = np.asarray(rows, dtype=int)
    log_y = np.log(np.asarray(measured_step_s, dtype=float))
    compute, comm = pred.compute[idx], pred.comm[idx]
    lo, hi = np.log(SCALE_BOUNDS)

    def misfit(p: np.ndarray) -> np.ndarray:
        t = np.exp(p[0]) * compute + np.exp(p[1]) * comm
        return (log_y - np.log(np.maximum(t, 1e-12))) / CALIBRATION_SPREAD

    def loss(p: np.ndarray) -> np.ndarray:  # soft L1 on the data (signed, so smooth at 0), squared on the prior
        r = misfit(p)
        prior_terms = [(p[1] - p[0]) / SCALE_PRIOR, (p[0] + p[1]) / (2 * LEVEL_PRIOR)]
        learned = pull * (p - centre) / CALIBRATION_SPREAD  # zero without a learned prior
        return np.concatenate([np.sign(r) * np.sqrt(2 * (np.sqrt(1 + r**2) - 1)), prior_terms, learned])

    from scipy.optimize import least_squares

    start = np.clip(centre, lo, hi)
    fit = least_squares(loss, start, bounds=([lo, lo], [hi, hi]))
    return Calibration(float(np.exp(fit.x[0])), float(np.exp(fit.x[1])), len(idx))
