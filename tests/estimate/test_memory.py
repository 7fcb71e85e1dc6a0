"""The memory model, term by term, against numbers derived by hand and a published measurement."""

from __future__ import annotations

import pytest

from sweeper.estimate.memory import estimate, layer_activation_bytes, microbatches_in_flight_at
from sweeper.layouts.layout import Layout
from sweeper.spec.hardware import GIB
from tests.conftest import make_sweep

P7B = 6_738_415_616
ONE_NODE = {"nodes": 1, "gpus_per_node": 8, "gpu": "a100-80gb"}


def sweep7b(**kw):
    base = dict(model="llama-7b", seq_len=2048, global_batch_size=64, cluster=ONE_NODE, space={"tp": [1]})
    return make_sweep(**(base | kw))


def est(layout: Layout, sweep=None):
    sweep = sweep or sweep7b()
    cols = layout.columns(sweep)
    e = estimate(cols, sweep)
    terms = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "overhead", "allocated", "reserved")
    return {k: float(getattr(e, k)[0]) for k in terms} | {"total": float(e.total[0])}


BASE = Layout(attention="flash2", rmsnorm="fused")


def test_model_states_18_bytes_per_parameter_unsharded():
    # Mixed-precision AdamW: 6 bytes weights (fp32 + 16-bit copy), 4 gradient, 8 Adam moments;
    # the 18 bytes/parameter of the Hugging Face "model training anatomy" guide.
    e = est(BASE)
    assert e["weights"] == 6 * P7B
    assert e["grads"] == 4 * P7B
    assert e["optimizer"] == 8 * P7B


def test_activations_by_hand():
    # Per token per layer, bf16 (e=2), h=4096, 32 heads, kv=4096, ffn=11008, flash, fused norm:
    #   attention: norm 2h+4, q/k/v input 2h, q,k,v 2*3h, output 2h (the o-proj reads it as a
    #              view) + lse 4*32                                                          = 49,284
    #   mlp: norm 2h+4, w1/w3 input 2h, four ffn tensors 4*2*11008                           = 104,452
    # total 153,736 bytes; x 2048 tokens x 32 layers.
    assert est(BASE)["activations"] == 153_736 * 2048 * 32


def test_logits_by_hand():
    # 2048 x 32000 logits: fp32 log-softmax kept (4) + bf16 logits and fp32 gradient at once (2 + 4);
    # the final norm (2h + 4) and the head's input (2h) per token
    assert est(BASE)["logits"] == 2048 * 32000 * 10 + 2048 * (2 * 4096 + 4 + 2 * 4096)


def test_overhead_counts_communicators():
    assert est(BASE)["overhead"] == 1.25 * GIB  # CUDA base 1 GiB + the data-parallel communicator
    assert est(Layout(tp=8, attention="flash2"))["overhead"] == 1.25 * GIB  # tp only (dp=1)
    one_gpu = sweep7b(cluster={"nodes": 1, "gpus_per_node": 1, "gpu": "h200"}, global_batch_size=8)
    assert est(BASE, one_gpu)["overhead"] == 1.0 * GIB


def test_score_kernels_keep_the_probabilities():
    flash, eager = est(BASE)["activations"], est(Layout(attention="eager", rmsnorm="fused"))["activations"]
    # eager: q, expanded k and v (3*2h) + probabilities 6 bytes x a*s + o-proj input copy (2h);
    # flash: q,k,v (6h) + out (2h, read by the o-proj as a view) + lse (4a)
    per_token_layer = 6 * 32 * 2048 - 4 * 32
    assert eager - flash == per_token_layer * 2048 * 32
    assert est(Layout(attention="fused_softmax", rmsnorm="fused"))["activations"] == eager
    for k in ("flash1", "sdpa_efficient", "cudnn"):
        assert est(Layout(attention=k, rmsnorm="fused"))["activations"] == flash


