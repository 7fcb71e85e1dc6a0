"""perfmodel.predict returns its parts by name; breakdown, the report and the plan read those parts;
1F1B with fewer micro-batches than stages is priced, and valid where the trainer runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sweeper.estimate.predict import breakdown, predict
from sweeper.estimate.step_time import COMM_PARTS, COMPUTE_PARTS, HIDDEN_PARTS, PARTS, Calibration, model_misses
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.report import explain_top, runner_up_sentences, varying_knobs
from sweeper.spec.hardware import lookup_gpu
from sweeper.spec.loader import parse_sweep
from sweeper.spec.traits import TimeTraits
from tests.conftest import make_sweep
from tests.report.test_page import row

SPACE = {
    "tp": [1, 2, 4, 8],
    "pp": [1, 2, 4],
    "micro_batch_size": [1, 2, 4],
    "activation_checkpointing": ["none", "full"],
    "sharding": ["none", "zero1", "fsdp"],
}


@pytest.mark.parametrize("calibration", [Calibration(), Calibration(1.4, 0.5, 3)])
def test_parts_sum_to_the_total(calibration):
    sweep = make_sweep(space=SPACE)
    plan = make_plan(sweep)
    rows = plan.candidate_mask
    pred = predict(plan.cols, sweep, calibration)
    assert set(pred.parts) == set(PARTS) == set(COMPUTE_PARTS) | set(COMM_PARTS) | set(HIDDEN_PARTS)
    assert np.allclose(sum(pred.parts[k] for k in COMPUTE_PARTS)[rows], pred.compute[rows], rtol=1e-12)
    assert np.allclose(sum(pred.parts[k] for k in COMM_PARTS)[rows], pred.comm[rows], rtol=1e-12)
    scaled = pred.calibrated_parts()
    assert np.allclose(sum(scaled[k] for k in PARTS if k not in HIDDEN_PARTS)[rows], pred.total[rows], rtol=1e-12)
    assert all((pred.parts[k][rows] >= 0).all() for k in PARTS)
    # the plan's step time is the same model's
    assert np.allclose(plan.throughput.total[rows], predict(plan.cols, sweep).total[rows], rtol=1e-12)


def test_breakdown_reads_predicts_parts():
    sweep = make_sweep(space=SPACE)
    cols = make_plan(sweep).cols
    cal = Calibration(1.3, 2.0, 4)
    parts, pred = breakdown(cols, sweep, cal), predict(cols, sweep, cal)
    for k in PARTS:
        assert np.array_equal(parts[k], pred.calibrated_parts()[k], equal_nan=True), k
    assert np.allclose(parts["forward"], (parts["matmul"] + parts["attention"]) / 3, equal_nan=True)


def _measured(sweep, layouts: list[dict], slowdown: list[float]) -> pd.DataFrame:
    """Trials whose measured step is the model's own step for the layout times `slowdown`."""
    plan = make_plan(sweep)
    rows = []
    for n, (knobs, k) in enumerate(zip(layouts, slowdown, strict=True)):
        step = float(predict(Layout(**knobs).columns(sweep), sweep).total[0]) * k
        r = row(n, 0.4, **knobs)
        flops = 6.0 * sweep.model.num_params * sweep.global_batch_size * sweep.seq_len
        r |= {"step_time_mean_s": step, "mfu": flops / (step * 64 * 312e12)}
        rows.append(r)
    return pd.DataFrame(rows), plan


def test_the_report_draws_the_calibrated_models_parts():
    sweep = make_sweep(space={"tp": [2, 4], "pp": [1, 4], "micro_batch_size": [2]})
    df, plan = _measured(
        sweep, [{"tp": 4, "pp": 1, "micro_batch_size": 2}, {"tp": 4, "pp": 4, "micro_batch_size": 2}], [1.3, 1.3]
    )
    ex = explain_top(df, plan, sweep)
    assert ex is not None
    # the calibration absorbs a common 1.3x: the calibrated model reproduces both measured steps
    assert np.allclose(ex.predicted_s, ex.trials["step_time_mean_s"], rtol=1e-6)
    total = sum(ex.parts[k] for k in PARTS if k not in HIDDEN_PARTS)
    assert np.allclose(total, ex.predicted_s)
    assert ex.parts["bubble"][1] > 0 == ex.parts["bubble"][0]


