"""The decoder the built-in trainer runs, built on the meta device, in the two block families of `ModelShape`.

LLaMA (the default): RMSNorm, RoPE in real arithmetic, grouped-query attention, SwiGLU, no biases;
`head_dim` may differ from hidden/heads (Qwen3, Gemma: wq is hidden -> heads*head_dim, wo back).
GPT (mlp=gelu, norm=layernorm, position=learned, as GPT-2/3 and Megatron-LM's GPT): LayerNorm with
weight and bias, Q/K/V/O projections with biases, a GELU MLP (fc1, tanh-approximated GELU, fc2,
both with biases) and a learned table of absolute positions added to the token embedding.
The three fields are independent: any mix builds.

Parameters are created without storage and materialised after parallelisation, shard by shard,
by `init_weights`: every value is drawn from a generator seeded by the parameter's name, so
every layout starts from the same weights as the single-process reference.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from sweeper.runtime import kernels
from sweeper.runtime.kernels import AttentionFn, NormFn
from sweeper.runtime.moe import MoE, expert_slice, is_expert_param
from sweeper.spec.models import ModelShape

if TYPE_CHECKING:
    from sweeper.runtime.context import ContextParallel

# A LayerNorm kernel: (x, weight, bias, eps) -> normalised x
LayerNormFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

NORM_EPS = 1e-5
ROPE_THETA = 10000.0
# Wrappers that insert a level into parameter names: checkpointing, torch.compile, DDP.
_WRAPPER_PREFIXES = re.compile(r"(_checkpoint_wrapped_module|_orig_mod|module)\.")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, norm_fn: NormFn) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.norm_fn = norm_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under autocast the fp32 weight would promote the output to fp32, and each following
        # matmul would keep its own 16-bit cast of it: return x's dtype, one tensor for all.
        return self.norm_fn(x, self.weight, NORM_EPS).type_as(x)


def eager_layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / std * weight + bias from plain ops, normalised in fp32 (as `eager_rmsnorm`)."""
    x32 = x.float()
    centred = x32 - x32.mean(-1, keepdim=True)
    normed = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight + bias


def fused_layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's native layer_norm kernel (one kernel forward, one backward, on CPU and CUDA)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def norm_kernel(shape: ModelShape, name: str) -> NormFn | LayerNormFn:
    """The norm function of the `rmsnorm` knob for the model's norm: `fused` is torch's operator
    (rms_norm, or the native layer_norm), `eager` the same maths from plain ops."""
    if shape.norm == "rmsnorm":
        return kernels.rmsnorm_kernel(name)
    if name == "fused":
        return fused_layernorm
    if name == "eager":
        return eager_layernorm
    raise kernels.KernelUnavailable(f"rmsnorm={name}: unknown kernel; known: eager, fused")


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias; the `rmsnorm` knob picks its kernel (see `norm_kernel`)."""

    def __init__(self, dim: int, norm_fn: LayerNormFn) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))
        self.norm_fn = norm_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # as RMSNorm: one output in x's dtype (autocast runs layer_norm in fp32 on CUDA)
        return self.norm_fn(x, self.weight, self.bias, NORM_EPS).type_as(x)


def make_norm(shape: ModelShape, norm_fn: Callable[..., torch.Tensor]) -> nn.Module:
    return LayerNorm(shape.hidden, norm_fn) if shape.norm == "layernorm" else RMSNorm(shape.hidden, norm_fn)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the head dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as real arithmetic (complex numbers break torch.compile), computed in fp32."""
    s = x.shape[-2]
    x32 = x.float()
    return (x32 * cos[:s] + rotate_half(x32) * sin[:s]).type_as(x)


