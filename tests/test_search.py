"""The search over candidates with a real Optuna storage (SQLite in a temp folder)."""

from __future__ import annotations

import optuna
import pytest

from sweeper.plan import make_plan
from sweeper.search import LayoutSearch, make_sampler, open_study
from tests.conftest import make_sweep


def _search(tmp_path, sampler: str, max_trials: int, **overrides):
    sweep = make_sweep(**overrides)
    plan = make_plan(sweep)
    n = int(plan.candidate_mask.sum())
    exhaustive = sampler == "grid" or (sampler == "auto" and n <= max_trials)
    study = open_study(f"sqlite:///{tmp_path}/o.db", "t",
                       sampler=make_sampler(sampler, seed=0, exhaustive=exhaustive, budget=max_trials))
    return plan, LayoutSearch(plan, study, sampler=sampler, max_trials=max_trials, seed=0)


def test_grid_asks_every_candidate_once_in_plan_order(tmp_path):
    plan, search = _search(tmp_path, "grid", 1000)
    rows = []
    while (p := search.ask()) is not None:
        rows.append(p.row)
        search.tell(p.optuna_trial, p.row, status="ok", mfu=0.5)
    assert rows == sorted(rows) and len(rows) == int(plan.candidate_mask.sum())
    assert all(plan.status[r] == "candidate" for r in rows)


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
        assert p is not None and plan.status[p.row] == "candidate" and p.row not in seen
        assert p.layout == plan.layout(p.row)
        seen.add(p.row)
        search.tell(p.optuna_trial, p.row, status="ok" if i % 3 else "oom", mfu=0.3 + 0.01 * i)
    trials = search.study.get_trials(deepcopy=False)
    rejected = [t for t in trials if t.user_attrs.get("kind") == "rejected"]
    assert all(t.value == 0.0 for t in rejected)
    # OOMs are told as objective 0, successes as their MFU
    values = sorted(t.value for t in trials if t.user_attrs.get("kind") is None and t.value is not None)
    assert values[0] == 0.0 and values[-1] == pytest.approx(0.41)


def test_equivalent_layout_maps_to_its_candidate(tmp_path):
    from sweeper.layout import Layout

    plan, search = _search(tmp_path, "tpe", 10, space={"tp": [1, 2], "sequence_parallel": [False, True]},
                           cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 10000, "peak_tflops": 1}})
    a = search.row_of(Layout(tp=1, sequence_parallel=True))
    b = search.row_of(Layout(tp=1, sequence_parallel=False))
    assert a == b is not None
    assert search.row_of(Layout(tp=3)) is None


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
