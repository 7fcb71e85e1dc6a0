"""The nanotron trainer: what its plan allows and refuses, its step-time traits, its log and its export.

Sources are nanotron at c2528430 (the commit the Ultra-Scale Playbook sweep ran); the loader's own
check of the export is tests/trainers/test_export_nanotron.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sweeper.estimate.memory import estimate
from sweeper.estimate.predict import predict
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.results.rows import ResultsStore
from sweeper.runtime.workloads import run_external
from sweeper.spec.sweep import Sweep
from sweeper.spec.traits import MEGATRON_LIKE
from sweeper.trainers import TRAINERS, trainer_of
from sweeper.trainers.export import layout_record
from sweeper.trainers.nanotron import NANOTRON_TIME, NanotronRecipe, parse_nanotron, to_nanotron
from tests.conftest import make_sweep, sweep_cli
from tests.trainers.test_export import row as results_row

H100 = {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"}


def nanotron_sweep(**overrides: Any) -> Sweep:
    spec: dict[str, Any] = {
        "cluster": H100,
        "workload": {"kind": "nanotron", "command": "torchrun run_train.py --config-file cfg.yaml"},
    }
    return make_sweep(**(spec | overrides))


def rejection(layout: Layout, sweep: Sweep) -> tuple[str | None, str]:
    r = layout.rejection(sweep)
    return (r.code, r.message) if r else (None, "")


def test_the_trainer_object_carries_its_recipe_kernels_and_traits():
    s = nanotron_sweep()
    assert s.trainer is TRAINERS["nanotron"] and s.trainer.time is NANOTRON_TIME
    assert isinstance(trainer_of(s).recipe, NanotronRecipe) and s.memory.recipe == "nanotron"
    # model states as Megatron-LM's table: 2 + 4 + (4 + 8) bytes, master and Adam sharded by ZeRO-1
    megatron = make_sweep(cluster=H100, workload={"kind": "megatron", "command": "run {flags}"})
    for sharding in ("none", "zero1"):
        assert trainer_of(s).recipe.table(s, sharding) == trainer_of(megatron).recipe.table(megatron, sharding)
    assert trainer_of(s).recipe.table(s, "zero1").sharded == ["master", "optimizer"]
    # its loss keeps an fp32 cast beside the kept softmax at the peak: 4 bytes per logit more than Megatron-LM's
    cols = Layout().columns(s)
    assert trainer_of(s).recipe.loss_bytes(cols, s) == (4.0, 6.0)
    assert trainer_of(megatron).recipe.loss_bytes(cols, megatron) == (4.0, 2.0)
    est, est_mg = estimate(cols, s), estimate(cols, megatron)
    assert float(est.logits[0]) > float(est_mg.logits[0])
    assert float(est.weights[0] + est.grads[0] + est.optimizer[0]) == pytest.approx(
        float(est_mg.weights[0] + est_mg.grads[0] + est_mg.optimizer[0])
    )
    assert trainer_of(s).attention == {"flash2"}
    assert NANOTRON_TIME != MEGATRON_LIKE and NANOTRON_TIME.grad_sync_per_microbatch_pp


def test_1f1b_runs_one_micro_batch_fewer_than_stages_and_no_fewer():
    # 48 sequences on 64 GPUs at tp 8, pp 4 (dp 2): micro-batch 8 gives 3 micro-batches, 12 gives 2
    s = nanotron_sweep(global_batch_size=48)
    three, two = Layout(tp=8, pp=4, micro_batch_size=8), Layout(tp=8, pp=4, micro_batch_size=12)
    assert three.grad_accum(64, 48) == 3 and two.grad_accum(64, 48) == 2
    assert rejection(three, s) == (None, "")
    # engine.py OneForwardOneBackwardPipelineEngine asserts m >= PP_SIZE-1
    code, why = rejection(two, s)
    assert code == "too_few_microbatches" and "needs at least 3" in why and "nanotron" in why
    # torchtitan (torch's Schedule1F1B) refuses 3 < 4 (the built-in trainer runs it in GPipe's order);
    # Megatron-LM runs 2 as well
    torchtitan = {"kind": "torchtitan", "command": "torchrun -m torchtitan.train {flags}"}
    tt = make_sweep(global_batch_size=48, cluster=H100, workload=torchtitan, memory={"recipe": "torchtitan"})
    assert rejection(three, tt)[0] == "too_few_microbatches"
    assert rejection(three, make_sweep(global_batch_size=48, cluster=H100)) == (None, "")
    megatron = make_sweep(global_batch_size=48, cluster=H100, workload={"kind": "megatron", "command": "run {flags}"})
    assert rejection(two, megatron) == (None, "")
    # AFAB (gpipe) runs any number
    assert rejection(Layout(tp=8, pp=4, micro_batch_size=24, pp_schedule="gpipe"), s) == (None, "")


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"sharding": "fsdp"}, "sharding = fsdp: no FSDP"),
        (
            {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2},
            "pp_schedule = interleaved: parallelism.pp_engine",
        ),
        (
            {"activation_checkpointing": "selective"},
            "activation_checkpointing = selective: parallelism.recompute_layer",
        ),
        ({"activation_checkpointing": "ffn"}, "activation_checkpointing = ffn"),
        ({"compile": True}, "compile = True: no torch.compile"),
        ({"float8": True}, "float8 = True: no float8 field"),
    ],
)
def test_knob_values_it_cannot_run_are_refused_with_its_reason(knobs: dict[str, Any], reason: str):
    code, why = rejection(Layout(tp=2, **knobs), nanotron_sweep())
    assert code == "knob_not_in_trainer" and why.startswith("the nanotron trainer cannot run ") and reason in why
    # the same layout is a candidate for Megatron-LM (which has each of them)
    megatron = make_sweep(cluster=H100, workload={"kind": "megatron", "command": "run {flags}"})
    assert rejection(Layout(tp=2, **knobs), megatron)[0] is None


def test_the_plan_of_a_nanotron_sweep():
    s = nanotron_sweep(
        space={
            "tp": [1, 2],
            "pp": [1, 2],
            "sharding": ["none", "zero1", "fsdp"],
            "attention": ["flash2", "cudnn"],
            "activation_checkpointing": ["none", "full", "selective"],
        }
    )
    plan = make_plan(s)
    codes = plan.reason_code
    cols = plan.cols
    assert not plan.candidate_mask[cols["sharding"] == "fsdp"].any()
    assert not plan.candidate_mask[cols["attention"] == "cudnn"].any()
    assert not plan.candidate_mask[cols["activation_checkpointing"] == "selective"].any()
    assert set(codes[(cols["sharding"] == "fsdp") & (cols["attention"] == "flash2")]) <= {
        "knob_not_in_trainer",
        "duplicate",  # fsdp at dp = 1 is the same layout as sharding none
    }
    ok = (
        (cols["sharding"] != "fsdp")
        & (cols["attention"] == "flash2")
        & (cols["activation_checkpointing"] != "selective")
    )
    assert plan.candidate_mask[ok].any()


def test_its_traits_price_zero0_with_a_pipeline_per_micro_batch():
    s = nanotron_sweep(global_batch_size=512)
    lays = [Layout(tp=2, pp=4, sharding=sh) for sh in ("none", "zero1")]
    cols = _columns(lays, s)
    accum = int(cols["grad_accum"][0])
    nano = predict(cols, s)  # the sweep's trainer's traits
    plain = predict(cols, s, traits=MEGATRON_LIKE)
    # ZeRO-0 at pp > 1: the reduction paid every micro-batch, none of it hidden
    once = plain.parts["dp_comm"][0] + plain.parts["dp_hidden"][0]  # one reduction, part of it hidden
    assert accum == 64 and once > 0  # 512 sequences over dp 8
    assert nano.parts["dp_comm"][0] == pytest.approx(accum * once) and nano.parts["dp_hidden"][0] == 0
    # ZeRO-1 reduces once, as Megatron-LM's distributed optimizer does
    assert nano.parts["dp_comm"][1] + nano.parts["dp_hidden"][1] == pytest.approx(
        plain.parts["dp_comm"][1] + plain.parts["dp_hidden"][1]
    )
    assert nano.total[0] > nano.total[1]


def _columns(lays: list[Layout], s: Sweep) -> dict[str, np.ndarray]:
    from sweeper.layouts.layout import with_derived

    raw = {k: np.asarray([getattr(lay, k) for lay in lays]) for k in lays[0].as_dict()}
    return with_derived(raw, s)


# Lines in nanotron's format, made by its own code at c2528430: src/nanotron/logging.py
# LoggerWriter.add_scalars_from_list (l. 280-286: "iteration: {step} / {total}" and every LogItem
# as "tag: human_format(value)", joined by " | ") on the LogItems of src/nanotron/trainer.py
# train_step_logs (l. 613-650), behind the Formatter of logging.py set_logger_verbosity_format
# (l. 294-298); and log_memory (logging.py l. 250-258, rank 0, the first five iterations).
NANOTRON_LOG = """\
11/24/2026 19:00:00 [INFO|DP=0|PP=0|TP=0]:  Memory usage: 20123.45MiB. Peak allocated 41234.50MiB. Peak reserved: 45056.00MiB
11/24/2026 19:00:05 [INFO|DP=0|PP=3|TP=0]: iteration: 1 / 10 | consumed_tokens: 3.15M | elapsed_time_per_iteration_ms: 4.57K | tokens_per_sec: 689K | tokens_per_sec_per_gpu: 10.8K | global_batch_size: 768 | lm_loss: 11.9 | lr: 3e-05 | model_tflops_per_gpu: 98.4 | hardware_tflops_per_gpu: 108 | grad_norm: 1.23 | cuda_memory_allocated: 12.3G | cuda_max_memory_reserved: 52.3G | hd_total_memory_tb: 1.9T
11/24/2026 19:00:06 [INFO|DP=0|PP=3|TP=0]: iteration: 2 / 10 | consumed_tokens: 6.29M | elapsed_time_per_iteration_ms: 1.23K | tokens_per_sec: 2.55M | tokens_per_sec_per_gpu: 39.8K | global_batch_size: 768 | lm_loss: 10.9 | lr: 6e-05 | model_tflops_per_gpu: 389 | hardware_tflops_per_gpu: 428 | grad_norm: 1.23 | cuda_memory_allocated: 12.3G | cuda_max_memory_reserved: 52.3G | hd_total_memory_tb: 1.9T
11/24/2026 19:00:07 [INFO|DP=0|PP=3|TP=0]: iteration: 3 / 10 | consumed_tokens: 9.44M | elapsed_time_per_iteration_ms: 987 | tokens_per_sec: 3.19M | tokens_per_sec_per_gpu: 49.8K | global_batch_size: 768 | lm_loss: 9.87 | lr: 9e-05 | model_tflops_per_gpu: 412 | hardware_tflops_per_gpu: 453 | grad_norm: 0.987
"""


def test_its_log_is_read_as_nanotron_writes_it():
    p = TRAINERS["nanotron"].parse_log(NANOTRON_LOG, nanotron_sweep())
    assert p.step_times_s == pytest.approx([4.57, 1.23, 0.987])  # human_format: K is 1000
    assert p.losses == pytest.approx([11.9, 10.9, 9.87])
    assert p.reported_tflops == pytest.approx([98.4, 389, 412])
    assert p.peak_mem_gib == pytest.approx(41234.5 / 1024)
    # the larger of log_memory's 44 GiB and the iteration line's 52.3e9 bytes
    assert p.peak_mem_reserved_gib == pytest.approx(52.3e9 / 2**30)
    # Megatron-LM's and torchtitan's lines are not nanotron's
    other = " [2025-04-13 23:41:12] iteration        1/      10 | elapsed time per iteration (ms): 1200.0 |\n"
    assert parse_nanotron(other).step_times_s == []


def test_its_export_is_a_config_with_its_launch_command():
    s = nanotron_sweep(global_batch_size=48)
    lay = Layout(tp=8, pp=4, micro_batch_size=8, sequence_parallel=True, sharding="zero1")
    rec = layout_record(lay.resolve(s).as_fields() | {"trial_number": 7, "mfu": 0.41}, s)
    text = to_nanotron(rec, s)
    cfg = yaml.safe_load(text)
    assert cfg["parallelism"] == {
        "dp": 2,
        "tp": 8,
        "pp": 4,
        "pp_engine": "1f1b",
        "tp_mode": "REDUCE_SCATTER",
        "tp_linear_async_communication": True,
        "recompute_layer": False,
        "tp_recompute_allgather": True,
        "expert_parallel_size": 1,
    }
    assert cfg["tokens"]["batch_accumulation_per_replica"] == 3 and cfg["optimizer"]["zero_stage"] == 1
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 8 --nproc_per_node 8" in text
    assert "# no nanotron field: rmsnorm=eager" in text  # its Llama runs TritonRMSNorm whatever the knob says
    assert TRAINERS["nanotron"].env(rec)[0] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert TRAINERS["nanotron"].flags(rec, 10) == []  # run_train.py takes --config-file only


def test_sweep_best_writes_the_winner_as_nanotron_config(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": "llama-13b",
                "seq_len": 2048,
                "global_batch_size": 2048,
                "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
                # the rows' sequence parallelism among the space's: a row outside it is skipped (issue 48)
                "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "sequence_parallel": [False, True]},
                "workload": {"kind": "nanotron", "command": "torchrun run_train.py --config-file cfg.yaml"},
                "results_dir": str(tmp_path / "results"),
            }
        )
    )
    store = ResultsStore(tmp_path / "results" / "t")
    store.ensure()
    store.write_row(results_row(tp=2, pp=1) | {"trial_number": 0, "mfu": 0.40})
    store.write_row(results_row(tp=4, pp=2, sequence_parallel=True) | {"trial_number": 1, "mfu": 0.55})
    got = sweep_cli("best", str(spec), "--format", "nanotron", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    cfg = yaml.safe_load(got.stdout)
    assert (cfg["parallelism"]["tp"], cfg["parallelism"]["pp"], cfg["parallelism"]["dp"]) == (4, 2, 8)
    assert cfg["parallelism"]["tp_mode"] == "REDUCE_SCATTER" and cfg["tokens"]["batch_accumulation_per_replica"] == 256
    assert got.stdout.startswith("# nanotron config: sweep t, trial 1, MFU 55.00%")


def test_a_trial_writes_its_config_and_reads_its_log(tmp_path):
    """`workload.kind: nanotron` end to end through `run_external`, nanotron's run_train.py stood in
    by tests/standins/nanotron_run_train.py (its config read, its log lines printed)."""
    standin = Path(__file__).parents[1] / "standins" / "nanotron_run_train.py"
    s = make_sweep(
        cluster=H100,
        workload={"kind": "nanotron", "command": f"{sys.executable} {standin} --config-file {{workdir}}/nanotron.yaml"},
        trial={"steps": 4},
    )
    r = run_external(s, Layout(tp=8, sequence_parallel=True), workdir=tmp_path / "w")
    assert r.status == "ok", r.error
    cfg = yaml.safe_load((tmp_path / "w" / "nanotron.yaml").read_text())
    assert cfg["parallelism"]["tp"] == 8 and cfg["tokens"]["train_steps"] == 4
    accum = cfg["tokens"]["batch_accumulation_per_replica"]
    assert accum == 2048 // 8  # 2048 sequences over dp 8, one per micro-batch
    assert r.step_time_mean_s == pytest.approx(0.1 * accum)  # the stand-in's 100 ms per micro-batch
    assert r.peak_mem_gib == pytest.approx(2.0)
