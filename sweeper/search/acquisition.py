"""Which untried layout the search runs next: the best chance of running the best layout per trial spent.

The search's belief about each untried layout is its expected speed (the recalibrated throughput
model corrected by the residual's mean) and its chance to run (to fit the card, moved by what its
neighbours did). Ranking by expected speed times the chance to run, as the search did, halves a
layout with an even chance to fit: the fastest layout of a sweep, a few % over the card by an
estimate that is itself 10-20 % uncertain, then ran after every certain layout within 2x of it
(in recorded Megatron-LM sweeps, 20th of 20 within 1 % of the best). Yet the question is not its
expected speed: it is how likely a trial there runs the best layout, and what the trial costs.

So each layout is ranked by the chance that it runs and is the best of all (the untried ones, each
weighted by its own chance to run, and the measured ones), under a prediction error of spread
`TAU` in log speed, divided by what its trial is expected to cost: a failed trial (out of
memory) ends at its first step, `FAILED_COST` of a trial that runs. With Gumbel-distributed
errors the chance has a closed form, a softmax (the Gumbel-max trick): for speeds s, chances p
and e = s^(1/TAU),

    P(i runs and is the best) ~= p_i e_i / (e_i + sum_{j != i} p_j e_j),
    index_i = P(i runs and is the best) / (p_i + (1 - p_i) FAILED_COST).

Among layouts certain to run it orders exactly as the expected speed does (the search's order
stands where nothing is in doubt). Away from the top, a layout with chance p is ranked as if
TAU * ln((p + (1 - p) FAILED_COST) / p) slower: 5 % at p = 0.5, 16 % at p = 0.1, 44 % at p = 0.01.
"""

from __future__ import annotations

import math

import numpy as np

from sweeper.search.residual import PRIOR_SIGMA

# The Gumbel's scale whose standard deviation (pi * TAU / sqrt(6)) is the model's prediction error
# before anything is measured (`residual.PRIOR_SIGMA`, in log space).
TAU = PRIOR_SIGMA * math.sqrt(6) / math.pi
# What a trial that fails costs against one that runs: an out-of-memory trial ends at its first step
# (the job's start-up, the model's build and one step, against those and 10 steps; benchmarks/
# search_bench.py charges 120 s of start-up against 120 s + 10 steps of 10-60 s: 0.17-0.5).
FAILED_COST = 0.3


def best_chance(log_speed: np.ndarray, ok: np.ndarray, measured_log_speed: np.ndarray) -> np.ndarray:
    """Log of each untried layout's chance to run and be the best of all (untried and measured), per
    expected cost of its trial (module docstring).

    `log_speed`, `ok`: the untried layouts' expected log speed (any common unit) and chance to run;
    `measured_log_speed`: the measured layouts' log speed in the same unit."""
    top = max(float(np.max(log_speed, initial=-np.inf)), float(np.max(measured_log_speed, initial=-np.inf)))
    e = np.exp((log_speed - top) / TAU)  # at most 1: the fastest has e = 1, the rest less
    total = float(np.sum(ok * e) + np.sum(np.exp((measured_log_speed - top) / TAU)))
    tiny = np.finfo(float).tiny
    with np.errstate(divide="ignore"):  # a chance of 0 is log 0: never the pick while any other is possible
        chance = np.log(ok) + (log_speed - top) / TAU - np.log(np.maximum(total + (1 - ok) * e, tiny))
    return chance - np.log(ok + (1 - ok) * FAILED_COST)
