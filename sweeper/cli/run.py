"""Plan a sweep and run its trials; `--dry-run` shows what would run, what is pruned, and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from sweeper.errors import Interrupted, SweepError
from sweeper.statuses import PlanStatus


def run(
    spec: Annotated[
        str, typer.Argument(help="sweep file: a path, or a bare name found here or among the shipped spaces")
    ],
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", metavar="", help="plan only: show candidates and pruned layouts; submit nothing"),
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="write the whole plan, one row per layout, as .parquet or .csv")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="candidate rows to show (0: all)")] = 40,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="print the plan summary and candidates as JSON")
    ] = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", metavar="", help="discard this sweep's results and study, and start over")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", metavar="", help="do not ask before --fresh deletes results")
    ] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="layouts to show at the end (at least 1)")] = 5,
    rebuild_study: Annotated[
        bool,
        typer.Option("--rebuild-study", help="set an unreadable optuna.db aside and rebuild the study from trials/"),
    ] = False,
) -> None:
    from sweeper.launchers import plan_for_launcher
    from sweeper.plan.plan import make_plan
    from sweeper.plan.summary import no_candidates_message
    from sweeper.spec.loader import load_sweep

    sweep = load_sweep(spec)
    # a bad launcher profile is an error of the plan too; a replay's missing layouts are left out
    plan = plan_for_launcher(make_plan(sweep))
    if out is not None:
        write_plan(plan, out)
    if not dry_run:
        if not plan.candidate_mask.any():  # refused before the results folder is made
            raise SweepError(no_candidates_message(plan))
        run_live(sweep, fresh=fresh, yes=yes, top=top, rebuild_study=rebuild_study)
        return
    if as_json:
        lines = [learned_line(sweep), *learned_moves(sweep, plan)]
        typer.echo(json.dumps(plan_summary(plan) | {"learned_profile": "\n".join(lines)}, indent=2))
    else:
        from sweeper.cli.render import make_console, print_plan

        console = make_console()
        print_plan(plan, limit=limit, console=console)
        for line in [learned_line(sweep), *learned_moves(sweep, plan)]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not plan.candidate_mask.any():  # the summary above says why; scripts must not take it for a plan
        raise SweepError(no_candidates_message(plan))


def learned_line(sweep) -> str:  # noqa: ANN001 - Sweep, imported lazily
    """One line: the learned profile the sweep would start from (`sweeper.search.learned`), or why none."""
    from sweeper.launchers import launcher_classes, resolve_profile
    from sweeper.results.identity import sweep_identity
    from sweeper.search.learned import learns
    from sweeper.search.learned_show import status_line

    profile = resolve_profile(sweep)
    here = launcher_classes()[profile.kind].measures_here
    return status_line(
        sweep,
        sweep_id=sweep_identity(sweep),
        cluster_name=profile.cluster_name(),
        enabled=learns(sweep, measures_here=here),
        measures_here=here,
    )


def learned_moves(sweep, plan) -> list[str]:  # noqa: ANN001 - Sweep, Plan, imported lazily
    """What the learned profile the sweep would start from changes in its first choice (none: [])."""
    from sweeper.launchers import launcher_classes, resolve_profile
    from sweeper.results.identity import sweep_identity
    from sweeper.search.learned import learns
    from sweeper.search.learned_show import moved_first_choice
    from sweeper.search.remember import Memory

    profile = resolve_profile(sweep)
    enabled = learns(sweep, measures_here=launcher_classes()[profile.kind].measures_here)
    if not enabled or not plan.candidate_mask.any():
        return []
    memory = Memory.of(sweep, sweep_id=sweep_identity(sweep), cluster_name=profile.cluster_name(), enabled=True)
    return moved_first_choice(plan, memory.prior) if memory.prior is not None else []


def cluster_of(sweep) -> str | None:  # noqa: ANN001 - Sweep
    """The cluster its launcher profile names (a SLURM partition), for its learned profile's key."""
    from sweeper.launchers import resolve_profile

    return resolve_profile(sweep).cluster_name()


def write_plan(plan, path: Path) -> None:  # noqa: ANN001 - Plan, imported lazily
    """Write the plan atomically (temp file + rename) as Parquet or CSV, by the file's extension."""
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".csv"):
        raise SweepError(f"--out {path}: the extension must be .parquet or .csv, got {suffix or 'none'!r}")
    if not path.parent.is_dir():
        raise SweepError(f"--out {path}: folder {path.parent} does not exist")
    from sweeper.files import atomic_write

    frame = plan.to_frame()
    try:
        if suffix == ".parquet":
            atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False), private=False)
        else:
            atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False), private=False)
    except OSError as e:
        raise SweepError(f"--out {path}: cannot write: {e.strerror}") from None
    from sweeper.cli.render import message_console, say

    # on stderr: a --json document on stdout stays one document
    say(message_console(), "wrote", f"the plan, {len(frame)} layouts (one row each), to {path}", style="green")


