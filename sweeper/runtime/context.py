"""Context parallelism: each rank of a cp group holds a part of every sequence and attends over all of it.

The sequence is cut into 2*cp equal chunks and rank i holds chunks i and 2*cp-1-i (Megatron-LM's
and torchtitan's load balancing: under a causal mask an early chunk has little work, a late one
much, and each rank gets one of each). Everything but attention is per token and runs on the
local tokens unchanged; attention needs every earlier key and value, so each rank all-gathers K
and V over the cp group (the exchange Llama 3's training describes), restores sequence order and
masks by global position. The all-gather's backward is a reduce-scatter: the gradient of a
rank's keys and values, summed over every rank that attended to them, returns to that rank.

Each local chunk then attends over the prefix of the gathered sequence that ends with it, with a
lower-right-aligned causal bias (`torch.nn.attention.bias.causal_lower_right`: query j of a
chunk of c tokens at global chunk g sees keys up to g*c + j), through SDPA pinned to the
attention knob's backend. The flash and memory-efficient kernels take that bias natively on
CUDA; math materialises it, and so does the CPU flash kernel (checked here, torch 2.13);
the memory-efficient and cuDNN kernels do not run on CPU at all.

This exchange is the one implementation, on CPU (gloo) and CUDA alike. PyTorch's
`torch.distributed.tensor.experimental.context_parallel` (a ring over SDPA, torchtitan's CUDA
path) does not run on CPU (no sharding strategy for the CPU flash kernel, and it resizes
buffers in place), so it cannot be checked here against the single-process reference; it is
not used. The all-gather holds the whole sequence's K/V per rank (a ring holds two chunks).

Positions: RoPE tables are indexed by the local tokens' global positions (`local_rope`), so a
model that applies `cos[:s]` to its local sequence rotates each token by its true position.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sweeper.errors import one_line
from sweeper.runtime.kernels import SDPA_BACKENDS, KernelUnavailable


def chunk_ids(cp: int, rank: int) -> tuple[int, int]:
    """The two of the 2*cp sequence chunks a cp rank holds: an early one and its mirror."""
    return rank, 2 * cp - 1 - rank


def local_positions(seq_len: int, cp: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
    """Global positions of the tokens cp rank `rank` holds, in its local order."""
    if seq_len % (2 * cp):
        raise ValueError(f"cp={cp}: 2*cp must divide seq_len ({seq_len})")
    size = seq_len // (2 * cp)
    return torch.cat([torch.arange(c * size, (c + 1) * size, device=device) for c in chunk_ids(cp, rank)])


def shard_sequence(x: torch.Tensor, *, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor (inputs, labels) along `dim`."""
    return x.index_select(dim, local_positions(x.shape[dim], cp, rank, x.device))


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward reduce-scatters (sums) the gradient back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        n = dist.get_world_size(group)
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        n = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // n, *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenate every rank's x along dim 0, in rank order (differentiable)."""
    out: torch.Tensor = _GatherSeq.apply(x, group)
    return out


class ContextParallel:
    """One cp rank's view of a sequence of `seq_len` tokens: its positions, and attention over the group.

    `backend`: the SDPA kernel attention is pinned to (None: SDPA picks); `gqa`: the kernel
    takes fewer key/value heads than query heads itself (else they are repeated first).
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        seq_len: int,
        device: torch.device,
        *,
        backend: SDPBackend | None = None,
        gqa: bool = True,
    ) -> None:
        self.group, self.seq_len = group, seq_len
        self.backend, self.gqa = backend, gqa
        self.cp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.positions = local_positions(seq_len, self.cp, self.rank, device)
        # gathered keys arrive rank by rank; `order` puts them back in sequence order
        gathered = torch.cat([local_positions(seq_len, self.cp, r, device) for r in range(self.cp)])
        self.order = gathered.argsort()

    def __deepcopy__(self, memo: dict[int, Any]) -> ContextParallel:
        """Itself: one rank's view, shared by every copy of the model (a pipeline split deep-copies
        the model, attention functions included, and a process group cannot be copied)."""
        return self

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return x.index_select(dim, self.positions.to(x.device))

    def local_rope(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE tables' rows of this rank's positions (tables of the full sequence in)."""
        return cos[self.positions], sin[self.positions]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of the local queries over every rank's keys; (batch, heads, seq, dim) layout."""
        # K and V in one collective: (2, b, h, s, d) -> sequence first, the dim all-gather joins on
        kv = torch.stack((k, v)).permute(3, 0, 1, 2, 4)
        full = gather_sequence(kv, self.group).index_select(0, self.order)
        k_all, v_all = full.permute(1, 2, 3, 0, 4).unbind(0)
        size = self.seq_len // (2 * self.cp)
        outs = [
            prefix_attention(
                q[:, :, i * size : (i + 1) * size],
                k_all[:, :, : (chunk + 1) * size],
                v_all[:, :, : (chunk + 1) * size],
                backend=self.backend,
                gqa=self.gqa,
            )
            for i, chunk in enumerate(chunk_ids(self.cp, self.rank))
        ]
        return torch.cat(outs, dim=2)


def prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: SDPBackend | None, gqa: bool
) -> torch.Tensor:
    """The last q.shape[-2] positions of a sequence attending causally over all of its k/v."""
    if not gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    # imported here: torch.nn.attention.bias imports torch._dynamo, seconds of CPU in every rank of
    # every trial, which only a cp > 1 trial needs
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(q.shape[-2], k.shape[-2])
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=gqa)


# the attention knob's kernels context parallelism runs (sweeper.trainers.builtin declares the same)
CP_KERNELS = ("flash2", "sdpa_efficient", "sdpa_math")


def cp_backend(
    name: str,
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
    cp: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[SDPBackend, bool]:
    """The SDPA backend of attention `name` under context parallelism, and whether it takes GQA
    natively, after one forward and backward of the largest local call (a chunk over the whole
    sequence) on this machine; KernelUnavailable where it cannot run."""
    if name not in CP_KERNELS:
        raise KernelUnavailable(
            f"attention={name} with cp > 1: context parallelism runs SDPA kernels {', '.join(CP_KERNELS)} only"
        )
    backend = SDPA_BACKENDS[name]
    chunk = seq_len // (2 * cp)
    errors = []
    for gqa in (True, False) if heads != kv_heads else (False,):

        def make(h: int, s: int) -> torch.Tensor:
            return torch.randn(batch, s, h, head_dim, device=device, dtype=dtype, requires_grad=True).transpose(1, 2)

        try:
            out = prefix_attention(
                make(heads, chunk), make(kv_heads, seq_len), make(kv_heads, seq_len), backend=backend, gqa=gqa
            )
            out.sum().backward()
            return backend, gqa
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # any failure of the probe is the kernel's
            errors.append(one_line(e))
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    raise KernelUnavailable(
        f"attention={name} with cp = {cp} (a lower-right causal bias) cannot run on {device.type} "
        f"with {str(dtype).removeprefix('torch.')}, head_dim={head_dim}: {errors[-1]}"
    )
