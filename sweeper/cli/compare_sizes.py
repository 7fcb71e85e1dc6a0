"""`sweep compare A` with one sweep over several node counts: each layout that ran at two sizes or
more, lined up across them: its MFU at each (tokens/s per GPU, in the card's peak), and the share
of the smallest size's it keeps at the largest."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from sweeper.errors import SweepError

if TYPE_CHECKING:
    import pandas as pd

    from sweeper.results.answer import Answer


def across_sizes(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per layout run ok at two node counts or more; a column of MFU per node count (the
    latest trial of each), and `kept`: the largest size's over the smallest's."""
    from sweeper.knobs import KNOBS

    keys = list(KNOBS)
    ok = frame[(frame.status == "ok") & frame.nodes.notna() & frame.mfu.notna()]
    last = ok.sort_values("trial_number").drop_duplicates([*keys, "nodes"], keep="last")
    # a knob a row lacks (written before it existed) is one value, not a dropped row
    last = last.assign(**{k: last[k].astype(object).where(last[k].notna(), "-") for k in keys})
    wide = last.pivot_table(index=keys, columns="nodes", values="mfu", aggfunc="last")
    wide = wide[wide.notna().sum(axis=1) >= 2]
    sizes = list(wide.columns)
    wide["kept"] = [_kept(row.dropna()) for _, row in wide[sizes].iterrows()]
    return wide.reset_index().sort_values("kept", ascending=False, na_position="last")


def _kept(values: Any) -> float | None:
    return float(values.iloc[-1] / values.iloc[0]) if len(values) >= 2 and values.iloc[0] > 0 else None


def show_across_sizes(frame: pd.DataFrame, name: str, *, as_json: bool, answer: Answer | None = None) -> None:
    """Print the layouts across node counts as a table (or JSON), and the sweep's answer (the one
    `sweep best` gives for its default --by); refuse a sweep of one node count."""
    import typer

    if "nodes" not in frame or frame.nodes.dropna().nunique() < 2:
        raise SweepError(f"{name}: one node count only; give a second sweep to compare with (sweep compare A B)")
    wide = across_sizes(frame)
    if as_json:
        records = wide.astype(object).where(wide.notna(), None).to_dict(orient="records")
        said = None if answer is None else {"by": answer.by.value, "nodes": answer.nodes, "trial": _trial(answer)}
        typer.echo(json.dumps({"a": name, "layouts": records, "answer": said}, indent=2, default=str))
        return
    from rich.table import Table

    from sweeper.cli.render import make_console
    from sweeper.knobs import KNOBS, label

    sizes = [c for c in wide.columns if isinstance(c, (int, float)) and c not in KNOBS]
    varying = [k for k, knob in KNOBS.items() if knob.always_shown or wide[k].nunique() > 1]
    table = Table(title=f"{name}: the same layout across node counts (MFU)", title_justify="left")
    for col in (*(label(k) for k in varying), *(f"{int(n)} nodes" for n in sizes), "kept"):
        table.add_column(col, justify="right")
    for _, r in wide.iterrows():
        cells = [_num(r[n]) for n in sizes]
        table.add_row(*(str(r[k]) for k in varying), *cells, "-" if r["kept"] is None else f"{100 * r['kept']:.0f}%")
    console = make_console()
    console.print(table)
    console.print(
        f"{len(wide)} layouts ran at two node counts or more; kept: MFU at the largest node count over the smallest"
    )
    if answer is not None:
        from rich.text import Text

        console.print(Text(answer.line()), soft_wrap=True)


def _trial(answer: Answer) -> int | None:
    return None if answer.row is None else int(answer.row["trial_number"])


def _num(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"
