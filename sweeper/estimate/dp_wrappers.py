"""What data parallelism's wrappers cost the host beyond their collectives, from a profile. Pure.

FSDP2 (`fully_shard`, and `replicate`, which the built-in trainer uses for unsharded data parallelism
when tensor or pipeline parallelism keeps DDP out) runs hooks around every wrapped module on every
micro-batch, and copies parameters and gradients in and out of its flat buffers. On CPU ranks that
time adds to the step: the profile measured it on the tiny model wrapped on a mesh of one rank, at
one and at three blocks (`sweeper.runtime.profile_block.time_wrapped`), so the collectives, which
`sweeper.estimate.profiled` prices by their span, are not in it, and the two depths separate the cost
per block from the cost per model (the root's hooks, the embedding's and the head's units).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.step_time import busiest_stage_layers
from sweeper.profiles.lookup import Lookup
from sweeper.profiles.profile import DP_WRAPPER_DEPTHS

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.traits import TimeTraits

SHALLOW, DEEP = DP_WRAPPER_DEPTHS


def wrapper_cost(lookup: Lookup, wrapper: str) -> tuple[float, float] | None:
    """(seconds per block, seconds per model) that `wrapper` adds to one forward and backward of the
    tiny model, from the profile's two depths; None where the profile did not measure it."""
    points = [lookup.block_s(k, str(n)) for k in (wrapper, "model") for n in (SHALLOW, DEEP)]
    if any(p is None for p in points):
        return None
    wrapped_1, wrapped_3, plain_1, plain_3 = (float(p) for p in points if p is not None)
    per_block = max(((wrapped_3 - plain_3) - (wrapped_1 - plain_1)) / (DEEP - SHALLOW), 0.0)
    per_model = max((wrapped_1 - plain_1) - SHALLOW * per_block, 0.0)
    return per_block, per_model


def wrapper_overhead(lookup: Lookup, cols: Columns, layers: int, traits: TimeTraits) -> np.ndarray:
    """Per step, on the busiest rank: FSDP's hooks and copies on every micro-batch; replicate's hooks on
    every micro-batch and its copies on the one that reduces (the trainer's `_grad_sync`); DDP's on the
    one that reduces (`no_sync` on the others); 0 for one data-parallel rank and where the profile
    did not measure the wrapper."""
    dp = cols["dp"].astype(float)
    accum = np.maximum(cols["grad_accum"], 1).astype(float)
    blocks = busiest_stage_layers(cols, layers)
    fsdp = (dp > 1) & (cols["sharding"] == "fsdp")
    torch_dp = (dp > 1) & ~fsdp & traits.torch_dp_wrappers
    replicated = torch_dp & ((cols["tp"] > 1) | (cols["pp"] > 1))
    out = np.zeros(len(dp))

    def per_pass(wrapper: str) -> np.ndarray | None:
        cost = wrapper_cost(lookup, wrapper)
        return None if cost is None else cost[0] * blocks + cost[1]

    if (hooks := per_pass("fsdp")) is not None:
        out = np.where(fsdp, accum * hooks, out)
    if (ddp := per_pass("ddp")) is not None:  # its hooks and bucket copies, on the micro-batch that reduces
        out = np.where(torch_dp & ~replicated, ddp, out)
    hooks, syncing = per_pass("replicate"), per_pass("replicate_sync")
    if hooks is not None and syncing is not None:
        out = np.where(replicated, accum * hooks + np.maximum(syncing - hooks, 0.0), out)
    return np.nan_to_num(out)
