"""Seconds for any shape from a measured profile's tables, vectorised over layouts. Pure.

A measured shape is read as measured; any other is interpolated log-log over its size (GEMM and
attention FLOPs, elements, bytes) between the measured points of its kind. Below the smallest
point the time stays at that point's (the host's launch cost bounds it from below); above the
largest the time grows in proportion to the size (the throughput of the largest is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from sweeper.profiles.profile import CollectivePoint, Profile, traffic


@dataclass(frozen=True)
class Curve:
    """Measured (size, seconds) points of one kind, sorted by size, duplicates averaged in log space."""

    log_size: np.ndarray
    log_s: np.ndarray

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]]) -> Curve:
        """The points' curve, made non-decreasing in size (more work never takes less time: a point
        below a smaller one's is a measurement a busy host disturbed; pool adjacent violators)."""
        by_size: dict[float, list[float]] = {}
        for size, seconds in points:
            by_size.setdefault(float(size), []).append(max(float(seconds), 1e-12))
        sizes = sorted(by_size)
        log_s = [float(np.mean(np.log(by_size[s]))) for s in sizes]
        return cls(np.log(np.array(sizes)), monotone(log_s, [len(by_size[s]) for s in sizes]))

    def __call__(self, size: np.ndarray) -> np.ndarray:
        x = np.log(np.maximum(np.asarray(size, dtype=float), 1e-300))
        inside = np.interp(x, self.log_size, self.log_s)
        above = self.log_s[-1] + (x - self.log_size[-1])  # constant throughput past the largest
        return np.exp(np.where(x > self.log_size[-1], above, inside))


