"""The plan: every layout of the cross product with its status (candidate, invalid, pruned) and reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.knobs import KNOBS
from sweeper.layout import RULES, Layout, canonical_columns, with_derived
from sweeper.memory import Estimate, estimate
from sweeper.spec import Sweep

if TYPE_CHECKING:
    import pandas as pd

CANDIDATE, INVALID, PRUNED = "candidate", "invalid", "pruned"


@dataclass(frozen=True)
class Plan:
    """Columns of the whole cross product, in the order of the space, with status and reason."""

    sweep: Sweep
    cols: dict[str, np.ndarray]
    status: np.ndarray
    reason_code: np.ndarray
    reason: np.ndarray
    memory: Estimate

    def __len__(self) -> int:
        return len(self.status)

    @property
    def candidate_mask(self) -> np.ndarray:
        return self.status == CANDIDATE

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.status.tolist()))

    def reason_counts(self) -> dict[str, int]:
        """Rejected layouts per reason code, most frequent first."""
        codes = self.reason_code[self.status != CANDIDATE]
        return dict(Counter(codes.tolist()).most_common())

    def layout(self, i: int) -> Layout:
        return Layout.from_mapping({k: self.cols[k][i] for k in KNOBS})

    def candidates(self) -> list[Layout]:
        return [self.layout(int(i)) for i in np.flatnonzero(self.candidate_mask)]

    def to_frame(self) -> pd.DataFrame:
        """One row per layout: knobs, dp, grad_accum, status, reason and the memory breakdown (GiB)."""
        import pandas as pd

        data: dict[str, Any] = {k: self.cols[k] for k in KNOBS}
        data["dp"] = self.cols["dp"]
        data["grad_accum"] = self.cols["grad_accum"]
        data["status"] = self.status
        data["reason"] = self.reason
        for name, values in self.memory.gib().items():
            data[name] = np.round(values, 4)
        data["mem_share"] = np.round(self.memory.total / (self.sweep.cluster.gpu.memory_gib * 1024**3), 4)
        frame = pd.DataFrame(data)
        for k, knob in KNOBS.items():
            if knob.kind is bool:
                frame[k] = frame[k].astype(bool)
            elif knob.kind is str:
                frame[k] = frame[k].astype(str)
        return frame


def cross_product(space: dict[str, tuple[Any, ...]]) -> dict[str, np.ndarray]:
    """Columns of every combination of knob values, the last knob varying fastest."""
    names = list(KNOBS)
    sizes = [len(space[n]) for n in names]
    total = int(np.prod(sizes))
    cols: dict[str, np.ndarray] = {}
    repeat = total
    for name, size in zip(names, sizes):
        repeat //= size
        idx = np.tile(np.repeat(np.arange(size), repeat), total // (size * repeat))
        values = np.asarray(space[name], dtype=_dtype(KNOBS[name].kind))
        cols[name] = values[idx]
    return cols


def _dtype(kind: type) -> Any:
    return {int: np.int64, bool: np.bool_, str: np.str_}[kind]


def make_plan(sweep: Sweep) -> Plan:
    """Enumerate, validate, de-duplicate and memory-check every layout of the sweep's space."""
    cols = with_derived(cross_product(sweep.space), sweep)
    n = len(cols["tp"])
    status = np.full(n, CANDIDATE, dtype=object)
    code = np.full(n, "", dtype=object)
    reason = np.full(n, "", dtype=object)

    for rule in RULES:
        hit = np.flatnonzero((status == CANDIDATE) & rule.broken(cols, sweep))
        if hit.size == 0:
            continue
        status[hit], code[hit] = INVALID, rule.code
        reason[hit] = _explain_many(rule, cols, sweep, hit)

    _mark_duplicates(cols, status, code, reason)
    mem = estimate(cols, sweep)
    over = np.flatnonzero((status == CANDIDATE) & ~mem.fits)
    status[over], code[over] = PRUNED, "memory"
    gib, cap = mem.total / 1024**3, mem.capacity_bytes / 1024**3
    reason[over] = [f"needs {gib[i]:.1f} GiB > {cap:.1f} GiB usable on {sweep.cluster.gpu.name}" for i in over]
    return Plan(sweep, cols, status.astype(str), code.astype(str), reason.astype(str), mem)


def _explain_many(rule: Any, cols: dict[str, np.ndarray], sweep: Sweep, rows: np.ndarray) -> list[str]:
    """Messages for many rows; identical knob values give identical messages, so cache by row key."""
    cache: dict[tuple, str] = {}
    out = []
    keys = ("tp", "pp", "micro_batch_size", "dp", "grad_accum", "virtual_stages", "pp_schedule", "chunks")
    for i in rows:
        key = tuple(cols[k][i].item() for k in keys)
        if key not in cache:
            cache[key] = rule.explain(cols, sweep, int(i))
        out.append(cache[key])
    return out


def _mark_duplicates(cols: dict[str, np.ndarray], status: np.ndarray, code: np.ndarray, reason: np.ndarray) -> None:
    """Among valid layouts, keep the first of each group that runs identically; mark the rest."""
    valid = np.flatnonzero(status == CANDIDATE)
    if valid.size == 0:
        return
    canon = canonical_columns({k: v[valid] for k, v in cols.items()})
    raw_differs = np.zeros(valid.size, dtype=bool)
    keys = []
    for k in KNOBS:
        _, inverse = np.unique(canon[k], return_inverse=True)
        keys.append(inverse)
        raw_differs |= canon[k] != cols[k][valid]
    # prefer the row that is already in canonical form, then the earliest
    order = np.lexsort((np.arange(valid.size), raw_differs, *reversed(keys)))
    stacked = np.stack(keys, axis=1)[order]
    first_of_group = np.ones(valid.size, dtype=bool)
    first_of_group[1:] = np.any(stacked[1:] != stacked[:-1], axis=1)
    group_head = np.maximum.accumulate(np.where(first_of_group, np.arange(valid.size), 0))
    dup = ~first_of_group
    for pos in np.flatnonzero(dup):
        row, head = valid[order[pos]], valid[order[group_head[pos]]]
        status[row], code[row] = INVALID, "duplicate"
        reason[row] = "same run as " + _describe_difference(cols, head, row)


def _describe_difference(cols: dict[str, np.ndarray], kept: int, row: int) -> str:
    diffs = [f"{k}={cols[k][kept].item()}" for k in KNOBS if cols[k][kept] != cols[k][row]]
    where = f"tp={cols['tp'][row]}, pp={cols['pp'][row]}, dp={cols['dp'][row]}"
    return f"{', '.join(diffs)} (no effect at {where})"
