"""The plan: every layout of the cross product with its status (candidate, invalid, pruned) and reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.estimate.memfit import MIN_FIT_CHANCE, fit_chance
from sweeper.estimate.memory import Estimate, estimate
from sweeper.estimate.predict import predict
from sweeper.estimate.step_time import StepTime
from sweeper.knobs import KNOBS, NO_EFFECT_VALUE
from sweeper.layouts.layout import RULES, Columns, Layout, Rule, ineffective, with_derived
from sweeper.spec.sweep import Sweep

if TYPE_CHECKING:
    import pandas as pd

from sweeper.statuses import PlanReason, PlanStatus

CANDIDATE, INVALID, PRUNED = PlanStatus.CANDIDATE, PlanStatus.INVALID, PlanStatus.PRUNED
UNCERTAIN = PlanStatus.UNCERTAIN


@dataclass(frozen=True)
class Plan:
    """Columns of the whole cross product, in the order of the space, with status and reason."""

    sweep: Sweep
    cols: dict[str, np.ndarray]
    status: np.ndarray
    reason_code: np.ndarray
    reason: np.ndarray
    memory: Estimate
    throughput: StepTime  # the throughput model (uncalibrated) for every layout; the search starts from it

    def __len__(self) -> int:
        return len(self.status)

    @property
    def pred_mfu(self) -> np.ndarray:
        """The throughput model's MFU (uncalibrated), for every layout."""
        return self.throughput.mfu

    @property
    def nodes(self) -> np.ndarray:
        """The node count of every layout (one value for a sweep of one size)."""
        return self.cols["nodes"]

    def nodes_of(self, i: int) -> int:
        return int(self.cols["nodes"][i])

    def sweep_of(self, i: int) -> Sweep:
        """The sweep at the node count of row i: its world, dp and gradient accumulation."""
        return self.sweep.at(self.nodes_of(i)) if self.sweep.several_sizes else self.sweep

    def _row_of_key(self, mask: np.ndarray) -> dict[tuple[Any, ...], int]:
        return {
            (self.nodes_of(int(r)), *_canonical_key({k: v[r : r + 1] for k, v in self.cols.items()})): int(r)
            for r in np.flatnonzero(mask)
        }

    @cached_property
    def _candidate_of_key(self) -> dict[tuple[Any, ...], int]:
        return self._row_of_key(self.candidate_mask)

    @cached_property
    def fit_chance(self) -> np.ndarray:
        """The chance each layout fits the card: 1 for a candidate, the estimate's error band's for an
        uncertain one, 0 for the rest (`sweeper.estimate.memfit.fit_chance`)."""
        chance = fit_chance(self.memory.total, self.memory.capacity_bytes)
        return np.where(self.status == CANDIDATE, 1.0, np.where(self.status == UNCERTAIN, chance, 0.0))

    @cached_property
    def _pruned_of_key(self) -> dict[tuple[Any, ...], int]:
        return self._row_of_key(self.status == PRUNED)

    def row_of(self, layout: Layout, *, pruned: bool = False, nodes: int | None = None) -> int | None:
        """The candidate row that runs this layout (itself, or the layout it runs identically to)
        on `nodes` nodes (default: the smallest size), or None when the plan rejected it; with
        `pruned`, the pruned row instead (the search may re-admit one that trials showed fits)."""
        table = self._pruned_of_key if pruned else self._candidate_of_key
        n = self.sweep.cluster.nodes if nodes is None else int(nodes)
        if n not in self.sweep.node_counts:
            return None
        return table.get((n, *_canonical_key(layout.columns(self.sweep.at(n)))))

    @property
    def candidate_mask(self) -> np.ndarray:
        """Layouts the search may run: candidates, and uncertain layouts (over the card within the
        estimate's measured error)."""
        return (self.status == CANDIDATE) | (self.status == UNCERTAIN)

    def near_card(self) -> np.ndarray:
        """Pruned layouts whose predicted total is within memory.probe_margin of the usable card."""
        margin = self.sweep.memory.probe_margin
        return (self.status == PRUNED) & (self.memory.total <= self.memory.capacity_bytes * (1 + margin))

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.status.tolist()))

    def reason_counts(self) -> dict[str, int]:
        """Rejected layouts per reason code, most frequent first."""
        codes = self.reason_code[~self.candidate_mask]
        return dict(Counter(codes.tolist()).most_common())

    def layout(self, i: int) -> Layout:
        return Layout.from_mapping({k: self.cols[k][i] for k in KNOBS})

    def candidates(self) -> list[Layout]:
        return [self.layout(int(i)) for i in np.flatnonzero(self.candidate_mask)]

    def columns(self) -> dict[str, np.ndarray]:
        """`to_frame`'s columns as arrays, one entry per layout: what the dry run's table reads, without
        importing pandas (a third of a dry run's start-up)."""
        data: dict[str, Any] = {"nodes": self.cols["nodes"]} if self.sweep.several_sizes else {}
        data |= {k: self.cols[k] for k in KNOBS}
        data["dp"] = self.cols["dp"]
        data["grad_accum"] = self.cols["grad_accum"]
        data["status"] = self.status
        data["reason"] = self.reason
        for name, values in self.memory.gib().items():
            data[name] = np.round(values, 4)
        data["peak_stage"] = self.memory.stage if self.memory.stage is not None else np.zeros(len(self), dtype=np.int64)
        data["mem_share"] = np.round(self.memory.total / (self.sweep.cluster.gpu.memory_gib * 1024**3), 4)
        data["pred_mfu"] = np.where(self.status == INVALID, np.nan, np.round(self.pred_mfu, 4))
        if self.sweep.several_sizes or self.sweep.goal is not None:
            data |= _run_columns(self)
        return data

    def to_frame(self) -> pd.DataFrame:
        """One row per layout: knobs, dp, grad_accum, status, reason and the memory breakdown (GiB)."""
        import pandas as pd

        frame = pd.DataFrame(self.columns())
        for k, knob in KNOBS.items():
            if knob.kind is bool:
                frame[k] = frame[k].astype(bool)
            elif knob.kind is str:
                frame[k] = frame[k].astype(str)
        return frame


