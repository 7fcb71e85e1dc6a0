"""One function per parallelism concern (as torchtitan does), and `parallelize` that applies them in order.

Each `apply_*` takes the model first and the rest by keyword; only `parallelize` knows the order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from sweeper.layouts.layout import Layout
from sweeper.layouts.stages import stage_bounds
from sweeper.runtime.context import ContextParallel
from sweeper.runtime.env import data_mesh
from sweeper.runtime.model import Attention, Transformer, materialize
from sweeper.runtime.moe import MoE, apply_ep

aten = torch.ops.aten
# Selective checkpointing keeps the outputs of matmuls (with or without a bias) and attention kernels (expensive to
# recompute), of reduce-scatters (a collective) and of aten.max (float8's scaling amax), and
# recomputes the cheap elementwise ops: torchtitan's `_op_sac_save_list`
# (torchtitan/models/llama3/infra/parallelize.py), plus the flash-attn package's own op and
# compiled regions (our fused_softmax) where this torch and that package have them.
SAC_SAVE_OPS = {
    aten.mm.default,
    aten.addmm.default,  # a linear layer with a bias (GPT blocks)
    aten.bmm.default,
    aten.max.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_attention_math.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def _optional_sac_ops() -> set[Any]:
    """Save-list ops that exist only with some torch builds or packages."""
    found: set[Any] = set()
    for owner, name in ((aten, "_scaled_dot_product_fused_attention_overrideable"),):
        if hasattr(owner, name):
            found.add(getattr(owner, name).default)
    for name in ("flex_attention", "inductor_compiled_code"):
        if hasattr(torch._higher_order_ops, name):
            found.add(getattr(torch._higher_order_ops, name))
    try:  # flash-attn >= 2.6 registers its kernels as torch ops once imported
        import flash_attn  # noqa: F401

        for name in ("_flash_attn_forward", "_flash_attn_varlen_forward"):
            op = getattr(torch.ops.flash_attn, name, None)
            if op is not None:
                found.add(op.default)
    except (ImportError, RuntimeError, AttributeError):
        pass
    return found


SAC_SAVE_OPS |= _optional_sac_ops()
# Instrumentation for the memory check: when a list, each selective-checkpoint region appends
# its cache (the tensors SAC keeps, which saved-tensor hooks do not see).
SAC_CACHES: list[dict[Any, Any]] | None = None


def apply_tp(model: Transformer, *, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallelism with DTensor; loss parallel (vocab-sharded logits) always.

    Q/K/V and w1/w3 (GPT: fc1) are column-parallel, wo and w2 (fc2) row-parallel; a column-parallel
    bias is split with its weight's rows, a row-parallel one replicated and added once. Under
    sequence parallelism the norms (weights and biases replicated) and the residual stream are
    sharded along the sequence, gathered before each block. A learned position table is
    replicated; each rank adds the rows of the positions it holds (`Transformer.add_positions`).
    """
    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.pos_embeddings is not None:
        distribute_module(model.pos_embeddings, tp_mesh)  # every parameter replicated
        model.pos_layout = seq
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attn.attention.wq": ColwiseParallel(),
            "attn.attention.wk": ColwiseParallel(),
            "attn.attention.wv": ColwiseParallel(),
            "attn.attention.wo": RowwiseParallel(output_layouts=seq),
        }
        if model.shape.mlp == "gelu":
            plan |= {"mlp.ffn.fc1": ColwiseParallel(), "mlp.ffn.fc2": RowwiseParallel(output_layouts=seq)}
        else:
            plan |= {
                "mlp.ffn.w1": ColwiseParallel(),
                "mlp.ffn.w3": ColwiseParallel(),
                "mlp.ffn.w2": RowwiseParallel(output_layouts=seq),
            }
        if sequence_parallel:
            plan |= {
                "attn.norm": SequenceParallel(),
                "attn.attention": PrepareModuleInput(
                    input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)
                ),
                "mlp.norm": SequenceParallel(),
                "mlp.ffn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            }
        parallelize_module(block, tp_mesh, plan)
    if model.shape.tied_embeddings and model.tok_embeddings is not None and model.output is not None:
        model.output.weight = model.tok_embeddings.weight  # the plan distributed them separately


