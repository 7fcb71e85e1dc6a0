"""Attention and RMSNorm kernels, chosen by name, with an up-front probe of what this machine can run.

A kernel the machine (or this trainer) cannot run raises `KernelUnavailable` with the reason
before any model is built, so the trial ends as `kernel_unavailable` instead of crashing later.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sweeper.errors import one_line
from sweeper.packages import flash_attn_major

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
NormFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]

SDPA_BACKENDS: dict[str, SDPBackend] = {
    "sdpa_math": SDPBackend.MATH,
    "flash2": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


class KernelUnavailable(RuntimeError):
    """A kernel this machine or this trainer cannot run; the trial ends as `kernel_unavailable`."""


# One causal mask per (length, device), shared by every layer and micro-batch: masked_fill
# saves its mask for backward, and a shared constant is not an activation.
_CAUSAL_MASKS: dict[tuple[int, str], torch.Tensor] = {}


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal: the positions a query must not see."""
    key = (seq_len, str(device))
    if key not in _CAUSAL_MASKS:
        _CAUSAL_MASKS[key] = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu_(1)
    return _CAUSAL_MASKS[key]


def _repeat_kv(k: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention for kernels without native support: kv head j serves queries j*rep.."""
    rep = heads // k.shape[1]
    return k if rep == 1 else k.repeat_interleave(rep, dim=1)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V with an explicit s x s score matrix; softmax in fp32 as Megatron does."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.float().masked_fill(causal_mask(q.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1).to(q.dtype) @ v


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: SDPBackend, gqa: bool
) -> torch.Tensor:
    """scaled_dot_product_attention pinned to one backend (no silent fallback to another kernel)."""
    if not gqa:
        k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def flash_attn_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The flash-attn package (FlashAttention 2): (batch, seq, heads, dim) layout, GQA native."""
    from flash_attn import flash_attn_func

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    return out.transpose(1, 2)


def flash1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """flash-attn 1.x (the paper's FlashAttention 1): packed (tokens, heads, dim) with cumulative
    sequence offsets, no grouped-query attention (K/V repeated to every head first)."""
    from flash_attn.flash_attn_interface import flash_attn_unpadded_func

    b, h, s, d = q.shape
    k, v = _repeat_kv(k, h), _repeat_kv(v, h)

    def pack(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(b * s, h, d)

    offsets = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
    out = flash_attn_unpadded_func(pack(q), pack(k), pack(v), offsets, offsets, s, s, 0.0, causal=True)
    return out.view(b, s, h, d).transpose(1, 2)


def _scale_mask_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    """Megatron's FusedScaleMaskSoftmax: scale, causal mask and softmax (in fp32) as one kernel
    once compiled; the mask is an index comparison inside the kernel, never a tensor."""
    s = scores.shape[-1]
    rows = torch.arange(s, device=scores.device).unsqueeze(-1)
    masked = (scores.float() * scale).masked_fill(torch.arange(s, device=scores.device) > rows, float("-inf"))
    return torch.softmax(masked, dim=-1).to(scores.dtype)


@cache
def _fused_scale_mask_softmax() -> Callable[[torch.Tensor, float], torch.Tensor]:
    """`_scale_mask_softmax` compiled, made once per process on first use (and compiled per shape);
    the graph is the three ops above. Not at import: `torch.compile` imports torch._dynamo, seconds
    of CPU in every rank of every trial, which only a fused_softmax trial needs."""
    return torch.compile(_scale_mask_softmax, fullgraph=True, dynamic=False)


def fused_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention with explicit s x s scores (like eager) whose scale-mask-softmax is one fused kernel."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    scores = q @ k.transpose(-2, -1)
    return _fused_scale_mask_softmax()(scores, 1.0 / math.sqrt(q.shape[-1])) @ v


def _probe(
    fn: AttentionFn,
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """One forward and backward at the trial's real shape and memory layout: a micro-batch, made as
    the model makes it ((batch, seq, heads, dim) projections seen through a transpose)."""

    def make(h: int) -> torch.Tensor:
        t = torch.randn(batch, seq_len, h, head_dim, device=device, dtype=dtype, requires_grad=True)
        return t.transpose(1, 2)

    fn(make(heads), make(kv_heads), make(kv_heads)).sum().backward()


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def attention_kernel(
    name: str,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
    batch: int = 1,
) -> AttentionFn:
    """The attention function for `name`, after checking that it runs here (heads are per TP rank,
    `batch` the micro-batch size). A probe that runs out of memory raises torch.OutOfMemoryError:
    the layout does not fit, which says nothing about the kernel."""
    shape = dict(
        batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim, seq_len=seq_len, dtype=dtype, device=device
    )
    if name == "eager":
        return eager_attention
    major = flash_attn_major()
    if name == "flash1":
        if major != 1:
            have = "not installed" if major is None else f"version {major}.x is installed"
            raise KernelUnavailable(
                f"attention=flash1 needs the flash-attn 1.x package (FlashAttention 1); flash-attn is {have}"
            )
        if device.type != "cuda" or dtype == torch.float32:
            raise KernelUnavailable(
                f"attention=flash1 needs a CUDA GPU and fp16/bf16; this trial runs on {device.type} with {dtype}"
            )
        candidates: list[AttentionFn] = [flash1_attention]
    elif name == "fused_softmax":
        candidates = [fused_softmax_attention]
    elif name == "flash2" and device.type == "cuda" and dtype != torch.float32 and major is not None and major >= 2:
        candidates = [flash_attn_attention]
    elif name in SDPA_BACKENDS:
        # GQA inside the kernel where it allows it, else K/V repeated to all heads first
        backend = SDPA_BACKENDS[name]
        candidates = [
            partial(sdpa_attention, backend=backend, gqa=g) for g in ((True, False) if heads != kv_heads else (False,))
        ]
    else:
        raise KernelUnavailable(
            f"attention={name}: unknown kernel; known: eager, fused_softmax, sdpa_math, flash1, flash2, sdpa_efficient, cudnn"
        )
    errors = []
    for fn in candidates:
        try:
            _probe(fn, **shape)
            return fn
        except Exception as e:  # any failure of the probe is the kernel's, except memory
            if _is_oom(e):
                raise torch.OutOfMemoryError(
                    f"attention={name} probe at micro-batch {batch}, {heads} heads, seq {seq_len}: {one_line(e)}"
                ) from e
            errors.append(one_line(e))
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the probe's blocks are not the trial's
    where = f"{device.type}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    raise KernelUnavailable(
        f"attention={name} cannot run on {where} with {str(dtype).removeprefix('torch.')}, head_dim={head_dim}: {errors[-1]}"
    )


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight, normalised in fp32 (LLaMA's reference implementation)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def fused_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's RMSNorm operator: one fused CUDA kernel, which torch takes only when input and weight
    have one dtype (else it falls back to the composite ops with a warning). Under autocast the
    weight is fp32 and the input may be bf16: the weight is cast to the input's dtype."""
    return F.rms_norm(x, (x.shape[-1],), weight if weight.dtype == x.dtype else weight.to(x.dtype), eps)


def rmsnorm_kernel(name: str) -> NormFn:
    """The RMSNorm function for `name`."""
    if name == "eager":
        return eager_rmsnorm
    if name == "fused":
        if not hasattr(F, "rms_norm"):
            raise KernelUnavailable(
                f"rmsnorm=fused needs torch.nn.functional.rms_norm (torch >= 2.4), have {torch.__version__}"
            )
        return fused_rmsnorm
    raise KernelUnavailable(f"rmsnorm={name}: unknown kernel; known: eager, fused")


def check_float8(device: torch.device) -> None:
    """float8 matmuls need a CUDA GPU with fp8 tensor cores (compute capability >= 8.9) and torchao."""
    if device.type != "cuda":
        raise KernelUnavailable(
            f"float8 needs a CUDA GPU with fp8 matmuls (compute capability >= 8.9); this trial runs on {device.type}"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        raise KernelUnavailable(
            f"float8 needs compute capability >= 8.9; {torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}"
        )
    if importlib.util.find_spec("torchao") is None:
        raise KernelUnavailable("float8 needs the torchao package (pip install torchao); it is not installed")