def cross_product(space: dict[str, tuple[Any, ...]]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Columns of every combination of knob values (the last knob varying fastest), and the
    same as integer codes (the index of each value in its list), for fast grouping."""
    sizes = [len(space[n]) for n in KNOBS]
    total = int(np.prod(sizes))
    cols: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    repeat = total
    for name, size in zip(KNOBS, sizes):
        repeat //= size
        idx = np.tile(np.repeat(np.arange(size), repeat), total // (size * repeat))
        codes[name] = idx
        cols[name] = np.asarray(space[name], dtype=_dtype(KNOBS[name].kind))[idx]
    return cols, codes


def _dtype(kind: type) -> Any:
    return {int: np.int64, bool: np.bool_, str: np.str_}[kind]


def _run_columns(plan: Plan) -> dict[str, np.ndarray]:
    """The predicted tokens/s of each layout and, with a goal, the days, GPU-hours and cost of the
    whole run (`sweeper.estimate.cost`); NaN where the plan predicts nothing."""
    from sweeper.estimate.cost import run_columns

    tokens_per_s = plan.sweep.global_batch_size * plan.sweep.seq_len / plan.throughput.total
    world = plan.nodes * plan.sweep.cluster.gpus_per_node
    return run_columns(np.where(plan.status == INVALID, np.nan, tokens_per_s), world, plan.sweep.goal)


def make_plan(sweep: Sweep) -> Plan:
    """Every layout of the sweep's space at each of its node counts, validated, de-duplicated and
    memory-checked per node count: the rows of one size after another (`cols["nodes"]`)."""
    plans = [_plan_one(sweep.at(n)) for n in sweep.node_counts]
    if len(plans) == 1:
        return replace(plans[0], sweep=sweep)
    return Plan(
        sweep,
        {k: np.concatenate([p.cols[k] for p in plans]) for k in plans[0].cols},
        np.concatenate([p.status.astype(object) for p in plans]).astype(str),
        np.concatenate([p.reason_code.astype(object) for p in plans]).astype(str),
        np.concatenate([p.reason.astype(object) for p in plans]).astype(str),
        _joined_estimate([p.memory for p in plans]),
        StepTime(
            np.concatenate([p.throughput.compute for p in plans]),
            np.concatenate([p.throughput.comm for p in plans]),
            plans[0].throughput.calibration,
            np.concatenate([p.throughput.mfu for p in plans]),
        ),
    )


def _joined_estimate(parts: list[Estimate]) -> Estimate:
    """The estimates of each size's layouts, one after another (the card and recipe are the same)."""
    fields = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "allocator", "overhead")
    first = parts[0]
    stages = [p.stage if p.stage is not None else np.full(len(p.weights), -1) for p in parts]
    return Estimate(
        **{f: np.concatenate([getattr(p, f) for p in parts]) for f in fields},
        capacity_bytes=first.capacity_bytes,
        recipe=first.recipe,
        stage=np.concatenate(stages).astype(np.int64),
    )


