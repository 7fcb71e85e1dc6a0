"""`sweep report`: an offline HTML page and PNG plots from a results folder of real Parquet rows."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta

import yaml

from sweeper.plan import make_plan
from sweeper.results import ResultsStore, now_utc
from sweeper.spec import load_sweep
from tests.conftest import SPACES


def test_report_writes_html_and_plots(tmp_path):
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name="rep", results_dir=str(tmp_path / "results"))
    path = tmp_path / "rep.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    plan = make_plan(sweep)
    store = ResultsStore(sweep.results_path)
    store.ensure()
    rows = [int(r) for r in plan.candidate_mask.nonzero()[0]]
    t0 = now_utc()
    for i, r in enumerate(rows):
        lay = plan.layout(r)
        ok = i != 3
        store.write_row(lay.as_dict() | {
            "trial_number": i, "status": "ok" if ok else "oom", "mfu": 0.02 + 0.01 * i if ok else None,
            "dp": int(plan.cols["dp"][r]), "grad_accum": int(plan.cols["grad_accum"][r]), "num_devices": 2,
            "step_time_mean_s": 0.05, "peak_mem_gib": 0.03 if ok else None, "pred_mem_gib": 0.3, "device": "cpu",
            "started_at": t0 + timedelta(seconds=10 * i), "finished_at": t0 + timedelta(seconds=10 * i + 6)})
    r = subprocess.run([sys.executable, "-m", "sweeper.cli", "report", str(path)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    root = sweep.results_path
    html = (root / "report.html").read_text()
    pngs = sorted(root.glob("*.png"))
    assert len(pngs) >= 5
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000 for p in pngs)
    assert not re.search(r"<(script|link)[^>]+(src|href)=.https?://", html)
    best = plan.layout(rows[-1])  # the highest MFU is the last row written
    assert f"tp={best.tp}" in html and "pp=" in html
    assert "oom" in html
