"""Collective and point-to-point times on a GPU cluster, vectorised over layouts. Pure.

Bandwidths are NCCL *bus* bandwidths (what nccl-tests print as busbw): a ring all-reduce of S
bytes over n ranks takes 2(n-1)/n * S / busbw, an all-gather or reduce-scatter (n-1)/n * S /
busbw (NCCL docs, "Performance" in nccl-tests/doc/PERFORMANCE.md).

- Within a node the bus bandwidth is the GPU's NVLink figure (`GPU.intra_gbps`: NCCL all-reduce
  busbw on 8xH100 SXM is about 450 GB/s, cluster_collectives.csv measures 436).
- Across nodes NCCL runs one ring channel per NIC, so the bus bandwidth is the NICs of the group's
  ranks on one node together: members per node x `GPU.inter_gbps` (one 400 Gb/s NIC per GPU on
  DGX H100: 8 x 50 = 400 GB/s, NVIDIA's published multi-node all-reduce busbw is ~370-400 GB/s),
  capped by NVLink. A data-parallel group at tp = 8 has one member per node: 50 GB/s.
- The effective bus bandwidth falls with the number of nodes a group spans (latency of longer
  rings, the fabric's oversubscription). The one measurement of that here is the Ultra-Scale
  Playbook cluster's (../shared/data/ultrascale/cluster_collectives.csv, 256 MB messages on 1-64
  nodes of 8xH100): its curve, relative to the 2-node figure, is `SCALING_*` below, applied to
  every GPU (no other cluster's curve is published with the data).
"""

from __future__ import annotations

import numpy as np

from sweeper.spec.hardware import GPU

GIGA = 1e9