def _plan_one(sweep: Sweep) -> Plan:
    """Enumerate, validate, de-duplicate and memory-check every layout of one size's space."""
    raw, codes = cross_product(sweep.space)
    cols = with_derived(raw, sweep)
    radix = {k: len(sweep.space[k]) + 1 for k in KNOBS}
    n = len(cols["tp"])
    status = np.full(n, CANDIDATE, dtype=object)
    code = np.full(n, "", dtype=object)
    reason = np.full(n, "", dtype=object)

    cols["nodes"] = np.full(n, sweep.cluster.nodes, dtype=np.int64)
    reject(cols, codes, sweep, status, code, reason)
    _mark_duplicates(cols, codes, radix, status, code, reason)
    # memory and throughput only for the valid rows (a few % of a large space); NaN elsewhere
    valid = np.flatnonzero(status == CANDIDATE)
    sub = {k: v[valid] for k, v in cols.items()}
    mem = _spread_estimate(estimate(sub, sweep), valid, n)
    over = np.flatnonzero((status == CANDIDATE) & ~mem.fits)
    gib, cap = mem.total / 1024**3, mem.capacity_bytes / 1024**3
    # an estimate over the card by less than its measured error may still fit: tried, not pruned
    chance = fit_chance(mem.total[over], mem.capacity_bytes)
    maybe, over = over[chance >= MIN_FIT_CHANCE], over[chance < MIN_FIT_CHANCE]
    status[over], code[over] = PRUNED, PlanReason.MEMORY
    reason[over] = [f"needs {gib[i]:.1f} GiB > {cap:.1f} GiB usable on {sweep.cluster.gpu.name}" for i in over]
    status[maybe], code[maybe] = UNCERTAIN, PlanReason.MEMORY_UNCERTAIN
    reason[maybe] = [
        f"needs {gib[i]:.1f} GiB > {cap:.1f} GiB usable, within the estimate's error: {100 * c:.0f}% chance it fits"
        for i, c in zip(maybe, chance[chance >= MIN_FIT_CHANCE])
    ]
    sub_time = predict(sub, sweep)
    throughput = StepTime(
        _widen(sub_time.compute, valid, n),
        _widen(sub_time.comm, valid, n),
        sub_time.calibration,
        _widen(sub_time.mfu, valid, n),
    )
    return Plan(sweep, cols, status.astype(str), code.astype(str), reason.astype(str), mem, throughput)


