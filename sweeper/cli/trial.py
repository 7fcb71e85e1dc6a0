"""Run one layout of a sweep by hand, on local processes (one per device of the sweep's cluster)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sweeper.errors import SweepError
from sweeper.statuses import TrialStatus
from sweeper.text import for_markup
from sweeper.trainers import trainer_of

if TYPE_CHECKING:
    from sweeper.layouts.layout import Layout
    from sweeper.results.trial import TrialResult
    from sweeper.spec.sweep import Sweep

# One process per device of the sweep's cluster; more than this on one machine is a mistake
# (a cluster-sized sweep belongs to `sweep run` with the slurm launcher).
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def trial(
    spec: Annotated[
        str, typer.Argument(help="sweep file: a path, or a bare name found here or among the shipped spaces")
    ],
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="KNOB=VALUE, repeatable; knobs not given take the first value of their list in the space"
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the result as one JSON object (the results columns)")
    ] = False,
    timeout_s: Annotated[
        float | None,
        typer.Option("--timeout-s", help="wall-clock limit in seconds (default: the sweep's trial.timeout_min)"),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            help="folder for the ranks' logs and files, kept (default: a temporary folder, removed after an ok trial)",
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", help="one of cluster.nodes when it lists several: the node count to run at"),
    ] = None,
) -> None:
    from sweeper.spec.loader import load_sweep

    sweep = at_nodes(load_sweep(spec), nodes)
    layout = layout_from_sets(sweep, sets or [])
    check_local(sweep, timeout_s)
    result = run_local(sweep, layout, timeout_s=timeout_s, workdir=workdir)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        print_result(result, moe=sweep.model.experts > 0)


def dense_line(values: dict[str, Any]) -> str:
    """A dense model's layout in one line: without ep and etp (an expert knob says nothing there)."""
    from sweeper.knobs import layout_line

    return " ".join(w for w in layout_line(values).split() if not w.startswith(("etp=", "ep=")))


def at_nodes(sweep: Sweep, nodes: int | None) -> Sweep:
    """The sweep at `--nodes` (default: its smallest node count); a count it does not list is refused."""
    if nodes is None:
        return sweep.at(sweep.cluster.nodes)
    if nodes not in sweep.node_counts:
        raise SweepError(f"--nodes {nodes}: not one of cluster.nodes {list(sweep.node_counts)}")
    return sweep.at(nodes)


def layout_from_sets(sweep: Sweep, sets: list[str]) -> Layout:
    """The layout of `--set` values, the first value of each other knob's list; invalid is an error."""
    from sweeper.knobs import KNOBS
    from sweeper.layouts.layout import Layout

    values = {name: sweep.space[name][0] for name in KNOBS}
    for item in sets:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep:
            raise SweepError(f"--set {item!r}: expected KNOB=VALUE, e.g. --set tp=2")
        if name not in KNOBS:
            raise SweepError(f"--set {item}: unknown knob {name!r}; knobs: {', '.join(KNOBS)}")
        values[name] = parse_knob(name, raw.strip())
    layout = Layout.from_mapping(values)
    rejection = layout.rejection(sweep)
    if rejection is not None:
        raise SweepError(f"invalid layout ({rejection.code}): {rejection.message}")
    return layout


def parse_knob(name: str, raw: str) -> Any:
    """One knob's value from its text, by the knob's type; the error names the allowed values."""
    from sweeper.knobs import KNOBS

    knob = KNOBS[name]
    if knob.kind is bool:
        if raw.lower() in TRUE + FALSE:
            return raw.lower() in TRUE
        raise SweepError(f"--set {name}={raw}: {name} takes true or false")
    if knob.kind is int:
        if raw.isdigit() and int(raw) >= 1:
            return int(raw)
        raise SweepError(f"--set {name}={raw}: {name} takes a positive integer")
    if raw not in knob.choices:
        raise SweepError(f"--set {name}={raw}: {name} takes one of {', '.join(knob.choices)}")
    return raw


