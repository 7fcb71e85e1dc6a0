"""Two sweeps side by side for the layouts they share: MFU of each, their ratio, and each status."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import pandas as pd


class Format(StrEnum):
    table = "table"
    json = "json"


def compare(
    a: Annotated[str, typer.Argument(help="first sweep file (path or bare name); ignored with --results-a")],
    b: Annotated[
        str | None,
        typer.Argument(
            help="second sweep file (path or bare name); ignored with --results-b; left out: A's node counts side by side"
        ),
    ] = None,
    results_a: Annotated[Path | None, typer.Option("--results-a", help="results folder of A")] = None,
    results_b: Annotated[Path | None, typer.Option("--results-b", help="results folder of B")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
) -> None:
    frame_a, name_a = _load(a, results_a, "--results-a")
    if b is None and results_b is None:  # one sweep over several node counts: each layout across its sizes
        from sweeper.cli.compare_sizes import show_across_sizes

        show_across_sizes(frame_a, name_a, as_json=fmt is Format.json, answer=_answer(frame_a, a, results_a))
        return
    frame_b, name_b = _load(b or "", results_b, "--results-b")
    shared = shared_layouts(frame_a, frame_b)
    summary = summarize(shared)
    if fmt is Format.json:
        doc = {
            "a": name_a,
            "b": name_b,
            **summary,
            "layouts": shared.astype(object).where(shared.notna(), None).to_dict(orient="records"),
        }
        typer.echo(json.dumps(doc, indent=2, default=_jsonable))
        return
    _print_table(shared, summary, name_a, name_b)


def _load(spec: str, results: Path | None, option: str) -> tuple[pd.DataFrame, str]:
    """A sweep's results frame and its name, from --results-a/-b (`option`) or the sweep file's results folder."""
    from sweeper.cli.render import message_console, say
    from sweeper.results.rows import open_results

    root, store = open_results(spec, results, option=option)
    frame = store.frame()
    err = message_console()
    for w in store.warnings:  # a row of another sweep, or of a node count it never ran: skipped, said
        say(err, "warning", w)
    return frame, root.name


def _answer(frame: pd.DataFrame, spec: str, results: Path | None) -> Any:
    """The sweep's answer for the default --by (`sweeper.results.answer`), None without a readable sweep file."""
    from sweeper.errors import SweepError
    from sweeper.results.answer import measured_answer
    from sweeper.results.rows import sweep_as_run

    root = results
    try:
        if root is None:
            from sweeper.spec.loader import load_sweep

            root = load_sweep(spec, profiles=False).results_path
        return measured_answer(frame.to_dict("records"), sweep_as_run(root, spec))
    except SweepError:
        return None


def shared_layouts(frame_a: pd.DataFrame, frame_b: pd.DataFrame) -> pd.DataFrame:
    """Layouts run in both sweeps (matched on every knob, and on the node count where both ran over
    several), the latest trial of each, sorted by MFU B / MFU A, with that ratio's interval and verdict."""
    from sweeper.knobs import KNOBS

    keys = list(KNOBS) + (["nodes"] if _sized(frame_a) and _sized(frame_b) else [])
    cols = [*keys, "trial_number", "status", "mfu", *INTERVAL]
    last_a = _with_interval(frame_a)[cols].sort_values("trial_number").drop_duplicates(keys, keep="last")
    last_b = _with_interval(frame_b)[cols].sort_values("trial_number").drop_duplicates(keys, keep="last")
    both = last_a.merge(last_b, on=keys, suffixes=("_a", "_b"))
    both["ratio"] = [_ratio(x, y) for x, y in zip(both["mfu_a"], both["mfu_b"])]
    ends = [_ratio_ends(r) for _, r in both.iterrows()]
    both["ratio_low"] = [e[0] for e in ends]
    both["ratio_high"] = [e[1] for e in ends]
    both["verdict"] = [_verdict(r, e) for (_, r), e in zip(both.iterrows(), ends)]
    return both.sort_values("ratio", ascending=False, na_position="last").reset_index(drop=True)


INTERVAL = ("mfu_low", "mfu_high")  # each trial's 95 % MFU interval (sweeper.results.noise)


def _sized(frame: pd.DataFrame) -> bool:
    return "nodes" in frame and frame["nodes"].notna().all() and frame["nodes"].nunique() > 1


