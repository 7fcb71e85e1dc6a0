"""The prices of a block's work from a measured profile: its GEMMs, attention, memory-bound work and
recomputation, forward and backward apart, per layout and micro-batch on one rank, and one block's
tensor-parallel collectives. Pure; `sweeper.estimate.profiled` adds them up into a step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from sweeper.estimate.step_time import FLOAT8_SPEEDUP
from sweeper.profiles.lookup import Lookup

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.models import ModelShape


@dataclass(frozen=True)
class Block:
    """Per-layout seconds of one block for one micro-batch on one rank, forward and backward apart."""

    gemm_fwd: np.ndarray
    gemm_bwd: np.ndarray
    mlp_gemm_fwd: np.ndarray
    attn_fwd: np.ndarray
    attn_bwd: np.ndarray
    elem_fwd: np.ndarray
    elem_bwd: np.ndarray
    mlp_elem_fwd: np.ndarray

    def recompute(self, mode: np.ndarray) -> np.ndarray:
        """What backward runs again: the whole forward (full), the memory-bound forward the
        selective policy does not save (it keeps GEMM and attention outputs), the MLP's (ffn)."""
        full = self.gemm_fwd + np.nan_to_num(self.attn_fwd) + self.elem_fwd
        ffn = self.mlp_gemm_fwd + self.mlp_elem_fwd
        return np.select([mode == "full", mode == "selective", mode == "ffn"], [full, self.elem_fwd, ffn], 0.0)

    def total(self) -> np.ndarray:
        attention = np.nan_to_num(self.attn_fwd + self.attn_bwd)
        return self.gemm_fwd + self.gemm_bwd + attention + self.elem_fwd + self.elem_bwd


def gemm_dtype(lookup: Lookup, precision: str) -> str:
    """The profile's GEMM table for a run in `precision` (bf16, fp32), or the one it has."""
    return precision if lookup.has_gemm(precision) else next(iter(lookup.gemm_curves))[0]


def block_prices(
    lookup: Lookup, m: ModelShape, *, rows: np.ndarray, tp: np.ndarray, sp: np.ndarray, cols: Columns, dtype: str
) -> Block:
    """One block's GEMMs, attention and memory-bound work per layout (rows = tokens per micro-batch)."""
    h, q, kv = m.hidden, m.q_dim / tp, m.kv_dim / tp
    ffn = np.maximum(m.ffn // tp, 1)
    fp8 = cols["float8"].astype(bool) & lookup.has_gemm("fp8")

    def gemm(n: ArrayLike, k: ArrayLike, part: str) -> np.ndarray:
        t = lookup.gemm_s(dtype, rows, n, k, part=part)
        if lookup.has_gemm("fp8"):
            t = np.where(fp8, lookup.gemm_s("fp8", rows, n, k, part=part), t)
        return np.where(cols["float8"].astype(bool) & ~fp8, t / FLOAT8_SPEEDUP, t)

    up = 2 if m.mlp == "swiglu" else 1
    attn_proj = {p: gemm(q, h, p) + 2 * gemm(kv, h, p) + gemm(h, q, p) for p in ("fwd", "bwd")}
    mlp = {p: up * gemm(ffn, h, p) + gemm(h, ffn, p) for p in ("fwd", "bwd")}
    attn_fwd, attn_bwd = attention_prices(lookup, m, cols, rows=rows, tp=tp)
    compiled = cols["compile"].astype(bool)

    def elem(op: str, mode: str, elements: np.ndarray, part: str) -> np.ndarray:
        eager = lookup.elementwise_s(op, mode, elements, part=part)
        return (
            np.where(compiled, lookup.elementwise_s(op, "compiled", elements, part=part), eager)
            if mode == "eager"
            else eager
        )

    norm = "layernorm" if m.norm == "layernorm" else "rmsnorm"
    fused = cols["rmsnorm"] == "fused"
    seq_rows = np.where(sp & (tp > 1), rows / tp, rows)
    out = {}
    for p in ("fwd", "bwd"):
        norms = 2 * np.where(fused, elem(norm, "fused", seq_rows * h, p), elem(norm, "eager", seq_rows * h, p))
        adds = 2 * elem("add", "eager", seq_rows * h, p)
        act = elem("gelu" if m.mlp == "gelu" else "swiglu", "eager", rows * ffn, p)
        rope = elem("rope", "eager", rows * (q + kv), p) if m.position == "rope" else np.zeros(len(tp))
        out[p] = (norms, adds, act, rope)
    norms_f, adds_f, act_f, rope_f = out["fwd"]
    return Block(
        gemm_fwd=attn_proj["fwd"] + mlp["fwd"],
        gemm_bwd=attn_proj["bwd"] + mlp["bwd"],
        mlp_gemm_fwd=mlp["fwd"],
        attn_fwd=attn_fwd,
        attn_bwd=attn_bwd,
        elem_fwd=norms_f + adds_f + act_f + rope_f,
        elem_bwd=np.sum(out["bwd"], axis=0),
        mlp_elem_fwd=norms_f / 2 + act_f,
    )


def attention_prices(
    lookup: Lookup, m: ModelShape, cols: Columns, *, rows: np.ndarray, tp: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Attention's forward and backward per block and micro-batch: each kernel as measured at the
    layout's shape; NaN where the profile has no such kernel (the table prices those rows)."""
    n = len(tp)
    fwd, bwd = np.full(n, np.nan), np.full(n, np.nan)
    seq = rows / np.maximum(cols["micro_batch_size"], 1)
    for kernel in np.unique(cols["attention"]):
        if not lookup.has_attention(str(kernel)):
            continue
        at = cols["attention"] == kernel
        args = (
            cols["micro_batch_size"][at],
            m.heads // tp[at],
            np.maximum(m.kv_heads // tp[at], 1),
            m.head_dim,
            seq[at],
        )
        fwd[at] = lookup.attention_s(str(kernel), *args, part="fwd")
        bwd[at] = lookup.attention_s(str(kernel), *args, part="bwd")
    return fwd, bwd


def tp_block_comm(lookup: Lookup, tp: np.ndarray, act_bytes: np.ndarray, sp: np.ndarray) -> np.ndarray:
    """One block's tensor-parallel collectives, forward and backward, at the measured bandwidths: two
    all-reduces each way without sequence parallelism, two all-gathers and two reduce-scatters with it
    (NaN where the profile has no collective measured)."""
    if not lookup.has_collective("all_reduce", "intra"):
        return np.full(len(tp), np.nan)
    ar = lookup.collective_s("all_reduce", "intra", tp, act_bytes)
    if lookup.has_collective("all_gather", "intra") and lookup.has_collective("reduce_scatter", "intra"):
        gather = lookup.collective_s("all_gather", "intra", tp, act_bytes)
        sp_block = 2 * (gather + lookup.collective_s("reduce_scatter", "intra", tp, act_bytes))
    else:
        sp_block = 2 * ar
    return np.where(tp > 1, np.where(sp, sp_block, 2 * ar), 0.0)
