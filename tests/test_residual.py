"""The search's calibration of the throughput model (`sweeper.residual.calibrate`): it recovers the
compute and communication scales from a few measured step times, and a trainer quirk (one layout
several times slower) moves them little, where a least-squares fit goes to its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.perfmodel import calibrate as least_squares_calibrate
from sweeper.plan import make_plan
from sweeper.residual import calibrate
from tests.conftest import make_sweep


def _model_and_rows():
    plan = make_plan(make_sweep(space={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2]}))
    rows = np.flatnonzero(plan.candidate_mask)
    share = plan.throughput.comm[rows] / plan.throughput.total[rows]
    return plan.throughput, rows[np.argsort(share)]  # from the least communication to the most


def test_a_few_exact_step_times_give_both_scales():
    model, rows = _model_and_rows()
    taught = [int(r) for r in rows[[0, len(rows) // 2, -1]]]
    truth = 0.5 * model.compute[taught] + 2.0 * model.comm[taught]
    c = calibrate(model, taught, truth.tolist())
    assert c.compute_scale == pytest.approx(0.5, rel=0.03) and c.comm_scale == pytest.approx(2.0, rel=0.03)
    assert c.trials == 3


def test_a_quirk_does_not_drag_the_scales():
    model, rows = _model_and_rows()
    taught = [int(r) for r in rows[:: max(1, len(rows) // 8)]][:8]
    truth = 0.8 * model.compute[taught] + 1.5 * model.comm[taught]
    truth[-1] *= 10.0  # the layout with the most communication runs 10x slower: a quirk, not a scale
    robust = calibrate(model, taught, truth.tolist())
    # the quirk is the point with the most leverage on communication (a small share of every step
    # here): it moves comm_scale by a third, compute_scale hardly
    assert robust.compute_scale == pytest.approx(0.8, rel=0.05) and robust.comm_scale == pytest.approx(1.5, rel=0.35)
    plain = least_squares_calibrate(model, taught, truth.tolist())
    assert abs(plain.compute_scale / 0.8 - 1) > 0.5 and plain.comm_scale / 1.5 > 2  # least squares: both far off


def test_nothing_measured_is_the_model_itself():
    model, _ = _model_and_rows()
    c = calibrate(model, [], [])
    assert (c.compute_scale, c.comm_scale, c.trials) == (1.0, 1.0, 0)
