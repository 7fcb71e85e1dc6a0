"""Every collective priced by the nodes it spans, from a measured profile. Pure.

- Within one node: the node's own table (`scope: intra`), as measured at that message size.
- Across two nodes: the collective as measured across the link (`scope: inter`) with as many of each
  node's ranks taking part (they share the node's link), at that message size. The profile ran every
  rank of its nodes in such groups at once; on nodes of another size the link is shared by another
  number of groups, and its time scales with them (`Lookup.inter_s`: four nodes of one rank priced
  from a profile of two nodes of two ranks have the link to one group, not two). The backend's own
  algorithm is what was timed: gloo runs a flat ring over the group's ranks in order, so a ring of
  n ranks over two nodes crosses the link twice, each crossing carrying the ring's whole per-edge
  traffic (2(n-1)/n of the buffer for an all-reduce).
- Beyond two nodes: the alpha-beta algebra of that ring fitted on the two-node measurement,
  t = alpha * steps + beta * path * bytes (steps: 2(n-1) for an all-reduce, n-1 for an
  all-gather, reduce-scatter or all-to-all, 1 for a send; path: the ring's per-edge traffic). A flat
  ring over N nodes crosses N links, each carrying the same per-edge traffic as over two: the
  bandwidth term stays, the latency grows with the ring's steps. gloo's broadcast is a binomial tree
  instead: ceil(log2 n) rounds, each sending the whole buffer (steps and path both ceil(log2 n)).
- Nothing measured (a profile of one node, or a collective the backend lacked): NaN, and the caller
  keeps the GPU table's price and its published curve of one cluster (`sweeper.estimate.comm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sweeper.profiles.lookup import Lookup
from sweeper.profiles.profile import traffic


def steps(op: str, ranks: np.ndarray) -> np.ndarray:
    """Sequential messages of the flat ring (or one send) on each rank's critical path."""
    n = np.maximum(ranks, 1.0)
    if op == "all_reduce":
        return 2.0 * (n - 1)
    if op == "send_recv":
        return np.ones_like(n)
    if op == "broadcast":
        return np.ceil(np.log2(n))
    return n - 1


def path(op: str, ranks: np.ndarray) -> np.ndarray:
    """Bytes on each rank's critical path per byte of the buffer: the ring's per-edge traffic, or for
    the binomial tree of a broadcast the whole buffer once a round."""
    return steps(op, ranks) if op == "broadcast" else traffic(op, ranks)


@dataclass(frozen=True)
class AlphaBeta:
    """Seconds of one collective: alpha per ring step plus beta per byte crossing the link."""

    alpha: float
    beta: float

    def __call__(self, op: str, ranks: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return self.alpha * steps(op, ranks) + self.beta * path(op, ranks) * nbytes


def fit_alpha_beta(lookup: Lookup, op: str) -> AlphaBeta | None:
    """Least squares (non-negative, relative error) of the two-node points of `op`; None without them."""
    points = lookup.comm.get((op, "inter"), [])
    if len(points) < 2:
        return None
    ranks = np.array([float(p.ranks) for p in points])
    nbytes = np.array([float(p.bytes) for p in points])
    seconds = np.array([p.seconds for p in points])
    # each row divided by its time: every size counts alike (small ones set alpha, large ones beta)
    design = np.stack([steps(op, ranks), path(op, ranks) * nbytes], axis=1) / seconds[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones(len(points)), rcond=None)
    alpha, beta = (float(max(c, 0.0)) for c in coef)
    if beta == 0.0:  # the link's bytes always cost: fall back to the largest message's rate
        big = int(np.argmax(nbytes))
        beta = seconds[big] / (path(op, ranks[big : big + 1])[0] * nbytes[big])
    return AlphaBeta(alpha, beta)


def span(ranks: np.ndarray, stride: np.ndarray, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """(nodes a group covers, its members on each node) for `ranks` members `stride` apart."""
    ranks, stride = np.asarray(ranks, dtype=float), np.maximum(np.asarray(stride, dtype=float), 1.0)
    width = ranks * stride
    nodes = np.where(width <= gpus_per_node, 1.0, np.ceil(width / gpus_per_node))
    per_node = np.clip(np.floor(gpus_per_node / stride), 1.0, ranks)
    return nodes, per_node


def collective_by_span(
    lookup: Lookup, op: str, ranks: np.ndarray, stride: np.ndarray, nbytes: np.ndarray, gpus_per_node: int
) -> np.ndarray:
    """Seconds of `op` over each group (see the module's docstring); NaN where nothing was measured."""
    ranks = np.asarray(ranks, dtype=float)
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), ranks.shape)
    nodes, per_node = span(ranks, np.broadcast_to(stride, ranks.shape), gpus_per_node)
    out = np.full(ranks.shape, np.nan)
    out[ranks < 2] = 0.0
    inside = (nodes <= 1) & (ranks >= 2)
    if inside.any() and lookup.has_collective(op, "intra"):
        out[inside] = lookup.collective_s(op, "intra", ranks[inside], nbytes[inside])
    two = (nodes == 2) & (ranks >= 2)
    if two.any() and lookup.has_collective(op, "inter"):
        out[two] = lookup.inter_s(op, per_node[two], ranks[two], nbytes[two], node_ranks=gpus_per_node)
    more = (nodes > 2) & (ranks >= 2)
    fit = fit_alpha_beta(lookup, op) if more.any() else None
    if fit is not None:
        out[more] = fit(op, ranks[more], nbytes[more])
    return out
