"""`sweep best --plan`: the layouts the plan predicts best, before any trial, in every `--format`
of `sweep best`, each marked as predicted, not measured (a comment line, or a JSON field)."""

from __future__ import annotations

import json
from typing import Any

import typer

from sweeper.errors import SweepError


def predicted_rows(spec: str, top: int) -> tuple[Any, list[dict[str, Any]]]:
    """The sweep, and its `top` candidates by predicted MFU as result-like rows (the dry run's
    table, first rows first), each with `predicted` set; refused when the plan leaves none."""
    from sweeper.launchers import plan_for_launcher
    from sweeper.plan.plan import make_plan
    from sweeper.plan.summary import no_candidates_message
    from sweeper.spec.loader import load_sweep
    from sweeper.statuses import PlanStatus

    sweep = load_sweep(spec)
    plan = plan_for_launcher(make_plan(sweep))  # as the dry run plans it
    frame = plan.to_frame()
    cands = frame[frame.status == PlanStatus.CANDIDATE].sort_values("pred_mfu", ascending=False, kind="stable")
    if cands.empty:
        raise SweepError(no_candidates_message(plan))
    rows = [
        {**r, "predicted": True, "trial_number": None, "mfu": None, "num_devices": _world(sweep, r)}
        for r in json.loads(cands.head(top).to_json(orient="records"))
    ]
    return sweep, rows


def _world(sweep: Any, row: dict[str, Any]) -> int:
    """The row's GPUs: its own node count's in a sweep over several (the plan's `nodes` column)."""
    return int(row.get("nodes", sweep.cluster.nodes)) * sweep.cluster.gpus_per_node


def _at(sweep: Any, row: dict[str, Any]) -> Any:
    """The sweep at the row's node count, which an export is written for."""
    return sweep.at(int(row["nodes"])) if "nodes" in row else sweep


def best_predicted(spec: str, *, top: int, fmt: str) -> None:
    """Print the plan's best layouts in `fmt` (table, json, or one of the exporters')."""
    from sweeper.trainers import EXPORTERS
    from sweeper.trainers.export import layout_record

    sweep, rows = predicted_rows(spec, top)
    if fmt == "table":
        from sweeper.cli.render import print_predicted
        from sweeper.knobs import KNOBS

        searched = [k for k in KNOBS if len(sweep.space[k]) > 1]  # the knobs the dry run's table shows
        title = f"{sweep.name}: best predicted layouts (the plan's model; no trial measured them)"
        print_predicted(rows, knobs=searched, title=title)
    elif fmt == "json":
        doc = {
            "name": sweep.name,
            "predicted": True,  # the plan's model, not a measurement
            "best": rows[0],
            "top": rows,
            "layout": layout_record(rows[0], _at(sweep, rows[0])),
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo(EXPORTERS[fmt](rows[0], _at(sweep, rows[0])), nl=False)
