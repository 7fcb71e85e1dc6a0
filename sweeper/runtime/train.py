"""One rank's training state for a layout (model share, optimizer, batch) and its optimizer step.

Without pipelining a step runs `grad_accum` micro-batches through forward and backward; with
it, the schedule does, and this rank feeds it the batch (first stage) and labels (last stage).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from sweeper.layouts.layout import Layout
from sweeper.runtime import kernels
from sweeper.runtime.context import ContextParallel, cp_backend
from sweeper.runtime.env import data_mesh, expert_mesh
from sweeper.runtime.model import build_model, loss_fn, norm_kernel
from sweeper.runtime.parallel import Parallelized, expert_param_names, parallelize, reduce_expert_grads
from sweeper.spec.models import ModelShape

ADAMW = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def synthetic_batch(shape: ModelShape, *, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random tokens from a fixed seed (CPU generator: the same on every machine): inputs, labels."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab, (batch, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_optimizer(params: list[nn.Parameter], *, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused where the device has the fused kernel (CUDA and CPU do).

    DTensor and plain parameters (norm weights under TP without SP) go in separate groups:
    one fused kernel call cannot mix them.
    """
    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    groups = [{"params": g} for g in groups if g]
    return torch.optim.AdamW(groups, lr=lr, fused=device.type in ("cuda", "cpu"), **ADAMW)


class ZeroOne:
    """ZeRO-1: Adam states sharded over the data-parallel ranks (torch's ZeroRedundancyOptimizer).

    ZeroRedundancyOptimizer broadcasts plain tensors, so DTensor (TP) parameters take part
    through their local shards, whose gradients are set from the DTensor gradients before a step.
    """

    def __init__(
        self, params: list[nn.Parameter], *, lr: float, group: dist.ProcessGroup, device: torch.device
    ) -> None:
        with torch.no_grad():
            self.pairs = [(p, p.to_local()) for p in params if isinstance(p, DTensor)]
        plain = [p for p in params if not isinstance(p, DTensor)] + [local for _, local in self.pairs]
        self.inner = ZeroRedundancyOptimizer(
            plain,
            optimizer_class=torch.optim.AdamW,
            process_group=group,
            lr=lr,
            fused=device.type in ("cuda", "cpu"),
            **ADAMW,
        )

    def step(self) -> None:
        for p, local in self.pairs:
            local.grad = p.grad.to_local() if p.grad is not None else None
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)
        for p, local in self.pairs:
            p.grad, local.grad = None, None