# nodes spanned -> bus bandwidth relative to 2 nodes, from cluster_collectives.csv (mean line):
# AllReduce 361.7, 160.1, 99.6, 84.7, 64.9, 32.9 GB/s; AllGather 184.6, 119.0, 69.0, 55.0, 28.0,
# 11.0 GB/s (ReduceScatter within 2 % of AllGather) on 2, 4, 8, 16, 32, 64 nodes
SCALING_NODES = np.array([2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
SCALING_ALLREDUCE = np.array([361.7, 160.1, 99.6, 84.7, 64.9, 32.9]) / 361.7
SCALING_GATHER = np.array([184.6, 119.0, 69.0, 55.0, 28.0, 11.0]) / 184.6
# the 2-node figure against the NICs' line rate (361.7 / 400 all-reduce; all-gather 184.6 / 400)
TWO_NODE_ALLREDUCE = 361.7 / 400.0
TWO_NODE_GATHER = 184.6 / 400.0
# NCCL's per-collective latency within a node (nccl-tests small-message time on NVLink, ~10-20 us)
# and per point-to-point send between nodes (one network round, ~20-30 us)
COLLECTIVE_LATENCY_S = 15e-6
P2P_LATENCY_S = 25e-6


def nodes_spanned(ranks: np.ndarray, stride: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Nodes a group of `ranks` members, `stride` ranks apart (tp inside dp inside pp), covers."""
    span = ranks * stride
    return np.where(span <= gpus_per_node, 1.0, np.ceil(span / gpus_per_node)).astype(float)


def bus_gbps(gpu: GPU, gpus_per_node: int, ranks: np.ndarray, stride: np.ndarray, *, gather: bool) -> np.ndarray:
    """Bus bandwidth (GB/s) of a collective over `ranks` members spaced `stride` apart.

    Across nodes: the lesser of the group's own NICs (members per node x NIC, at the 2-node
    efficiency) and the whole node's line rate scaled by the measured curve of the span: at 64
    nodes the curve, not the NICs, binds (latency and fabric, whatever the group's width), which
    the sweep shows (an 8B's tp=4 gradient all-reduce on 64 nodes runs at the measured ~33 GB/s).
    """
    nodes = nodes_spanned(ranks, stride, gpus_per_node)
    per_node = np.maximum(np.minimum(ranks, gpus_per_node // np.maximum(stride, 1)), 1)
    two = TWO_NODE_GATHER if gather else TWO_NODE_ALLREDUCE
    curve = SCALING_GATHER if gather else SCALING_ALLREDUCE
    scale = np.interp(np.log2(np.maximum(nodes, 2)), np.log2(SCALING_NODES), curve)
    # past 64 nodes: the measured halving per doubling from 32 to 64 continues
    scale = np.where(nodes > 64, curve[-1] * 64 / np.maximum(nodes, 1), scale)
    line = min(gpus_per_node * gpu.inter_gbps, gpu.intra_gbps)
    own = np.minimum(per_node * gpu.inter_gbps, gpu.intra_gbps) * two
    inter = np.minimum(own, line * two * scale)
    intra = gpu.intra_gbps * (1.0 if not gather else 250.0 / 436.0)  # all-gather busbw 250 vs 436 on 1 node
    return np.where(nodes <= 1, intra, inter)


def allreduce_s(nbytes: np.ndarray, ranks: np.ndarray, busbw: np.ndarray) -> np.ndarray:
    """Ring all-reduce time: 2(n-1)/n of the buffer at the bus bandwidth, plus NCCL's latency."""
    return np.where(
        ranks > 1, 2 * (ranks - 1) / np.maximum(ranks, 1) * nbytes / (busbw * GIGA) + COLLECTIVE_LATENCY_S, 0.0
    )


def gather_s(nbytes: np.ndarray, ranks: np.ndarray, busbw: np.ndarray) -> np.ndarray:
    """All-gather or reduce-scatter of a `nbytes` full buffer: (n-1)/n of it at the bus bandwidth."""
    return np.where(ranks > 1, (ranks - 1) / np.maximum(ranks, 1) * nbytes / (busbw * GIGA) + COLLECTIVE_LATENCY_S, 0.0)


# ---- point-to-point and all-to-all traffic (context-parallel ring, expert dispatch) ----------
# All-to-all reaches ~96 % of NVLink inside a node and ~86 % of the NIC across nodes: DeepEP's
# normal kernels (github.com/deepseek-ai/DeepEP README, H800, EP8 dispatch 153 of ~160 GB/s NVLink;
# EP16 dispatch and combine 43 of ~50 GB/s RDMA, the figure without its NVLink forwarding gains)
ALLTOALL_NVLINK_SHARE = 153.0 / 160.0
ALLTOALL_NIC_SHARE = 43.0 / 50.0


def link_domain(gpu: GPU, gpus_per_node: int) -> int:
    """GPUs that talk over NVLink: the node, or the NVLink fabric when it joins more (NVL72 racks)."""
    return max(gpus_per_node, gpu.nvlink_domain)


def link_gbps(gpu: GPU, gpus_per_node: int, span: np.ndarray) -> np.ndarray:
    """Per-GPU bandwidth (GB/s, one direction) of point-to-point traffic in a group covering `span`
    consecutive ranks: NVLink when the span stays in one NVLink domain, else the GPU's own NIC
    (a ring's step waits for its slowest hop, the one that leaves the node)."""
    return np.where(span <= link_domain(gpu, gpus_per_node), gpu.intra_gbps, gpu.inter_gbps)


def alltoall_s(nbytes: np.ndarray, ranks: np.ndarray, stride: np.ndarray, gpu: GPU, gpus_per_node: int) -> np.ndarray:
    """All-to-all of `nbytes` per rank over `ranks` members `stride` ranks apart: each rank keeps
    1/n of its buffer and sends the rest; what goes to members in its NVLink domain moves over
    NVLink, the rest through its NIC, both at once (the slower one sets the time)."""
    n = np.maximum(ranks, 1)
    domain = link_domain(gpu, gpus_per_node)
    local = np.clip(domain // np.maximum(stride, 1), 1, n)  # members sharing this rank's NVLink domain
    nvlink = (local - 1) / n * nbytes / (gpu.intra_gbps * ALLTOALL_NVLINK_SHARE * GIGA)
    nic = (n - local) / n * nbytes / (gpu.inter_gbps * ALLTOALL_NIC_SHARE * GIGA)
    return np.where(ranks > 1, np.maximum(nvlink, nic) + COLLECTIVE_LATENCY_S, 0.0)
