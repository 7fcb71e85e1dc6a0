"""What the search and its study learn from result rows: a row's layout and plan row, what it
measured, the attributes the study keeps of it, and a study rebuilt from the rows.

Shared by a run that picks up an earlier run's rows and one whose study was lost or set aside
(`--rebuild-study`): either way the study ends as the run that wrote the rows left it, numbered like
the sweep (`sweeper.search.study`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweeper.layouts.layout import Layout
from sweeper.plan.plan import Plan
from sweeper.results.rows import InFlight
from sweeper.run.unwritten import not_written
from sweeper.search.search import LayoutSearch
from sweeper.search.stopping import MFU_LOW
from sweeper.search.study import rebuild_study, study_state, trial_attrs
from sweeper.statuses import TrialStatus


def layout_of(row: Mapping[str, Any]) -> Layout:
    return Layout.from_mapping({k: row[k] for k in Layout.__dataclass_fields__ if row.get(k) is not None})


def plan_row(plan: Plan, row: Mapping[str, Any]) -> int:
    """The plan row a result row ran (a candidate, or a pruned layout the trials re-admitted), -1 if none."""
    layout, nodes = layout_of(row), row.get("nodes")  # a sweep over several node counts: the row's own
    found = plan.row_of(layout, nodes=nodes)
    if found is None:
        found = plan.row_of(layout, pruned=True, nodes=nodes)
    return -1 if found is None else found


def measured(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the search learns from a result row."""
    return {
        "status": row["status"],
        "mfu": row.get("mfu"),
        "step_time_s": row.get("step_time_mean_s"),
        "peak_mem_gib": row.get("peak_mem_gib"),
        "device": row.get("device"),
        "peak_mem_reserved_gib": row.get("peak_mem_reserved_gib"),
    }


def row_attrs(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the Optuna study keeps of a result row beside the layout: error line, job id, trial number."""
    low = row.get("mfu_low")  # the early stop compares a running trial with the best's interval
    extra = {MFU_LOW: float(low)} if low is not None and math.isfinite(float(low)) else {}
    return trial_attrs(
        None, error=row.get("error"), job_id=row.get("job_id"), trial_number=int(row["trial_number"]), **extra
    )


def learn_rows(search: LayoutSearch, plan: Plan, rows: Sequence[Mapping[str, Any]]) -> None:
    """The search learns every finished row of an earlier run (not one the full disk kept from being
    written: its layout was not measured, and runs again)."""
    for r in rows:
        found = plan_row(plan, r)
        if found >= 0 and not not_written(r):
            search.observe(found, **measured(r))


def rebuild_from_rows(
    search: LayoutSearch, plan: Plan, rows: Sequence[Mapping[str, Any]], records: Sequence[InFlight], *, count: int
) -> int:
    """Give the (empty) study one trial per sweep number below `count`: each row's in the state it
    was told in, with the attributes it was told with; each trial in flight running; a placeholder for
    a number with neither (an unreadable row). Returns how many rows were told."""
    made: dict[int, FrozenTrial] = {
        rec.trial_number: search.trial_of(
            Layout.from_mapping(rec.layout), attrs={"trial_number": rec.trial_number}, nodes=plan.nodes_of(rec.row)
        )
        for rec in records
    }
    for r in rows:
        status, lost = TrialStatus(r["status"]), not_written(r)
        value = None if lost else search.done.get(plan_row(plan, r), 0.0)
        state = TrialState.FAIL if lost else study_state(status, value)
        attrs = row_attrs(r) | {"status": str(status), "kind": "rebuilt"}
        made[int(r["trial_number"])] = search.trial_of(
            layout_of(r),
            attrs=attrs,
            state=state,
            value=value if state == TrialState.COMPLETE else None,
            nodes=r.get("nodes"),
        )
    rebuild_study(search.study, count, made)
    return len(rows)
