"""Functions the context-parallel and expert-parallel parity tests run on every rank (through `launch`),
the one 2-rank launch of every parity module (`two_rank_parity`), and the tiny MoE model and
references they share with the single-process runs."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sweeper.runtime import kernels, parallel
from sweeper.runtime.context import ContextParallel
from sweeper.runtime.env import DistEnv
from sweeper.runtime.model import Transformer, build_model, canonical_name, loss_fn, materialize, norm_kernel
from sweeper.runtime.moe import MoE, apply_ep, expert_slice, is_expert_param
from sweeper.runtime.parallel import apply_cp
from sweeper.runtime.train import make_optimizer, reduce_losses, synthetic_batch
from sweeper.spec.models import ModelShape
from sweeper.spec.sweep import Sweep

from .bounds import Reference, Run, Variant, batches, measure, train
from .workers import parity_cases, start

# ---- context parallel: the tiny LLaMA of the dense parity tests, its sequence split over cp ranks


def two_rank_parity(
    *,
    out_dir: Path,
    dense: dict[str, Any],
    cp: dict[str, Any],
    ep: dict[str, Any],
    trainer: list[dict[str, Any]] | None = None,
) -> None:
    """Every 2-rank parity case in one launch (the ranks start up once): the dense layouts of
    test_parity and test_parity_families (`workers.parity_cases`), the context-parallel cases,
    the expert-parallel ones, then the cp/ep layouts through the trainer's own setup
    (test_cp_ep_trainer)."""
    env, device = start()
    parity_cases(env, device, out_dir=out_dir, **dense)
    _cp_parity(env, device, out_dir=out_dir, **cp)
    _ep_parity(env, device, out_dir=out_dir, **ep)
    for case in trainer or []:
        _trainer_case(case, out_dir, env, device)
    dist.destroy_process_group()


def _trainer_case(case: dict[str, Any], out_dir: Path, env: DistEnv, device: torch.device) -> None:
    """A cp/ep layout built by `build_trainer` (mesh, groups, DDP/FSDP/ZeRO-1, sharded batch), trained
    `case["steps"]` steps as `Trainer.step` does; every rank saves its losses, step-0 gradients and
    final parameters (experts: this rank's; the rest whole)."""
    from sweeper.layouts.layout import Layout

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
    opt = make_optimizer(list(model.parameters()), lr=sweep.trial.lr, device=device)
    x, y = synthetic_batch(shape, batch=sweep.global_batch_size, seq_len=sweep.seq_len, seed=sweep.trial.seed)
    # every rank holds as many tokens: the global mean loss is the mean of the ranks' losses
    out = train(model, opt, [(cp.shard(x), cp.shard(y))], steps, loss_fn, sync=_dense_sync)
    if env.rank == 0:  # every parameter is replicated over cp
        torch.save(out, out_dir / "cp_rank0.pt")
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
    model: TinyMoE, micro: list[tuple[torch.Tensor, torch.Tensor]], case: dict[str, Any], *, sync: Any = None
) -> Run:
    """`case["steps"]` AdamW steps on the micro-batches; `sync(model, loss)` averages gradients and returns the global loss."""

    def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    return train(model, torch.optim.AdamW(model.parameters(), lr=0.01), micro, case["steps"], cross_entropy, sync=sync)


def tiny_moe_reference(case: dict[str, Any]) -> Reference:
    """The tiny MoE on the whole batch in one process, with its noise floor (tests/runtime/bounds.py)."""
    return _tiny_moe_reference(tuple(sorted(case.items())))


@cache
def _tiny_moe_reference(items: tuple[tuple[str, Any], ...]) -> Reference:
    case = dict(items)

    def run(variant: Variant) -> Run:
        model = TinyMoE(case)
        init_tiny_moe(model, case)
        return train_tiny_moe(model.to(variant.dtype), batches(*tiny_batch(case), variant), case)

    return measure(run)


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
        out = train_tiny_moe(model, [(x[rows], y[rows])], case, sync=_ep_sync)
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


def model_reference(case: dict[str, Any]) -> Reference:
    """The case's model in one process on the whole batch, without checkpointing, with its noise floor."""
    return _model_reference(tuple(sorted((case | {"ac": "none"}).items())))


@cache
def _model_reference(items: tuple[tuple[str, Any], ...]) -> Reference:
    case = dict(items)

    def run(variant: Variant) -> Run:
        model = model_for(case, device=torch.device("cpu")).to(variant.dtype)
        x, y = synthetic_batch(case["shape"], batch=case["batch"], seq_len=case["seq"], seed=0)
        return train_model(model, batches(x, y, variant), case["steps"])

    return measure(run)


def merge_ranks(ranks: list[dict[str, Any]], ep: int) -> Run:
    """One model's run from the ranks' files: under ep experts joined along dim 0; the losses and
    everything else must be equal on both ranks."""
    assert ranks[0]["losses"] == ranks[1]["losses"]
    out: Run = {"losses": ranks[0]["losses"]}
    for what in ("grads", "params"):
        out[what] = {}
        for name, t in ranks[0][what].items():
            if ep > 1 and is_expert_param(name):
                out[what][name] = torch.cat([r[what][name] for r in ranks])
            else:
                assert torch.equal(t, ranks[1][what][name]), f"{what} of {name} differ between ranks"
                out[what][name] = t
    return out


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


def train_model(
    model: Transformer, micro: list[tuple[torch.Tensor, torch.Tensor]], steps: int, sync: Any = None
) -> Run:
    opt = make_optimizer(list(model.parameters()), lr=0.003, device=micro[0][0].device)
    return train(model, opt, micro, steps, loss_fn, sync=sync, name=lambda k: canonical_name(k, model.shape))


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
    out = train_model(model, [(x, y)], case["steps"], sync=sharded or _dense_sync)
    torch.save(out, out_dir / f"{case['id']}_rank{rank}.pt")
    dist.barrier()


def _dense_sync(model: nn.Module, loss: torch.Tensor) -> float:
    n = dist.get_world_size()
    _average([p.grad for p in model.parameters()], n)
    return _mean_over_ranks(loss, n)
