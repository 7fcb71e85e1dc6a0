"""The search over candidates with a real Optuna storage (SQLite in a temp folder)."""

from __future__ import annotations

import optuna
import pytest

from sweeper.plan.plan import make_plan
from sweeper.search.build import build_search
from sweeper.search.search import Schedule
from tests.conftest import make_sweep


def _search(tmp_path, sampler: str, max_trials: int, **overrides):
    plan = make_plan(make_sweep(**overrides))
    search = build_search(
        plan, storage=f"sqlite:///{tmp_path}/o.db", study_name="t", sampler=sampler, max_trials=max_trials, seed=0
    )
    return plan, search


def test_grid_asks_every_candidate_once_in_plan_order(tmp_path):
    plan, search = _search(tmp_path, "grid", 1000)
    rows = []
    while (p := search.ask()) is not None:
        rows.append(p.row)
        search.tell(p.optuna_trial, p.row, status="ok", mfu=0.5)
    assert rows == sorted(rows) and len(rows) == int(plan.candidate_mask.sum())
    assert all(plan.status[r] in ("candidate", "uncertain") for r in rows)


@pytest.mark.parametrize("sampler", ["tpe", "random", "auto"])
def test_model_based_samplers_never_run_rejected_or_repeated_layouts(tmp_path, sampler):
    # the 13B space of conftest: many layouts pruned by memory; a budget below the candidates
    # (no headroom, so that 16 candidates outlast 12 trials whose OOMs exclude hungrier ones)
    plan, search = _search(tmp_path, sampler, 12, memory={"headroom": 0.0})
    n_cand = int(plan.candidate_mask.sum())
    assert n_cand > 12 and not search.exhaustive
    seen = set()
    for i in range(12):
        p = search.ask()
        assert p is not None and plan.status[p.row] in ("candidate", "uncertain") and p.row not in seen
        assert p.layout == plan.layout(p.row)
        seen.add(p.row)
        search.tell(p.optuna_trial, p.row, status="ok" if i % 3 else "oom", mfu=0.3 + 0.01 * i)
    trials = search.study.get_trials(deepcopy=False)
    rejected = [t for t in trials if t.user_attrs.get("kind") == "rejected"]
    assert all(t.value == 0.0 for t in rejected)
    # rejected proposals: infeasible for the sampler, with the plan's verdict as status
    assert all(t.constraints == {"failed": 1.0} and t.user_attrs["status"] in ("invalid", "pruned") for t in rejected)
    # OOMs are stored as FAIL with their status, successes as their MFU
    ran = [t for t in trials if t.user_attrs.get("kind") is None and t.state != optuna.trial.TrialState.RUNNING]
    assert sorted(t.user_attrs["status"] for t in ran if t.state == optuna.trial.TrialState.FAIL) == ["oom"] * 4
    assert max(t.value for t in ran if t.state == optuna.trial.TrialState.COMPLETE) == pytest.approx(0.41)


def test_equivalent_layout_maps_to_its_candidate(tmp_path):
    from sweeper.layouts.layout import Layout

    plan, search = _search(
        tmp_path,
        "tpe",
        10,
        space={"tp": [1, 2], "sequence_parallel": [False, True]},
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 10000, "peak_tflops": 1}},
    )
    a = plan.row_of(Layout(tp=1, sequence_parallel=True))
    b = plan.row_of(Layout(tp=1, sequence_parallel=False))
    assert a == b is not None
    assert plan.row_of(Layout(tp=3)) is None


def test_search_resumes_from_storage(tmp_path):
    plan, search = _search(tmp_path, "grid", 1000)
    first = search.ask()
    search.tell(first.optuna_trial, first.row, status="ok", mfu=0.4)
    # a new process: same storage, the finished row known from the results
    plan2, again = _search(tmp_path, "grid", 1000)
    again.done[first.row] = 0.4
    nxt = again.ask()
    candidates = [int(r) for r in search.rows]
    assert first.row == candidates[0] and nxt.row == candidates[1]
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/o.db")
    assert study.best_value == 0.4


@pytest.mark.parametrize(
    "sampler,n,budget,exploits",
    [
        ("auto", 10, 20, [True] * 6),  # every candidate fits: best predicted first, always
        ("auto", 100, 20, [True] * 6),  # the search's own pick (expected speed) every trial
        ("tpe", 100, 20, [False] * 6),
        ("grid", 100, 20, [True] * 6),
    ],
)
def test_schedule(sampler, n, budget, exploits):
    policy = Schedule.of(sampler, n_candidates=n, max_trials=budget)
    assert [policy.exploit(started=i) for i in range(6)] == exploits
    assert policy.in_plan_order is (sampler == "grid")
