"""The blocks the trainer builds from a ModelShape (parameter inventory), the LayerNorm kernels, and the uneven stage split.

Single process, no launch: what the parity and memory tests rely on, stated directly.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sweeper.runtime import kernels
from sweeper.runtime.model import (
    build_model,
    eager_layernorm,
    fused_layernorm,
    norm_kernel,
)
from sweeper.runtime.parallel import split_stage
from sweeper.spec.models import ModelShape

LLAMA = ModelShape(layers=4, hidden=64, heads=4, kv_heads=2, ffn=176, vocab=256)
GPT = dataclasses.replace(LLAMA, kv_heads=4, ffn=256, mlp="gelu", norm="layernorm", position="learned")
HEAD_DIM = dataclasses.replace(LLAMA, head_dim=32)
SEQ = 32


def _model(shape: ModelShape, layers: int | None = None) -> torch.nn.Module:
    shape = dataclasses.replace(shape, layers=layers) if layers else shape
    return build_model(shape, SEQ, attend=kernels.eager_attention, norm_fn=norm_kernel(shape, "eager"))


def _block(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {
        k.removeprefix("layers.0."): tuple(p.shape) for k, p in model.named_parameters() if k.startswith("layers.0.")
    }


def test_gpt_block_parameters() -> None:
    """h=64, ffn=256, 4 heads of 16: LayerNorm weight+bias twice, Q/K/V/O with biases, fc1/fc2 with biases."""
    assert _block(_model(GPT)) == {
        "attn.norm.weight": (64,),
        "attn.norm.bias": (64,),
        "attn.attention.wq.weight": (64, 64),
        "attn.attention.wq.bias": (64,),
        "attn.attention.wk.weight": (64, 64),
        "attn.attention.wk.bias": (64,),
        "attn.attention.wv.weight": (64, 64),
        "attn.attention.wv.bias": (64,),
        "attn.attention.wo.weight": (64, 64),
        "attn.attention.wo.bias": (64,),
        "mlp.norm.weight": (64,),
        "mlp.norm.bias": (64,),
        "mlp.ffn.fc1.weight": (256, 64),
        "mlp.ffn.fc1.bias": (256,),
        "mlp.ffn.fc2.weight": (64, 256),
        "mlp.ffn.fc2.bias": (64,),
    }
    model = _model(GPT)
    h, q, kv, f, v, layers = 64, 64, 64, 256, 256, 4
    per_layer = (h * q + q) + 2 * (h * kv + kv) + (q * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    # token embedding, position table (seq_len rows), blocks, final LayerNorm (weight, bias), untied head
    assert per_layer == 12 * h * h + 13 * h  # the GPT-2/3 block when kv = q = h and f = 4h
    assert sum(p.numel() for p in model.parameters()) == v * h + SEQ * h + layers * per_layer + 2 * h + v * h
    assert tuple(model.pos_embeddings.weight.shape) == (SEQ, h) and model.rope_cos is None


def test_head_dim_block_parameters() -> None:
    """4 heads of 32 on hidden 64: wq 64 -> 128, wo 128 -> 64, wk/wv 64 -> 2*32; no biases, no q/k norms."""
    assert _block(_model(HEAD_DIM)) == {
        "attn.norm.weight": (64,),
        "attn.attention.wq.weight": (128, 64),
        "attn.attention.wk.weight": (64, 64),
        "attn.attention.wv.weight": (64, 64),
        "attn.attention.wo.weight": (64, 128),
        "mlp.norm.weight": (64,),
        "mlp.ffn.w1.weight": (176, 64),
        "mlp.ffn.w3.weight": (176, 64),
        "mlp.ffn.w2.weight": (64, 176),
    }
    model = _model(HEAD_DIM)
    assert model.rope_cos.shape == (SEQ, 32)  # RoPE over the 32-wide heads
    assert sum(p.numel() for p in model.parameters()) == HEAD_DIM.num_params


def test_eager_layernorm_is_torch_layer_norm() -> None:
    """Same values and gradients in fp32 (the eager kernel normalises in fp32 whatever the input)."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen, dtype=dtype) * 3 + 1
    w, b = torch.randn(64, generator=gen, dtype=dtype), torch.randn(64, generator=gen, dtype=dtype)
    grads = []
    for fn in (eager_layernorm, fused_layernorm):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        out = fn(xs, ws, bs, 1e-5)
        out.pow(2).sum().backward()
        grads.append((out.detach(), xs.grad, ws.grad, bs.grad))
    for a, c in zip(*grads):
        assert (a - c).abs().max().item() <= 1e-5 * max(1.0, c.abs().max().item())


def test_norm_kernel_follows_the_model_norm() -> None:
    assert norm_kernel(GPT, "fused") is fused_layernorm
    assert norm_kernel(GPT, "eager") is eager_layernorm
    assert norm_kernel(LLAMA, "eager") is kernels.eager_rmsnorm
    with pytest.raises(kernels.KernelUnavailable, match="rmsnorm=apex"):
        norm_kernel(GPT, "apex")


@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [
        (5, 2, [[0, 1], [2, 3, 4]]),
        (7, 4, [[0], [1, 2], [3, 4], [5, 6]]),
        (4, 2, [[0, 1], [2, 3]]),
    ],
)
def test_stages_hold_the_uneven_split(layers: int, stages: int, expected: list[list[int]]) -> None:
    model = _model(GPT, layers)
    parts = [split_stage(model, stage=i, num_stages=stages) for i in range(stages)]
    assert [[int(k) for k in p.layers] for p in parts] == expected
    assert [(p.tok_embeddings is not None, p.pos_embeddings is not None) for p in parts] == [(True, True)] + [
        (False, False)
    ] * (stages - 1)
    assert [(p.norm is not None, p.output is not None) for p in parts] == [(False, False)] * (stages - 1) + [
        (True, True)
    ]


def test_layernorm_bytes_follow_autocast() -> None:
    """Fused LayerNorm keeps input + mean + rstd per token: an fp32 input copy under bf16 autocast
    (4*64 + 8 = 264 B), the bf16 input when FSDP's mixed precision casts instead (2*64 + 8 = 136 B);
    eager keeps 4*64 + 4 + 2*64 = 388 B either way; fp32 fused 4*64 + 8 = 264 B."""
    import numpy as np

    from sweeper.estimate import memory
    from sweeper.layouts.layout import Layout

    from .helpers import tiny_sweep

    def per_token(world: int, precision: str, **knobs: object) -> float:
        sweep = tiny_sweep(world, precision=precision, model="gpt")
        cols = Layout(**knobs).columns(sweep)
        return float(memory.norm_bytes(cols, sweep, np.ones(1))[0])

    assert per_token(1, "bf16", rmsnorm="fused") == 264
    assert per_token(2, "bf16", rmsnorm="fused", sharding="fsdp", micro_batch_size=2) == 136
    assert per_token(2, "bf16", rmsnorm="fused", sharding="zero1", micro_batch_size=2) == 264
    assert per_token(1, "bf16", rmsnorm="eager") == 388
    assert per_token(1, "fp32", rmsnorm="fused") == 264
