"""`sweep compare`: two sweeps' shared layouts side by side, from real Parquet results."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sweeper.cli.compare import shared_layouts, summarize
from sweeper.knobs import KNOBS
from sweeper.results.rows import ResultsStore
from tests.conftest import sweep_cli


def row(n: int, *, tp: int, pp: int, mfu: float | None, status: str = "ok", etp: int = 0) -> dict[str, Any]:
    # etp as a result row holds it: the tp it follows, unless set (Layout resolves it)
    knobs = {k: knob.default for k, knob in KNOBS.items()} | {"tp": tp, "pp": pp, "etp": etp or tp}
    return {"trial_number": n, "status": status, "mfu": mfu, **knobs, "dp": 8 // (tp * pp), "num_devices": 8}


def write(root: Path, rows: list[dict[str, Any]]) -> ResultsStore:
    store = ResultsStore(root)
    store.ensure()
    for r in rows:
        store.write_row(r)
    return store


def two_sweeps(tmp_path: Path) -> tuple[Path, Path]:
    a = tmp_path / "before"
    b = tmp_path / "after"
    write(
        a,
        [
            row(0, tp=1, pp=1, mfu=0.40),
            row(1, tp=2, pp=1, mfu=0.50),
            row(2, tp=4, pp=1, mfu=0.30),
            row(3, tp=8, pp=1, mfu=None, status="oom"),
        ],
    )
    write(
        b,
        [
            row(0, tp=1, pp=1, mfu=0.44),
            row(1, tp=2, pp=1, mfu=0.45),
            row(2, tp=8, pp=1, mfu=0.20),
            row(3, tp=2, pp=2, mfu=0.35),
        ],
    )
    return a, b


def test_shared_layouts_ratio_sorted_and_geomean(tmp_path):
    a, b = two_sweeps(tmp_path)
    shared = shared_layouts(ResultsStore(a).frame(), ResultsStore(b).frame())
    assert list(shared["tp"]) == [1, 2, 8]  # tp=4 only in A, tp=2 pp=2 only in B
    assert shared["ratio"][0] == 0.44 / 0.40 and shared["ratio"][1] == 0.45 / 0.50
    assert math.isnan(shared["ratio"][2]) and list(shared["status_a"]) == ["ok", "ok", "oom"]
    s = summarize(shared)
    assert s["shared"] == 3 and s["with_ratio"] == 2
    assert math.isclose(s["geomean_ratio"], math.sqrt(1.1 * 0.9))


def test_compare_cli_json_and_table(tmp_path):
    a, b = two_sweeps(tmp_path)
    base = ["compare", "a", "b", "--results-a", str(a), "--results-b", str(b)]
    r = sweep_cli(*base, "--format", "json", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["a"], doc["b"], doc["shared"], doc["with_ratio"]) == ("before", "after", 3, 2)
    assert [x["tp"] for x in doc["layouts"]] == [1, 2, 8] and doc["layouts"][2]["ratio"] is None
    t = sweep_cli(*base, cwd=tmp_path, timeout=120)
    assert t.returncode == 0 and "3 layouts shared, 2 with an MFU on both sides" in t.stdout
    assert f"geometric mean B / A: {math.sqrt(1.1 * 0.9):.3f}" in t.stdout and "oom" in t.stdout


def test_compare_shows_etp_only_where_it_departs_from_tp(tmp_path):
    a, b = two_sweeps(tmp_path)  # dense: etp follows tp in every row
    base = ["compare", "a", "b", "--results-a", str(a), "--results-b", str(b)]
    header = next(ln for ln in sweep_cli(*base, cwd=tmp_path, timeout=120).stdout.splitlines() if "MFU A" in ln)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "tp",
        "pp",
        "mbs",
        "MFU A",
        "MFU B",
        "B / A",
        "B / A 95%",
        "verdict",
        "status A",
        "status B",
    ]
    moe_a, moe_b = tmp_path / "moe_a", tmp_path / "moe_b"
    for root in (moe_a, moe_b):
        write(root, [row(0, tp=2, pp=1, mfu=0.4, etp=1), row(1, tp=2, pp=1, mfu=0.3, etp=2)])
    moe = sweep_cli(
        "compare", "a", "b", "--results-a", str(moe_a), "--results-b", str(moe_b), cwd=tmp_path, timeout=120
    )
    assert "etp" in next(ln for ln in moe.stdout.splitlines() if "MFU A" in ln)


def test_compare_without_results_is_one_line_error(tmp_path):
    r = sweep_cli(
        "compare",
        "a",
        "b",
        "--results-a",
        str(tmp_path / "x"),
        "--results-b",
        str(tmp_path / "y"),
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2 and "no results under" in r.stderr and "Traceback" not in r.stderr
