"""Pipeline geometry: how a model's layers and parameters are split over pipeline stages,
when the stages do not divide them evenly.

Pure (numpy only). Megatron-LM and torchtitan both run uneven stages: a 60-layer model on 8 stages is 4
stages of 8 and 4 of 7. The first stage also holds the embedding and the last the output head
and loss, so the extra layers go to the middle stages first; both the memory model and the
built-in trainer read the split from here, so what is estimated is what runs. The memory
and the time models read the parameters of each stage from here too (`stage_params`); in a
mixture of experts the dense leading blocks sit on the first stage(s) (`stage_dense_layers`)
and each sparse block's experts are split by ep and etp (`moe_block_params_per_rank`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep


def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage (in pipeline order), as even as possible; the remainder goes to the middle.

    >>> split_layers(60, 8)
    (7, 8, 8, 8, 8, 7, 7, 7)
    >>> split_layers(32, 4)
    (8, 8, 8, 8)
    """
    if stages < 1 or layers < stages:
        raise ValueError(f"cannot split {layers} layers over {stages} stages (each stage needs a layer)")
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    for i in _middle_first(stages)[:extra]:
        counts[i] += 1
    return tuple(counts)


def _middle_first(stages: int) -> list[int]:
    """Stage indices, the ones holding neither the embedding nor the head first (in order), then last, then first."""
    if stages <= 2:
        return list(range(stages))[::-1]  # with two stages the head's side is lighter on activations
    return list(range(1, stages - 1)) + [stages - 1, 0]


def stage_bounds(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """[start, end) layer indices of every stage, in pipeline order."""
    out, start = [], 0
    for n in split_layers(layers, stages):
        out.append((start, start + n))
        start += n
    return tuple(out)


def layer_params_per_rank(cols: Columns, sweep: Sweep) -> np.ndarray:
    """The largest block's parameters on one rank: a dense block (matrices split by tp, norms
    replicated) or, in a mixture of experts, a sparse block with its local experts."""
    m = sweep.model
    dense = (m.attention_params + m.mlp_params) / cols["tp"] + m.layer_norm_params
    if not m.is_moe:
        return dense
    shared, experts = moe_block_params_per_rank(cols, sweep)
    return np.maximum(dense, shared + experts) if m.dense_layers else shared + experts


def moe_block_params_per_rank(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, expert) parameters of one mixture-of-experts block on one rank.

    Non-expert: attention split by tp, the norms and the router's gate replicated (Megatron-LM's
    TopKRouter holds a whole experts x hidden weight on every rank, moe/router.py), shared experts
    split by tp as a dense MLP (moe/shared_experts.py is a tensor-parallel MLP). Expert: experts/ep
    experts per rank, each split by etp (moe/experts.py: num_local_experts = experts / ep, each
    expert's ffn / expert-tensor-parallel size).
    """
    m = sweep.model
    t = cols["tp"].astype(float)
    shared = (m.attention_params + m.shared_experts * m.expert_params) / t + m.router_params + m.layer_norm_params
    experts = m.experts / cols["ep"].astype(float) * m.expert_params / cols["etp"].astype(float)
    return shared, experts


def stage_dense_layers(layers: int, dense: int, pp: int, chunks: int = 1) -> tuple[int, ...]:
    """Dense leading blocks (the first `dense` of the model) held by each pipeline rank, split as
    `stage_layers` splits the blocks: they fall on the first chunk(s), so on rank 0 first."""
    held = [max(0, min(end, dense) - start) for start, end in stage_bounds(layers, pp * chunks)]
    return tuple(sum(held[r::pp]) for r in range(pp))


def stage_layers(layers: int, pp: int, chunks: int = 1) -> tuple[int, ...]:
    """Layers held by each pipeline rank: its chunks of `split_layers(layers, pp*chunks)`
    (chunk c runs on rank c mod pp, as Megatron-LM's and torch's interleaved schedules place them)."""
    split = split_layers(layers, pp * chunks)
    return tuple(sum(split[r::pp]) for r in range(pp))


def pipeline_shapes(cols: Columns) -> list[tuple[int, int]]:
    """The distinct (pp, chunks per rank) pairs among the layouts, in order."""
    # one int64 key per row (chunks < 2**20), then the distinct keys: a 1-D unique is fast
    key = np.asarray(cols["pp"], dtype=np.int64) * (1 << 20) + np.asarray(cols["chunks"], dtype=np.int64)
    return [(int(k) >> 20, int(k) & ((1 << 20) - 1)) for k in np.unique(key)]


def stage_param_groups_at(
    cols: Columns,
    sweep: Sweep,
    layers: np.ndarray | float,
    *,
    first: np.ndarray | bool,
    last: np.ndarray | bool,
    dense: np.ndarray | float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, expert) parameters on a rank of a stage holding `layers` blocks, `dense` of
    them dense (default: the model's dense leading blocks, as on the first stage; the rest are
    mixture-of-experts blocks).

    The first stage holds the embedding (vocab-parallel under tp) and a learned position table
    (replicated, as Megatron-LM keeps it); the last the final norm and the output head (or,
    when tied and the stage is not also the first, its own copy of the embedding). Expert
    parameters are kept apart: their gradients are reduced and their optimizer states sharded
    over expert data parallel (edp), the rest over dp*cp (Megatron-LM's distributed optimizer).
    """
    m = sweep.model
    embed = m.vocab * m.hidden / cols["tp"]
    head = np.where(first, 0.0, embed) if m.tied_embeddings else embed
    outside = np.where(first, embed + m.position_params, 0.0) + np.where(last, head + m.norm_params, 0.0)
    dense_block = (m.attention_params + m.mlp_params) / cols["tp"] + m.layer_norm_params
    if not m.is_moe:
        return layers * dense_block + outside, np.zeros(np.shape(outside))
    n_dense = np.minimum(layers, m.dense_layers) if dense is None else dense
    shared, experts = moe_block_params_per_rank(cols, sweep)
    moe = layers - n_dense
    return n_dense * dense_block + moe * shared + outside, moe * experts


def stage_params_at(
    cols: Columns,
    sweep: Sweep,
    layers: np.ndarray | float,
    *,
    first: np.ndarray | bool,
    last: np.ndarray | bool,
    dense: np.ndarray | float | None = None,
) -> np.ndarray:
    """Parameters on a rank of a stage holding `layers` blocks (`dense` of them dense), both
    groups of `stage_param_groups_at` together."""
    shared, experts = stage_param_groups_at(cols, sweep, layers, first=first, last=last, dense=dense)
    return shared + experts


def stage_params(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """Parameters on a rank of the first and of the last pipeline stage (tp-split, uneven splits included)."""
    m = sweep.model
    L = m.layers
    n = len(cols["pp"])
    first_layers, last_layers = np.zeros(n), np.zeros(n)
    first_dense, last_dense = np.zeros(n), np.zeros(n)
    for p in np.unique(cols["pp"]):
        split = stage_layers(L, int(p)) if p <= L else (np.nan,)
        dense = stage_dense_layers(L, m.dense_layers, int(p)) if p <= L and m.is_moe else split
        first_layers[cols["pp"] == p], last_layers[cols["pp"] == p] = split[0], split[-1]
        first_dense[cols["pp"] == p], last_dense[cols["pp"] == p] = dense[0], dense[-1]
    single = cols["pp"] == 1
    first = stage_params_at(cols, sweep, first_layers, first=True, last=single, dense=first_dense)
    last_stage = stage_params_at(cols, sweep, last_layers, first=False, last=True, dense=last_dense)
    return first, np.where(single, first, last_stage)