def test_a_report_whose_model_misses_a_trial_says_so():
    sweep = make_sweep(space={"tp": [2, 4], "pp": [1], "micro_batch_size": [1, 2]})
    layouts = [
        {"tp": 4, "pp": 1, "micro_batch_size": 2},
        {"tp": 2, "pp": 1, "micro_batch_size": 2},
        {"tp": 4, "pp": 1, "micro_batch_size": 1},
    ]
    df, plan = _measured(sweep, layouts, [1.0, 1.05, 3.0])  # the third measured 3x the model
    ex = explain_top(df, plan, sweep)
    assert ex is not None
    slow = int(np.flatnonzero(ex.trials["trial_number"] == 2)[0])
    miss = model_misses(ex.predicted_s, ex.trials["step_time_mean_s"].to_numpy(float))
    assert miss[slow] < -0.15
    sentences = runner_up_sentences(ex, varying_knobs(df), sweep)
    (said,) = [s for s in sentences if "trial 2 (" in s.split(":")[0]]
    assert "the calibrated model misses trial 2's measured step by" in said
    assert "not attributed to a modelled part" in said and "what costs it most" not in said


def test_model_misses_marks_only_beyond_fifteen_percent():
    m = model_misses(np.array([1.0, 1.1, 0.8, 2.0]), np.array([1.0, 1.0, 1.0, 1.0]))
    assert np.isnan(m[0]) and np.isnan(m[1])
    assert m[2] == pytest.approx(-0.2) and m[3] == pytest.approx(1.0)


CHECK_SPEC = {
    "name": "pp_fewer_microbatches",
    "model": "llama-7b",
    "seq_len": 4096,
    "global_batch_size": 256,
    "cluster": {"nodes": 64, "gpus_per_node": 8, "gpu": "h100-sxm"},
    "space": {"tp": [2], "pp": [2], "micro_batch_size": [2], "sharding": ["zero1"]},
}


def _plan(**extra):
    return make_plan(parse_sweep(yaml.safe_dump(CHECK_SPEC | extra)))


def test_1f1b_with_fewer_micro_batches_than_stages_is_a_candidate_for_megatron():
    megatron = {"workload": {"kind": "megatron", "command": "torchrun pretrain_gpt.py {flags}"}}
    plan = _plan(**megatron)
    assert int(plan.cols["grad_accum"][0]) == 1 and list(plan.status) == ["candidate"]
    # priced by its bubble: (pp - 1) / m = 1 of the work, i.e. the step is two micro-batch slots
    parts = predict(plan.cols, plan.sweep).parts
    work = sum(parts[k][0] for k in ("matmul", "attention", "memory_bound", "framework", "recompute"))
    assert parts["bubble"][0] == pytest.approx(work)
    # torch.distributed.pipelining's Schedule1F1B (torchtitan) refuses it; the built-in trainer runs it in
    # GPipe's order; interleaved needs pp everywhere
    torchtitan = {"workload": {"kind": "torchtitan", "command": "torchrun -m torchtitan.train {flags}"}}
    assert list(_plan(memory={"recipe": "torchtitan"}, **torchtitan).status) == ["invalid"]
    builtin = _plan()
    assert list(builtin.status) == ["candidate"] and bool(builtin.cols["gpipe_order"][0])
    space = CHECK_SPEC["space"] | {"pp_schedule": ["interleaved"], "virtual_stages": [2]}
    assert list(_plan(space=space, **megatron).status) == ["invalid"]
    assert list(_plan(space=CHECK_SPEC["space"] | {"pp_schedule": ["gpipe"]}).status) == ["candidate"]


def test_time_traits_change_only_what_they_name():
    sweep = make_sweep(space={"tp": [2], "pp": [1, 2], "micro_batch_size": [1], "sharding": ["none", "zero1"]})
    cols = make_plan(sweep).cols
    plain = predict(cols, sweep)
    slow = predict(cols, sweep, traits=TimeTraits(grad_sync_per_microbatch_pp=True))
    hit = (cols["pp"] > 1) & (cols["sharding"] == "none")
    assert (slow.total[hit] > 2 * plain.total[hit]).all()
    assert np.allclose(slow.total[~hit], plain.total[~hit])


def test_no_trainer_is_named_in_the_step_time_model():
    text = (Path(__file__).resolve().parents[2] / "sweeper" / "estimate" / "step_time.py").read_text()
    for name in ("megatron", "torchtitan", "deepspeed", "builtin", "nanotron"):
        assert f'"{name}"' not in text and f"'{name}'" not in text


@pytest.mark.parametrize("name", ["gb200", "gb300", "b300"])
def test_blackwell_systems_are_in_the_table(name):
    gpu = lookup_gpu(name)
    assert gpu is not None and gpu.supports_fp8 and gpu.bf16_tflops >= 2250 and gpu.memory_gib > 170