def _with_interval(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame with its interval columns (NaN where rows were written before intervals were kept)."""
    return frame.assign(**{c: frame.get(c, math.nan) for c in INTERVAL})


def _ratio(mfu_a: Any, mfu_b: Any) -> float | None:
    """MFU B / MFU A, or None where either side has no MFU (a failed trial)."""
    if mfu_a is None or mfu_b is None or math.isnan(mfu_a) or math.isnan(mfu_b) or mfu_a <= 0:
        return None
    return float(mfu_b / mfu_a)


def _ratio_ends(r: Any) -> tuple[float | None, float | None]:
    """B / A between the intervals' far ends: B's low over A's high, B's high over A's low (None:
    unknown, or no upper end)."""
    a_low, a_high, b_low, b_high = (_num(r[k]) for k in ("mfu_low_a", "mfu_high_a", "mfu_low_b", "mfu_high_b"))
    if a_low is None or b_low is None or a_low <= 0:
        return None, None
    low = b_low / a_high if a_high else 0.0
    return low, (b_high / a_low if b_high is not None else None)


def _verdict(r: Any, ends: tuple[float | None, float | None]) -> str:
    """`B faster` or `A faster` beyond noise (the ratio's interval excludes 1), `tie` within noise,
    `unknown` without an interval on both sides, `-` without an MFU on both."""
    if _ratio(r["mfu_a"], r["mfu_b"]) is None:
        return "-"
    low, high = ends
    if low is None:
        return "unknown"
    if low > 1:
        return "B faster"
    return "A faster" if high is not None and high < 1 else "tie"


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def summarize(shared: pd.DataFrame) -> dict[str, Any]:
    """How many layouts are shared, how many have an MFU on both sides, the geometric mean of B / A,
    and how many are a win either way beyond noise, a tie within it, or unknown."""
    ratios = [r for r in shared["ratio"] if r is not None and not math.isnan(r)]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
    verdicts = list(shared["verdict"]) if "verdict" in shared else []
    counts = {v: verdicts.count(v) for v in ("B faster", "A faster", "tie", "unknown")}
    return {"shared": len(shared), "with_ratio": len(ratios), "geomean_ratio": geomean, "verdicts": counts}


def _print_table(shared: pd.DataFrame, summary: dict[str, Any], name_a: str, name_b: str) -> None:
    from rich.table import Table

    from sweeper.cli.render import make_console
    from sweeper.knobs import KNOBS, label, shown_in_tables

    console = make_console()
    # as the other tables: a knob that does not vary, or only follows another (etp = tp, dense), is left out
    records = shared[list(KNOBS)].to_dict(orient="records")
    varying = [k for k, knob in KNOBS.items() if knob.always_shown or shown_in_tables(k, records)]
    table = Table(title=f"{name_a} (A) vs {name_b} (B): shared layouts", title_justify="left", header_style="bold")
    sized = "nodes" in shared.columns
    cols = (*(["nodes"] if sized else []), *(label(k) for k in varying), "MFU A", "MFU B", "B / A", "B / A 95%")
    for col in (*cols, "verdict", "status A", "status B"):
        table.add_column(col, justify="left" if col.startswith("status") or col == "verdict" else "right")
    for _, r in shared.iterrows():
        table.add_row(
            *([str(r["nodes"])] if sized else []),
            *(str(r[k]) for k in varying),
            _pct(r["mfu_a"]),
            _pct(r["mfu_b"]),
            "-" if r["ratio"] is None or math.isnan(r["ratio"]) else f"{r['ratio']:.3f}",
            _ends(r["ratio_low"], r["ratio_high"]),
            str(r["verdict"]),
            str(r["status_a"]),
            str(r["status_b"]),
        )
    if len(shared):
        console.print(table)
    g = summary["geomean_ratio"]
    console.print(
        f"{summary['shared']} layouts shared, {summary['with_ratio']} with an MFU on both sides; "
        f"geometric mean B / A: {'-' if g is None else f'{g:.3f}'}"
    )
    v = summary["verdicts"]
    if summary["with_ratio"]:  # B / A 95%: between the ends of the two trials' MFU intervals (95% t interval)
        console.print(
            f"beyond noise: B faster {v['B faster']}, A faster {v['A faster']}; tie within noise {v['tie']}; "
            f"unknown {v['unknown']} (no step-time spread on both sides)"
        )


def _ends(low: Any, high: Any) -> str:
    if _num(low) is None:
        return "-"
    return f"{low:.3f}–" + ("∞" if _num(high) is None else f"{high:.3f}")


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"


def _jsonable(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else str(v)
