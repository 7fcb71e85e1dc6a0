"""Step-to-step noise (sweeper.results.noise): the interval arithmetic with numbers, the winner against the
runner-up (win, tie, unknown), the results columns it fills, and rows written before them."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweeper.layouts.layout import Layout
from sweeper.results.noise import (
    StepInterval,
    Verdict,
    interval_fields,
    margin,
    row_interval,
    row_mfu_range,
    steps_to_separate,
    t_factor,
)
from sweeper.results.rows import SCHEMA, ResultsStore, row_from
from sweeper.results.trial import summarize
from tests.runtime.helpers import tiny_sweep


def test_t_factor_is_students_quantile():
    assert t_factor(2) == pytest.approx(12.7062, abs=1e-4)  # 1 degree of freedom
    assert t_factor(9) == pytest.approx(2.3060, abs=1e-4)  # the 10-step protocol: 9 measured steps
    assert t_factor(1000) == pytest.approx(1.9623, abs=1e-4)  # towards the normal's 1.96


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.99, 0.999])
def test_t_factor_agrees_with_scipys_quantile(confidence: float) -> None:
    """noise.py computes the quantile itself (scipy.special's import cost every process 0.3 s): scipy's
    inverse of the t distribution's CDF agrees, to 1e-12 up to 1000 steps and 1e-9 at 100,000."""
    from scipy.special import stdtrit

    for steps in [*range(2, 60), 99, 250, 1000, 5000, 100_000]:
        want = float(stdtrit(steps - 1, (1 + confidence) / 2))
        assert t_factor(steps, confidence) == pytest.approx(want, rel=1e-12 if steps <= 1000 else 1e-9), steps


@pytest.mark.parametrize(("steps", "confidence"), [(1, 0.95), (0, 0.95), (9, 1.0), (9, 0.0)])
def test_t_factor_refuses_what_has_no_interval(steps: int, confidence: float) -> None:
    with pytest.raises(ValueError, match="2 or more steps and a confidence in"):
        t_factor(steps, confidence)


def test_interval_of_four_steps():
    iv = StepInterval.of([1.0, 1.2, 0.8, 1.0])
    assert iv is not None and (iv.mean_s, iv.steps) == (pytest.approx(1.0), 4)
    assert iv.std_s == pytest.approx(math.sqrt(0.08 / 3))  # sample standard deviation
    assert iv.half_width_s == pytest.approx(3.182446 * math.sqrt(0.08 / 3) / 2, rel=1e-6)  # t(0.975, 3) s / sqrt(4)
    low, high = iv.mfu_range(0.5)  # MFU is work / step time: the interval inverted
    assert low == pytest.approx(0.5 / 1.259849, rel=1e-5) and high == pytest.approx(0.5 / 0.740151, rel=1e-5)


def test_an_interval_reaching_zero_seconds_has_no_upper_mfu():
    iv = StepInterval.of([0.1, 3.0])  # mean 1.55 s, half-width 12.7 * 2.05 / 1.41: past 0 s
    assert iv is not None and iv.half_width_s > iv.mean_s
    low, high = iv.mfu_range(0.4)
    assert high is None and low == pytest.approx(0.4 * 1.55 / (1.55 + iv.half_width_s))


def test_fewer_than_two_measured_steps_have_no_interval():
    assert StepInterval.of([1.0]) is None and StepInterval.of([]) is None
    assert interval_fields([1.0], 0.4) == {
        "steps_measured": 1,
        "step_time_ci_s": None,
        "mfu_low": None,
        "mfu_high": None,
    }


def test_summarize_records_the_interval_of_the_measured_steps():
    sweep = tiny_sweep(2)
    times = [3.0, 0.5, 0.4, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]  # the warm-up step (3.0) is not measured
    r = summarize(sweep, Layout(tp=2), step_times_s=times, losses=[6.0] * 10)
    half = 2.306004 * 0.05 / 3  # t(0.975, 8) x std 0.05 / sqrt(9)
    assert r.steps_measured == 9 and r.step_time_ci_s == pytest.approx(half, rel=1e-6)
    assert r.mfu_low == pytest.approx(r.mfu * 0.5 / (0.5 + half)) and r.mfu_high == pytest.approx(
        r.mfu * 0.5 / (0.5 - half)
    )
    assert row_interval(r.to_dict()) == StepInterval(pytest.approx(0.5), pytest.approx(0.05), 9)
    assert {"steps_measured", "step_time_ci_s", "mfu_low", "mfu_high"} <= set(SCHEMA.names)


def test_steps_to_separate_two_spreads():
    a, b = StepInterval(1.0, 0.1, 9), StepInterval(1.1, 0.1, 9)
    # t(n-1) * (0.1 + 0.1) / sqrt(n) < 0.1 first holds at n = 18 (0.0995), not at 17 (0.1028)
    assert steps_to_separate(a, b) == 18
    assert t_factor(18) * 0.2 / math.sqrt(18) < 0.1 <= t_factor(17) * 0.2 / math.sqrt(17)
    assert steps_to_separate(a, StepInterval(1.0, 0.1, 9)) is None  # equal means: no number of steps
    assert steps_to_separate(a, StepInterval(1.0001, 0.1, 9)) is None  # past MAX_STEPS


def row(n: int, mean: float, std: float, steps: int = 9, work: float = 0.5) -> dict:
    """An ok row of a sweep where MFU x step time = `work` seconds, with the given spread."""
    return {
        "trial_number": n,
        "status": "ok",
        "mfu": work / mean,
        "step_time_mean_s": mean,
        "step_time_std_s": std,
        "steps_measured": steps,
        "step_times_s": [9.0] + [mean] * steps,  # one warm-up step
    }


def test_overlapping_intervals_are_a_tie_with_the_steps_that_would_settle_it():
    m = margin(row(3, 1.0, 0.1), row(5, 1.1, 0.1))
    assert m.verdict is Verdict.TIE and m.within_noise() and (m.winner, m.runner_up) == (3, 5)
    assert m.lead == pytest.approx(0.1)  # measured: 10 % faster
    h = t_factor(9) * 0.1 / 3  # 0.0769 s each side
    assert m.winner_mfu == pytest.approx((0.5, 0.5 / (1 + h), 0.5 / (1 - h)))
    assert m.lead_low == pytest.approx((0.5 / (1 + h)) / (0.5 / (1.1 - h)) - 1) and m.lead_low < 0
    assert (m.steps_now, m.steps_to_settle, m.warmup_steps) == (9, 18, 1)
    text = m.sentence()
    assert text.startswith(
        "A tie within noise: trial 3 (50.00% MFU, interval 46.43% to 54.16%) and trial 5 (45.45% MFU"
    )
    assert "95% t interval of the mean step time, 9 measured steps" in text
    assert "about 18 measured steps each (trial.steps: 19)" in text and "a repeat of both layouts" in text


def test_apart_intervals_are_a_win_with_the_lead_between_their_ends():
    m = margin(row(0, 1.0, 0.02), row(1, 1.2, 0.02))
    h = t_factor(9) * 0.02 / 3
    assert m.verdict is Verdict.WIN and not m.within_noise() and m.steps_to_settle is None
    assert m.lead == pytest.approx(0.2)
    assert m.lead_low == pytest.approx((1.2 - h) / (1 + h) - 1) and m.lead_high == pytest.approx(
        (1.2 + h) / (1 - h) - 1
    )
    assert m.sentence().startswith("A win beyond noise: trial 0 leads trial 1 by 20.0% (16.7% to 23.4% between")


def test_equal_means_are_a_tie_that_only_a_repeat_settles():
    m = margin(row(0, 1.0, 0.1), row(1, 1.0, 0.1) | {"mfu": 0.5 - 1e-12})
    assert m.verdict is Verdict.TIE and m.steps_to_settle is None
    assert "too alike for more steps to separate them" in m.sentence()


def test_a_row_without_a_spread_leaves_the_noise_unknown():
    m = margin(row(0, 1.0, 0.1), row(1, 1.2, 0.1, steps=1))
    assert m.verdict is Verdict.UNKNOWN and not m.within_noise()
    assert "whether that is beyond noise is unknown" in m.sentence()
    assert row_mfu_range(row(1, 1.2, 0.1, steps=1)) == "-"
    assert row_mfu_range(row(0, 1.0, 0.1)) == "46.43–54.16%"


def test_rows_written_before_the_interval_columns_still_read(tmp_path):
    store = ResultsStore(tmp_path / "r")
    store.ensure()
    old = {c: v for c, v in row_from(row(0, 1.0, 0.1)).items() if c not in interval_fields([], None)}
    schema = pa.schema([f for f in SCHEMA if f.name in old])
    pq.write_table(pa.Table.from_pylist([old], schema=schema), store.trial_path(0))
    store.write_row(row(1, 1.1, 0.1))
    rows = store.rows()
    assert store.warnings == [] and [r["trial_number"] for r in rows] == [0, 1]
    assert "steps_measured" not in rows[0] and row_interval(rows[0]) is None
    frame = store.frame()
    assert frame["steps_measured"].isna().tolist() == [True, False]
    assert margin(frame.iloc[0], frame.iloc[1]).verdict is Verdict.UNKNOWN  # a pandas row, NaN for the missing column
