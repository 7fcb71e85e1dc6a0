"""`sweep best --plan`: the layouts the plan predicts best, before any trial, in every `--format`
of `sweep best`, each marked as predicted, not measured (a comment line, or a JSON field)."""

from __future__ import annotations

import json
from typing import Any

import typer

from sweeper.errors import NoSuccessError, SweepError
from sweeper.plan.sizes import Winner, winner
from sweeper.text import for_terminal


def predicted_rows(spec: str, top: int, *, by: Winner = Winner.time) -> tuple[Any, list[dict[str, Any]], Any]:
    """The sweep, its `top` candidates by predicted MFU as result-like rows (the dry run's table,
    first rows first), each with `predicted` set, and, over several node counts or with a goal,
    the answer per size (`plan_view`): then the rows are those of the size chosen `by` time or
    cost among the sizes predicted to meet the goal's limits, its best first. Refused when the plan
    leaves no candidate."""
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
    view = None
    if sweep.several_sizes or sweep.goal is not None:
        from sweeper.cli.best_sizes import plan_view

        view = plan_view(plan)
        chosen = winner(view.found, by, measured=False)
        if chosen is None or chosen.layout is None:
            return sweep, [], view
        # the chosen size's best predicted layout first (the very layout its answer names), then its others
        same = (cands.nodes == chosen.nodes) if "nodes" in cands else cands.pred_mfu.notna()
        first = same & _matches(cands, chosen.layout)
        import pandas as pd

        cands = pd.concat([cands[first], cands[same & ~first]])
    rows = [
        {**r, "predicted": True, "trial_number": None, "mfu": None, "num_devices": _world(sweep, r)}
        for r in json.loads(cands.head(top).to_json(orient="records"))
    ]
    return sweep, rows, view


def _matches(frame: Any, layout: dict[str, Any]) -> Any:
    """The frame's rows of `layout`: every knob equal."""
    from sweeper.knobs import KNOBS

    mask = frame.pred_mfu.notna()
    for k in KNOBS:
        if k in frame:
            mask &= frame[k] == layout[k]
    return mask


def _world(sweep: Any, row: dict[str, Any]) -> int:
    """The row's GPUs: its own node count's in a sweep over several (the plan's `nodes` column)."""
    return int(row.get("nodes", sweep.cluster.nodes)) * sweep.cluster.gpus_per_node


def _at(sweep: Any, row: dict[str, Any]) -> Any:
    """The sweep at the row's node count, which an export is written for."""
    return sweep.at(int(row["nodes"])) if "nodes" in row else sweep


def best_predicted(spec: str, *, top: int, fmt: str, by: Winner = Winner.time) -> None:
    """Print the plan's best layouts in `fmt` (table, json, or one of the exporters'); over several
    node counts or with a goal, those of the size chosen `by` time or cost, and the answer per size."""
    from sweeper.trainers import EXPORTERS
    from sweeper.trainers.export import layout_record

    sweep, rows, view = predicted_rows(spec, top, by=by)
    if fmt == "table":
        from sweeper.cli.render import print_predicted
        from sweeper.knobs import KNOBS

        if view is not None:
            _print_view(view, by, rows)
        if rows:
            searched = [k for k in KNOBS if len(sweep.space[k]) > 1]  # the knobs the dry run's table shows
            at = f" at {rows[0]['nodes']} node(s)" if view is not None and "nodes" in rows[0] else ""
            title = f"{sweep.name}: best predicted layouts{at} (the plan's model; no trial measured them)"
            print_predicted(rows, knobs=searched, title=title)
    elif fmt == "json":
        doc: dict[str, Any] = {
            "name": sweep.name,
            "predicted": True,  # the plan's model, not a measurement
            "best": rows[0] if rows else None,
            "top": rows,
            "layout": layout_record(rows[0], _at(sweep, rows[0])) if rows else None,
        }
        if view is not None:
            from sweeper.cli.best_sizes import view_json

            doc["per_nodes"] = view_json(view, by, measured=False)
            doc["nodes"] = doc["per_nodes"]["winner_nodes"]
        typer.echo(json.dumps(doc, indent=2))
    elif rows:
        typer.echo(EXPORTERS[fmt](rows[0], _at(sweep, rows[0])), nl=False)
    if not rows:  # the same exit status in every format, as `sweep best` without a measured winner
        raise NoSuccessError(f"--by {by.value}: no node count is predicted to meet the goal ({_missed(view)})")


def _missed(view: Any) -> str:
    from sweeper.plan.sizes import verdict

    return "; ".join(f"{a.nodes} node(s): {verdict(a, view.sweep.goal) or a.why_none}" for a in view.found)


def _print_view(view: Any, by: Winner, rows: list[dict[str, Any]]) -> None:
    """The answer per node count, as the dry run shows it, and which size `--by` names."""
    from rich.text import Text

    from sweeper.cli.render import make_console
    from sweeper.cli.render_sizes import print_sizes

    console = make_console()
    title = f"{view.sweep.name}: best predicted layout per node count (the model uncalibrated: ±band)"
    print_sizes(console, view.found, view.marks, view.sweep.goal, title)
    if rows:
        what = "fastest" if by is Winner.time else "cheapest"
        limits = " meeting the goal's limits" if view.sweep.goal is not None else ""
        line = f"--by {by.value}: {rows[0].get('nodes', view.sweep.cluster.nodes)} node(s), the {what} predicted run{limits}"
        console.print(Text(for_terminal(line)), soft_wrap=True)
