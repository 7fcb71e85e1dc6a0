"""DeepSpeed: its ZeRO memory recipe. As a workload it is a command of the user's own (DeepSpeed
has no layout flags of its own to write): the layout reaches it through placeholders ({tp},
{micro_batch_size}, ...) and its log is read as a plain command's (Megatron-DeepSpeed prints
Megatron-LM's iteration lines)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.memory import compute_bytes
from sweeper.spec.memory_options import DeepSpeedMemory, MemoryOptions, StateBytes
from sweeper.trainers.base import TableRecipe
from sweeper.trainers.command import Command

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

# DeepSpeed ZeRO defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size and
# allgather_bucket_size 5e8 elements, stage3_prefetch_bucket_size 5e7 elements.
DEEPSPEED_REDUCE_BUCKET = 5e8
DEEPSPEED_PREFETCH_BUCKET = 5e7


class DeepSpeedRecipe(TableRecipe):
    """deepspeed: 2 + 2 + 12 bytes per parameter (ZeRO paper, K = 12); stage 1 shards the
    optimizer (master + moments), 2 also gradients, 3 parameters; plus its gradient-reduction
    bucket (reduce_bucket_size elements) and, at stage 3, its prefetch bucket."""

    name = "deepspeed"
    options = DeepSpeedMemory
    # DeepSpeed logs typically show reserved 5-15 % above max allocated
    reserved_factor = 1.10

    def table(self, sweep: Sweep, sharding: str) -> StateBytes:
        m = sweep.memory
        assert isinstance(m, DeepSpeedMemory)
        e = compute_bytes(sweep)
        params, master = (2.0, 4.0) if e < 4 else (4.0, 0.0)
        grads = 4.0 if (m.grad_accum_dtype == "fp32" or e == 4) else 2.0  # default: the parameters' dtype
        stage = (
            {"none": 0, "zero1": 1, "fsdp": 3}[sharding]
            if (m.zero_stage is None or sharding == "none")
            else m.zero_stage
        )
        sharded = ["master", "optimizer", "grads", "params"][: {0: 0, 1: 2, 2: 3, 3: 4}[stage]]
        return StateBytes.model_validate(
            {"params": params, "grads": grads, "master": master, "optimizer": 8.0, "sharded": sharded}
        )

    def buffers(self, sweep: Sweep, table: StateBytes, params: np.ndarray) -> np.ndarray:
        if not table.sharded:
            return np.zeros(np.shape(params))
        buffers = np.minimum(params, DEEPSPEED_REDUCE_BUCKET) * table.grads
        if "params" in table.sharded:
            buffers = buffers + np.minimum(params, DEEPSPEED_PREFETCH_BUCKET) * compute_bytes(sweep)
        return buffers

    def summary(self, options: MemoryOptions) -> list[str]:
        assert isinstance(options, DeepSpeedMemory)
        stage = options.zero_stage if options.zero_stage is not None else "as sharding says"
        return [f"ZeRO stage {stage}", f"grads {options.grad_accum_dtype or 'bf16'}"]


class DeepSpeed(Command):
    """A DeepSpeed training script run as the sweep's command, its memory held as ZeRO holds it."""

    kind = "deepspeed"
    recipe = DeepSpeedRecipe()
