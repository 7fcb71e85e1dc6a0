"""Functions the context-parallel and expert-parallel parity tests run on every rank (through `launch`),
and the tiny MoE model they share with the single-process reference."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sweeper.models import ModelShape
from sweeper.spec import Sweep
from sweeper.trainer import kernels, parallel
from sweeper.trainer.context import ContextParallel, apply_cp
from sweeper.trainer.env import DistEnv
from sweeper.trainer.model import Transformer, build_model, canonical_name, loss_fn, materialize, norm_kernel
from sweeper.trainer.moe import MoE, apply_ep, expert_slice, is_expert_param
from sweeper.trainer.train import make_optimizer, reduce_losses, synthetic_batch

from .workers import start

# ---- context parallel: the tiny LLaMA of the dense parity tests, its sequence split over cp ranks


def cp_and_ep_parity(
    *, out_dir: Path, cp: dict[str, Any], ep: dict[str, Any], trainer: list[dict[str, Any]] | None = None
) -> None:
    """The context-parallel cases, then the expert-parallel ones, then the layouts through the
    trainer's own setup (test_cp_ep_trainer), in one 2-rank launch: the ranks start up once."""
    env, device = start()
    _cp_parity(env, device, out_dir=out_dir, **cp)
    _ep_parity(env, device, out_dir=out_dir, **ep)
    for case in trainer or []:
        _trainer_case(case, out_dir, env, device)
    dist.destroy_process_group()


def _trainer_case(case: dict[str, Any], out_dir: Path, env: DistEnv, device: torch.device) -> None:
    """A cp/ep layout built by `build_trainer` (mesh, groups, DDP/FSDP/ZeRO-1, sharded batch), trained
    `case["steps"]` steps as `Trainer.step` does; every rank saves its losses, step-0 gradients and
    final parameters (experts: this rank's; the rest whole)."""
    from sweeper.layout import Layout

    from .workers import full_state, trainer_for

    sweep: Sweep = case["sweep"]
    trainer = trainer_for(sweep, Layout(**case["knobs"]), device, env.world_size)
    trainer.optimizer.zero_grad(set_to_none=True)
    losses = [trainer.forward_backward()]
    trainer.sync_experts()
    grads = full_state(trainer, grads=True)
    trainer.optimizer.step()
    losses += [trainer.step() for _ in range(case["steps"] - 1)]
    params = full_state(trainer, grads=False)
    out = {"losses": reduce_losses(trainer, losses), "grads": grads, "params": params}
    torch.save(out, out_dir / f"{case['id']}_rank{env.rank}.pt")
    dist.barrier()


def _cp_parity(
    env: DistEnv, device: torch.device, *, out_dir: Path, sweep: Sweep, steps: int, model_cases: list[dict[str, Any]]
) -> None:
    """Train the whole batch, each rank holding its 2 of the 2*cp sequence chunks; save losses,
    step-0 gradients and final parameters (rank 0: every parameter is replicated over cp).
    Then the `model_cases` (see `model_parity`)."""
    for case in model_cases:
        _model_case(case, out_dir, env.rank, device)
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


def _ep_parity(env: DistEnv, device: torch.device, *, out_dir: Path, cases: list[dict[str, Any]]) -> None:
    """ep = world = dp: each rank trains its share of the batch; its experts see every rank's tokens."""
    group = dist.group.WORLD
    try:  # 3 experts cannot be split over 2 ranks
        MoE(hidden=8, experts=3, top_k=1, moe_ffn=8, ep_group=group)
        refused = ""
    except ValueError as e:
        refused = str(e)
    (out_dir / f"refused_rank{env.rank}.txt").write_text(refused)
    for case in cases:
        if "shape" in case:
            _model_case(case, out_dir, env.rank, device)
            continue
        model = TinyMoE(case, ep_group=group)
        init_tiny_moe(model, case, ep_rank=env.rank, ep=env.world_size)
        x, y = tiny_batch(case)
        per_rank = case["batch"] // env.world_size
        rows = slice(env.rank * per_rank, (env.rank + 1) * per_rank)
        out = train_tiny_moe(model, x[rows], y[rows], case, sync=_ep_sync)
        torch.save(out, out_dir / f"{case['id']}_rank{env.rank}.pt")
        dist.barrier()


def _ep_sync(model: nn.Module, loss: torch.Tensor) -> float:
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


# ---- the built-in Transformer with MoE blocks and/or context parallelism (2 ranks)


@dataclass(frozen=True)
class MoEShape(ModelShape):
    """ModelShape with the MoE fields the model reads (the spec's ModelShape gains them later)."""

    experts: int = 0
    experts_per_token: int = 1
    moe_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0


TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
# 2 layers: the first dense, the second 4 experts, top-2, one shared expert
TINY_MOE = MoEShape(**TINY, experts=4, experts_per_token=2, moe_ffn=32, shared_experts=1, dense_layers=1)
TINY_GPT = MoEShape(**TINY | dict(kv_heads=4), mlp="gelu", norm="layernorm", position="learned")


