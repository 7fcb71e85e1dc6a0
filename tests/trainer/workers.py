"""Functions the multi-process tests run on every rank (through `launch`), several layouts per launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from sweeper.layout import Layout
from sweeper.spec import Sweep
from sweeper.trainer.env import DistEnv, build_mesh, init_distributed, pick_device
from sweeper.trainer.model import canonical_name
from sweeper.trainer.train import Trainer, build_trainer, reduce_losses


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def full_state(trainer: Trainer, *, grads: bool) -> dict[str, torch.Tensor]:
    """Every parameter (or gradient) of this rank's stages as full tensors, by unwrapped name."""
    out = {}
    for part in trainer.par.parts:
        for name, p in part.named_parameters():
            out[canonical_name(name, trainer.shape)] = _full(p.grad if grads else p)
    return out


def start() -> tuple[DistEnv, torch.device]:
    env = DistEnv.from_environ()
    device = pick_device(env)
    init_distributed(env, device, timeout_s=300)
    return env, device


def trainer_for(sweep: Sweep, layout: Layout, device: torch.device, world: int) -> Trainer:
    mesh = build_mesh(device, pp=layout.pp, dp=layout.dp(world), tp=layout.tp)
    return build_trainer(
        sweep.model, layout, mesh=mesh, device=device, seq_len=sweep.seq_len, global_batch_size=sweep.global_batch_size,
        precision=sweep.trial.precision, seed=sweep.trial.seed, lr=sweep.trial.lr,
    )


def parity(*, out_dir: Path, cases: list[dict[str, Any]], steps: int = 10) -> None:
    """Train each case's layout `steps` steps; save losses, step-0 gradients and final parameters.

    Only ranks with dp and tp coordinate 0 save (the others hold copies or shards of the same);
    the test merges the pipeline stages' files.
    """
    env, device = start()
    for case in cases:
        layout = Layout(**case["knobs"])
        trainer = trainer_for(case["sweep"], layout, device, env.world_size)
        trainer.optimizer.zero_grad(set_to_none=True)
        losses = [trainer.forward_backward()]
        trainer.sync_tied_head()
        grads = full_state(trainer, grads=True)
        trainer.optimizer.step()
        losses += [trainer.step() for _ in range(steps - 1)]
        params = full_state(trainer, grads=False)
        loss = reduce_losses(trainer, losses)
        if trainer.mesh["dp"].get_local_rank() == 0 and trainer.mesh["tp"].get_local_rank() == 0:
            torch.save({"losses": loss, "grads": grads, "params": params}, out_dir / f"{case['id']}_rank{env.rank}.pt")
        dist.barrier()
    dist.destroy_process_group()