def rope_tables(seq_len: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta^(-2i/d), each frequency repeated for both halves."""
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    """Q, K, V and output projections around an attention kernel; heads per rank follow the weights.

    wq: hidden -> q_dim (heads*head_dim), wk/wv: hidden -> kv_dim, wo: q_dim -> hidden; with biases
    in GPT blocks (position=learned), where RoPE is not applied.
    """

    def __init__(self, shape: ModelShape, attend: AttentionFn) -> None:
        super().__init__()
        h, q, kv = shape.hidden, shape.q_dim, shape.kv_dim
        bias = shape.position == "learned"
        self.head_dim = shape.head_dim
        self.wq, self.wk, self.wv = nn.Linear(h, q, bias=bias), nn.Linear(h, kv, bias=bias), nn.Linear(h, kv, bias=bias)
        self.wo = nn.Linear(q, h, bias=bias)
        self.attend = attend

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if cos is not None and sin is not None:  # RoPE models only (Transformer passes None otherwise)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.attend(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class GeluMLP(nn.Module):
    """GPT's MLP: fc2(gelu(fc1 x)), with biases, GELU in its tanh approximation (GPT-2/3, Megatron-LM)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.fc1 = nn.Linear(shape.hidden, shape.ffn, bias=True)
        self.fc2 = nn.Linear(shape.ffn, shape.hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden, shape.ffn, bias=False)
        self.w3 = nn.Linear(shape.hidden, shape.ffn, bias=False)
        self.w2 = nn.Linear(shape.ffn, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class AttentionBlock(nn.Module):
    """Pre-norm attention without its residual (the unit that tensor parallelism gathers around)."""

    def __init__(self, shape: ModelShape, attend: AttentionFn, norm_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.norm = make_norm(shape, norm_fn)
        self.attention = Attention(shape, attend)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        return self.attention(self.norm(x), cos, sin)


def make_ffn(shape: ModelShape, layer: int) -> nn.Module:
    """The block's feed-forward: a mixture of experts where the shape has experts (past its
    leading `dense_layers`), else the dense MLP of its family.

    The MoE fields are read with getattr: the parity tests' shapes may lack them. The router is
    a softmax over the gate (`moe.Router`); a sigmoid router (DeepSeek-V3) is not built, and the
    sweep file's loader refuses it for this trainer (`Builtin.routers`): this is the last guard.
    """
    experts = getattr(shape, "experts", 0)
    if experts and getattr(shape, "router", "softmax") != "softmax":
        raise ValueError(f"model.router={shape.router}: the built-in trainer's MoE routes by softmax only")
    if experts and layer >= getattr(shape, "dense_layers", 0):
        return MoE(
            hidden=shape.hidden,
            experts=experts,
            top_k=getattr(shape, "experts_per_token", 1),
            moe_ffn=getattr(shape, "moe_ffn", 0) or shape.ffn,
            shared_experts=getattr(shape, "shared_experts", 0),
        )
    return GeluMLP(shape) if shape.mlp == "gelu" else FeedForward(shape)


class MLPBlock(nn.Module):
    """Pre-norm MLP without its residual: the unit that `ffn` checkpointing recomputes."""

    def __init__(self, shape: ModelShape, norm_fn: Callable[..., torch.Tensor], layer: int = 0) -> None:
        super().__init__()
        self.norm = make_norm(shape, norm_fn)
        self.ffn: nn.Module = make_ffn(shape, layer)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.norm(h))


class TransformerBlock(nn.Module):
    def __init__(
        self, shape: ModelShape, attend: AttentionFn, norm_fn: Callable[..., torch.Tensor], layer: int = 0
    ) -> None:
        super().__init__()
        self.attn = AttentionBlock(shape, attend, norm_fn)
        self.mlp = MLPBlock(shape, norm_fn, layer)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        h = x + self.attn(x, cos, sin)
        return h + self.mlp(h)


class Transformer(nn.Module):
    """The decoder. A pipeline stage is the same class with the parts it does not hold set to None."""

    def __init__(
        self, shape: ModelShape, seq_len: int, *, attend: AttentionFn, norm_fn: Callable[..., torch.Tensor]
    ) -> None:
        super().__init__()
        self.shape, self.seq_len = shape, seq_len
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.vocab, shape.hidden)
        # learned absolute positions (GPT): one row per position, added to the token embedding
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(seq_len, shape.hidden) if shape.position == "learned" else None
        )
        # where the embedding output lives along the sequence under tensor parallelism (set by apply_tp)
        self.pos_layout: Any = None
        # keyed by the global layer index, so names stay the same in every pipeline stage
        self.layers = nn.ModuleDict({str(i): TransformerBlock(shape, attend, norm_fn, i) for i in range(shape.layers)})
        # context parallelism (set by context.apply_cp): this rank's positions of the sequence
        self.cp: ContextParallel | None = None
        self.norm: nn.Module | None = make_norm(shape, norm_fn)
        self.output: nn.Linear | None = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        tables = (
            rope_tables(seq_len, shape.head_dim, torch.get_default_device())
            if shape.position == "rope"
            else (None, None)
        )
        self.register_buffer("rope_cos", tables[0], persistent=False)
        self.register_buffer("rope_sin", tables[1], persistent=False)

    def add_positions(self, h: torch.Tensor) -> torch.Tensor:
        """h + the learned position rows of its tokens.

        Under tensor parallelism the table is a replicated DTensor and h this rank's local part
        (the whole sequence, or its slice under sequence parallelism): the sum is formed as
        DTensors, so each rank adds its own positions and the table's gradient is gathered.
        """
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        assert self.pos_embeddings is not None
        table = self.pos_embeddings.weight
        if not isinstance(table, DTensor):
            return h + (table[self.cp.positions] if self.cp is not None else table[: h.shape[1]])
        seq = self.pos_layout
        if self.cp is not None:
            # this cp rank's positions; under sequence parallelism this tp rank's slice of them,
            # whose rows' gradients the tp ranks sum (Partial), else the same on every tp rank
            positions, grad = self.cp.positions, Replicate()
            if isinstance(seq, Shard):
                mesh = table.device_mesh
                positions, grad = positions.chunk(mesh.size())[mesh.get_local_rank()], Partial()
            return h + table.to_local(grad_placements=[grad])[positions]
        full = DTensor.from_local(h, table.device_mesh, [seq], run_check=False)
        rows: DTensor = table[: full.shape[1]]  # slicing a DTensor is one
        if isinstance(seq, Shard):
            rows = rows.redistribute(table.device_mesh, [Shard(0)])  # a local slice, no communication
        out: DTensor = full + rows
        return out.to_local()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if self.pos_embeddings is not None:
            h = self.add_positions(h)
        if torch.is_autocast_enabled(h.device.type):
            # the embedding is not autocast: start the residual stream in 16 bits, as FSDP's
            # mixed precision (bf16 weights) does, instead of carrying it in fp32
            h = h.to(torch.get_autocast_dtype(h.device.type))
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def build_model(
    shape: ModelShape, seq_len: int, *, attend: AttentionFn, norm_fn: Callable[..., torch.Tensor]
) -> Transformer:
    """The whole model on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        return Transformer(shape, seq_len, attend=attend, norm_fn=norm_fn)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the micro-batch's tokens, in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def canonical_name(name: str, shape: ModelShape) -> str:
    """A parameter's name in the unwrapped, unsplit model (a tied head is the embedding)."""
    name = _WRAPPER_PREFIXES.sub("", name)
    return "tok_embeddings.weight" if shape.tied_embeddings and name == "output.weight" else name


