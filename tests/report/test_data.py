"""sweeper.report.data: what the report shows, as records, computed without matplotlib."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd

from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.report.data import layout_counts, memory_points, mfu_points, rank_correlation
from tests.conftest import make_sweep


def _frame(rows: list[dict]) -> pd.DataFrame:
    base = {"sharding": "none", "sequence_parallel": False, "activation_checkpointing": "none", "attention": "flash2"}
    defaults = {"rmsnorm": "eager", "pp_schedule": "1f1b", "virtual_stages": 1, "compile": False, "float8": False}
    return pd.DataFrame([{**base, **defaults, "device": "cuda", **r} for r in rows])


def test_the_data_and_the_analysis_import_no_matplotlib():
    code = "import sys, sweeper.report.data, sweeper.report.explain, sweeper.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_memory_and_mfu_points_match_results_to_plan_rows():
    sweep = make_sweep()
    plan = make_plan(sweep)
    df = _frame(
        [
            {
                "trial_number": 0,
                "tp": 8,
                "pp": 1,
                "micro_batch_size": 1,
                "status": "ok",
                "mfu": 0.4,
                "peak_mem_gib": 30.0,
            },
            {
                "trial_number": 1,
                "tp": 4,
                "pp": 2,
                "micro_batch_size": 1,
                "status": "ok",
                "mfu": 0.5,
                "peak_mem_gib": 20.0,
            },
            {
                "trial_number": 2,
                "tp": 4,
                "pp": 1,
                "micro_batch_size": 2,
                "status": "oom",
                "mfu": None,
                "peak_mem_gib": None,
            },
        ]
    )
    mem = memory_points(df, plan, sweep)
    assert mem.skipped == "" and mem.trials is not None and mem.trials.tolist() == [0, 1]
    assert mem.measured_gib is not None and mem.measured_gib.tolist() == [30.0, 20.0]
    row = plan.row_of(Layout(tp=8, pp=1, micro_batch_size=1))
    assert row is not None and mem.tensors_gib is not None
    assert mem.tensors_gib[0] == (plan.memory.total[row] - plan.memory.overhead[row]) / 1024**3
    mfu = mfu_points(df, plan, sweep)
    assert mfu.trials is not None and mfu.trials.tolist() == [0, 1]
    assert mfu.predicted is not None and mfu.predicted[0] == plan.throughput.mfu[row]
    assert mfu.rank_correlation is None  # two points: too few for a rank correlation


def test_points_say_why_they_are_missing():
    sweep = make_sweep()
    plan = make_plan(sweep)
    cpu = _frame([{"trial_number": 0, "tp": 8, "pp": 1, "micro_batch_size": 1, "status": "ok", "mfu": 0.4,
                   "peak_mem_gib": 3.0, "device": "cpu"}])  # fmt: skip
    assert memory_points(cpu, plan, sweep).skipped.startswith("Not plotted: on CPU")
    unknown = _frame([{"trial_number": 0, "tp": 3, "pp": 1, "micro_batch_size": 1, "status": "ok", "mfu": 0.4,
                       "peak_mem_gib": 3.0}])  # fmt: skip
    assert "could not be matched" in memory_points(unknown, plan, sweep).skipped
    assert "could not be matched" in mfu_points(unknown, plan, sweep).skipped
    assert mfu_points(unknown.iloc[:0], plan, sweep).skipped == "skipped: no successful trial"


def test_layout_counts_split_the_candidates_into_run_and_not_run():
    sweep = make_sweep()
    plan = make_plan(sweep)
    counts = plan.counts()
    got = layout_counts(_frame([{"trial_number": 0}, {"trial_number": 1}]), plan)
    assert got == {
        "candidate, run": 2,
        "candidate, not run": counts["candidate"] + counts.get("uncertain", 0) - 2,  # uncertain ones may run too
        "pruned (memory)": counts.get("pruned", 0),
        "invalid": counts.get("invalid", 0),
    }
    assert sum(got.values()) == len(plan)


def test_rank_correlation():
    assert rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])) == 1.0
    assert rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == -1.0
    assert rank_correlation(np.array([1.0, 2.0]), np.array([1.0, 2.0])) is None