@dataclass
class Trainer:
    """What one rank needs to run optimizer steps of a layout."""

    shape: ModelShape
    layout: Layout
    mesh: DeviceMesh
    device: torch.device
    par: Parallelized
    optimizer: Any
    inputs: torch.Tensor
    labels: torch.Tensor
    grad_accum: int
    bf16_autocast: bool
    tied_group: dist.ProcessGroup | None = None
    # the expert mesh (ep > 1): the ep-sharded experts' gradients are reduced over its "edp"
    experts: DeviceMesh | None = None

    @property
    def has_last_stage(self) -> bool:
        return self.par.num_stages - 1 in self.par.stage_ids

    def contexts(self) -> contextlib.ExitStack:
        """What forward and backward run under: autocast (bf16 without FSDP), loss parallel (TP)."""
        stack = contextlib.ExitStack()
        if self.bf16_autocast:
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        if self.mesh["tp"].size() > 1:
            stack.enter_context(loss_parallel())  # logits stay vocab-sharded, forward and backward
        return stack

    def forward_backward(self) -> torch.Tensor:
        """Gradients of one global batch; returns this rank's mean micro-batch loss (0 without the last stage).

        The contexts are entered once for all micro-batches (autocast once per step, as torchtitan
        does), not once per micro-batch.
        """
        with self.contexts():
            if self.par.schedule is not None:
                return self._pipeline_forward_backward()
            return self._accumulate()

    def _accumulate(self) -> torch.Tensor:
        model, total = self.par.parts[0], torch.zeros((), device=self.device)
        mbs = len(self.inputs) // self.grad_accum
        for i in range(self.grad_accum):
            x, y = self.inputs[i * mbs : (i + 1) * mbs], self.labels[i * mbs : (i + 1) * mbs]
            with _grad_sync(model, i == self.grad_accum - 1):
                loss = loss_fn(model(x), y) / self.grad_accum
                loss.backward()
            total += _local(loss.detach())
        return total

    def _pipeline_forward_backward(self) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (self.inputs,) if 0 in self.par.stage_ids else ()
        kwargs = {"target": self.labels, "losses": losses} if self.has_last_stage else {}
        self.par.schedule.step(*args, **kwargs)
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([_local(x.detach()) for x in losses]).mean()

    def step(self) -> torch.Tensor:
        """One optimizer step on the global batch; returns this rank's loss contribution."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward()
        self.sync_tied_head()
        self.sync_experts()
        self.optimizer.step()
        return loss

    def sync_experts(self) -> None:
        """The ep-sharded experts, which DDP leaves alone: summed over expert data parallel, / dp*cp."""
        if self.experts is not None:
            edp = self.experts["edp"].get_group() if self.experts["edp"].size() > 1 else None
            reduce_expert_grads(self.par.parts, edp_group=edp, divide_by=data_mesh(self.mesh).size())

    def sync_tied_head(self) -> None:
        """A tied embedding split over pipeline stages: its two copies add their gradients (Megatron)."""
        if self.tied_group is None:
            return
        for part in self.par.parts:  # pipeline stages: never wrapped in DDP (see parallelize)
            for mod in (part.tok_embeddings, part.output):
                if mod is not None and mod.weight.grad is not None:
                    dist.all_reduce(_local(mod.weight.grad), group=self.tied_group)


@contextlib.contextmanager
def _grad_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Replicated data parallelism reduces gradients on the last micro-batch only (FSDP every one:
    it keeps only gradient shards between micro-batches)."""
    if isinstance(model, DistributedDataParallel) and not sync:
        with model.no_sync():
            yield
        return
    if isinstance(model, ReplicateModule):
        model.set_requires_gradient_sync(sync)
    yield


def reduce_losses(trainer: Trainer, losses: list[torch.Tensor]) -> list[float]:
    """The global batch's loss per step on every rank (one collective for all steps).

    The loss lives on the last pipeline stage; its tp ranks hold the same value; dp ranks average,
    and so do cp ranks (each the mean over its tokens, all holding as many).
    """
    mesh = trainer.mesh
    counts = trainer.has_last_stage and mesh["tp"].get_local_rank() == 0
    loss = torch.stack(losses).double() / data_mesh(mesh).size()
    if not counts:
        loss = torch.zeros_like(loss)
    dist.all_reduce(loss)
    return loss.tolist()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def tied_group(mesh: DeviceMesh, shape: ModelShape) -> dist.ProcessGroup | None:
    """The group of the first and last pipeline rank with this rank's (dp, cp, tp) coordinates, for a tied head."""
    pp = mesh.mesh.shape[0]
    if not shape.tied_embeddings or pp == 1:
        return None
    mine, rank = None, dist.get_rank()
    first, last = mesh.mesh[0].flatten().tolist(), mesh.mesh[pp - 1].flatten().tolist()
    for ranks in zip(first, last, strict=True):
        group = dist.new_group(list(ranks))  # every rank creates every group, in the same order
        if rank in ranks:
            mine = group
    return mine


class Optimizers:
    """Two optimizers stepped as one: the dense weights' and the ep-sharded experts' (whose
    ZeRO-1 partition, if any, is over expert data parallel, not over dp*cp)."""

    def __init__(self, *inner: Any) -> None:
        self.inner = inner

    def step(self) -> None:
        for opt in self.inner:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.inner:
            opt.zero_grad(set_to_none)


