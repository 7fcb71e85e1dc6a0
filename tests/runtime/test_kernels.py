"""Kernels, the model's building blocks and checkpointing, in one process (fast)."""

from __future__ import annotations

import pytest
import torch

from sweeper.results.trial import KERNEL_UNAVAILABLE, OOM
from sweeper.runtime import kernels
from sweeper.runtime.kernels import KernelUnavailable
from sweeper.runtime.model import apply_rope, build_model, canonical_name, loss_fn, rope_tables
from sweeper.runtime.outcome import classify
from sweeper.runtime.parallel import apply_ac
from sweeper.runtime.train import synthetic_batch
from sweeper.spec.models import ModelShape

from .helpers import CPU, plain_model, tiny_sweep

GQA = dict(heads=4, kv_heads=2, head_dim=16, seq_len=32, dtype=torch.float32, device=CPU)


def _qkv(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, h, 32, 16, generator=g, requires_grad=True) for h in (4, 2, 2))


@pytest.mark.parametrize("name", ["sdpa_math", "flash2", "fused_softmax"])
def test_cpu_attention_kernels_agree_with_eager(name: str) -> None:
    q, k, v = _qkv()
    want = kernels.eager_attention(q, k, v)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    fn = kernels.attention_kernel(name, **GQA)
    got = fn(q, k, v)
    got_grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for g, w in zip(got_grads, want_grads):  # gradients of order 10: fp32 rounding of a few 1e-6
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_eager_attention_is_causal() -> None:
    q, k, v = _qkv()
    out = kernels.eager_attention(q, k, v)
    v2 = v.detach().clone()
    v2[:, :, 10:] += 100.0  # the future must not leak into positions < 10
    torch.testing.assert_close(kernels.eager_attention(q, k, v2)[:, :, :10], out[:, :, :10])


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("sdpa_efficient", "cannot run on cpu"),
        ("cudnn", "cannot run on cpu"),
        ("flash1", "needs the flash-attn 1.x package"),
    ],
)
def test_kernels_missing_here_are_unavailable_with_a_reason(name: str, reason: str) -> None:
    with pytest.raises(KernelUnavailable, match=reason) as info:
        kernels.attention_kernel(name, **GQA)
    assert f"attention={name}" in str(info.value)
    assert classify(info.value, rank=0).status == KERNEL_UNAVAILABLE


def test_selftest_gives_a_missing_kernels_reason_whole() -> None:
    # `sweep selftest` cut these at 200 characters, mid-sentence ("... the math kernel and the fused")
    from sweeper.run.selftest import kernel_checks

    rows = {c.name: c for c in kernel_checks(CPU)}
    for name in ("sdpa_efficient", "cudnn"):
        with pytest.raises(KernelUnavailable) as info:
            kernels.attention_kernel(
                name, heads=4, kv_heads=4, head_dim=32, seq_len=128, dtype=torch.float32, device=CPU
            )
        whole = " ".join(str(info.value).split())
        assert rows[f"attention={name}"].detail == f"unavailable: {whole}" and whole.endswith("."), whole


def test_float8_is_unavailable_without_a_cuda_gpu() -> None:
    with pytest.raises(KernelUnavailable, match="float8 needs a CUDA GPU"):
        kernels.check_float8(CPU)


def test_out_of_memory_errors_are_classified_oom() -> None:
    assert classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), rank=3).status == OOM
    assert (
        classify(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"), rank=0).status
        == OOM
    )
    failed = classify(ValueError("bad shape"), rank=1)
    assert failed.status == "failed" and failed.error.startswith("rank 1: ValueError: bad shape")


def test_fused_rmsnorm_matches_eager() -> None:
    x = torch.randn(2, 8, 64, requires_grad=True)
    w = torch.rand(64, requires_grad=True)
    torch.testing.assert_close(
        kernels.fused_rmsnorm(x, w, 1e-5), kernels.eager_rmsnorm(x, w, 1e-5), atol=1e-6, rtol=1e-5
    )


def test_rope_in_real_arithmetic_equals_the_complex_rotation() -> None:
    """LLaMA's complex form rotates pairs (2i, 2i+1); ours rotates (i, i + d/2): the same map up to that pairing."""
    s, d = 32, 16
    x = torch.randn(1, 2, s, d)
    cos, sin = rope_tables(s, d, CPU)
    ours = apply_rope(x, cos, sin)
    freqs = 1.0 / 10000.0 ** (torch.arange(0, d, 2).float() / d)
    rot = torch.polar(torch.ones(s, d // 2), torch.outer(torch.arange(s).float(), freqs))
    pairs = torch.stack((x[..., : d // 2], x[..., d // 2 :]), dim=-1)  # (i, i + d/2) as one complex number
    theirs = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * rot)
    torch.testing.assert_close(ours, torch.cat((theirs[..., 0], theirs[..., 1]), dim=-1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_model_has_the_parameters_the_shape_counts(tied: bool) -> None:
    shape = ModelShape(4, 64, 4, 2, 176, 256, tied_embeddings=tied)
    model = build_model(shape, 32, attend=kernels.eager_attention, norm_fn=kernels.eager_rmsnorm)
    assert sum(p.numel() for p in model.parameters()) == shape.num_params
    assert all(p.is_meta for p in model.parameters())  # nothing allocated before parallelisation


def test_wrapper_prefixes_do_not_change_a_parameter_name() -> None:
    shape = ModelShape(4, 64, 4, 2, 176, 256, tied_embeddings=True)
    assert (
        canonical_name("layers.1._checkpoint_wrapped_module._orig_mod.mlp.ffn.w1.weight", shape)
        == "layers.1.mlp.ffn.w1.weight"
    )
    assert canonical_name("module.output.weight", shape) == "tok_embeddings.weight"


@pytest.mark.parametrize("mode", ["selective", "ffn", "full"])
def test_checkpointing_gives_the_gradients_of_none(mode: str) -> None:
    sweep = tiny_sweep(1)
    x, y = synthetic_batch(sweep.model, batch=4, seq_len=sweep.seq_len, seed=0)

    def grads(ac: str) -> dict[str, torch.Tensor]:
        model = plain_model(sweep)
        apply_ac(model, mode=ac)
        loss_fn(model(x), y).backward()
        return {canonical_name(k, sweep.model): p.grad for k, p in model.named_parameters()}

    want, got = grads("none"), grads(mode)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-9, rtol=1e-6)
