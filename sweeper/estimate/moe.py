"""The step-time terms of context parallelism and of mixtures of experts (`estimate.predict.predict`'s
`expert_matmul`, `cp_comm` and `ep_comm` parts, and the gradient reductions' groups).

- Context parallel (cp): each rank holds seq/cp tokens of every sequence (two of 2*cp chunks, so
  causal attention is balanced), so every per-token term of a rank counts seq/cp tokens and the
  attention work per rank is 1/cp of a sequence's. Keys and values travel between the cp ranks:
  a ring (Megatron-LM / Transformer Engine `cp_comm_type="p2p"`) sends cp-1 K/V chunks per block
  forward and twice that backward (K/V again and their gradients), each transfer issued while
  the attention kernel of the previous chunk runs; an all-gather (PyTorch's `context_parallel`
  with torchtitan's default rotate method "allgather", the built-in trainer's CPU path) gathers
  K/V before the kernel and reduce-scatters their gradients after it, exposed.
- Mixture of experts: the routed experts' matmuls run as grouped GEMMs whose rows are the tokens
  each local expert receives, at `step_time.gemm_efficiency_at` of that size; the busiest
  expert-parallel rank sets the pace (EXPERT_IMBALANCE); every MoE block dispatches and combines
  its tokens by all-to-all over ep (two forward, two backward), sorts them by expert and back
  (`moe_permute_bytes`, memory-bound), and pays a host-side cost per micro-batch
  (MOE_BLOCK_OVERHEAD_S, counted as framework time).
- Rank placement, as Megatron-LM orders its meshes (`parallel_state`, order "tp-cp-ep-dp-pp"):
  the cp group is cp ranks tp apart, inside one NVLink domain when tp*cp fits; the expert mesh
  is etp-ep-dp-pp, so the ep group is ep ranks etp apart, in one domain when etp*ep fits, and the
  expert data-parallel group is edp ranks etp*ep apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.comm import COLLECTIVE_LATENCY_S, alltoall_s, bus_gbps, gather_s, link_gbps
from sweeper.layouts.layout import Columns
from sweeper.layouts.stages import stage_layers, stage_params, stage_params_at

if TYPE_CHECKING:
    from sweeper.spec.models import ModelShape
    from sweeper.spec.sweep import Sweep

GIGA = 1e9
# The busiest expert-parallel rank receives this much more than the mean of routed tokens. With a
# load-balancing loss the busiest of 8 experts carried 1.02-1.22x the mean token count across the
# 16 layers logged in github.com/shawntan/scattermoe issue 10 (median 1.08); a rank holding
# several experts averages some of that out, a top-k router with k > 1 adds correlated picks:
# 1.1 is taken. Applied to the routed experts' matmuls and to the all-to-alls (the busiest
# receiver finishes last); not at ep = 1, where one rank runs every token whatever the routing.
EXPERT_IMBALANCE = 1.1
# share of the ring's K/V transfers that can hide behind the attention kernel of the chunk in
# flight: all of it (TE's `AttnFuncWithCPAndKVP2P` posts step i+1's send/receive on its own
# stream before step i's kernel); what exceeds that kernel's time is exposed
CP_RING_HIDDEN = 1.0
# Host-side cost of one MoE block per micro-batch, forward and backward, on top of the block's
# LAYER_OVERHEAD_S. Dropless routing leaves each expert's token count on the GPU; Megatron-Core's
# dispatcher copies it to the host (`tensor.cpu()`, a device-to-host sync: NVIDIA/Megatron-LM issue
# 1598) before it can launch the all-to-all and the grouped GEMM (the built-in trainer's
# sweeper/runtime/moe.py syncs the same way, `counts.tolist()`), so the GPU idles while the host
# launches the rest of the block's many small kernels (router, permute, per-expert GEMMs,
# unpermute), and the same dynamic shapes keep the block out of CUDA graphs (Megatron-LM's MoE
# README, "CPU Overhead Bottleneck": "increase micro-batch size"; PR 5258: "the dynamic token-count
# device syncs, MoE dispatch/combine, and per-layer launch overhead"). NVIDIA's tables show its size:
# Qwen3-30B-A3B on 8 GB200, one layout, 10.0 s per step in release 26.04 and 6.4 s in 26.06, once
# Megatron-Bridge fused kernels and captured the whole iteration in a CUDA graph (its PR 4211):
# 4.7 ms per MoE block per micro-batch; on 8 B200, 27.1 s at micro-batch 1 and 9.8 s at 4 for the
# same global batch (7.5 ms per extra block pass).
# No source states it apart from the rest of a step: 2.75 ms is fitted, the value on a 0.25 ms grid
# that minimises the median |step-time error| of the FIT rows of `nvidia-perf moe`
# (benchmarks/throughput_moe.py: 13.4 % there, 23.7 % on its held-out rows, 24.0 / 24.8 % without).
# Runs that graph the whole iteration (padding each expert to a fixed capacity, as most of NVIDIA's
# MoE recipes do from release 26.06 on) do not pay it.
MOE_BLOCK_OVERHEAD_S = 2.75e-3


def rank_tokens(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Tokens of one micro-batch on one rank: micro-batch x seq_len / cp (before tensor parallelism)."""
    return cols["micro_batch_size"] * sweep.seq_len / cols["cp"]


