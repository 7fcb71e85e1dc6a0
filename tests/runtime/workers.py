"""Functions the multi-process tests run on every rank (through `launch`), several layouts per launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from sweeper.layouts.layout import Layout
from sweeper.runtime import kernels
from sweeper.runtime.env import DistEnv, build_mesh, init_distributed, pick_device
from sweeper.runtime.model import canonical_name, loss_fn
from sweeper.runtime.moe import EXPERT_WEIGHTS, MoE
from sweeper.runtime.train import Trainer, build_trainer, reduce_losses
from sweeper.spec.sweep import Sweep


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def full_state(trainer: Trainer, *, grads: bool, gather_experts: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or gradient) of this rank's stages as full tensors, by unwrapped name;
    ep-sharded experts this rank's own, or, `gather_experts`, all of them (gathered over ep)."""
    out = {}
    for part in trainer.par.parts:
        for name, p in part.named_parameters():
            out[canonical_name(name, trainer.shape)] = _full(p.grad if grads else p)
        for mod, m in part.named_modules() if gather_experts else ():
            if isinstance(m, MoE) and m.ep > 1:
                for w in EXPERT_WEIGHTS:
                    t = getattr(m.experts, w)
                    t = (t.grad if grads else t).detach().contiguous()
                    whole = t.new_empty((m.ep * t.shape[0], *t.shape[1:]))
                    dist.all_gather_into_tensor(whole, t, group=m.ep_group)
                    out[canonical_name(f"{mod}.experts.{w}", trainer.shape)] = whole.cpu()
    return out


def start() -> tuple[DistEnv, torch.device]:
    env = DistEnv.from_environ()
    device = pick_device(env)
    init_distributed(env, device, timeout_s=300)
    return env, device


def trainer_for(sweep: Sweep, layout: Layout, device: torch.device, world: int) -> Trainer:
    mesh = build_mesh(device, pp=layout.pp, dp=layout.dp(world), tp=layout.tp, cp=layout.cp)
    return build_trainer(
        sweep.model,
        layout,
        mesh=mesh,
        device=device,
        seq_len=sweep.seq_len,
        global_batch_size=sweep.global_batch_size,
        precision=sweep.trial.precision,
        seed=sweep.trial.seed,
        lr=sweep.trial.lr,
    )


def parity(*, out_dir: Path, cases: list[dict[str, Any]], steps: int) -> None:
    """`parity_cases` in a launch of its own."""
    env, device = start()
    parity_cases(env, device, out_dir=out_dir, cases=cases, steps=steps)
    dist.destroy_process_group()


def parity_cases(env: DistEnv, device: torch.device, *, out_dir: Path, cases: list[dict[str, Any]], steps: int) -> None:
    """Train each case's layout `steps` steps; save losses, step-0 gradients and final parameters.

    Only ranks with dp and tp coordinate 0 save (the others hold copies or shards of the same);
    the test merges the pipeline stages' files.
    """
    for case in cases:
        layout = Layout(**case["knobs"])
        trainer = trainer_for(case["sweep"], layout, device, env.world_size)
        trainer.optimizer.zero_grad(set_to_none=True)
        losses = [trainer.forward_backward()]
        trainer.sync_tied_head()
        trainer.sync_experts()
        grads = full_state(trainer, grads=True, gather_experts=True)
        trainer.optimizer.step()
        losses += [trainer.step() for _ in range(steps - 1)]
        params = full_state(trainer, grads=False, gather_experts=True)
        loss = reduce_losses(trainer, losses)
        if trainer.mesh["dp"].get_local_rank() == 0 and trainer.mesh["tp"].get_local_rank() == 0:
            torch.save({"losses": loss, "grads": grads, "params": params}, out_dir / f"{case['id']}_rank{env.rank}.pt")
        dist.barrier()


# ---- memory check: what autograd keeps, by storage ------------------------------------------


