"""llm-foundry's MPT as it trains: a fused cross-entropy kernel (`memory.loss_kernel: fused`) and a
low-precision LayerNorm (the fused norm on the 16-bit input), by hand and against torch.

MosaicML's published MPT layouts (../shared/data/llm-foundry) all ran; estimated with an fp32 loss
and an eager norm, those at the card's edge were pruned. These tests hold the two terms that
explain it to numbers, and one of those layouts to a plan that tries it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sweeper.errors import SpecError
from sweeper.estimate.memory import estimate, logits_bytes, norm_bytes
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.results.identity import sweep_identity
from sweeper.statuses import PlanStatus
from tests.conftest import make_sweep

ONE_NODE = {"nodes": 1, "gpus_per_node": 8, "gpu": "a100-80gb"}
FLASH = Layout(attention="flash2", rmsnorm="fused")


def llama7b(memory: dict[str, object]):
    return make_sweep(
        model="llama-7b", seq_len=2048, global_batch_size=64, cluster=ONE_NODE, space={"tp": [1]}, memory=memory
    )


def logits_of(sweep) -> tuple[float, float]:
    kept, transient = logits_bytes(FLASH.columns(sweep), sweep)
    return float(kept[0]), float(transient[0])


@pytest.mark.parametrize("recipe", ["builtin", "megatron", "torchtitan"])
def test_fused_loss_keeps_the_16bit_logits_and_writes_a_16bit_gradient(recipe: str):
    # 2048 x 32000 logits, bf16: the kernel keeps the logits it was given (2) and writes a bf16
    # gradient (2), whatever the recipe's own loss; the final norm (2h + 4) and the head's input (2h)
    head_in = 2048 * (2 * 4096 + 4 + 2 * 4096)
    assert logits_of(llama7b({"recipe": recipe, "loss_kernel": "fused"})) == (
        2048 * 32000 * 2 + head_in,
        2048 * 32000 * 2,
    )


def test_without_the_option_the_recipe_keeps_its_loss():
    # Megatron-LM's vocab_parallel_cross_entropy: the fp32 copy kept (4), the bf16 logits beside it (2)
    head_in = 2048 * (2 * 4096 + 4 + 2 * 4096)
    assert logits_of(llama7b({"recipe": "megatron"})) == (2048 * 32000 * 4 + head_in, 2048 * 32000 * 2)


def test_an_unknown_loss_kernel_is_a_spec_error_naming_the_field():
    with pytest.raises(SpecError, match=r"memory\.loss_kernel"):
        llama7b({"recipe": "megatron", "loss_kernel": "liger"})


def test_the_dry_run_names_the_loss_kernel_beside_the_recipe():
    from sweeper.cli.render import recipe_summary

    assert "fused cross-entropy" in recipe_summary(llama7b({"recipe": "megatron", "loss_kernel": "fused"}))
    assert "cross-entropy" not in recipe_summary(llama7b({"recipe": "megatron"}))


def test_the_option_joins_the_identity_only_when_set():
    plain, fused = llama7b({"recipe": "megatron"}), llama7b({"recipe": "megatron", "loss_kernel": "fused"})
    assert sweep_identity(plain) != sweep_identity(fused)
    assert sweep_identity(plain) == sweep_identity(llama7b({"recipe": "megatron", "loss_kernel": None}))


def lp_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """llm-foundry's LPLayerNorm.forward (llmfoundry/models/layers/norm.py @ 5e85bd62d): input,
    weight and bias cast to the autocast dtype, then torch's layer_norm with autocast off."""
    dtype = torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", enabled=False):
        return F.layer_norm(x.to(dtype), (x.shape[-1],), weight.to(dtype), bias.to(dtype), 1e-5)


def test_low_precision_layernorm_keeps_the_16bit_input_as_the_estimate_counts():
    tokens, h = 64, 256
    # the residual stream and the parameters in fp32, as under Composer's DEFAULT mixed precision
    x = torch.randn(tokens, h, requires_grad=True)
    weight, bias = torch.ones(h, requires_grad=True), torch.zeros(h, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp_layer_norm(x, weight, bias).float().sum().backward()
    per_token = [t for t in saved if t.shape[0] == tokens]  # not the weight and bias casts
    input_bytes = sum(t.numel() * t.element_size() for t in per_token if t.shape[-1] == h)
    stats_bytes = sum(t.numel() * t.element_size() for t in per_token if t.shape[-1] != h)
    assert input_bytes == 2 * h * tokens  # the bf16 input only: no fp32 copy of it
    assert 0 < stats_bytes <= 8 * tokens  # mean and rstd per token (fp32 on CUDA, 8 bytes)
    mpt = make_sweep(
        model={"layers": 2, "hidden": h, "heads": 4, "ffn": 4 * h, "vocab": 1000, "mlp": "gelu", "norm": "layernorm"},
        seq_len=128,
        global_batch_size=16,
        cluster=ONE_NODE,
        space={"tp": [1]},
    )
    cols = Layout(sharding="fsdp", rmsnorm="fused", attention="flash2").columns(mpt)
    assert float(norm_bytes(cols, mpt, np.ones(1))[0]) == 2 * h + 8


# MPT-1b on 16 H100 at micro-batch 20, seq 2048, no checkpointing (llm-foundry's benchmark table,
# H100 80GB BF16): 24 layers, d_model 2048, 16 heads, GELU ffn 8192, vocab 50368, LayerNorm
MPT_1B = {
    "name": "mpt1b",
    "model": {
        "layers": 24,
        "hidden": 2048,
        "heads": 16,
        "ffn": 8192,
        "vocab": 50368,
        "mlp": "gelu",
        "norm": "layernorm",
        "tied_embeddings": True,
    },
    "seq_len": 2048,
    "global_batch_size": 320,
    "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "h100-sxm"},
    "space": {
        "tp": [1],
        "pp": [1],
        "micro_batch_size": [20],
        "sharding": ["fsdp"],
        "attention": ["flash2"],
        "activation_checkpointing": ["none"],
        "rmsnorm": ["fused"],
    },
    "memory": {"recipe": "megatron", "loss_kernel": "fused"},
}


def test_a_published_mpt_layout_at_the_card_edge_is_tried_with_its_terms_by_hand():
    sweep = make_sweep(**MPT_1B)
    cols = Layout(
        micro_batch_size=20, sharding="fsdp", attention="flash2", activation_checkpointing="none", rmsnorm="fused"
    ).columns(sweep)
    e = estimate(cols, sweep)
    tokens, h = 20 * 2048, 2048
    # per token per layer: attention: norm 2h+8, Wqkv input 2h, q,k,v 6h, output 2h, lse 4*16 = 24,648;
    # mlp: norm 2h+8, up_proj input 2h, GELU input and output 2*2*8192                        = 40,968
    assert float(e.activations[0]) == 24 * tokens * (24_648 + 40_968)
    # the fused loss: bf16 logits kept and a bf16 gradient; the final norm and the head's input
    assert float(e.logits[0]) == tokens * 50368 * (2 + 2) + tokens * (2 * h + 8 + 2 * h)
    assert make_plan(sweep).status[0] != PlanStatus.PRUNED
