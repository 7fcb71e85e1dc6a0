"""Every validity rule of DESIGN.md, checked on single layouts and through the planner."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from tests.conftest import make_sweep

# A card with room for anything, so that these tests see validity alone, not memory.
HUGE = {"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 100000, "peak_tflops": 100}}


def reject_code(layout: Layout, **sweep_overrides) -> str | None:
    r = layout.rejection(make_sweep(**sweep_overrides))
    return r.code if r else None


def test_derived_values(sweep13b):
    lay = Layout(tp=4, pp=2, micro_batch_size=2)
    assert lay.dp(64) == 8
    assert lay.grad_accum(64, 2048) == 2048 // (2 * 8)
    assert lay.rejection(sweep13b) is None


@pytest.mark.parametrize(
    "layout,overrides,code",
    [
        (Layout(tp=8, pp=4), {"cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "a100-80gb"}}, "world_not_divisible"),
        (
            Layout(tp=8),
            {"cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "a100-80gb"}, "space": {"tp": [1]}},
            "tp_exceeds_node",
        ),
        (Layout(tp=8), {"model": "llama-30b", "space": {"tp": [1]}}, "heads_not_divisible"),
        (
            Layout(tp=2),
            {
                "model": {"layers": 4, "hidden": 96, "heads": 6, "kv_heads": 3, "ffn": 256, "vocab": 64},
                "space": {"tp": [1]},
            },
            "kv_heads_not_divisible",
        ),
        (
            Layout(tp=2),
            {"model": {"layers": 4, "hidden": 64, "heads": 4, "ffn": 175, "vocab": 64}, "space": {"tp": [1]}},
            "ffn_not_divisible",
        ),
        (
            Layout(pp=8),
            {"model": {"layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 64}, "space": {"tp": [1]}},
            "pp_exceeds_layers",
        ),
        (Layout(micro_batch_size=3), {"global_batch_size": 2048}, "batch_not_divisible"),
        (Layout(tp=8, sequence_parallel=True), {"seq_len": 2044}, "seq_not_divisible"),
        (Layout(pp=4, micro_batch_size=8), {"global_batch_size": 512}, "too_few_microbatches"),  # 512/(8*16)=4 ok?
        (Layout(pp=2, pp_schedule="interleaved", virtual_stages=1), {}, "interleaved_virtual_stages"),
        (Layout(pp=4, pp_schedule="interleaved", virtual_stages=16), {}, "interleaved_layers"),  # 64 chunks > 40
        (
            Layout(pp=4, pp_schedule="interleaved", virtual_stages=2),
            {"global_batch_size": 144},
            "interleaved_microbatches",
        ),
        (Layout(float8=True), {}, "float8_unsupported"),  # A100 has no fp8
    ],
)
def test_each_rule(layout, overrides, code):
    got = reject_code(layout, **overrides)
    if code == "too_few_microbatches":
        # 512 sequences / (8 per micro-batch * dp 16) = 4 micro-batches: exactly pp, valid;
        # on twice the GPUs it is 2 < 4
        assert got is None
        # torchtitan's Schedule1F1B refuses 2 < 4; the built-in trainer runs that in GPipe's order
        cluster = {"nodes": 16, "gpus_per_node": 8, "gpu": "a100-80gb"}
        assert reject_code(layout, global_batch_size=512, cluster=cluster) is None
        tt = {"kind": "torchtitan", "command": "torchrun -m torchtitan.train {flags}"}
        got = reject_code(layout, global_batch_size=512, cluster=cluster, workload=tt, memory={"recipe": "torchtitan"})
    assert got == code


def test_gpipe_runs_with_fewer_microbatches_than_stages():
    lay = Layout(pp=4, micro_batch_size=8, pp_schedule="gpipe")
    assert (
        reject_code(lay, global_batch_size=512, cluster={"nodes": 16, "gpus_per_node": 8, "gpu": "a100-80gb"}) is None
    )


def test_interleaved_rounds_follow_torch():
    # grad_accum 24 with pp 4: 6 rounds of 4 -> fine; 96 sequences / 16 dp = 6 micro-batches -> 1 round of 6: fine
    assert reject_code(Layout(pp=4, pp_schedule="interleaved", virtual_stages=2), global_batch_size=384) is None
    # 144 sequences on dp 16 -> 9 micro-batches, 2 rounds of 4.5: rejected
    assert (
        reject_code(Layout(pp=4, pp_schedule="interleaved", virtual_stages=2), global_batch_size=144)
        == "interleaved_microbatches"
    )


def test_float8_allowed_on_h100():
    assert reject_code(Layout(float8=True), cluster={"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"}) is None


def test_reason_names_every_factor(sweep13b):
    r = Layout(tp=8, pp=4).rejection(make_sweep(cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "a100-80gb"}))
    assert r.message == "tp*pp = 8*4 does not divide world = 8 GPUs"
    r = Layout(micro_batch_size=3).rejection(sweep13b)
    assert r.message == "micro_batch_size*dp = 3*64 does not divide global_batch_size = 2048"


def test_sequence_parallel_at_tp1_counted_once():
    plan = make_plan(make_sweep(cluster=HUGE, space={"tp": [1, 2], "sequence_parallel": [False, True]}))
    f = plan.to_frame()
    assert len(f) == 4
    dup = f[f.reason.str.startswith("same run as")]
    assert len(dup) == 1 and dup.iloc[0].tp == 1 and bool(dup.iloc[0].sequence_parallel)
    assert "sequence_parallel=False" in dup.iloc[0].reason
    assert (f.status == "candidate").sum() == 3


def test_sequence_parallel_only_true_keeps_tp1_once():
    # no sp=false in the space: the tp=1 row is the only representative and stays a candidate
    plan = make_plan(make_sweep(cluster=HUGE, space={"tp": [1, 2], "sequence_parallel": [True]}))
    assert plan.counts() == {"candidate": 2}


def test_schedule_and_virtual_stages_collapse_where_they_have_no_effect():
    plan = make_plan(
        make_sweep(cluster=HUGE, space={"pp": [1, 2], "pp_schedule": ["1f1b", "interleaved"], "virtual_stages": [2, 4]})
    )
    f = plan.to_frame()
    cand = f[f.status == "candidate"]
    # pp=1: one layout; pp=2: 1f1b once (virtual stages collapse), interleaved with v=2 and v=4 (40 % 8 == 0)
    assert sorted(zip(cand.pp, cand.pp_schedule, cand.virtual_stages)) == [
        (1, "1f1b", 2),
        (2, "1f1b", 2),
        (2, "interleaved", 2),
        (2, "interleaved", 4),
    ]


def test_sharding_collapses_at_dp1():
    plan = make_plan(
        make_sweep(
            cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "a100-80gb"},
            space={"tp": [8], "sharding": ["none", "fsdp"]},
        )
    )
    assert plan.counts() == {"candidate": 1, "invalid": 1}


def installed_flash_attn(folder: Path, version: str) -> Path:
    """An installed flash-attn as pip leaves it for importlib.metadata: its dist-info folder on a path entry."""
    info = folder / f"flash_attn-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash-attn\nVersion: {version}\n")
    return folder


def test_builtin_trainer_runs_flash1_only_where_flash_attn_1_is_installed(tmp_path, monkeypatch):
    # no flash-attn here: refused, naming the kernel and the package it needs
    r = Layout(attention="flash1").rejection(make_sweep())
    assert r is not None and r.code == "kernel_not_in_workload"
    assert r.message == (
        "attention = flash1 needs the flash-attn 1.x package, and flash-attn here is not installed "
        "(the builtin trainer runs it with that package only)"
    )
    megatron = {"kind": "megatron", "command": "pretrain_gpt.py {flags}"}
    assert Layout(attention="flash1").rejection(make_sweep(workload=megatron)) is None  # Megatron-LM has it
    # flash-attn 2: still refused, saying which version is there
    monkeypatch.syspath_prepend(str(installed_flash_attn(tmp_path / "v2", "2.7.4")))
    r = Layout(attention="flash1").rejection(make_sweep())
    assert r is not None and "flash-attn here is 2.x" in r.message
    # flash-attn 1.x: the kernel probe of a trial (and of `sweep selftest`) finds it, so the plan keeps it
    monkeypatch.syspath_prepend(str(installed_flash_attn(tmp_path / "v1", "1.0.9")))
    assert Layout(attention="flash1").rejection(make_sweep()) is None


def test_a_trainer_without_the_kernel_names_what_it_has():
    nanotron = {"kind": "nanotron", "command": "torchrun run_train.py --config-file cfg.yaml"}
    r = Layout(attention="eager").rejection(make_sweep(workload=nanotron))
    assert r is not None and r.message == "attention = eager: the nanotron trainer has no such kernel (it has: flash2)"


def test_plan_rejects_kernels_of_the_workload_only():
    space = {"tp": [1, 2], "attention": ["eager", "fused_softmax", "flash1", "flash2"]}
    plan = make_plan(make_sweep(space=space, cluster=HUGE))
    attention = plan.cols["attention"]
    lacking = attention == "flash1"  # no flash-attn 1.x here; fused_softmax: the built-in trainer compiles it
    assert (plan.reason_code[lacking] == "kernel_not_in_workload").all() and lacking.sum() == 2
    assert (plan.status[~lacking] == "candidate").all()
    megatron = make_plan(
        make_sweep(space=space, cluster=HUGE, workload={"kind": "megatron", "command": "pretrain_gpt.py {flags}"})
    )
    assert (megatron.status == "candidate").all()


def test_uneven_pipeline_stages_are_valid():
    # 40 layers over 16 stages (2 or 3 each) and 40 over 4*4 interleaved chunks run in
    # Megatron-LM and torchtitan: both valid now
    assert reject_code(Layout(pp=16)) is None
    assert reject_code(Layout(pp=4, pp_schedule="interleaved", virtual_stages=4)) is None