def init_std(name: str, shape: ModelShape) -> float | None:
    """Standard deviation of a weight's normal init (None: a constant, see `full_init_value`).

    Embeddings N(0, 1) (untied) or N(0, 1/h) (tied, since they also produce the logits); learned
    positions 0.02 (GPT-3, Megatron-LM's init_method_std); projections 0.02, those writing into
    the residual stream scaled down with depth; head 1/sqrt(h). Norm weights one, biases zero.
    """
    if name.endswith(("norm.weight", ".bias")):
        return None
    if name == "pos_embeddings.weight":
        return 0.02
    if name == "tok_embeddings.weight":
        return shape.hidden**-0.5 if shape.tied_embeddings else 1.0
    if name == "output.weight":
        return shape.hidden**-0.5
    if name.endswith(("wo.weight", "w2.weight", "fc2.weight", "experts.w2")):
        layer = int(name.split(".")[1])
        return 0.02 / math.sqrt(2 * (layer + 1))
    return 0.02


def full_init_value(name: str, shape: ModelShape, size: torch.Size, *, seed: int, device: torch.device) -> torch.Tensor:
    """The whole (unsharded) initial value of parameter `name`: same on every rank and layout."""
    std = init_std(name, shape)
    if std is None:
        return torch.zeros(size, device=device) if name.endswith(".bias") else torch.ones(size, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    out = torch.empty(size, device=device)
    return nn.init.trunc_normal_(out, std=std, a=-3 * std, b=3 * std, generator=gen)


def reset_rope(model: nn.Module, device: torch.device) -> None:
    """Recompute the RoPE tables of every (possibly wrapped) stage module after `to_empty`."""
    for m in model.modules():
        if isinstance(m, Transformer) and m.shape.position == "rope":
            cos, sin = rope_tables(m.seq_len, m.shape.head_dim, device)
            # under context parallelism each local token is rotated by its global position
            m.rope_cos, m.rope_sin = m.cp.local_rope(cos, sin) if m.cp is not None else (cos, sin)


@torch.no_grad()
def init_weights(model: nn.Module, shape: ModelShape, *, seed: int, device: torch.device) -> None:
    """Fill every parameter (after `to_empty`) with its slice of the layout-independent initial value.

    A DTensor parameter (tensor parallel, FSDP, or both) receives the part of the full value its
    placements give this rank; the full value of one parameter exists only while it is copied.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        cname = canonical_name(name, shape)
        moe = model.get_submodule(name.rsplit(".", 2)[0]) if is_expert_param(cname) else None
        if isinstance(moe, MoE) and moe.ep > 1:  # this rank's experts of the whole grouped weight
            if isinstance(param, DTensor):
                raise ValueError(
                    "ep > 1 with FSDP: the built-in trainer does not shard experts over expert data parallel"
                )
            size = torch.Size((moe.num_experts, *param.shape[1:]))
            whole = full_init_value(cname, shape, size, seed=seed, device=device)
            param.copy_(expert_slice(cname, whole, ep_rank=moe.ep_rank, ep=moe.ep))
            continue
        full = full_init_value(cname, shape, param.shape, seed=seed, device=device)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    reset_rope(model, device)


def materialize(model: nn.Module, shape: ModelShape, *, seed: int, device: torch.device) -> None:
    """Give the meta parameters storage on `device` (each rank only its shards), then initialise them.

    Parameters are swapped in place rather than replaced, so a tied head stays the embedding.
    """
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    init_weights(model, shape, seed=seed, device=device)
