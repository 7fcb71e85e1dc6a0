"""Stopping a clearly slow trial early: an Optuna pruner over per-step MFU, and what stopping saves.

A trial reports the MFU of each measured step after its warm-up (`step_mfu`) as Optuna
intermediate values; `SlowerThanBest` prunes it once, with at least MIN_STEPS measured steps, its
interval (`sweeper.results.noise`: the 95 % t interval of the mean step time, as the report
computes it, here over the steps reported) lies wholly below the best finished trial's, and its
median is more than `STOP_SLOWER` times below the best's MFU. On a busy host a few steps spread
wide, their interval reaches up to the best's, and the trial runs on. The trial is then recorded as
`stopped_early` (Optuna's PRUNED) with the steps it ran, and the GPU time of the steps it did not
run is accounted (`gpu_hours_saved`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from sweeper.estimate.flops import model_flops_per_token
from sweeper.results.noise import StepInterval
from sweeper.spec.sweep import Sweep

# "Clearly slower": the first steps' median takes more than this times the best's step time, and
# their interval lies below the best's. Step-to-step noise is a few % on a quiet GPU (the ultrascale
# data's single-iteration noise), far more on a loaded CPU host, where the interval decides: a
# fixed 1.5x on 2 steps stopped 11 of 12 trials of the demo on a busy 2-core machine.
STOP_SLOWER = 1.5
MIN_STEPS = 3  # measured steps (after the warm-up) before a trial may be stopped: 2 give no usable interval


class SlowerThanBest(optuna.pruners.BasePruner):
    """Prune a trial whose reported per-step MFU (median) is `slower` times below the best finished MFU
    (at its node count, in a sweep over several)."""

    def __init__(self, slower: float = STOP_SLOWER, min_steps: int = MIN_STEPS) -> None:
        self.slower = slower
        self.min_steps = min_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        values = list(trial.intermediate_values.values())
        if len(values) < self.min_steps or not all(v > 0 for v in values):
            return False
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        # over several node counts MFU falls as nodes grow: a trial is measured against its own size's best
        nodes = trial.params.get("nodes")
        mine = [(float(t.value), t) for t in done if t.value is not None and t.params.get("nodes") == nodes]
        if not mine:
            return False
        best, trial_of_best = max(mine, key=lambda pair: pair[0])
        best_low = float(trial_of_best.user_attrs.get(MFU_LOW) or best)  # its interval's lower end, where it has one
        return float(np.median(values)) * self.slower < best and mfu_high(values) < best_low


MFU_LOW = "mfu_low"  # the user attribute of a told trial with the lower end of its MFU interval


def mfu_high(step_mfu: Sequence[float]) -> float:
    """The upper end of the MFU interval of steps with these MFUs (inf: the interval has none). MFU is
    a fixed work over the step time, so each step's time is 1 / its MFU, in units of that work."""
    iv = StepInterval.of([1.0 / m for m in step_mfu])
    if iv is None:
        return math.inf
    high = iv.mfu_range(1.0 / iv.mean_s)[1]
    return math.inf if high is None else high


def mfu_seconds(sweep: Sweep) -> float:
    """MFU x step time of every layout of the sweep: the step's model FLOPs over the cluster's peak."""
    flops = sweep.global_batch_size * sweep.seq_len * model_flops_per_token(sweep.model, sweep.seq_len)
    return flops / (sweep.cluster.world * sweep.cluster.gpu.peak_flops(sweep.trial.precision))


def step_mfu(sweep: Sweep, step_times_s: Sequence[float]) -> list[float]:
    """The MFU each measured step (after the warm-up) would give on its own."""
    work = mfu_seconds(sweep)
    return [work / t for t in list(step_times_s)[sweep.trial.warmup_steps :] if t > 0]


def gpu_hours_saved(sweep: Sweep, step_times_s: Sequence[float]) -> float:
    """GPU-hours of the steps a trial stopped after `step_times_s` did not run (at its measured pace)."""
    kept = list(step_times_s)[sweep.trial.warmup_steps :] or list(step_times_s)
    left = max(sweep.trial.steps - len(step_times_s), 0)
    return sweep.cluster.world * left * float(np.mean(kept)) / 3600
