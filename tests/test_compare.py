"""`sweep compare A B`: shared layouts side by side, ratios and their geometric mean."""

from __future__ import annotations

import json
import subprocess
import sys

from sweeper.layout import Layout
from sweeper.results import ResultsStore


def _write(root, rows):
    store = ResultsStore(root)
    store.ensure()
    for i, (lay, status, mfu) in enumerate(rows):
        store.write_row(lay.as_dict() | {"trial_number": i, "status": status, "mfu": mfu})


def test_compare_shared_layouts(tmp_path):
    a, b = Layout(tp=2), Layout(tp=4)
    _write(tmp_path / "A", [(a, "ok", 0.40), (b, "ok", 0.50), (Layout(pp=2), "ok", 0.3)])
    _write(tmp_path / "B", [(a, "ok", 0.44), (b, "oom", None), (Layout(tp=8), "ok", 0.2)])
    r = subprocess.run([sys.executable, "-m", "sweeper.cli", "compare", "x", "y", "--results-a", str(tmp_path / "A"),
                        "--results-b", str(tmp_path / "B"), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["shared"] == 2 and abs(doc["geomean_ratio"] - 1.1) < 1e-9
    first, second = doc["layouts"]
    assert first["tp"] == 2 and abs(first["ratio"] - 1.1) < 1e-9
    assert second["tp"] == 4 and second["status_b"] == "oom" and second["ratio"] is None
    table = subprocess.run([sys.executable, "-m", "sweeper.cli", "compare", "x", "y", "--results-a", str(tmp_path / "A"),
                            "--results-b", str(tmp_path / "B")], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "2 layouts in both" in table.stdout and "1.100" in table.stdout


def test_compare_without_results_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sweeper.cli", "compare", "x", "y", "--results-a", str(tmp_path / "none"),
                        "--results-b", str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no results under" in r.stderr