def leave_out(plan: Plan, cannot_run: Callable[[Columns], np.ndarray], why: str) -> Plan:
    """The plan less the valid layouts a launcher cannot run (`Launcher.cannot_run`): invalid, with
    `why`, so the search never proposes them and no trial re-admits them."""
    valid = np.flatnonzero(plan.status != INVALID)
    hit = valid[cannot_run({k: v[valid] for k, v in plan.cols.items()})] if valid.size else valid
    if hit.size == 0:
        return plan
    # as objects first: a fixed-width string array would cut the new code and reason to its width
    status, code, reason = (a.astype(object) for a in (plan.status, plan.reason_code, plan.reason))
    status[hit], code[hit], reason[hit] = INVALID, PlanReason.LAUNCHER_CANNOT_RUN.value, why
    return replace(plan, status=status.astype(str), reason_code=code.astype(str), reason=reason.astype(str))


def _widen(a: np.ndarray | None, rows: np.ndarray, n: int, fill: float = np.nan) -> np.ndarray:
    """Values over a subset of rows, widened to all n rows (`fill` where not computed)."""
    out = np.full(n, fill)
    if a is not None:
        out[rows] = a
    return out


def _spread_estimate(sub: Estimate, rows: np.ndarray, n: int) -> Estimate:
    """An estimate over a subset of rows, widened to all n rows (NaN where not estimated)."""
    fields = {
        f: _widen(getattr(sub, f), rows, n)
        for f in ("weights", "grads", "optimizer", "activations", "logits", "buffers", "allocator", "overhead")
    }
    return Estimate(
        **fields,
        capacity_bytes=sub.capacity_bytes,
        recipe=sub.recipe,
        stage=_widen(sub.stage, rows, n, -1).astype(np.int64),
    )


def reject(
    cols: Columns,
    codes: Mapping[str, np.ndarray] | None,
    sweep: Sweep,
    status: np.ndarray,
    code: np.ndarray,
    reason: np.ndarray,
    rules: tuple[Rule, ...] = RULES,
) -> None:
    """Mark the candidate rows that break a rule invalid, with the first rule's code and message."""
    for rule in rules:
        hit = np.flatnonzero((status == CANDIDATE) & rule.broken(cols, sweep))
        if hit.size == 0:
            continue
        status[hit], code[hit] = INVALID, rule.code
        reason[hit] = messages(_in_sweep(rule, sweep), cols, hit, codes)


def _in_sweep(rule: Rule, sweep: Sweep) -> Callable[[Columns, int], str]:
    """The rule's message for one row of some columns, in this sweep."""

    def explain(cols: Columns, row: int) -> str:
        return rule.explain(cols, sweep, row)

    return explain