def _local_tensor(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    while isinstance(t, (DTensor, AsyncCollectiveTensor)):
        t = t._local_tensor if isinstance(t, DTensor) else t.elem
    return t


VIEW_NODES = ("TBackward0", "TransposeBackward0", "ViewBackward0", "PermuteBackward0", "ExpandBackward0")


def _is_param_copy(t: torch.Tensor) -> bool:
    """A cast of a parameter, or a view of one (autocast's 16-bit weight copy): weights, not activations."""
    fn = t.grad_fn
    while fn is not None and fn.name() in VIEW_NODES:
        fn = fn.next_functions[0][0]
    return (
        fn is not None and fn.name() == "ToCopyBackward0" and type(fn.next_functions[0][0]).__name__ == "AccumulateGrad"
    )


class SavedBytes:
    """Bytes of the storages autograd keeps (parameters, buffers and their casts excluded), by region."""

    def __init__(self, model: torch.nn.Module) -> None:
        owned = [*model.parameters(), *model.buffers()]
        self.exclude = {_local_tensor(t).untyped_storage().data_ptr() for t in owned}
        self.regions: dict[str, dict[int, int]] = {}
        self.current: dict[int, int] | None = None
        self.ctx: Any = None

    def add(self, t: torch.Tensor) -> None:
        if self.current is None or not isinstance(t, torch.Tensor) or _is_param_copy(t):
            return
        storage = _local_tensor(t).untyped_storage()
        masks = {m.untyped_storage().data_ptr() for m in kernels._CAUSAL_MASKS.values()}  # one per model, constant
        if storage.data_ptr() not in self.exclude | masks:
            self.current[storage.data_ptr()] = storage.nbytes()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.add(t)
        return t

    def enter(self, region: str) -> None:
        self.current = self.regions.setdefault(region, {})
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.ctx.__enter__()

    def exit(self) -> None:
        self.ctx.__exit__(None, None, None)
        self.current = None

    def total(self, region: str) -> int:
        return sum(self.regions.get(region, {}).values())


def _cache_bytes(cache: Any, seen: set[int]) -> int:
    """Bytes of the tensors a selective-checkpoint cache holds (wrapped, nested), new storages only."""
    if isinstance(cache, torch.Tensor):
        s = _local_tensor(cache).untyped_storage()
        if s.data_ptr() in seen:
            return 0
        seen.add(s.data_ptr())
        return s.nbytes()
    if hasattr(cache, "val"):
        return _cache_bytes(cache.val, seen)
    if isinstance(cache, dict):
        return sum(_cache_bytes(v, seen) for v in cache.values())
    if isinstance(cache, (list, tuple)):
        return sum(_cache_bytes(v, seen) for v in cache)
    return 0


def measure_activations(trainer: Trainer, micro_batch: int) -> dict[str, Any]:
    """Saved bytes of each block, of the final norm and output projection, and of the loss, for one
    micro-batch forward.

    Checkpointed regions hide what they save from the hooks: their inputs (kept by the
    checkpoint) are added by a pre-hook, selective checkpointing's cache is counted separately.
    The batch itself (token ids, labels) is data, not an activation.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from sweeper.runtime import parallel

    model = trainer.par.parts[0]
    saved = SavedBytes(model)
    saved.exclude |= {t.untyped_storage().data_ptr() for t in (trainer.inputs, trainer.labels)}
    handles = []
    # the embedding region: from the token lookup (and learned positions) to the first block
    handles.append(model.tok_embeddings.register_forward_pre_hook(lambda *_: saved.enter("embed")))
    for key, block in model.layers.items():
        handles.append(block.register_forward_pre_hook(lambda _m, _a, key=key: _next_region(saved, f"block{key}")))
        handles.append(block.register_forward_hook(lambda *_: saved.exit()))
    for mod in model.modules():
        if isinstance(mod, CheckpointWrapper):  # the region's input stays alive for recomputation
            handles.append(mod.register_forward_pre_hook(lambda _m, args: saved.add(args[0])))
    handles.append(model.norm.register_forward_pre_hook(lambda *_: saved.enter("final")))
    handles.append(model.output.register_forward_hook(lambda *_: saved.exit()))
    parallel.SAC_CACHES = []
    try:
        with trainer.contexts():
            logits = model(trainer.inputs[:micro_batch])
            saved.enter("loss")
            loss = loss_fn(logits, trainer.labels[:micro_batch])
            saved.exit()
        seen: set[int] = set()
        sac = [_cache_bytes(c, seen) for c in parallel.SAC_CACHES]
    finally:
        parallel.SAC_CACHES = None
        for h in handles:
            h.remove()
    del loss, logits
    blocks = [saved.total(f"block{k}") + (sac[i] if i < len(sac) else 0) for i, k in enumerate(model.layers)]
    return {
        "blocks": blocks,
        "sac_cache": sac,
        "final": saved.total("final"),
        "loss": saved.total("loss"),
        "embed": saved.total("embed"),
    }


def _next_region(saved: SavedBytes, region: str) -> None:
    if saved.current is not None:  # still in the embedding region
        saved.exit()
    saved.enter(region)


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen = {}
    for t in tensors:
        s = _local_tensor(t).untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def measure_states(trainer: Trainer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer states after one optimizer step."""
    trainer.step()
    params = list({id(p): p for part in trainer.par.parts for p in part.parameters()}.values())
    opt = trainer.optimizer
    inner = opt.inner.optim if hasattr(opt, "inner") else opt  # ZeRO-1: this rank's local AdamW
    states = [t for st in inner.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    return {
        "weights": _storage_bytes(params),
        "grads": _storage_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer": _storage_bytes(states),
        "params": sum(_local_tensor(p).numel() for p in params),
    }


def memory_check(*, out_dir: Path, cases: list[dict[str, Any]]) -> None:
    """Measure activations (one micro-batch) or states (after one step) for each case; rank files as JSON."""
    import json

    env, device = start()
    for case in cases:
        layout = Layout(**case["knobs"])
        trainer = trainer_for(case["sweep"], layout, device, env.world_size)
        out: dict[str, Any] = {"stages": trainer.par.stage_ids, "num_stages": trainer.par.num_stages}
        if case["what"] == "activations":
            out |= measure_activations(trainer, layout.micro_batch_size)
        else:
            out |= measure_states(trainer)
        (out_dir / f"{case['id']}_rank{env.rank}.json").write_text(json.dumps(out))
        dist.barrier()
    dist.destroy_process_group()


def unavailable(*, out_dir: Path, sweep: Sweep, layouts: list[dict[str, Any]]) -> None:
    """Build the trainer for each layout; record the status its failure classifies to, and why."""
    import json

    from sweeper.runtime.outcome import classify

    env, device = start()
    for i, knobs in enumerate(layouts):
        try:
            trainer_for(sweep, Layout(**knobs), device, env.world_size)
            outcome = {"status": "ok", "error": None}
        except Exception as e:  # what run_trial would catch
            failure = classify(e, rank=env.rank)
            outcome = {"status": failure.status, "error": failure.error}
        (out_dir / f"{i}_rank{env.rank}.json").write_text(json.dumps(outcome))
    dist.destroy_process_group()