def shard_embedding_grad(model: Transformer) -> None:
    """Under TP, DTensor's embedding backward returns the vocab-parallel weight's gradient
    replicated (the full vocabulary on every rank); keep only this rank's rows, like the weight.

    A tensor hook: register it on the materialised parameter (materialising swaps tensors).
    """
    weight = model.tok_embeddings.weight if model.tok_embeddings is not None else None
    if isinstance(weight, DTensor):
        weight.register_hook(partial(_shard_like, param=weight))


def _shard_like(grad: DTensor, *, param: DTensor) -> DTensor:
    return grad if grad.placements == param.placements else grad.redistribute(param.device_mesh, param.placements)


def _sac_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAC_SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _sac_context() -> tuple[Any, Any]:
    caching, cached = create_selective_checkpoint_contexts(_sac_policy)
    if SAC_CACHES is not None:
        SAC_CACHES.append(caching.storage)
    return caching, cached


def apply_ac(model: Transformer, *, mode: str) -> None:
    """Activation checkpointing per block: full, selective (op-level), ffn (the MLP and its norm) or none."""
    if mode == "none":
        return
    for key, block in model.layers.items():
        if mode == "full":
            model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)
        elif mode == "selective":
            model.layers[key] = checkpoint_wrapper(block, context_fn=_sac_context, preserve_rng_state=False)
        elif mode == "ffn":
            block.mlp = checkpoint_wrapper(block.mlp, preserve_rng_state=False)
        else:
            raise ValueError(f"activation_checkpointing={mode!r}; allowed: none, selective, ffn, full")


def apply_compile(model: Transformer) -> None:
    """torch.compile each block (repeated blocks share one compiled graph)."""
    for key, block in model.layers.items():
        # fullgraph: a graph break inside a block would silently split it and run the rest eagerly
        model.layers[key] = torch.compile(block, fullgraph=True)
    if model.tok_embeddings is not None:
        # Under TP the embedding returns an AsyncCollectiveTensor, which compiled blocks fail on
        # in backward; clone() waits for it and, unlike wait(), stays on the autograd graph.
        model.tok_embeddings.register_forward_hook(
            lambda _m, _i, out: out.clone() if isinstance(out, AsyncCollectiveTensor) else out
        )


def apply_float8(model: Transformer) -> None:
    """Swap the blocks' linear layers for torchao float8 training linears (the head stays in bf16)."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=lambda _mod, fqn: fqn.startswith("layers."))


def apply_fsdp(
    model: Transformer,
    *,
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    pipelined: bool,
) -> None:
    """FSDP2 per block, the embedding and the head as their own units, the root for the rest.

    Under pipelining a stage runs several micro-batches forward before backward: keeping its
    parameters gathered (no reshard after forward) avoids one all-gather per micro-batch.
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    shard = partial(fully_shard, mesh=dp_mesh, mp_policy=mp)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # the last block is needed again at once by backward: do not free it after forward
        shard(block, reshard_after_forward=not pipelined and i < len(blocks) - 1)
    tied = model.shape.tied_embeddings and model.tok_embeddings is not None and model.output is not None
    if model.tok_embeddings is not None and not tied:
        shard(model.tok_embeddings, reshard_after_forward=not pipelined)
    if model.output is not None and not tied:
        shard([model.norm, model.output], reshard_after_forward=False)
    shard(model, reshard_after_forward=False)


def apply_ddp(
    model: nn.Module, *, dp_mesh: DeviceMesh, device: torch.device, ignore: list[str] | None = None
) -> nn.Module:
    """torch's DistributedDataParallel: gradients all-reduced in buckets, overlapped with backward.

    `ignore`: parameters DDP leaves alone (expert-parallel experts, reduced over their own group
    by `reduce_expert_grads`); its constructor neither broadcasts nor all-reduces them.
    """
    if ignore:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignore)
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=ids, broadcast_buffers=False)


def expert_param_names(model: nn.Module) -> list[str]:
    """The routed experts' grouped weights of the MoE blocks sharded over ep (names in `model`)."""
    return [
        f"{mod}.{name}"
        for mod, m in model.named_modules()
        if isinstance(m, MoE) and m.ep > 1
        for name in ("experts.w1", "experts.w2", "experts.w3")
    ]


