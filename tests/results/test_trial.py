"""The pure side of a trial: metrics from step times, results as JSON, and no torch where none belongs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sweeper.estimate.flops import hardware_flops_per_token, model_flops_per_token
from sweeper.layouts.layout import Layout
from sweeper.results.trial import FAILED, OK, STATUSES, TrialResult, summarize, without_run
from tests.runtime.helpers import tiny_sweep


def test_summarize_follows_the_protocol_and_the_mfu_formula() -> None:
    sweep = tiny_sweep(2)  # 8 sequences of 32 tokens, 2 CPU "devices" of nominal 0.192 TFLOP/s
    layout = Layout(tp=2, activation_checkpointing="full", micro_batch_size=4)
    times = [3.0, 0.5, 0.4, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    r = summarize(sweep, layout, step_times_s=times, losses=[6.0] * 10, peak_mem_gib=0.02)
    assert r.status == OK and r.step_times_s == times  # every step kept, the warm-up one too
    assert r.step_time_mean_s == pytest.approx(0.5)  # the first (warm-up) step is dropped
    assert r.step_time_std_s == pytest.approx((0.02 / 8) ** 0.5)  # sample std of the other 9
    tokens_per_s = 8 * 32 / 0.5
    assert r.tokens_per_s == pytest.approx(tokens_per_s)
    assert r.tokens_per_s_per_gpu == pytest.approx(tokens_per_s / 2)
    model_flops = 6 * sweep.model.num_params + 12 * 4 * 64 * 32
    assert model_flops_per_token(sweep.model, 32) == model_flops
    assert r.mfu == pytest.approx(tokens_per_s * model_flops / (2 * 0.192e12))
    assert r.hfu == pytest.approx(tokens_per_s * hardware_flops_per_token(sweep.model, 32, "full") / (2 * 0.192e12))
    assert r.hfu > r.mfu  # full checkpointing runs every forward twice
    assert r.tflops_per_gpu == pytest.approx(tokens_per_s * model_flops / 2 / 1e12)
    assert (r.tp, r.dp, r.grad_accum, r.num_devices, r.activation_checkpointing) == (2, 1, 2, 2, "full")
    assert r.peak_mem_reserved_gib is None  # not measured on CPU: null, never 0


def test_summarize_refuses_a_run_without_timed_steps() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        summarize(tiny_sweep(2), Layout(tp=2), step_times_s=[1.0], losses=[6.0])


def test_a_failed_trial_has_no_metrics_and_round_trips_through_json() -> None:
    r = without_run(tiny_sweep(2), Layout(pp=2), status=FAILED, error="rank 1: boom")
    data = json.loads(json.dumps(r.to_dict()))
    assert data["status"] == "failed" and data["error"] == "rank 1: boom"
    assert all(data[k] is None for k in ("mfu", "hfu", "tokens_per_s", "step_time_mean_s", "peak_mem_gib"))
    assert data["pp"] == 2 and data["dp"] == 1 and data["grad_accum"] == 8
    assert TrialResult.from_dict(data | {"a_future_column": 1}) == r
    with pytest.raises(ValueError, match="status must be one of"):
        without_run(tiny_sweep(2), Layout(), status="exploded", error=None)
    assert set(STATUSES) == {"ok", "oom", "kernel_unavailable", "timeout", "failed", "stopped_early"}


def test_trial_results_and_the_launcher_do_not_import_torch() -> None:
    code = "import sys, sweeper.results.trial, sweeper.launchers.ranks; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