def build_optimizer(
    par: Parallelized,
    layout: Layout,
    *,
    mesh: DeviceMesh,
    experts: DeviceMesh | None,
    lr: float,
    device: torch.device,
) -> Any:
    """AdamW over this rank's parameters; ZeRO-1 shards its states over the ranks holding the same
    weights: dp*cp for the dense ones, expert data parallel for the ep-sharded experts."""
    params = list({id(p): p for part in par.parts for p in part.parameters()}.values())
    expert_ids = {id(part.get_parameter(n)) for part in par.parts for n in expert_param_names(part)}
    dense_params = [p for p in params if id(p) not in expert_ids]
    expert_params = [p for p in params if id(p) in expert_ids]
    dense = data_mesh(mesh)

    def make(ps: list[nn.Parameter], group: DeviceMesh | None) -> Any:
        if layout.sharding == "zero1" and group is not None and group.size() > 1:
            return ZeroOne(ps, lr=lr, group=group.get_group(), device=device)
        return make_optimizer(ps, lr=lr, device=device)

    if not expert_params:
        return make(dense_params, dense)
    assert experts is not None
    return Optimizers(make(dense_params, dense), make(expert_params, experts["edp"]))


def build_trainer(
    shape: ModelShape,
    layout: Layout,
    *,
    mesh: DeviceMesh,
    device: torch.device,
    seq_len: int,
    global_batch_size: int,
    precision: str,
    seed: int,
    lr: float,
) -> Trainer:
    """Probe the kernels, build and parallelise the model, the optimizer and this rank's batch.

    Under cp > 1 each rank of a cp group takes the same rows (its dp coordinate's) and keeps its
    two chunks of every sequence (`ContextParallel.shard`).
    """
    pp, dp, cp, tp = (mesh[d].size() for d in ("pp", "dp", "cp", "tp"))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if layout.float8:
        kernels.check_float8(device)
        if tp > 1:
            raise kernels.KernelUnavailable(
                "float8 with tensor parallelism needs torchao's float8 TP plans, which the built-in trainer does not wire"
            )
    heads = dict(heads=shape.heads // tp, kv_heads=shape.kv_heads // tp, head_dim=shape.head_dim)
    context = None
    if cp > 1:
        backend, gqa = cp_backend(
            layout.attention, **heads, seq_len=seq_len, cp=cp, dtype=dtype, device=device, batch=layout.micro_batch_size
        )
        context = ContextParallel(mesh["cp"].get_group(), seq_len, device, backend=backend, gqa=gqa)
        attend: kernels.AttentionFn = context.attention  # set again by apply_cp, on every attention module
    else:
        attend = kernels.attention_kernel(
            layout.attention, **heads, seq_len=seq_len, dtype=dtype, device=device, batch=layout.micro_batch_size
        )
    model = build_model(shape, seq_len, attend=attend, norm_fn=norm_kernel(shape, layout.rmsnorm))
    experts = expert_mesh(mesh, layout.ep)
    grad_accum = global_batch_size // (layout.micro_batch_size * dp)
    par = parallelize(
        model,
        layout=layout,
        mesh=mesh,
        device=device,
        precision=precision,
        seed=seed,
        grad_accum=grad_accum,
        loss_fn=loss_fn,
        cp=context,
        experts=experts,
    )
    optimizer = build_optimizer(par, layout, mesh=mesh, experts=experts, lr=lr, device=device)
    inputs, labels = synthetic_batch(shape, batch=global_batch_size, seq_len=seq_len, seed=seed)
    rows = global_batch_size // dp
    start = mesh["dp"].get_local_rank() * rows
    inputs, labels = inputs[start : start + rows], labels[start : start + rows]
    if context is not None:
        inputs, labels = context.shard(inputs), context.shard(labels)
    return Trainer(
        shape,
        layout,
        mesh,
        device,
        par,
        optimizer,
        inputs.to(device),
        labels.to(device),
        grad_accum,
        bf16_autocast=precision == "bf16" and not (layout.sharding == "fsdp" and dp * cp > 1),
        tied_group=tied_group(mesh, shape),
        experts=experts,
    )
