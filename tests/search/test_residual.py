"""The search's calibration of the throughput model (`sweeper.search.residual.calibrate`): it recovers the
compute and communication scales from a few measured step times, and a trainer quirk (one layout
several times slower) moves them little, where a least-squares fit goes to its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.estimate.step_time import calibrate as least_squares_calibrate
from sweeper.plan.plan import make_plan
from sweeper.search.residual import Residual, calibrate, features
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


def test_a_knob_s_trend_reaches_values_nothing_near_has_measured():
    """pp=4 measured 10x and pp=8 20x slower than the model: the residual's per-knob effect carries
    the trend down to pp=1, which a neighbourhood kernel alone would leave at the prior."""
    cols = {
        "pp": np.array([1, 2, 4, 8, 1, 2, 4, 8]),
        "micro_batch_size": np.array([1, 1, 1, 1, 2, 2, 2, 2]),
        "grad_accum": np.array([8, 8, 8, 8, 4, 4, 4, 4]),
    }
    rows = np.arange(8)
    x = features(cols, rows, ["pp", "micro_batch_size"])
    assert x.shape == (8, 3)  # log2 pp, log2 micro-batch, log2 micro-batches per step, each in [0, 1]
    residual = Residual(x)
    residual.fit(np.array([2, 3]), np.log([10.0, 20.0]))
    mean, _ = residual.predict(rows)
    # pp=1 is predicted faster than pp=2, and both faster than pp=4 (measured) by a good share
    assert mean[0] < mean[1] < mean[2] - 0.4 and mean[2] - mean[0] > 0.6
    assert mean[2] == pytest.approx(np.log(10.0), abs=0.05) and mean[3] == pytest.approx(np.log(20.0), abs=0.05)