def reduce_expert_grads(parts: list[nn.Module], *, edp_group: dist.ProcessGroup | None, divide_by: int) -> None:
    """Average the ep-sharded experts' gradients as the dense ones are (the docstring of `moe.py`).

    Each is already the sum over the ep group's tokens (the all-to-all's backward); summed over
    expert data parallel (ranks holding the same experts) it covers every token of dp*cp, and
    dividing by dp*cp (`divide_by`) gives the gradient of the mean of the dp*cp ranks' losses.
    """
    for part in parts:
        for m in part.modules():
            if isinstance(m, MoE) and m.ep > 1:
                for p in m.experts.parameters():
                    if p.grad is None:
                        continue
                    if edp_group is not None and dist.get_world_size(edp_group) > 1:
                        dist.all_reduce(p.grad, group=edp_group)
                    p.grad.div_(divide_by)


def apply_replicate(model: Transformer, *, dp_mesh: DeviceMesh) -> None:
    """Replicated data parallelism on FSDP2's machinery, per block and for the root (like `apply_fsdp`).

    For layouts DDP cannot run: DTensor (TP) parameters, which DDP broadcasts with plain
    collectives, and pipeline stages, whose per-micro-batch backwards break DDP's bucket rebuild.
    The ep-sharded experts are left out (plain tensors, reduced by `reduce_expert_grads`).
    """
    from torch.distributed._composable.replicate_with_fsdp import replicate

    ignored = {model.get_parameter(n) for n in expert_param_names(model)} or None
    for block in model.layers.values():
        replicate(block, mesh=dp_mesh, ignored_params=ignored)
    replicate(model, mesh=dp_mesh, ignored_params=ignored)


def stage_ids(pp_rank: int, pp: int, chunks: int) -> list[int]:
    """Pipeline stages held by one rank: one, or `chunks` in a loop (rank r holds r, r+pp, ...)."""
    return [pp_rank + k * pp for k in range(chunks)]


def split_stage(model: Transformer, *, stage: int, num_stages: int) -> Transformer:
    """A copy of the (meta) model holding only stage `stage`'s blocks, first embeds, last norms and projects.

    The blocks are `sweeper.layouts.stages.stage_bounds`' share for the stage (uneven where the stages
    do not divide the layers), the split the memory model estimates.
    """
    part = copy.deepcopy(model)
    start, end = stage_bounds(model.shape.layers, num_stages)[stage]
    for key in list(part.layers):
        if not start <= int(key) < end:
            del part.layers[key]
    if stage != 0:
        part.tok_embeddings, part.pos_embeddings = None, None
    if stage != num_stages - 1:
        part.norm, part.output = None, None
    return part


def build_pipeline(
    stages: list[tuple[int, nn.Module]],
    *,
    pp_mesh: DeviceMesh,
    num_stages: int,
    schedule: str,
    n_microbatches: int,
    loss_fn: Callable[..., torch.Tensor],
    device: torch.device,
) -> Any:
    """A torch.distributed.pipelining schedule over this rank's stages; micro-batches = grad_accum."""
    # imported here: torch.distributed.pipelining imports torch._dynamo, seconds of CPU in every rank
    # of every trial, which only a pp > 1 trial needs
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    group = pp_mesh.get_group()
    pipe = [PipelineStage(mod, idx, num_stages, device, group=group) for idx, mod in stages]
    if schedule == "interleaved":
        return ScheduleInterleaved1F1B(pipe, n_microbatches=n_microbatches, loss_fn=loss_fn)
    # torch's Schedule1F1B refuses fewer micro-batches than stages; with m < pp the first stage of a
    # 1F1B warms up all m forwards before its first backward, so GPipe's order costs the same bubble
    # and stage 0 the same peak (sweeper.trainers.builtin: short_1f1b_as_gpipe)
    if schedule == "1f1b" and n_microbatches < num_stages:
        schedule = "gpipe"
    cls = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule]
    return cls(pipe[0], n_microbatches=n_microbatches, loss_fn=loss_fn)


@dataclass
class Parallelized:
    """This rank's share of the model: its stages (wrapped for data parallelism) and the schedule."""

    parts: list[nn.Module]
    stage_ids: list[int]
    num_stages: int
    schedule: Any | None


