"""A replay launcher answers only what its table holds: it matches a layout as it runs (a knob with no
effect taken at the value it behaves as), and the layouts its table lacks leave the plan before the
search starts, so no trial is spent on "not in replay table"."""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import yaml

from sweeper.knobs import KNOBS
from sweeper.launchers.replay import ReplayLauncher
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec, cli_command, cli_env

SPACE = {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch_size": [1, 2], "sequence_parallel": [True]}


def _sweep(tmp_path, table: pd.DataFrame, **search):
    table.to_csv(tmp_path / "table.csv", index=False)
    spec = base_spec(
        name="cover",
        model="gpt3-1.3b",
        results_dir=str(tmp_path / "results"),
        space=SPACE,
        launcher={"kind": "replay", "table": str(tmp_path / "table.csv")},
        search={"parallel": 1, "seed": 0, **search},
    )
    path = tmp_path / "cover.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_sweep(path)


def _table(plan, rows) -> pd.DataFrame:
    """Rows of the plan as a replay table recorded the way a trainer logs it: sequence parallel off
    where tp=1 (it has no effect there), though the sweep asks for it everywhere."""
    t = pd.DataFrame({k: plan.cols[k][rows] for k in ("tp", "pp", "micro_batch_size")})
    t["sequence_parallel"] = t.tp > 1
    t["status"] = "ok"
    t["mfu"] = np.round(0.3 + 0.01 * np.arange(len(rows)), 3)
    return t


def test_a_layout_is_matched_as_it_runs_and_missing_ones_are_left_out(tmp_path):
    plan = make_plan(_sweep(tmp_path, pd.DataFrame({"tp": [1], "status": ["ok"], "mfu": [0.3]})))
    cands = np.flatnonzero(plan.candidate_mask)
    tp1 = [int(r) for r in cands if plan.cols["tp"][r] == 1]
    assert tp1 and all(plan.cols["sequence_parallel"][r] for r in tp1)  # the sweep's value: True
    kept = cands[::2]  # the table holds every other candidate
    sweep = _sweep(tmp_path, _table(plan, kept))
    launcher = ReplayLauncher(tmp_path / "table.csv", sweep)
    cannot = launcher.cannot_run({k: v[cands] for k, v in plan.cols.items()})
    assert list(np.flatnonzero(~cannot)) == list(range(0, len(cands), 2))

    run = prepare(sweep, launcher, storage=str(tmp_path / "study.journal"))
    left = run.plan.reason_code == "launcher_cannot_run"
    assert set(np.flatnonzero(left)) == set(cands[1::2].tolist())
    assert (run.plan.status[left] == "invalid").all()
    assert any(f"{left.sum()} valid layout(s) left out: not in the replay table" in n for n in run.notes)
    run_loop(run, poll_s=0)
    ran = [run.plan.row_of(Layout.from_mapping({k: r[k] for k in KNOBS})) for r in run.rows]
    # every layout the table holds ran once, tp=1 ones included, and nothing else was tried
    assert sorted(ran) == sorted(kept.tolist())
    assert all(r["status"] == "ok" for r in run.rows)


def test_the_dry_run_leaves_out_what_the_replay_table_lacks_as_the_run_does(tmp_path):
    plan = make_plan(_sweep(tmp_path, pd.DataFrame({"tp": [1], "status": ["ok"], "mfu": [0.3]})))
    cands = np.flatnonzero(plan.candidate_mask)
    _sweep(tmp_path, _table(plan, cands[:3]))  # the table holds the first three candidates only
    res = subprocess.run(
        cli_command("run", str(tmp_path / "cover.yaml"), "--dry-run", "--out", str(tmp_path / "plan.csv")),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    dry = pd.read_csv(tmp_path / "plan.csv")
    assert (dry.status == "candidate").sum() == 3
    left = dry[dry.reason.str.startswith("not in the replay table", na=False)]
    assert len(left) == len(cands) - 3 and (left.status == "invalid").all()
    assert f"{len(left)} left out: not in the replay table: a replay answers only the layouts it holds" in (
        " ".join(res.stdout.split())
    )
