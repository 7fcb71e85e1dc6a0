"""Functions the context-parallel and expert-parallel parity tests run on every rank (through `launch`),
and the tiny MoE model they share with the single-process reference."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sweeper.spec import Sweep
from sweeper.trainer.context import ContextParallel
from sweeper.trainer.model import build_model, loss_fn, materialize, norm_kernel
from sweeper.trainer.moe import MoE, expert_slice, is_expert_param
from sweeper.trainer.train import make_optimizer, synthetic_batch

from .workers import start

# ---- context parallel: the tiny LLaMA of the dense parity tests, its sequence split over cp ranks


def cp_parity(*, out_dir: Path, sweep: Sweep, steps: int) -> None:
    """Train the whole batch, each rank holding its 2 of the 2*cp sequence chunks; save losses,
    step-0 gradients and final parameters (rank 0: every parameter is replicated over cp)."""
    env, device = start()
    group = dist.group.WORLD
    cp = ContextParallel(group, sweep.seq_len, device)
    shape = sweep.model
    model = build_model(shape, sweep.seq_len, attend=cp.attention, norm_fn=norm_kernel(shape, "eager"))
    materialize(model, shape, seed=sweep.trial.seed, device=device)
    model.rope_cos, model.rope_sin = cp.local_rope(model.rope_cos, model.rope_sin)
    params = list(model.parameters())
    opt = make_optimizer(params, lr=sweep.trial.lr, device=device)
    x, y = synthetic_batch(shape, batch=sweep.global_batch_size, seq_len=sweep.seq_len, seed=sweep.trial.seed)
    x, y = cp.shard(x), cp.shard(y)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        # every rank holds as many tokens: the global mean loss is the mean of the ranks' losses
        _average([p.grad for p in params], env.world_size)
        losses.append(_mean_over_ranks(loss, env.world_size))
        if step == 0:
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
    if env.rank == 0:
        state = {k: p.detach().clone() for k, p in model.named_parameters()}
        torch.save({"losses": losses, "grads": grads, "params": state}, out_dir / "cp_rank0.pt")
    dist.barrier()
    dist.destroy_process_group()


def _average(tensors: list[torch.Tensor | None], n: int) -> None:
    for t in tensors:
        assert t is not None
        dist.all_reduce(t)
        t.div_(n)


def _mean_over_ranks(loss: torch.Tensor, n: int) -> float:
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / n


# ---- expert parallel: a tiny MoE language model


class TinyMoE(nn.Module):
    """Embedding, one residual MoE block, a head: enough for the router, the experts and their
    gradients to meet the loss."""

    def __init__(self, case: dict[str, Any], ep_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(case["vocab"], case["hidden"])
        self.moe = MoE(
            hidden=case["hidden"],
            experts=case["experts"],
            top_k=case["top_k"],
            moe_ffn=case["moe_ffn"],
            shared_experts=case["shared"],
            renormalize=case["renormalize"],
            ep_group=ep_group,
        )
        self.output = nn.Linear(case["hidden"], case["vocab"], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x)
        return self.output(h + self.moe(h))


STDS = {"tok_embeddings.weight": 1.0, "moe.router.gate.weight": 0.5, "output.weight": 0.2}


@torch.no_grad()
def init_tiny_moe(model: TinyMoE, case: dict[str, Any], *, ep_rank: int = 0, ep: int = 1) -> None:
    """Every parameter from a generator seeded by its name; an expert weight gets its ep slice.

    `skewed`: every embedding has +1 in feature 0 and the gate sends -100 * feature 0 to the
    second half of the experts, so they (all of rank 1's under ep=2) receive no token at all.
    """
    for name, p in model.named_parameters():
        full_shape = (case["experts"], *p.shape[1:]) if is_expert_param(name) else p.shape
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        full = torch.randn(full_shape, generator=gen) * STDS.get(name, 0.1)
        if case.get("skewed") and name == "tok_embeddings.weight":
            full[:, 0] = 1.0
        if case.get("skewed") and name == "moe.router.gate.weight":
            full[case["experts"] // 2 :, 0] = -100.0
        p.copy_(expert_slice(name, full, ep_rank=ep_rank, ep=ep))


def tiny_batch(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, case["vocab"], (case["batch"], case["seq"] + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def train_tiny_moe(
    model: TinyMoE, x: torch.Tensor, y: torch.Tensor, case: dict[str, Any], *, sync: Any = None
) -> dict[str, Any]:
    """`case["steps"]` AdamW steps on (x, y); `sync(model, loss)` averages gradients and returns the global loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses, grads = [], {}
    for step in range(case["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        losses.append(sync(model, loss) if sync else loss.item())
        if step == 0:
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def ep_parity(*, out_dir: Path, cases: list[dict[str, Any]]) -> None:
    """ep = world = dp: each rank trains its share of the batch; its experts see every rank's tokens."""
    env, device = start()
    group = dist.group.WORLD
    for case in cases:
        model = TinyMoE(case, ep_group=group)
        init_tiny_moe(model, case, ep_rank=env.rank, ep=env.world_size)
        x, y = tiny_batch(case)
        per_rank = case["batch"] // env.world_size
        rows = slice(env.rank * per_rank, (env.rank + 1) * per_rank)
        out = train_tiny_moe(model, x[rows], y[rows], case, sync=_ep_sync)
        torch.save(out, out_dir / f"{case['id']}_rank{env.rank}.pt")
        dist.barrier()
    dist.destroy_process_group()


def _ep_sync(model: TinyMoE, loss: torch.Tensor) -> float:
    """Data-parallel averaging: dense gradients all-reduced over dp; an expert's gradient already
    sums every rank's tokens (the all-to-all's backward), so it is only divided by dp (expert
    data parallel = world / ep = 1 here)."""
    n = dist.get_world_size()
    for name, p in model.named_parameters():
        assert p.grad is not None
        if not is_expert_param(name):
            dist.all_reduce(p.grad)
        p.grad.div_(n)
    return _mean_over_ranks(loss, n)
