"""The replay launcher: a past sweep's results answer trials at once; `sweep run` finds its best."""

from __future__ import annotations

import json

import pandas as pd
import yaml

from sweeper.plan.plan import make_plan
from sweeper.results.rows import ResultsStore, now_utc
from sweeper.spec.loader import load_sweep
from tests.conftest import SPACES, sweep_cli


def test_replay_reproduces_a_past_sweeps_best(tmp_path):
    spec = yaml.safe_load((SPACES / "llama13b_2k.yaml").read_text())
    spec.update(
        name="past",
        results_dir=str(tmp_path / "results"),
        space={"tp": [2, 4, 8], "pp": [1, 2], "micro_batch_size": [1, 2], "attention": ["flash2", "eager"]},
    )
    past = tmp_path / "past.yaml"
    past.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(past)
    plan = make_plan(sweep)
    store = ResultsStore(tmp_path / "old")
    store.ensure()
    cands = [int(r) for r in (plan.status == "candidate").nonzero()[0]]  # (not the uncertain layouts)
    assert len(cands) > 10
    for i, r in enumerate(cands[:-1]):  # a past sweep of all but one candidate: one clearly best, a few OOMs
        lay = plan.layout(r)
        status = "oom" if i % 7 == 3 else "ok"
        store.write_row(
            lay.as_dict()
            | {
                "trial_number": i,
                "status": status,
                "mfu": None if status == "oom" else 0.3 + (0.3 if i == 5 else 0.001 * i),
                "started_at": now_utc(),
                "finished_at": now_utc(),
            }
        )
    spec.update(
        name="replayed",
        launcher={"kind": "replay", "table": str(store.trials_dir)},
        search={"max_trials": 60, "sampler": "auto", "seed": 0},
    )
    path = tmp_path / "replayed.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    best = json.loads(sweep_cli("best", str(path), "--format", "json", cwd=tmp_path, timeout=60).stdout)["best"]
    expected = plan.layout(cands[5]).as_dict()
    assert {k: best[k] for k in expected} == expected and best["mfu"] == 0.6
    df = pd.read_parquet(tmp_path / "results" / "replayed" / "trials")
    assert (df.launcher == "replay").all()
    missing = df[df.error == "not in replay table"]
    knobs = list(expected)
    assert not df.duplicated(knobs).any()
    # every candidate once, less those an OOM showed would not fit (they need more memory)
    # (and the uncertain layouts, tried too: the past sweep's table lacks them)
    uncertain = int((plan.status == "uncertain").sum())
    assert len(cands) - 3 <= len(df) <= len(cands) + uncertain and (df.status == "oom").sum() >= 1
    assert len(missing) <= 1 + uncertain and (missing.status == "failed").all()  # the one the table lacks