class _Reading(Mapping[str, np.ndarray]):
    """Columns taken at some rows, noting which columns are read: a message depends on those only."""

    def __init__(self, cols: Columns, rows: np.ndarray) -> None:
        self._cols, self._rows = cols, rows
        self._taken: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._taken:
            self._taken[name] = np.asarray(self._cols[name])[self._rows]
        return self._taken[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        return len(self._cols)

    @property
    def read(self) -> list[str]:
        return list(self._taken)


def messages(
    explain: Callable[[Columns, int], str],
    cols: Columns,
    rows: np.ndarray,
    codes: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """explain(view, j) for every row of `rows` (the view holds the columns at those rows), called
    once per distinct value of the columns the messages read.

    Which knobs a message names is not listed anywhere: a message can depend only on the columns it
    reads, so rows that agree on all of them share it. The first call finds what it reads; a later
    call that reads a column not yet in the key (a branch) widens the key and the grouping restarts.
    """
    view = _Reading(cols, rows)
    keyed: list[str] = []
    while True:
        # a knob's integer codes group as its values do, and need no sort
        key = _value_key([codes[k][rows] if codes and k in codes else view[k] for k in keyed], len(rows))
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        found = np.asarray([explain(view, int(j)) for j in first], dtype=object)
        if set(view.read) <= set(keyed):
            return found[inverse.reshape(-1)]
        keyed = view.read


def _value_key(columns: list[np.ndarray], n: int) -> np.ndarray:
    """One int64 per row, equal where the rows agree on every column (0 for all rows when none)."""
    key = np.zeros(n, dtype=np.int64)
    for c in columns:
        code, radix = _small_codes(c)
        if int(key.max()) * radix >= 2**62:  # compact first, so the mixed radix cannot overflow
            key = np.unique(key, return_inverse=True)[1].reshape(-1)
        key = key * radix + code
    return key


def _small_codes(column: np.ndarray) -> tuple[np.ndarray, int]:
    """Integers 0..radix-1 equal where the column's values are; without a sort for ints and bools."""
    if column.dtype.kind in "iub" and column.size:
        lo, hi = int(column.min()), int(column.max())
        if hi - lo < 2**20:
            return column.astype(np.int64) - lo, hi - lo + 1
    _, code = np.unique(column, return_inverse=True)
    return code.reshape(-1), int(code.max(initial=0)) + 1


def _group_key(codes: dict[Any, np.ndarray], radix: dict[Any, int]) -> np.ndarray:
    """One int64 per row from several small codes (mixed radix; -1 allowed as 'no effect')."""
    key = np.zeros(len(next(iter(codes.values()))), dtype=np.int64)
    for k, c in codes.items():
        key = key * radix[k] + (c + 1)
    return key


def _mark_duplicates(
    cols: dict[str, np.ndarray],
    codes: dict[str, np.ndarray],
    radix: dict[str, int],
    status: np.ndarray,
    code: np.ndarray,
    reason: np.ndarray,
) -> None:
    """Among valid layouts, keep one of each group that runs identically and mark the others.

    The kept one is the layout whose no-op knobs already hold their neutral value when there
    is one (sequence_parallel=false at tp=1, ...), else the first in the space's order.
    """
    valid = np.flatnonzero(status == CANDIDATE)
    if valid.size == 0:
        return
    sub = {k: v[valid] for k, v in cols.items()}
    noop = ineffective(sub)
    group_codes = {k: np.where(noop[k], -1, codes[k][valid]) if k in noop else codes[k][valid] for k in KNOBS}
    group = _group_key(group_codes, radix)
    not_neutral = np.zeros(valid.size, dtype=bool)
    for k, mask in noop.items():
        not_neutral |= mask & (sub[k] != NO_EFFECT_VALUE[k])
    order = np.lexsort((np.arange(valid.size), not_neutral, group))
    g = group[order]
    first = np.ones(valid.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    head_pos = np.maximum.accumulate(np.where(first, np.arange(valid.size), 0))
    dup_pos = np.flatnonzero(~first)
    if dup_pos.size == 0:
        return
    rows, heads = valid[order[dup_pos]], valid[order[head_pos[dup_pos]]]
    status[rows], code[rows] = INVALID, PlanReason.DUPLICATE
    # each duplicate row beside the values of the layout kept for it, as columns `kept.<knob>`
    kept = {f"kept.{k}": _at(cols[k], rows, cols[k][heads]) for k in NO_EFFECT_VALUE}
    reason[rows] = messages(_describe_difference, {**cols, **kept}, rows)


def _at(column: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A copy of `column` holding `values` at `rows`."""
    out = column.copy()
    out[rows] = values
    return out


def _describe_difference(cols: Columns, row: int) -> str:
    diffs = [
        f"{k}={_python(cols[f'kept.{k}'][row])}" for k in NO_EFFECT_VALUE if cols[f"kept.{k}"][row] != cols[k][row]
    ]
    where = f"tp={cols['tp'][row]}, pp={cols['pp'][row]}, dp={cols['dp'][row]}"
    return f"same run as {', '.join(diffs)} (no effect at {where})"


def _canonical_key(cols: Mapping[str, np.ndarray]) -> tuple[Any, ...]:
    """One layout's identity: its knobs, each no-op knob at the value it behaves as."""
    noop = ineffective(cols)
    return tuple(NO_EFFECT_VALUE[k] if (k in noop and bool(noop[k][0])) else _python(cols[k][0]) for k in KNOBS)


def _python(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
