"""Issue 38: the early stop is noise-aware. A trial is stopped only when, after MIN_STEPS measured
steps, its interval (the report's 95 % t interval of the mean step time) lies wholly below the best's
and its median is STOP_SLOWER below; on a loaded host a fixed 1.5x on 2 steps stopped 11 of 12."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from sweeper.results.noise import StepInterval
from sweeper.run.rows_told import row_attrs
from sweeper.search.stopping import MFU_LOW, MIN_STEPS, SlowerThanBest, mfu_high

optuna.logging.set_verbosity(optuna.logging.WARNING)


def pruned(steps: list[float], *, best: float = 0.40, best_low: float | None = None) -> bool:
    study = optuna.create_study(direction="maximize", pruner=SlowerThanBest())
    attrs = {MFU_LOW: best_low} if best_low is not None else {}
    study.add_trial(create_trial(value=best, user_attrs=attrs))
    trial = study.ask()
    for i, v in enumerate(steps):
        trial.report(v, i)
    answer = trial.should_prune()
    study.tell(trial, state=TrialState.FAIL)
    return answer


def test_steady_slow_steps_are_stopped_after_enough_steps():
    assert MIN_STEPS == 3
    assert not pruned([0.20, 0.20])  # 2 steps: no interval to speak of
    assert pruned([0.20, 0.21, 0.20])


def test_noisy_steps_whose_interval_reaches_the_best_run_on():
    # median 0.2 (2x below the best) but the steps spread from 0.1 to 0.6: the interval reaches 0.40
    noisy = [0.20, 0.60, 0.12, 0.20]
    assert mfu_high(noisy) > 0.40
    assert not pruned(noisy)


def test_the_best_is_compared_by_its_own_interval():
    steps = [0.24, 0.25, 0.26]
    assert 0.26 < mfu_high(steps) < 0.30
    assert pruned(steps, best=0.40)  # no interval kept for the best: its point value
    assert not pruned(steps, best=0.40, best_low=0.25)  # the best's own interval reaches down to it


def test_mfu_high_is_the_reports_interval():
    steps = [0.20, 0.22, 0.21, 0.19]
    times = [1 / m for m in steps]
    iv = StepInterval.of(times)
    assert iv is not None
    assert mfu_high(steps) == pytest.approx(1 / (iv.mean_s - iv.half_width_s))
    assert mfu_high([0.2, 0.9]) == math.inf  # the interval reaches 0 s: no upper end


def test_a_told_row_keeps_its_interval_for_the_stop():
    assert row_attrs({"trial_number": 3, "mfu_low": 0.31})[MFU_LOW] == 0.31
    assert MFU_LOW not in row_attrs({"trial_number": 3, "mfu_low": None})