def test_eager_rmsnorm_keeps_an_fp32_copy_and_the_normalised_value():
    diff = est(Layout(attention="flash2", rmsnorm="eager"))["activations"] - est(BASE)["activations"]
    # eager keeps the fp32 copy (4h) instead of the input (2h), plus the normalised value (2h)
    assert diff == 2 * (4 * 4096) * 2048 * 32  # two norms per block


def test_tensor_parallel_splits_all_but_norms_and_matmul_inputs():
    s = sweep7b(space={"tp": [8]})
    kept, _ = layer_activation_bytes(Layout(tp=8, attention="flash2", rmsnorm="fused").columns(s), s)
    # unsplit: two norms (2h+4 each) and two gathered matmul inputs (2h each) = 8h + 8
    # split by 8: q,k,v 6h + out 2h + lse 128 + ffn 8*11008
    per_token = 8 * 4096 + 8 + (6 * 4096 + 2 * 4096 + 128 + 8 * 11008) / 8
    assert float(kept[0]) == pytest.approx(per_token * 2048)


def test_sequence_parallel_splits_the_norms():
    s = sweep7b(space={"tp": [8]})
    no_sp = layer_activation_bytes(Layout(tp=8, rmsnorm="fused").columns(s), s)[0][0]
    sp = layer_activation_bytes(Layout(tp=8, sequence_parallel=True, rmsnorm="fused").columns(s), s)[0][0]
    assert no_sp - sp == pytest.approx(2 * (2 * 4096 + 4) * (1 - 1 / 8) * 2048)  # input and rstd


def test_checkpointing_modes():
    none = est(BASE)
    full = est(Layout(attention="flash2", rmsnorm="fused", activation_checkpointing="full"))
    # full: each block keeps its input (2h per token) + one block recomputed at a time
    assert full["activations"] == 2 * 4096 * 2048 * 32 + 153_736 * 2048
    ffn = est(Layout(attention="flash2", rmsnorm="fused", activation_checkpointing="ffn"))
    assert ffn["activations"] == (49_284 + 2 * 4096) * 2048 * 32 + 104_452 * 2048
    sel = est(Layout(attention="flash2", rmsnorm="fused", activation_checkpointing="selective"))
    assert full["activations"] < sel["activations"] < none["activations"]
    assert ffn["activations"] < none["activations"]


def test_1f1b_first_stage_holds_the_same_layers_as_no_pipeline():
    # Korthikanti et al. 2022, 4.2.3: with 1F1B the first stage keeps pp micro-batches of L/pp layers
    s = sweep7b(space={"pp": [4]})
    pp1 = est(BASE)["activations"]
    pp4 = est(Layout(pp=4, attention="flash2", rmsnorm="fused"), s)["activations"]
    assert pp4 == pytest.approx(pp1)


def microbatches_in_flight(cols):
    """Micro-batches in flight on the first and on the last pipeline rank (the memory model's schedule arithmetic)."""
    return microbatches_in_flight_at(cols, 0), microbatches_in_flight_at(cols, int(cols["pp"][0]) - 1)


def test_interleaved_and_gpipe_in_flight():
    s = sweep7b(space={"pp": [4]})
    lay = Layout(pp=4, pp_schedule="interleaved", virtual_stages=2)
    first = microbatches_in_flight_at(lay.columns(s), 0)
    assert float(first[0]) == pytest.approx(4 * (1 + 3 / 8))  # L(1 + (p-1)/(p*v)) in units of L/p
    gpipe = Layout(pp=4, pp_schedule="gpipe").columns(s)
    first, last = microbatches_in_flight_at(gpipe, 0), microbatches_in_flight_at(gpipe, 3)
    assert float(first[0]) == gpipe["grad_accum"][0] == 32 and float(last[0]) == 32


