"""`sweep report`: the HTML page and its PNGs from real Parquet results, checked by content."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sweeper.knobs import KNOBS
from sweeper.plan import make_plan
from sweeper.report import gpu_hours, match_plan_rows, summary_lines
from sweeper.results import ResultsStore
from sweeper.spec import load_sweep
from tests.conftest import SPACES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def spec_file(tmp_path: Path) -> Path:
    """A 13B sweep on 64 A100s with two attention kernels and two checkpointing modes."""
    spec = {"name": "r", "model": "llama-13b", "seq_len": 2048, "global_batch_size": 2048,
            "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
            "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2],
                      "activation_checkpointing": ["none", "full"], "attention": ["flash2", "eager"]},
            "results_dir": str(tmp_path / "results")}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def row(n: int, mfu: float | None, status: str = "ok", **knobs: Any) -> dict[str, Any]:
    values = {k: knob.default for k, knob in KNOBS.items()} | knobs
    dp = 64 // (values["tp"] * values["pp"])
    step = None if mfu is None else 5.0 * 0.47 / mfu  # 13B on 64 A100s: ~5 s per 4M-token step at 47 % MFU
    measured = {} if step is None else {"step_time_mean_s": step, "tokens_per_s": 2048 * 2048 / step,
                                        "tflops_per_gpu": 312.0 * mfu}
    return {"trial_number": n, "status": status, "mfu": mfu, **values, "dp": dp, **measured,
            "grad_accum": 2048 // (values["micro_batch_size"] * dp), "num_devices": 64,
            "pred_mem_gib": 40.0 + 5 * n, "peak_mem_gib": 38.0 + 5 * n if status == "ok" else None,
            "device": "cuda", "started_at": T0 + timedelta(minutes=10 * n),
            "finished_at": T0 + timedelta(minutes=10 * n + 6)}


ROWS = [
    row(0, 0.41, tp=2, pp=1, micro_batch_size=1),
    row(1, 0.47, tp=4, pp=2, micro_batch_size=2),  # the winner
    row(2, 0.45, tp=4, pp=1, micro_batch_size=1, activation_checkpointing="full"),
    row(3, None, "oom", tp=1, pp=1, micro_batch_size=2, attention="eager", error="CUDA out of memory. Tried to "
        "allocate 2.00 GiB\nTraceback (most recent call last):"),
    row(4, 0.30, tp=8, pp=1, micro_batch_size=1, attention="eager", activation_checkpointing="full"),
]


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = spec_file(tmp_path)
    store = ResultsStore(tmp_path / "results" / "r")
    store.ensure()
    for r in ROWS:
        store.write_row(r)
    return path


def run_report(spec: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeper.cli", "report", str(spec), *extra], cwd=spec.parent,
                          capture_output=True, text=True, timeout=300)


def test_report_writes_html_and_pngs(results):
    r = run_report(results)
    assert r.returncode == 0, r.stderr
    out = results.parent / "results" / "r"
    pngs = {p.name for p in out.glob("*.png")}
    assert {"heatmap_flash2_none.png", "heatmap_flash2_full.png", "heatmap_eager_full.png", "mfu_vs_mbs.png",
            "memory_pred_vs_measured.png", "mfu_pred_vs_measured.png", "progress.png", "status.png"} <= pngs
    assert "heatmap_eager_none.png" in pngs  # its only trial was an OOM: the cell says so
    for name in pngs:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    page = (out / "report.html").read_text()
    assert "Winner: trial 1 at 47.00% MFU" in page
    assert "tp=4 pp=2 dp=8 mbs=2 grad_accum=128" in page
    assert "Margin over the runner-up (trial 2, 45.00% MFU): 2.00 points" in page
    assert re.search(r"Grid run: 5 trials of \d+ candidate layouts", page)
    assert "Invalid:" in page and "Pruned by the memory estimate:" in page
    assert not re.search(r"<(script|link)\b", page, re.I) and not re.search(r"src=[\"']?https?:", page, re.I)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == len(pngs) and all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)


def test_pngs_decode_with_matplotlib(results):
    import matplotlib.image as mpimg

    assert run_report(results).returncode == 0
    for p in (results.parent / "results" / "r").glob("*.png"):
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_summary_counts_plan_reasons(results):
    sweep = load_sweep(results)
    plan = make_plan(sweep)
    df = ResultsStore(sweep.results_path).frame()
    lines = summary_lines(sweep, plan, df)
    cands = plan.counts()["candidate"]
    assert f"Grid run: 5 trials of {cands} candidate layouts" in lines[2]
    for code, n in plan.reason_counts().items():
        if code != "memory":
            assert f": {n}" in lines[4]


def test_match_plan_rows_and_gpu_hours(results):
    sweep = load_sweep(results)
    plan = make_plan(sweep)
    df = ResultsStore(sweep.results_path).frame()
    idx = match_plan_rows(plan, df)
    assert idx is not None and all(int(plan.cols["tp"][i]) == t for i, t in zip(idx, df["tp"]))
    assert np.allclose(gpu_hours(df), np.cumsum([64 * 0.1] * 5))  # 6 minutes on 64 GPUs each
    foreign = df.copy()
    foreign.loc[0, "tp"] = 16  # not in the space: cannot be matched
    assert match_plan_rows(plan, foreign) is None


def test_unmatched_results_skip_the_prediction_plot(results, tmp_path):
    other = yaml.safe_load(results.read_text())
    other["space"]["tp"] = [1, 2]  # the file changed since the run, and no sweep.yaml beside the results
    results.write_text(yaml.safe_dump(other))
    r = run_report(results)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "results" / "r" / "report.html").read_text()
    assert "skipped: results could not be matched" in page


def test_report_without_results_is_one_line_error(tmp_path):
    r = run_report(spec_file(tmp_path))
    assert r.returncode == 2 and "no results under" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_report_on_the_real_tiny_sweep(tmp_path):
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec["results_dir"] = str(tmp_path / "results")
    spec["trial"].update(steps=3, warmup_steps=1)
    spec["search"] = {"max_trials": 4, "parallel": 1, "seed": 0}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    run = subprocess.run([sys.executable, "-m", "sweeper.cli", "run", str(path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    r = run_report(path)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "results" / "tiny_cpu" / "report.html").read_text()
    assert "Winner: trial" in page and "RSS growth above a baseline" in page
    assert "Grid run: 4 trials of 12 candidate layouts" in page