def check_local(sweep: Sweep, timeout_s: float | None) -> None:
    # imported here: the launchers import the plan, and `sweeper.cli` imports this module for every command
    from sweeper.launchers.local import MAX_LOCAL_PROCESSES

    world = sweep.cluster.world
    if world > MAX_LOCAL_PROCESSES:
        raise SweepError(
            f"sweep trial starts one local process per device of the cluster ({sweep.cluster.nodes} x "
            f"{sweep.cluster.gpus_per_node} = {world}), more than {MAX_LOCAL_PROCESSES}; run it with `sweep run` on SLURM"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise SweepError(f"--timeout-s must be positive, but got {timeout_s}")


def run_local(sweep: Sweep, layout: Layout, *, timeout_s: float | None, workdir: Path | None = None) -> TrialResult:
    """Launch the trial's processes, with progress on stderr; keep the logs when it did not end ok."""
    from rich.console import Console

    from sweeper.launchers.ranks import launch_trial
    from sweeper.results.trial import OK

    err = Console(stderr=True, highlight=False)
    world = sweep.cluster.world
    limit = timeout_s if timeout_s is not None else sweep.trial.timeout_min * 60
    # under `sweep run`'s local launcher (--workdir) the ranks' logs stay in the trial's folder
    keep = workdir is not None
    workdir = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="sweep-trial-"))
    if trainer_of(sweep).runs_command:  # an external trainer's command, its log parsed
        from sweeper.runtime.workloads import run_external

        err.print(
            f"trial {sweep.name}: {sweep.workload.kind} workload, tp={layout.tp} pp={layout.pp} "
            f"(limit {limit:.0f} s, log in {workdir / 'workload.log'})"
        )
        return run_external(sweep, layout, workdir=workdir, timeout_s=limit)
    resolved = layout.resolve(sweep)
    # cp and ep only where set: a dense run without them reads as before
    split = "".join(f" {k}={getattr(layout, k)}" for k in ("cp", "ep") if getattr(layout, k) > 1)
    err.print(
        f"trial {sweep.name}: tp={layout.tp} pp={layout.pp}{split} dp={resolved.dp} "
        f"grad_accum={resolved.grad_accum} on {world} local processes "
        f"(limit {limit:.0f} s)"
    )
    result = launch_trial(sweep, layout, workdir=workdir, timeout_s=timeout_s)
    if result.status == OK and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    elif result.status != OK:
        err.print(f"trial ended {result.status}; rank logs in {workdir / 'logs'}")
    return result


def print_result(result: TrialResult, *, moe: bool = True) -> None:
    """The result as a two-column table on stdout (`moe=False`: a dense model, without ep and etp,
    which only a mixture of experts has)."""
    from rich.console import Console
    from rich.table import Table

    from sweeper.knobs import layout_line

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    r = result
    table = Table(title="trial", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("status", r.status + (f": {for_markup(r.error)}" if r.error else "")),
        (
            "layout",
            dense_line(vars(r)) if not moe else layout_line(vars(r)),
        ),
        ("device", for_markup(f"{r.num_devices} x {r.device}")),
        (
            "step time",
            # the 95 % interval of the mean, as every other command shows it, over the steps measured
            f"{num(r.step_time_mean_s, '.4f')} s ± {num(r.step_time_ci_s, '.4f')} (95 % interval of the mean "
            f"of {r.steps_measured if r.steps_measured is not None else len(r.step_times_s)} measured steps)",
        ),
        ("tokens/s", f"{num(r.tokens_per_s, ',.0f')} ({num(r.tokens_per_s_per_gpu, ',.0f')} per device)"),
        ("TFLOP/s/device", num(r.tflops_per_gpu, ".4f")),
        ("MFU / HFU", f"{num(r.mfu and 100 * r.mfu, '.2f')}% / {num(r.hfu and 100 * r.hfu, '.2f')}%"),
        (
            "peak memory",
            f"{num(r.peak_mem_gib, '.3f')} GiB"
            + (f" (reserved {r.peak_mem_reserved_gib:.3f} GiB)" if r.peak_mem_reserved_gib is not None else ""),
        ),
        ("loss", f"{num(r.losses[0], '.4f')} -> {num(r.losses[-1], '.4f')}" if r.losses else "-"),
        ("start-up", f"{num(r.startup_s, '.1f')} s"),
    ]
    for what, value in rows if r.status == TrialStatus.OK else rows[:3]:
        table.add_row(what, value)
    Console().print(table)
