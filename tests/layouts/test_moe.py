"""The context- and expert-parallel rules: derived degrees as Megatron-LM defines them, the
trainer-specific ones asked of the trainer object, and values no layout can use refused as input."""

from __future__ import annotations

import pytest

from sweeper.errors import SpecError
from sweeper.layouts.layout import Layout
from tests.conftest import make_sweep

QWEN3_235B = "qwen3-235b-a22b"
MEGATRON = {"kind": "megatron", "command": "torchrun pretrain_gpt.py {flags}"}


def _code(layout: Layout, **sweep):
    r = layout.rejection(make_sweep(**sweep))
    return None if r is None else r.code.value


def test_dp_and_expert_data_parallel_follow_megatrons_definitions():
    sweep = make_sweep(model="mixtral-8x7b", cluster={"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm"})
    r = Layout(tp=2, cp=2, pp=2, ep=4, etp=1).resolve(sweep)
    assert r.dp == 32 // (2 * 2 * 2)
    cols = Layout(tp=2, cp=2, pp=2, ep=4, etp=1).columns(sweep)
    assert int(cols["edp"][0]) == 32 // (1 * 4 * 2)


def test_etp_follows_tp_unless_given():
    assert Layout(tp=4).etp == 4
    assert Layout(tp=4, etp=1).etp == 1


def test_nvidias_qwen3_235b_layout_is_valid_for_megatron_but_not_where_ep_comes_from_dp_cp():
    # Megatron-Bridge's H100 Qwen3-235B recipe: tp 2, pp 8, ep 32, etp 1 on 256 GPUs; dp*cp = 16,
    # which ep = 32 does not divide: Megatron-LM's parallel folding runs it over dp*cp*tp
    cluster = {"nodes": 32, "gpus_per_node": 8, "gpu": "h100-sxm"}
    layout = Layout(tp=2, pp=8, ep=32, etp=1, sequence_parallel=True, micro_batch_size=1)
    space = {"tp": [2], "pp": [8], "ep": [32], "etp": [1]}
    common = {"model": QWEN3_235B, "cluster": cluster, "global_batch_size": 2048, "seq_len": 4096, "space": space}
    assert _code(layout, workload=MEGATRON, memory={"recipe": "megatron"}, **common) is None
    # the built-in trainer keeps its expert-parallel groups inside dp*cp
    assert _code(layout, memory={"recipe": "builtin"}, **common) == "ep_not_in_dp_cp"


def test_megatron_needs_sequence_parallel_where_expert_and_tensor_parallelism_meet():
    common = {"model": "mixtral-8x7b", "workload": MEGATRON, "memory": {"recipe": "megatron"}}
    assert _code(Layout(tp=2, ep=4, etp=1), **common) == "ep_needs_sp"
    assert _code(Layout(tp=2, ep=4, etp=1, sequence_parallel=True), **common) is None


def test_the_builtin_trainer_keeps_each_expert_whole():
    # at tp = 2 the reason is tp, whatever etp (it follows tp here): a message naming etp sent users there
    for etp in (0, 1):
        r = Layout(tp=2, ep=2, etp=etp).rejection(make_sweep(model="mixtral-8x7b"))
        assert r is not None and r.code.value == "experts_not_in_workload"
        assert r.message == (
            "the builtin trainer runs a mixture of experts only with tp = 1, not tp = 2 "
            "(it has no tensor-parallel MoE block; no etp value changes that)"
        )
    r = Layout(tp=1, ep=2, etp=2).rejection(make_sweep(model="mixtral-8x7b"))
    assert r is not None and r.message == "the builtin trainer runs etp = 1 only, not etp = 2 (tp = 1)"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"model": "mixtral-8x7b", "space": {"ep": [3]}}, "space.ep: value 3 can never be used"),
        ({"space": {"ep": [2]}}, "space.ep: value 2 can never be used: ep = 2 needs a model with experts"),
        ({"space": {"etp": [1]}}, "space.etp: llama-13b has no experts"),
        ({"seq_len": 4096, "space": {"cp": [3]}}, "space.cp: value 3 can never be used"),
    ],
)
def test_values_no_layout_can_use_are_one_line_input_errors(overrides, field):
    with pytest.raises(SpecError) as e:
        make_sweep(**overrides)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_top_k_above_the_expert_count_is_refused():
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256, "experts": 4, "experts_per_token": 5}
    with pytest.raises(SpecError, match="model.experts_per_token: 5 exceeds experts=4"):
        make_sweep(model=model)


def test_a_router_the_trainer_does_not_compute_is_a_one_line_input_error():
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256, "experts": 4, "experts_per_token": 2}
    with pytest.raises(SpecError, match="model.router: the builtin trainer routes by softmax only, not sigmoid"):
        make_sweep(model=model | {"router": "sigmoid"}, space={"tp": [1]})
    assert (
        make_sweep(model=model | {"router": "sigmoid"}, space={"tp": [1]}, workload=MEGATRON).model.router == "sigmoid"
    )