def monotone(values: list[float], weights: list[int]) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, float(w), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v1, w1, n1), (v2, w2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return np.concatenate([np.full(int(n), v) for v, _, n in blocks])


def _per_unique(keys: np.ndarray, price: Callable[[tuple[int, ...]], float]) -> np.ndarray:
    """`price` of each row's key (rows of an int matrix), evaluated once per distinct key."""
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    values = np.array([price(tuple(int(v) for v in row)) for row in uniq], dtype=float)
    return values[inverse.reshape(-1)]


class Lookup:
    """The profile's tables, indexed for pricing (built once per prediction)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        # a shape as measured on a GPU (steady; two GEMMs of one size may differ by their aspect);
        # on a CPU the ranks and the host's other work disturb single points more than shapes
        # differ: there every shape reads the monotone curve of its kind
        steady = profile.gpu != "cpu"
        self.gemm_exact: dict[tuple[str, int, int, int], tuple[float, float]] = {
            (g.dtype, g.m, g.n, g.k): (g.fwd_s, g.bwd_s) for g in profile.gemm if steady
        }
        self.gemm_curves: dict[tuple[str, str], Curve] = {
            (dtype, part): Curve.of(
                (2.0 * g.m * g.n * g.k, g.fwd_s if part == "fwd" else g.bwd_s) for g in profile.gemm if g.dtype == dtype
            )
            for dtype in {g.dtype for g in profile.gemm}
            for part in ("fwd", "bwd")
        }
        self.attn_exact = {
            (a.kernel, a.batch, a.heads, a.kv_heads, a.head_dim, a.seq): (a.fwd_s, a.bwd_s)
            for a in profile.attention
            if steady
        }
        self.attn_curves = {
            (kernel, part): Curve.of(
                (attention_flops(a.batch, a.heads, a.head_dim, a.seq), a.fwd_s if part == "fwd" else a.bwd_s)
                for a in profile.attention
                if a.kernel == kernel
            )
            for kernel in {a.kernel for a in profile.attention}
            for part in ("fwd", "bwd")
        }
        self.elem_curves: dict[tuple[str, str, str], Curve] = {
            (op, mode, part): Curve.of(
                (e.elements, e.fwd_s if part == "fwd" else e.bwd_s)
                for e in profile.elementwise
                if (e.op, e.mode) == (op, mode)
            )
            for op, mode in {(e.op, e.mode) for e in profile.elementwise}
            for part in ("fwd", "bwd")
        }
        self.blocks = {(b.knob, b.value): b for b in profile.block}
        self.comm: dict[tuple[str, str], list[CollectivePoint]] = {}
        for c in profile.collectives:
            self.comm.setdefault((c.op, c.scope), []).append(c)

    # ---- GEMMs ----------------------------------------------------------------------------------
    def has_gemm(self, dtype: str) -> bool:
        return (dtype, "fwd") in self.gemm_curves

    def gemm_s(self, dtype: str, m: ArrayLike, n: ArrayLike, k: ArrayLike, *, part: str) -> np.ndarray:
        """Seconds of the GEMMs C[m, n] = A[m, k] B[k, n] (`part`: fwd, or bwd's dgrad + wgrad)."""
        curve = self.gemm_curves[(dtype, part)]
        index = 0 if part == "fwd" else 1

        def price(key: tuple[int, ...]) -> float:
            mm, nn, kk = key
            exact = self.gemm_exact.get((dtype, mm, nn, kk))
            return exact[index] if exact else float(curve(np.array(2.0 * mm * nn * kk)))

        keys = np.stack(np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (m, n, k))), axis=-1)
        return _per_unique(keys.reshape(-1, 3), price).reshape(keys.shape[:-1])

    # ---- attention ------------------------------------------------------------------------------
    def has_attention(self, kernel: str) -> bool:
        return (kernel, "fwd") in self.attn_curves

    def attention_s(
        self,
        kernel: str,
        batch: ArrayLike,
        heads: ArrayLike,
        kv_heads: ArrayLike,
        head_dim: int,
        seq: ArrayLike,
        *,
        part: str,
    ) -> np.ndarray:
        """Seconds of one attention call of `kernel` (measured, or by FLOPs from its other shapes)."""
        curve = self.attn_curves[(kernel, part)]
        index = 0 if part == "fwd" else 1

        def price(key: tuple[int, ...]) -> float:
            b, h, kv, s = key
            exact = self.attn_exact.get((kernel, b, h, kv, head_dim, s))
            return exact[index] if exact else float(curve(np.array(attention_flops(b, h, head_dim, s))))

        arrays = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (batch, heads, kv_heads, seq)))
        keys = np.stack(arrays, axis=-1)
        return _per_unique(keys.reshape(-1, 4), price).reshape(keys.shape[:-1])

    # ---- memory-bound work ----------------------------------------------------------------------
    def has_elementwise(self, op: str, mode: str) -> bool:
        return (op, mode, "fwd") in self.elem_curves

    def elementwise_s(self, op: str, mode: str, elements: ArrayLike, *, part: str = "both") -> np.ndarray:
        """Seconds of `op` over `elements` (fwd, bwd, or both); a compiled op not measured reads as eager."""
        if not self.has_elementwise(op, mode):
            mode = "eager"
        if part == "both":
            return self.elementwise_s(op, mode, elements, part="fwd") + self.elementwise_s(
                op, mode, elements, part="bwd"
            )
        return self.elem_curves[(op, mode, part)](np.asarray(elements, dtype=float))

    # ---- the block's host overhead --------------------------------------------------------------
    def block_s(self, knob: str, value: str) -> float | None:
        b = self.blocks.get((knob, value))
        return None if b is None else b.seconds

    # ---- collectives ----------------------------------------------------------------------------
    def has_collective(self, op: str, scope: str) -> bool:
        return (op, scope) in self.comm

    def collective_s(self, op: str, scope: str, ranks: ArrayLike, nbytes: ArrayLike) -> np.ndarray:
        """Seconds of `op` over `ranks` members on a `nbytes` buffer: the bus bandwidth measured at that
        size (on the nearest measured group size) times the algorithm's traffic, at least the time of
        the smallest message measured (its latency). 0 where ranks < 2."""
        return self._priced(self.comm[(op, scope)], op, ranks, nbytes)

    def inter_s(
        self, op: str, per_node: ArrayLike, ranks: ArrayLike, nbytes: ArrayLike, *, node_ranks: float | None = None
    ) -> np.ndarray:
        """Seconds of `op` across two nodes with `per_node` of each node's ranks taking part: the
        points measured with that many (the nearest measured) sharing the link, as `collective_s`.

        A point of q ranks per node was measured with every rank of the profile's nodes in a group, so
        with (the profile's ranks per node / q) groups sharing each link at once. On nodes of
        `node_ranks` ranks (the sweep's GPUs per node; default: the profile's), node_ranks / per_node
        groups share it: the link's time scales by that ratio (a node of one rank has the link to
        itself where the profile's two groups split it), never below the smallest message's time."""
        per_node = np.asarray(per_node, dtype=float)
        ranks, nbytes = np.broadcast_arrays(np.asarray(ranks, dtype=float), np.asarray(nbytes, dtype=float))
        points = self.comm[(op, "inter")]
        counts = sorted({p.per_node or p.ranks // 2 for p in points})
        out = np.zeros(np.broadcast(per_node, ranks).shape)
        nearest = np.array(counts, dtype=float)[np.argmin([np.abs(per_node - c) for c in counts], axis=0)]
        measured_on = self.profile.processes / max(self.profile.nodes, 1)
        sharing = measured_on if node_ranks is None else float(node_ranks)
        for q in counts:
            rows = nearest == q
            if rows.any():
                group = [p for p in points if (p.per_node or p.ranks // 2) == q]
                scale = (sharing / np.maximum(per_node[rows], 1.0)) / max(measured_on / q, 1.0)
                priced = self._priced(group, op, ranks[rows], nbytes[rows])
                out[rows] = np.maximum(priced * scale, min(p.seconds for p in group))
        return out

    def _priced(self, points: list[CollectivePoint], op: str, ranks: ArrayLike, nbytes: ArrayLike) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=float)
        nbytes = np.asarray(nbytes, dtype=float)
        sizes = sorted({p.ranks for p in points})
        out = np.zeros(np.broadcast(ranks, nbytes).shape)
        r_b, n_b = np.broadcast_arrays(ranks, nbytes)
        for size in sizes:
            group = sorted(
                (p for p in points if p.ranks == size), key=lambda p: p.bytes
            )  # np.interp needs sizes in order
            near = np.abs(r_b - size) == np.min([np.abs(r_b - s) for s in sizes], axis=0)
            rows = near & (r_b >= 2) & (out == 0)
            if not rows.any():
                continue
            log_b = np.log([p.bytes for p in group])
            log_bw = np.log([max(p.busbw_gbps, 1e-9) for p in group])
            bw = np.exp(np.interp(np.log(np.maximum(n_b[rows], 1.0)), log_b, log_bw))
            floor = min(p.seconds for p in group)
            out[rows] = np.maximum(traffic(op, r_b[rows]) * n_b[rows] / (bw * 1e9), floor)
        return out


def attention_flops(batch: float, heads: float, head_dim: float, seq: float) -> float:
    """Forward FLOPs of attention's two matmuls (QK^T and PV), all s x s scores counted."""
    return 4.0 * batch * heads * seq * seq * head_dim


@dataclass(frozen=True)
class MeasuredProfile:
    """A cluster's measured profile as the sweep carries it (`Cluster.profile`): the file's content,
    where it was read from, and its tables as lookups (built on first use)."""

    profile: Profile
    path: str
    source: str = field(init=False)

    def __post_init__(self) -> None:
        p = self.profile
        object.__setattr__(self, "source", f"profile {self.path} (measured {p.measured_at} on {p.device})")

    @cached_property
    def lookup(self) -> Lookup:
        return Lookup(self.profile)

    def __getstate__(self) -> dict[str, object]:  # pickled to trial processes: the tables rebuild on use
        return {"profile": self.profile, "path": self.path, "source": self.source}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