def model_case(case_id: str, shape: ModelShape, *, cp: int, ep: int) -> dict[str, Any]:
    return {"id": case_id, "shape": shape, "cp": cp, "ep": ep, "seq": 32, "batch": 4, "steps": 4}


def model_reference(case: dict[str, Any]) -> dict[str, Any]:
    """The case's model in one process on the whole batch, without checkpointing."""
    model = model_for(case | {"ac": "none"}, device=torch.device("cpu"))
    x, y = synthetic_batch(case["shape"], batch=case["batch"], seq_len=case["seq"], seed=0)
    return train_model(model, x, y, case["steps"])


def merge_ranks(ranks: list[dict[str, Any]], what: str, ep: int) -> dict[str, torch.Tensor]:
    """One model's tensors from the ranks' files: under ep experts joined along dim 0; the rest
    must be equal on both ranks."""
    out = {}
    for name, t in ranks[0][what].items():
        if ep > 1 and is_expert_param(name):
            out[name] = torch.cat([r[what][name] for r in ranks])
        else:
            assert torch.equal(t, ranks[1][what][name]), f"{what} of {name} differ between ranks"
            out[name] = t
    return out


def parity_diffs(
    ranks: list[dict[str, Any]], ref: dict[str, Any], ep: int, *, grad_tol: float, grad_rtol: float
) -> tuple[float, float, float]:
    """(max loss difference, max step-0 gradient difference, max final parameter difference);
    fails on the first gradient beyond max(grad_tol, grad_rtol * the tensor's largest gradient)."""
    assert ranks[0]["losses"] == ranks[1]["losses"]
    dloss = max(abs(a - b) for a, b in zip(ranks[0]["losses"], ref["losses"], strict=True))
    grads, params = merge_ranks(ranks, "grads", ep), merge_ranks(ranks, "params", ep)
    assert set(grads) == set(ref["grads"])
    dgrad = 0.0
    for name, g in ref["grads"].items():
        diff = (grads[name] - g).abs().max().item()
        allowed = max(grad_tol, grad_rtol * g.abs().max().item())
        assert diff <= allowed, f"step-0 gradient of {name} differs by {diff:.2e} (allowed {allowed:.1e})"
        dgrad = max(dgrad, diff)
    dparam = max((params[k] - v).abs().max().item() for k, v in ref["params"].items())
    return dloss, dgrad, dparam


def model_for(case: dict[str, Any], *, device: torch.device, cp: int = 1, ep: int = 1) -> Transformer:
    """The case's Transformer (flash2 attention, eager norms), its sequence over cp ranks and its
    experts over ep ranks of the world group, materialised with the layout-independent init."""
    shape: ModelShape = case["shape"]
    attend = kernels.attention_kernel(
        "flash2",
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        seq_len=case["seq"],
        dtype=torch.float32,
        device=device,
    )
    model = build_model(shape, case["seq"], attend=attend, norm_fn=norm_kernel(shape, "eager"))
    if cp > 1:
        apply_cp(model, ContextParallel(dist.group.WORLD, case["seq"], device))
    if ep > 1:
        apply_ep(model, dist.group.WORLD)
    # checkpointing re-runs each block's forward, collectives included, inside backward
    parallel.apply_ac(model, mode=case.get("ac", "none"))
    materialize(model, shape, seed=0, device=device)
    return model


def train_model(model: Transformer, x: torch.Tensor, y: torch.Tensor, steps: int, sync: Any = None) -> dict[str, Any]:
    opt = make_optimizer(list(model.parameters()), lr=0.003, device=x.device)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(sync(model, loss) if sync else loss.item())
        if step == 0:
            grads = {canonical_name(k, model.shape): p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
    params = {canonical_name(k, model.shape): p.detach().clone() for k, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def _model_case(case: dict[str, Any], out_dir: Path, rank: int, device: torch.device) -> None:
    """cp ranks share the batch rows and split the sequence; otherwise the 2 ranks are data
    parallel and split the rows. ep (2 or 1) lies inside dp*cp = 2 either way."""
    cp, ep, world = case["cp"], case["ep"], dist.get_world_size()
    model = model_for(case, device=device, cp=cp, ep=ep)
    x, y = synthetic_batch(case["shape"], batch=case["batch"], seq_len=case["seq"], seed=0)
    if cp > 1:
        assert model.cp is not None
        x, y = model.cp.shard(x), model.cp.shard(y)
    else:
        rows = slice(rank * case["batch"] // world, (rank + 1) * case["batch"] // world)
        x, y = x[rows], y[rows]
    sharded = _ep_sync if ep > 1 else None
    out = train_model(model, x, y, case["steps"], sync=sharded or _dense_sync)
    torch.save(out, out_dir / f"{case['id']}_rank{rank}.pt")
    dist.barrier()


def _dense_sync(model: nn.Module, loss: torch.Tensor) -> float:
    n = dist.get_world_size()
    _average([p.grad for p in model.parameters()], n)
    return _mean_over_ranks(loss, n)
