"""Check this node before a sweep: kernels, matmul TFLOP/s against the card's peak, TP/PP/FSDP/DDP
on a small model (estimate against measured memory), and NCCL bandwidth. Exit 1 when something a
sweep relies on is broken."""

from __future__ import annotations

from typing import Annotated

import typer


def selftest(
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=1, max=1024, help="processes for the layout and all-reduce checks (default 2)"),
    ] = None,
) -> None:
    from rich.console import Console
    from rich.table import Table

    from sweeper.run.selftest import Verdict, run_selftest
    from sweeper.text import for_markup

    console = Console(highlight=False, soft_wrap=True)
    with console.status("self-test: probing kernels, running small layouts..."):
        report = run_selftest(gpus=gpus)
    colour = {Verdict.PASS: "green", Verdict.WARN: "yellow", Verdict.FAIL: "bold red", Verdict.SKIP: "dim"}
    table = Table(title="sweep selftest")
    for col in ("group", "check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        table.add_row(c.group, for_markup(c.name), f"[{colour[c.verdict]}]{c.verdict.value}[/]", for_markup(c.detail))
    console.print(table)
    broken = report.broken
    if broken:
        console.print(
            f"[bold red]broken:[/] {for_markup(', '.join(c.name for c in broken))}: a sweep on this node would fail"
        )
    else:
        console.print("[green]ready:[/] nothing a sweep relies on is broken")
    raise typer.Exit(report.exit_code)
