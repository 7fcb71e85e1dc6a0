"""A mixture-of-experts feed-forward block with expert parallelism, as torchtitan's MoE
(torchtitan/models/moe/moe.py and torchtitan/distributed/expert_parallel.py) builds it.

A router picks each token's top-k experts by softmax over a linear gate (Mixtral, Qwen3,
GPT-OSS); the experts are SwiGLU MLPs held as grouped weights, one [experts, ...] tensor per
matrix; optional shared experts (DeepSeek, Qwen2-MoE) see every token. Routing is dropless:
every token reaches each of its k experts, however unbalanced the load.

Under expert parallelism (ep > 1) the experts are split over the ranks of an ep process group,
experts/ep consecutive ones each. Tokens travel to the rank holding their expert and back by
`all_to_all_single` with uneven split sizes (the counts are exchanged first, themselves by an
all-to-all); the expert tensor parallel degree is 1 (each expert whole on one rank). gloo runs
all of it on CPU (torch 2.13), so the same code path is tested on CPU and used on CUDA.

Gradients: an expert's weights receive the gradient of every token routed to them, from every
rank of the ep group, through the all-to-all's backward. The ep group lies inside data
parallelism, so each rank's loss covers only its own tokens: the caller averages the experts'
gradients like the others (the dense weights are all-reduced over dp*cp; an expert's, summed
here already over the ep group, are divided by dp*cp and all-reduced over expert data parallel,
world/(ep*pp)).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# The grouped expert weights, by name: `init_std` and the sharding key on the `experts.` prefix.
EXPERT_WEIGHTS = ("w1", "w2", "w3")


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(
    x: torch.Tensor, *, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """Rows in_splits[r] of x go to rank r; out_splits[r] rows come from rank r (differentiable)."""
    out: torch.Tensor = _AllToAll.apply(x, out_splits, in_splits, group)
    return out


class Router(nn.Module):
    """Token-choice top-k: softmax over the gate's logits in fp32, the k largest scores kept,
    renormalised to sum to one when `renormalize` (Mixtral, Qwen3's norm_topk_prob)."""

    def __init__(self, hidden: int, experts: int, top_k: int, *, renormalize: bool = True) -> None:
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"experts_per_token={top_k}: must be between 1 and experts ({experts})")
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (tokens, hidden) -> (weights (tokens, k) in fp32, expert ids (tokens, k))."""
        scores = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = scores.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids


class GroupedExperts(nn.Module):
    """`local` SwiGLU experts held as three grouped weights: w1 and w3 [local, ffn, hidden],
    w2 [local, hidden, ffn] (torchtitan's layout). A loop of one matmul pair per expert over its
    contiguous run of tokens: CPU has no grouped GEMM, and the sizes vary per step anyway."""

    def __init__(self, local: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(local, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(local, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(local, ffn, hidden))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: tokens sorted by expert, counts[e] of them for local expert e."""
        outs = []
        for e, part in enumerate(torch.split(x, counts, dim=0)):
            h = F.silu(part @ self.w1[e].t()) * (part @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
        return torch.cat(outs) if outs else x.new_empty((0, self.w2.shape[1]))


class SharedExperts(nn.Module):
    """Experts every token goes through: one SwiGLU of width shared*moe_ffn (torchtitan, DeepSeek)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Router, routed experts (this rank's experts/ep of them) and optional shared experts.

    `ep_group` None (or of size 1): every expert here, no communication. Otherwise this rank
    holds experts [ep_rank*local, (ep_rank+1)*local) and exchanges tokens over the group.
    """

    def __init__(
        self,
        *,
        hidden: int,
        experts: int,
        top_k: int,
        moe_ffn: int,
        shared_experts: int = 0,
        renormalize: bool = True,
        ep_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.num_experts, self.ep, self.ep_rank, self.ep_group = experts, 1, 0, None
        self.router = Router(hidden, experts, top_k, renormalize=renormalize)
        self.experts = GroupedExperts(experts, hidden, moe_ffn)
        self.shared = SharedExperts(hidden, shared_experts * moe_ffn) if shared_experts else None
        if ep_group is not None:
            self.shard_experts(ep_group)

    @property
    def local(self) -> int:
        """Experts held on this rank."""
        return self.num_experts // self.ep

    def shard_experts(self, group: dist.ProcessGroup) -> None:
        """Keep only this rank's experts/ep experts (new, uninitialised weights on the same device:
        call on the meta model, before materialising) and route over `group`."""
        ep = dist.get_world_size(group)
        if self.num_experts % ep:
            raise ValueError(f"ep={ep}: must divide experts ({self.num_experts})")
        if ep == 1:
            return
        self.ep, self.ep_rank, self.ep_group = ep, dist.get_rank(group), group
        ffn, hidden = self.experts.w1.shape[1:]
        with torch.device(self.experts.w1.device):
            self.experts = GroupedExperts(self.local, hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, ids = self.router(tokens)
        # sort the (token, choice) pairs by expert: each expert's tokens become one contiguous run
        order = ids.flatten().argsort(stable=True)
        counts = torch.bincount(ids.flatten(), minlength=self.num_experts)
        routed = tokens[order // self.router.top_k]
        out = self._experts(routed, counts) if self.ep_group is not None else self.experts(routed, counts.tolist())
        # combine: weight each expert's output by its router score and add it back to its token
        out = (out.float() * weights.flatten()[order].unsqueeze(-1)).to(x.dtype)
        combined = torch.zeros_like(tokens).index_add(0, order // self.router.top_k, out)
        if self.shared is not None:
            combined = combined + self.shared(tokens)
        return combined.view(shape)

    def _experts(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch the sorted tokens to the ranks holding their experts, run them, bring them back."""
        assert self.ep_group is not None
        ep, local = self.ep, self.local
        # received[r, e]: tokens rank r sends to this rank's local expert e
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.ep_group)
        send = counts.view(ep, local).sum(1).tolist()
        recv_by_rank = received.view(ep, local)
        recv = recv_by_rank.sum(1).tolist()
        arrived = all_to_all(routed, out_splits=recv, in_splits=send, group=self.ep_group)
        # arrived is ordered (source rank, expert); the experts want (expert, source rank)
        perm = _regroup(recv_by_rank)
        out = self.experts(arrived[perm], recv_by_rank.sum(0).tolist())
        back = torch.empty_like(out).index_copy(0, perm, out)
        return all_to_all(back, out_splits=send, in_splits=recv, group=self.ep_group)


def _regroup(counts: torch.Tensor) -> torch.Tensor:
    """Row indices that reorder runs laid out (rank, expert) with counts[rank, expert] rows each
    into (expert, rank) order."""
    ranks, local = counts.shape
    run = torch.repeat_interleave(torch.arange(ranks * local, device=counts.device), counts.flatten())
    # run r*local + e becomes key e*ranks + r; a stable sort keeps the rows of a run in order
    key = (run % local) * ranks + run // local
    return key.argsort(stable=True)


def apply_ep(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Shard the experts of every MoE block of a (meta) model over the ep group."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.shard_experts(group)


def expert_slice(name: str, full: torch.Tensor, *, ep_rank: int, ep: int) -> torch.Tensor:
    """This rank's rows of a grouped expert weight (dim 0 is the expert); others whole."""
    if not is_expert_param(name):
        return full
    local = full.shape[0] // ep
    return full[ep_rank * local : (ep_rank + 1) * local]


def is_expert_param(name: str) -> bool:
    """A routed expert's grouped weight (sharded over ep), by parameter name."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in EXPERT_WEIGHTS
