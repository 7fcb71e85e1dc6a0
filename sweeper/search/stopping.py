"""Stopping a clearly slow trial early: an Optuna pruner over per-step MFU, and what stopping saves.

A trial reports the MFU of each measured step after its warm-up (`step_mfu`) as Optuna
intermediate values; `SlowerThanBest` prunes it once the median of those is more than
`STOP_SLOWER` times below the best finished trial's MFU. The trial is then recorded as
`stopped_early` (Optuna's PRUNED) with the steps it ran, and the GPU time of the steps it did not
run is accounted (`gpu_hours_saved`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from sweeper.estimate.flops import model_flops_per_token
from sweeper.spec.sweep import Sweep

# "Clearly slower": the first steps' median takes more than this times the best's step time.
# Step-to-step noise is a few % (the ultrascale data's single-iteration noise, our own CPU
# trials' spread), so 1.5x is far outside it and still stops the 2-40x slow layouts.
STOP_SLOWER = 1.5
MIN_STEPS = 2  # measured steps (after the warm-up) before a trial may be stopped


class SlowerThanBest(optuna.pruners.BasePruner):
    """Prune a trial whose reported per-step MFU (median) is `slower` times below the best finished MFU
    (at its node count, in a sweep over several)."""

    def __init__(self, slower: float = STOP_SLOWER, min_steps: int = MIN_STEPS) -> None:
        self.slower = slower
        self.min_steps = min_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        values = list(trial.intermediate_values.values())
        if len(values) < self.min_steps:
            return False
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        # over several node counts MFU falls as nodes grow: a trial is measured against its own size's best
        nodes = trial.params.get("nodes")
        best = max((t.value for t in done if t.value is not None and t.params.get("nodes") == nodes), default=None)
        return best is not None and float(np.median(values)) * self.slower < best


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
