"""After a replay sweep the Optuna study holds exactly the sweep's trials, read back with Optuna's own API:
one trial per sweep trial, numbered alike, ok COMPLETE with its MFU, OOM FAIL, stopped early PRUNED."""

from __future__ import annotations

import itertools

import optuna
import pandas as pd
import pytest
import yaml

from sweeper.launchers.replay import ReplayLauncher
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec

STATE = {"ok": "COMPLETE", "oom": "FAIL", "failed": "FAIL", "stopped_early": "PRUNED"}


@pytest.mark.parametrize("sampler", ["auto", "tpe"])
def test_the_study_holds_exactly_the_sweeps_trials(tmp_path, sampler):
    rows = []
    for tp, pp, mb in itertools.product([1, 2, 4], [1, 2, 4], [1, 2]):
        bad = tp * pp == 16 or (mb == 2 and tp == 1)  # as the search-learns check's table
        # pp=4 runs 3x slower than the rest from its second step: stopped early once something ran
        step = 1.0 / (0.3 + 0.05 * tp - 0.04 * pp + 0.01 * mb) * (3.0 if pp == 4 else 1.0)
        rows.append(
            {
                "tp": tp,
                "pp": pp,
                "micro_batch_size": mb,
                "status": "oom" if bad else "ok",
                "step_time_mean_s": None if bad else step,
                "step_times_s": None if bad else [1.0] + [step] * 9,
            }
        )
    table = tmp_path / "table.parquet"
    pd.DataFrame(rows).to_parquet(table)
    spec = base_spec(
        name="st",
        results_dir=str(tmp_path / "results"),
        space={"tp": [1, 2, 4], "pp": [1, 2, 4], "micro_batch_size": [1, 2]},
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 10000, "peak_tflops": 1000}},
        search={"max_trials": 10, "sampler": sampler, "seed": 1},
    )
    path = tmp_path / "st.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    run = prepare(sweep, ReplayLauncher(table, sweep))
    assert int(run.plan.candidate_mask.sum()) > 10  # the search chooses: not every layout runs
    run_loop(run, poll_s=0)

    url = f"sqlite:///{tmp_path}/results/st/optuna.db"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    results = sorted(run.rows, key=lambda r: r["trial_number"])
    assert len(study.trials) == len(results) == 10
    assert [t.number for t in study.trials] == [r["trial_number"] for r in results]
    assert [t.user_attrs["trial_number"] for t in study.trials] == [r["trial_number"] for r in results]
    assert [t.state.name for t in study.trials] == [STATE[r["status"]] for r in results]
    statuses = {r["status"] for r in results}
    assert {"ok", "oom"} <= statuses
    for t, r in zip(study.trials, results):
        assert t.user_attrs["status"] == r["status"]
        if r["status"] == "ok":
            assert t.value == pytest.approx(r["mfu"])
