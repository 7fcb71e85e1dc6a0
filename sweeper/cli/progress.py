"""The live display of `sweep run` (on stderr): trials done / in flight / budget, best so far, failures."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from sweeper.knobs import ALWAYS_SHOWN, SUMMARY_KNOBS, label, set_knobs
from sweeper.layouts.layout import Layout
from sweeper.run.state import SweepRun
from sweeper.statuses import TrialStatus
from sweeper.text import for_markup


def describe(row: dict[str, Any] | Layout, knobs: tuple[str, ...] = SUMMARY_KNOBS) -> str:
    """A layout in one short line: tp=2 pp=1 mbs=1 ..., and cp, ep, etp where they are set (`knobs.set_knobs`)."""
    values = row.as_dict() if isinstance(row, Layout) else row
    named = [k for k in knobs if values.get(k) is not None]
    named += [k for k in set_knobs(values) if k not in named]
    return " ".join(f"{label(k)}={_v(values.get(k))}" for k in named)


def _v(x: Any) -> str:
    return ("on" if x else "off") if isinstance(x, bool) else str(x)


class LiveProgress:
    """Implements the orchestrator's Progress protocol with a rich Live panel."""

    def __init__(self, console: Console | None = None) -> None:
        from sweeper.cli.render import make_console

        self.console = console or make_console(stderr=True)
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.task: TaskID | None = None
        self.live: Live | None = None
        self.t0 = time.time()

    def started(self, run: SweepRun) -> None:
        n_cand = int(run.plan.candidate_mask.sum())
        total = min(run.budget, n_cand)
        self.console.print(
            f"[bold]{for_markup(run.sweep.name)}[/]: {n_cand} candidate layouts, budget {run.budget} trials, "
            f"{run.sweep.search.parallel} at a time, launcher {run.launcher.kind}; "
            f"{len(run.rows)} already finished, {len(run.running)} re-attached"
        )
        self.task = self.bar.add_task("trials", total=total, completed=len(run.rows))
        self.live = Live(self._render(run), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def submitted(self, run: SweepRun, number: int, layout: Layout, job_id: str) -> None:
        self._refresh(run)

    def finished(self, run: SweepRun, row: dict[str, Any]) -> None:
        mfu = f"MFU {100 * row['mfu']:.2f}%" if row.get("mfu") is not None else ""
        err = (row.get("error") or "").splitlines()
        detail = mfu or (err[0][:100] if err else "")
        colour = "green" if row["status"] == TrialStatus.OK else "red"
        knobs = tuple(k for k in SUMMARY_KNOBS if len(run.sweep.space.get(k, ())) > 1) or ALWAYS_SHOWN
        # over several node counts the size is part of what ran: a 16-node trial's MFU is not a 32-node one's
        size = f"nodes={row.get('nodes')} " if run.sweep.several_sizes and row.get("nodes") is not None else ""
        self.console.print(
            f"trial {row['trial_number']:>3} [{colour}]{for_markup(str(row['status']).ljust(18))}[/] "
            f"{for_markup(size)}{for_markup(describe(row, knobs))}  {for_markup(detail)}"
        )
        self._refresh(run)

    def tick(self, run: SweepRun) -> None:
        self._refresh(run)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
            if not self.console.is_terminal:  # a pipe or file: rich leaves the last panel line open
                self.console.line()

    def _refresh(self, run: SweepRun) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=len(run.rows))
        if self.live is not None:
            self.live.update(self._render(run))

    def _render(self, run: SweepRun) -> Group:
        grid = Table.grid(padding=(0, 2))
        ok = [r for r in run.rows if r["status"] == TrialStatus.OK and r.get("mfu") is not None]
        best = max(ok, key=lambda r: r["mfu"]) if ok else None
        grid.add_row(
            "in flight", for_markup(", ".join(f"#{n} ({i.handle.job_id})" for n, i in run.running.items()) or "-")
        )
        grid.add_row("best so far", for_markup(f"MFU {100 * best['mfu']:.2f}%  {describe(best)}") if best else "-")
        # a trial stopped early ran fine and was clearly slower: not a failure (as the report says)
        fails = Counter(r["status"] for r in run.rows if r["status"] not in (TrialStatus.OK, TrialStatus.STOPPED_EARLY))
        grid.add_row("failures", for_markup(", ".join(f"{k} {v}" for k, v in fails.most_common()) or "none"))
        stopped = sum(r["status"] == TrialStatus.STOPPED_EARLY for r in run.rows)
        if stopped:
            grid.add_row("stopped early", f"{stopped} (clearly slower than the best so far; not failures)")
        return Group(self.bar, grid)
