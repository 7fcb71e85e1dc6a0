"""The plan's view of what the built-in trainer runs with cp > 1 and with a mixture of experts
(sweeper/trainers/builtin.py): the layouts its parity tests cover are candidates, the others are
refused with a line naming what it needs; other trainers keep their own rules."""

from __future__ import annotations

from typing import Any

import pytest

from sweeper.layouts.layout import Layout
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep


def _sweep(experts: bool, workload: str = "") -> Sweep:
    moe = ", experts: 4, experts_per_token: 2, moe_ffn: 32" if experts else ""
    return parse_sweep(f"""
name: t
model: {{layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256{moe}}}
seq_len: 64
global_batch_size: 8
cluster: {{nodes: 1, gpus_per_node: 8, gpu: h100-sxm}}
{workload}
""")


@pytest.mark.parametrize(
    ("knobs", "experts"),
    [
        ({"cp": 2}, True),
        ({"cp": 2, "sharding": "fsdp", "attention": "sdpa_math"}, True),
        ({"cp": 4, "sharding": "zero1", "attention": "sdpa_efficient"}, True),
        ({"ep": 2}, True),
        ({"ep": 4, "sharding": "zero1"}, True),
        ({"cp": 2, "ep": 4}, True),
        ({"sharding": "fsdp"}, True),  # experts whole on each rank, FSDP-sharded like any weight
        ({"pp": 2, "ep": 2, "pp_schedule": "interleaved", "virtual_stages": 2}, True),
        ({"cp": 2, "tp": 2, "sequence_parallel": True}, False),
        ({"cp": 2, "pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2}, False),
    ],
)
def test_layouts_the_trainer_runs_are_candidates(knobs: dict[str, Any], experts: bool) -> None:
    assert Layout(**knobs).rejection(_sweep(experts=experts)) is None


@pytest.mark.parametrize(
    ("knobs", "code", "message"),
    [
        ({"cp": 2, "compile": True}, "cp_not_in_workload", "the builtin trainer runs cp > 1 only with compile off"),
        (
            {"cp": 2, "attention": "cudnn"},
            "cp_not_in_workload",
            "the builtin trainer runs cp > 1 only with attention flash2, sdpa_efficient, sdpa_math, not cudnn",
        ),
    ],
)
def test_dense_cp_layouts_it_does_not_run_are_refused(knobs: dict[str, Any], code: str, message: str) -> None:
    r = Layout(**knobs).rejection(_sweep(experts=False))
    assert r is not None and (r.code, r.message) == (code, message)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (
            {"tp": 2, "etp": 1, "sequence_parallel": True},
            "the builtin trainer runs a mixture of experts only with tp = 1, not tp = 2 "
            "(it has no tensor-parallel MoE block; no etp value changes that)",
        ),
        ({"compile": True}, "the builtin trainer runs a mixture of experts only with compile off"),
        ({"ep": 2, "sharding": "fsdp"}, "the builtin trainer runs ep > 1 with sharding none or zero1 only, not fsdp"),
        (
            {"float8": True},
            "the builtin trainer runs no float8 mixture of experts (its grouped experts are no nn.Linear)",
        ),
    ],
)
def test_moe_layouts_it_does_not_run_are_refused(knobs: dict[str, Any], message: str) -> None:
    r = Layout(**knobs).rejection(_sweep(experts=True))
    assert r is not None and (r.code, r.message) == ("experts_not_in_workload", message)


def test_other_trainers_keep_their_rules() -> None:
    megatron = _sweep(experts=True, workload='workload: {kind: megatron, command: "pretrain_gpt.py {flags}"}')
    assert Layout(cp=2, tp=2, sequence_parallel=True).rejection(megatron) is None
    assert Layout(ep=2, pp=2).rejection(megatron) is None
    r = Layout(tp=1, etp=4).rejection(_sweep(experts=True))
    assert r is not None and r.message == "the builtin trainer runs etp = 1 only, not etp = 4 (tp = 1)"
