"""The smaller items of issue 45: `sweep compare A B` with each ratio's interval and whether it is
a tie within noise, and the goal line naming every limit the goal sets (max_days, max_cost)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.cli.compare import shared_layouts, summarize
from sweeper.knobs import KNOBS
from sweeper.results.rows import ResultsStore
from tests.conftest import base_spec, sweep_cli


def _row(n: int, tp: int, mfu: float, half: float | None, nodes: int | None = None) -> dict[str, Any]:
    """An ok row with its MFU interval `mfu ± half` (None: a row without a step-time spread)."""
    knobs = {k: knob.default for k, knob in KNOBS.items()} | {"tp": tp, "pp": 1, "etp": tp}
    ends = {} if half is None else {"mfu_low": mfu - half, "mfu_high": mfu + half}
    sized = {} if nodes is None else {"nodes": nodes}
    return {"trial_number": n, "status": "ok", "mfu": mfu, **knobs, "dp": 8 // tp, "num_devices": 8} | ends | sized


def _write(root: Path, rows: list[dict[str, Any]]) -> Path:
    store = ResultsStore(root)
    store.ensure()
    for r in rows:
        store.write_row(r)
    return root


def test_compare_gives_each_ratio_its_interval_and_verdict(tmp_path):
    # tp=1: B 0.5852 against A 0.40, intervals far apart (B faster); tp=2: 0.51 against 0.50, the
    # intervals overlap (a tie); tp=4: 0.30 against 0.36 (A faster); tp=8: no spread in A (unknown)
    a = _write(
        tmp_path / "a",
        [_row(0, 1, 0.40, 0.01), _row(1, 2, 0.50, 0.02), _row(2, 4, 0.36, 0.01), _row(3, 8, 0.20, None)],
    )
    b = _write(
        tmp_path / "b",
        [_row(0, 1, 0.5852, 0.01), _row(1, 2, 0.51, 0.02), _row(2, 4, 0.30, 0.01), _row(3, 8, 0.22, 0.01)],
    )
    shared = shared_layouts(ResultsStore(a).frame(), ResultsStore(b).frame())
    by_tp = {int(r.tp): r for _, r in shared.iterrows()}
    assert by_tp[1].verdict == "B faster" and by_tp[1].ratio_low == pytest.approx(0.5752 / 0.41)
    assert by_tp[1].ratio_high == pytest.approx(0.5952 / 0.39)
    assert by_tp[2].verdict == "tie" and by_tp[2].ratio_low < 1 < by_tp[2].ratio_high
    assert by_tp[4].verdict == "A faster" and by_tp[4].ratio_high == pytest.approx(0.31 / 0.35)
    assert by_tp[8].verdict == "unknown"
    assert summarize(shared)["verdicts"] == {"B faster": 1, "A faster": 1, "tie": 1, "unknown": 1}

    base = ["compare", "a", "b", "--results-a", str(a), "--results-b", str(b)]
    table = sweep_cli(*base, cwd=tmp_path, timeout=120)
    assert table.returncode == 0, table.stderr
    line = next(s for s in table.stdout.splitlines() if "1.463" in s)  # B / A of tp=1
    assert f"{0.5752 / 0.41:.3f}–{0.5952 / 0.39:.3f}" in line and "B faster" in line
    assert "beyond noise: B faster 1, A faster 1; tie within noise 1; unknown 1" in table.stdout
    doc = json.loads(sweep_cli(*base, "--format", "json", cwd=tmp_path, timeout=120).stdout)
    assert doc["verdicts"]["tie"] == 1
    assert {x["tp"]: x["verdict"] for x in doc["layouts"]} == {1: "B faster", 2: "tie", 4: "A faster", 8: "unknown"}


def test_compare_over_node_counts_matches_each_layout_at_its_own_size(tmp_path):
    # the same tp=2 layout at 8 and 16 nodes in both sweeps: four trials, two pairs, never 8 against 16
    a = _write(tmp_path / "a", [_row(0, 2, 0.50, 0.01, nodes=8), _row(1, 2, 0.40, 0.01, nodes=16)])
    b = _write(tmp_path / "b", [_row(0, 2, 0.40, 0.01, nodes=16), _row(1, 2, 0.52, 0.01, nodes=8)])
    shared = shared_layouts(ResultsStore(a).frame(), ResultsStore(b).frame())
    assert sorted(zip(shared.nodes, shared.ratio)) == [(8, pytest.approx(0.52 / 0.50)), (16, pytest.approx(1.0))]


def test_the_goal_line_names_max_days_and_max_cost(tmp_path):
    spec = base_spec(
        name="goal",
        cluster={"nodes": [8, 16], "gpus_per_node": 8, "gpu": "a100-80gb"},
        goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0, "max_days": 30, "max_cost": 250000},
        results_dir=str(tmp_path / "results"),
    )
    path = tmp_path / "goal.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("run", str(path), "--dry-run", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "goal: 1e+12 tokens, 2 per GPU-hour, max_days 30, max_cost 250000" in r.stdout