def plan_summary(plan) -> dict:  # noqa: ANN001
    """The dry run as data: counts, rejections per reason, and the candidate layouts."""
    from dataclasses import asdict

    from sweeper.cli.render import pricing_line
    from sweeper.launchers.startup import trial_startup
    from sweeper.plan.summary import cost_estimate, plan_counts

    frame = plan.to_frame()
    cands = frame[frame.status == PlanStatus.CANDIDATE]
    counts, cost = plan_counts(plan), cost_estimate(plan, trial_startup(plan.sweep))
    return {
        "name": plan.sweep.name,
        "step_time_model": pricing_line(plan.sweep),
        "memory_recipe": plan.memory.recipe,
        "near_card": counts.near_card,
        "layouts": counts.layouts,
        "counts": {s.status: s.count for s in counts.statuses if s.count},  # they add up to layouts
        "reasons": plan.reason_counts(),
        "statuses": [asdict(s) for s in counts.statuses],
        "estimate": {**asdict(cost), "assumes": cost.assumes} | _budget_split(plan),
        "candidates": json.loads(cands.drop(columns=["status", "reason"]).to_json(orient="records")),
    } | _per_nodes(plan)


def _budget_split(plan) -> dict:  # noqa: ANN001 - Plan
    """With search.max_gpu_hours: its expected split over the node counts (`search.budget.expected_split`)."""
    from dataclasses import asdict

    from sweeper.launchers.startup import trial_startup
    from sweeper.search.budget import expected_split

    if plan.sweep.search.max_gpu_hours is None:
        return {}
    shares = expected_split(plan, trial_startup(plan.sweep).seconds)
    return {"max_gpu_hours": plan.sweep.search.max_gpu_hours, "budget_split": [asdict(s) for s in shares]}


def _per_nodes(plan) -> dict:  # noqa: ANN001 - Plan
    """Over several node counts or with a goal: the answer per size (days, GPU-hours, cost and the
    verdict against the goal's limits), the one `sweep best --plan` gives."""
    from sweeper.cli.best_sizes import plan_view, view_json
    from sweeper.plan.sizes import Winner

    sweep = plan.sweep
    if not sweep.several_sizes and sweep.goal is None:
        return {}
    view = plan_view(plan)
    by_cost = view_json(view, Winner.cost, measured=False)["winner_nodes"]
    return {"per_nodes": view_json(view, Winner.time, measured=False) | {"winner_nodes_by_cost": by_cost}}


def run_live(sweep, *, fresh: bool, yes: bool, top: int, rebuild_study: bool = False) -> None:  # noqa: ANN001 - Sweep
    """The real run with a live display on stderr, then the best layouts."""
    from rich.console import Console
    from rich.text import Text

    from sweeper.cli.progress import LiveProgress
    from sweeper.cli.render import make_console, message_console, print_best, say
    from sweeper.errors import NoSuccessError
    from sweeper.results.rows import best_rows
    from sweeper.run.orchestrator import run_sweep

    err = Console(stderr=True)
    progress = LiveProgress(err)
    try:
        run = run_sweep(
            sweep,
            fresh=fresh,
            rebuild_study=rebuild_study,
            progress=progress,
            confirm=lambda question: yes or typer.confirm(question, err=True),
            on_interrupt=lambda: err.print("[yellow]interrupted: no new trials; press Ctrl-C again to quit at once[/]"),
        )
    # Ctrl-C while planning, at --fresh's question (typer's confirm turns it into Abort), or the second
    # one: one line and 130, not "Aborted." and 1, which a script would take for a refused sweep
    except (KeyboardInterrupt, typer.Abort):
        err.print()  # off the question's line (or the terminal's ^C)
        raise Interrupted("interrupted: quit at once; `sweep run` again resumes the sweep") from None
    finally:
        progress.stop()
    out = message_console()  # never cut inside a path, whatever the width
    for note in run.notes:
        say(out, "note", note)
    for w in [*run.store.warnings, *run.warnings]:
        say(out, "warning", w)
    if run.running:
        jobs = ", ".join(i.handle.job_id for i in run.running.values())
        say(out, "note", f"{len(run.running)} trial(s) still running ({jobs}); `sweep run` again re-attaches to them")
    if run.fatal:
        raise SweepError(f"{sweep.name}: stopped after one trial, this machine cannot run the sweep: {run.fatal}")
    rows = run.rows  # this sweep's rows, earlier runs' included
    from sweeper.results.answer import measured_answer

    answer = measured_answer(rows, sweep)  # the one `sweep best` gives, for its default --by
    if answer.found is not None:  # over several node counts or with a goal: which size and trial
        make_console().print(Text(answer.line()), soft_wrap=True)
    print_best(rows, top=top, title=f"{sweep.name}: best layouts", answer=answer)
    if run.stop_requested:  # Ctrl-C: what ran is shown, but a script must not take it for a finished sweep
        say(out, "note", f"interrupted after {len(rows)} trial(s); `sweep run` again resumes the sweep")
        raise typer.Exit(Interrupted.exit_code)
    if not best_rows(rows, 1):  # scripts must not take a sweep of failures for a result
        raise NoSuccessError(f"no trial succeeded ({len(rows)} finished)")