def parallelize(
    model: Transformer,
    *,
    layout: Layout,
    mesh: DeviceMesh,
    device: torch.device,
    precision: str,
    seed: int,
    grad_accum: int,
    loss_fn: Callable[..., torch.Tensor],
    cp: ContextParallel | None = None,
    experts: DeviceMesh | None = None,
) -> Parallelized:
    """Split, shard, wrap and materialise the meta model for `layout` on this rank.

    `cp`: this rank's context-parallel view (cp > 1), `experts`: the expert mesh (`env.expert_mesh`,
    ep > 1). Dense weights are data parallel over dp*cp (`env.data_mesh`); the ep-sharded experts
    are left out of DDP and reduced by `reduce_expert_grads`.
    """
    pp, tp = mesh["pp"].size(), mesh["tp"].size()
    dense = data_mesh(mesh)
    dp = dense.size()  # the ranks the dense weights are averaged over: dp*cp
    chunks = layout.stages_per_rank() if pp > 1 else 1
    num_stages = pp * chunks
    ids = stage_ids(mesh["pp"].get_local_rank(), pp, chunks)
    # Pipeline split first, on the meta model: every later step sees only this rank's layers.
    parts = [split_stage(model, stage=i, num_stages=num_stages) for i in ids] if pp > 1 else [model]
    bf16 = precision == "bf16"
    for part in parts:
        # cp and ep after the split (a process group does not survive its deepcopy), on meta:
        # attention over the cp group and this rank's positions; this rank's experts only.
        if cp is not None:
            apply_cp(part, cp)
        if experts is not None:
            apply_ep(part, experts["ep"].get_group())
        # float8 swaps nn.Linear modules, so it precedes the TP plan that matches them.
        if layout.float8:
            apply_float8(part)
        # TP before AC and compile: they wrap the blocks whose submodules the TP plan names.
        if tp > 1:
            apply_tp(part, tp_mesh=mesh["tp"], sequence_parallel=layout.sequence_parallel)
        apply_ac(part, mode=layout.activation_checkpointing)
        # compile after AC, so each compiled graph contains its block's checkpoint region.
        if layout.compile:
            apply_compile(part)
        # Data parallelism wraps last (FSDP shards what TP left), still on meta: nothing is ever
        # held unsharded. DDP, which cannot hold TP or pipeline stages, comes after materialising.
        if dp > 1 and layout.sharding == "fsdp":
            if experts is not None:
                raise ValueError(
                    "ep > 1 with FSDP: the built-in trainer does not shard experts over expert data parallel"
                )
            apply_fsdp(
                part,
                dp_mesh=dense,
                param_dtype=torch.bfloat16 if bf16 else None,
                reduce_dtype=torch.float32 if bf16 else None,
                pipelined=pp > 1,
            )
        elif dp > 1 and (tp > 1 or pp > 1):
            apply_replicate(part, dp_mesh=dense)
        # Materialise shard by shard only now, when every parameter has its final placement.
        materialize(part, model.shape, seed=seed, device=device)
        if tp > 1:
            shard_embedding_grad(part)
    # DDP after materialising: its constructor broadcasts real parameters.
    if dp > 1 and layout.sharding != "fsdp" and tp == 1 and pp == 1:
        parts = [apply_ddp(p, dp_mesh=dense, device=device, ignore=expert_param_names(p)) for p in parts]
    # The pipeline stages wrap the final (DDP/FSDP) modules: the schedule drives their gradient sync.
    schedule = None
    if pp > 1:
        schedule = build_pipeline(
            list(zip(ids, parts)),
            pp_mesh=mesh["pp"],
            num_stages=num_stages,
            schedule=layout.pp_schedule,
            n_microbatches=grad_accum,
            loss_fn=loss_fn,
            device=device,
        )
    return Parallelized(parts, ids, num_stages, schedule)


def apply_cp(model: nn.Module, cp: ContextParallel) -> None:
    """Make a (possibly pipeline-split) Transformer attend over the cp group: every attention runs
    `cp.attention`, and positions (RoPE tables, learned rows) are this rank's global ones.

    After any deepcopy (`parallel.split_stage`), which a process group does not survive; before
    materialising, whose `reset_rope` builds the tables of this rank's positions.
    """
    for m in model.modules():
        if isinstance(m, Transformer):
            m.cp = cp
        elif isinstance(m, Attention):
            m.attend = cp.attention