def test_sharding():
    s = sweep7b(space={"tp": [1]})
    z1 = est(Layout(sharding="zero1", attention="flash2", rmsnorm="fused"), s)
    assert z1["optimizer"] == 8 * P7B / 8 and z1["weights"] == 6 * P7B and z1["grads"] == 4 * P7B
    fsdp = est(Layout(sharding="fsdp", attention="flash2", rmsnorm="fused"), s)
    unit = 202_383_360  # the largest unit gathered at once: one block (the embedding has 131M)
    assert fsdp["optimizer"] == 8 * P7B / 8
    assert fsdp["weights"] == 4 * P7B / 8 + 2 * unit * 2
    assert fsdp["grads"] == 4 * P7B / 8 + unit * 6


def test_pipeline_stages_split_the_parameters():
    s = sweep7b(space={"pp": [4]})
    e = est(Layout(pp=4, attention="flash2", rmsnorm="fused"), s)
    # first stage: 8 blocks + embedding and 4 micro-batches in flight, the more loaded end
    # (the last has 8 blocks + final norm + head, one micro-batch and the logits)
    assert e["optimizer"] == 8 * (8 * 202_383_360 + 32000 * 4096)


def test_torchtitan_published_measurement():
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md, table 1: Llama 3.1 8B, FSDP over 8
    # H100 (95 GiB), local batch 2, seq 8192, selective op checkpointing, no compile: 82.4 GiB,
    # which torchtitan's metrics report as max reserved, so it is compared with the reserved
    # estimate. Under the torchtitan recipe its op policy recomputes every second matmul
    # (wk, wo, w3); the estimate sits 10 % below this row (and 4 % below the same layout with
    # torch.compile, 77.0 GiB). The built-in trainer's selective policy keeps every matmul
    # output, so its recipe must sit at or above the measurement.
    def reserved(recipe: str) -> float:
        s = make_sweep(
            model="llama3-8b",
            seq_len=8192,
            global_batch_size=16,
            cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm"},
            space={"tp": [1]},
            memory={"recipe": recipe},
        )
        return (
            est(
                Layout(
                    sharding="fsdp",
                    micro_batch_size=2,
                    activation_checkpointing="selective",
                    attention="flash2",
                    rmsnorm="fused",
                ),
                s,
            )["reserved"]
            / GIB
        )

    assert 0.85 <= reserved("torchtitan") / 82.4 <= 1.0
    assert 1.0 <= reserved("builtin") / 82.4 <= 1.15


def test_fsdp_with_pipeline_keeps_the_stage_unsharded():
    # pp > 1: parameters stay gathered (16-bit) across micro-batches and the fp32 gradient of the
    # whole stage lives until the schedule ends
    s = sweep7b(space={"pp": [2]})
    e = est(Layout(pp=2, sharding="fsdp", attention="flash2", rmsnorm="fused"), s)
    stage = 16 * 202_383_360 + 32000 * 4096  # the first stage: 16 blocks + embedding
    assert e["weights"] == 4 * stage / 4 + 2 * stage
    assert e["grads"] == 4 * stage / 4 + 4 * stage


def test_a_short_1f1b_the_builtin_trainer_runs_as_gpipe_holds_what_gpipe_holds():
    # one micro-batch on two stages: the built-in trainer runs GPipe's order (torch's Schedule1F1B
    # refuses it), so every stage's estimate is GPipe's, the logits of every micro-batch included
    sweep = make_sweep(global_batch_size=8, space={"tp": [8], "pp": [2], "micro_batch_size": [2]})
    short = estimate(Layout(tp=8, pp=2, micro_batch_size=2).columns(sweep), sweep)
    gpipe = estimate(Layout(tp=8, pp=2, micro_batch_size=2, pp_schedule="gpipe").columns(sweep), sweep)
    assert Layout(tp=8, pp=2, micro_batch_size=2).resolve(sweep).grad_accum == 1
    assert short.total[0] == gpipe.total[0] and short.activations[0] == gpipe.activations[0]