def routed_flops_per_token(m: ModelShape) -> float:
    """Matmul FLOPs (fwd 2, bwd 4 per weight) per token in the routed experts: top-k experts per MoE block.
    Shared experts see every token, as a dense MLP does: they stay with the dense matmuls."""
    return 6.0 * m.moe_layers * m.experts_per_token * m.expert_params


def expert_rows(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Rows of each grouped expert GEMM per micro-batch: the tokens one local expert receives.

    A rank's tokens (seq/cp, 1/tp of them under sequence parallelism) go top-k times each to
    `experts` experts; an expert on this rank gets them from the ep ranks of its group and, with
    etp > 1, from the etp ranks that share its weights: tokens x top-k x ep x etp / experts.
    """
    m = sweep.model
    tokens = rank_tokens(cols, sweep) / np.where(cols["effective_sp"], cols["tp"], 1)
    return tokens * m.experts_per_token * cols["ep"] * cols["etp"] / max(m.experts, 1)


def expert_gemm_size(cols: Columns, sweep: Sweep) -> np.ndarray:
    """M x N of an expert's up-projection in 2^20 elements (the size `gemm_efficiency_at` reads)."""
    return expert_rows(cols, sweep) * (sweep.model.expert_ffn / cols["etp"]) / 2**20


def expert_imbalance(cols: Columns) -> np.ndarray:
    return np.where(cols["ep"] > 1, EXPERT_IMBALANCE, 1.0)


def moe_block_share(m: ModelShape) -> float:
    return m.moe_layers / m.layers


def moe_block_overhead_s(m: ModelShape, block_passes: np.ndarray) -> np.ndarray:
    """Seconds per step of the MoE blocks' host-side cost (MOE_BLOCK_OVERHEAD_S per MoE block per
    micro-batch); `block_passes`: blocks x micro-batches the busiest rank runs per step."""
    return MOE_BLOCK_OVERHEAD_S * moe_block_share(m) * block_passes


def moe_permute_bytes(m: ModelShape, e: float) -> float:
    """HBM bytes per token per block, averaged over blocks, of sorting tokens by expert and back:
    permute reads a token and writes its k copies, unpermute the reverse, forward and backward."""
    return moe_block_share(m) * 4 * (m.experts_per_token + 1) * m.hidden * e


def tp_block_share(m: ModelShape) -> float:
    """Share of a dense block's tensor-parallel traffic an average block pays: a MoE block's MLP
    runs none (its sequence-parallel tokens go to the router and the all-to-all as they are; the
    expert-tp gathers are the dispatch's, `ep_alltoall`), only its attention's half."""
    return 1.0 - moe_block_share(m) / 2


def mlp_elementwise_width(m: ModelShape) -> float:
    """Width of the MLP's elementwise work per token, averaged over blocks: ffn in a dense block,
    the top-k and shared experts' widths in a MoE block."""
    moe = (m.experts_per_token + m.shared_experts) * m.expert_ffn
    share = moe_block_share(m)
    return (1 - share) * m.ffn + share * moe


def cp_exchange(
    cols: Columns, sweep: Sweep, e: float, moves: np.ndarray, *, ring: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per step of the cp group's K/V exchange on one rank: (raw, hideable).

    `moves`: how often a block's K/V cross the group per step: per block pass forward once,
    backward twice (K/V again, and their gradients), once more when the forward is recomputed.
    The ring's `raw` may hide behind attention (the caller caps it by the kernel's time); the
    all-gather's hideable part is zero.
    """
    m, cl = sweep.model, sweep.cluster
    cp, tp = cols["cp"].astype(float), cols["tp"].astype(float)
    kv_heads_split = np.minimum(tp, m.kv_heads)  # fewer kv heads than tp: replicated
    chunk = rank_tokens(cols, sweep) * 2 * m.kv_dim / kv_heads_split * e  # this rank's K and V
    if ring:
        bw = link_gbps(cl.gpu, cl.gpus_per_node, tp * cp)
        step = (cp - 1) * (chunk / (bw * GIGA) + COLLECTIVE_LATENCY_S)
        raw = np.where(cp > 1, moves * step, 0.0)
        return raw, raw
    bw = bus_gbps(cl.gpu, cl.gpus_per_node, cp, tp, gather=True)
    raw = moves * gather_s(chunk * cp, cp, bw)
    return raw, np.zeros_like(raw)


def ep_alltoall(cols: Columns, sweep: Sweep, e: float, passes: np.ndarray) -> np.ndarray:
    """Seconds per step of the MoE blocks' token dispatch and combine on one rank.

    Per MoE block pass, two all-to-alls forward (dispatch, combine) and two backward, each of the
    rank's routed tokens (tokens x top-k x hidden x bytes, (ep-1)/ep of it leaving the rank) over
    ep ranks etp apart; the busiest receiver (EXPERT_IMBALANCE) sets the time. `passes`: block
    passes per step, forward and backward counted apart (2 per block per micro-batch, 3 when the
    forward is recomputed).
    """
    m, cl = sweep.model, sweep.cluster
    if not m.is_moe:
        return np.zeros(len(cols["ep"]))
    tokens = rank_tokens(cols, sweep) / np.where(cols["effective_sp"], cols["tp"], 1)
    nbytes = tokens * m.experts_per_token * m.hidden * e
    etp = cols["etp"].astype(float)
    one = alltoall_s(nbytes, cols["ep"].astype(float), etp, cl.gpu, cl.gpus_per_node)
    # etp > 1: the tokens an expert receives are all-gathered over its etp ranks after the
    # dispatch and reduce-scattered before the combine (Megatron-LM's MoEAlltoAllTokenDispatcher)
    gathered = gather_s(nbytes * etp, etp, bus_gbps(cl.gpu, cl.gpus_per_node, etp, np.ones_like(etp), gather=True))
    return passes * moe_block_share(m) * 2 * (one + gathered) * expert_imbalance(cols)


def reduction_groups(cols: Columns, sweep: Sweep) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(parameters per rank, group size, stride) of each data-parallel gradient reduction.

    Dense parameters are reduced over dp*cp (the cp ranks hold the same weights), tp apart;
    a mixture's routed experts over expert data parallel (edp), etp*ep apart. Parameters are the
    most loaded of the first and last pipeline stages (`stages.stage_params` for a dense model).
    """
    m = sweep.model
    dp_cp = cols["dp"] * cols["cp"]
    if not m.is_moe:
        first, last = stage_params(cols, sweep)
        return [(np.maximum(first, last), dp_cp, cols["tp"])]
    tp, ep, etp = (cols[k].astype(float) for k in ("tp", "ep", "etp"))
    n = len(tp)
    first_layers, last_layers = np.zeros(n), np.zeros(n)
    for p in np.unique(cols["pp"]):
        split = stage_layers(m.layers, int(p)) if p <= m.layers else (np.nan,)
        first_layers[cols["pp"] == p], last_layers[cols["pp"] == p] = split[0], split[-1]
    single = cols["pp"] == 1
    moe_first = np.maximum(first_layers - m.dense_layers, 0.0)
    moe_last = np.where(single, moe_first, np.minimum(last_layers, m.moe_layers))
    block = m.attention_params / tp + m.layer_norm_params
    moe_dense = block + m.router_params + m.shared_experts * m.expert_params / tp
    dense_block = block + m.mlp_params / tp

    def dense_at(layers: np.ndarray, moe: np.ndarray, first: np.ndarray | bool, last: np.ndarray | bool) -> np.ndarray:
        outside = stage_params_at(cols, sweep, 0.0, first=first, last=last)
        return outside + moe * moe_dense + (layers - moe) * dense_block

    dense = np.maximum(dense_at(first_layers, moe_first, True, single), dense_at(last_layers, moe_last, single, True))
    expert = np.maximum(moe_first, moe_last) * m.experts / ep * m.expert_params / etp
    return [(dense, dp_cp, tp), (expert, cols["edp"], etp * ep)]
