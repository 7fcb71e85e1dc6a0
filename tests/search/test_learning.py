"""The search's learning paths (not run-everything): a few trials to the best of a replay table,
recalibration that reorders the untried layouts, the stop margin, and measured peaks that prune."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from sweeper.launchers.replay import ReplayLauncher
from sweeper.plan.plan import make_plan
from sweeper.results.rows import ResultsStore, now_utc
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.search.build import build_search
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec, make_sweep


def _plan(**overrides):
    return make_plan(make_sweep(**overrides))


def test_replay_with_more_candidates_than_budget_runs_the_best_within_a_few_trials(tmp_path):
    spec = base_spec(
        name="big",
        results_dir=str(tmp_path / "results"),
        space={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4], "attention": ["flash2", "eager"]},
        search={"max_trials": 8, "sampler": "auto", "seed": 0},
        memory={"probe_margin": 0},
    )  # no probe of a pruned layout
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    plan = make_plan(sweep)
    cands = np.flatnonzero(plan.candidate_mask)
    assert len(cands) > 3 * sweep.search.max_trials  # the run-everything path is not taken
    # The table's truth: the model's MFU, except that its third-ranked layout is really the best.
    # Uncertain layouts (over the card within the estimate's error) really do not fit here.
    certain = cands[plan.status[cands] == "candidate"]
    by_pred = certain[np.argsort(-plan.pred_mfu[certain], kind="stable")]
    best = int(by_pred[2])
    table = ResultsStore(tmp_path / "table")
    table.ensure()
    for i, r in enumerate(cands):
        fits = plan.status[r] == "candidate"
        mfu = float(plan.pred_mfu[r]) * (1.3 if r == best else 1.0) if fits else None
        table.write_row(
            plan.layout(int(r)).as_dict()
            | {"trial_number": i, "status": "ok" if fits else "oom", "mfu": mfu}
            | {"started_at": now_utc(), "finished_at": now_utc()}
        )
    run = prepare(sweep, ReplayLauncher(table.trials_dir, sweep))
    run_loop(run, poll_s=0)
    ran = [run.plan.row_of(_layout_of(r)) for r in sorted(run.rows, key=lambda r: r["trial_number"])]
    assert len(run.rows) == sweep.search.max_trials
    assert best in ran[:4], (best, ran)  # within the first 4 trials of 8, among hundreds of candidates
    assert max(r["mfu"] for r in run.rows if r["mfu"] is not None) == pytest.approx(float(plan.pred_mfu[best]) * 1.3)


def _layout_of(row):
    from sweeper.knobs import KNOBS
    from sweeper.layouts.layout import Layout

    return Layout.from_mapping({k: row[k] for k in KNOBS})


def test_recalibration_reorders_the_untried_layouts():
    plan = _plan(space={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2]})
    search = build_search(plan, sampler="auto", max_trials=10, seed=0)
    model = search.model
    before = np.asarray(search.untried())
    pred_before = search.pred_mfu.copy()
    order_before = before[np.argsort(-pred_before[before], kind="stable")]
    # Measured: communication takes 4x what the model says, compute a quarter (a 4x comm alone keeps
    # this plan's order: its comm share already rises with tp). Train on the layouts with the most
    # and least communication so the two scales separate.
    share = model.comm[before] / model.total[before]
    taught = [int(before[np.argmax(share)]), int(before[np.argmin(share)]), int(before[len(before) // 2])]
    for r in taught:
        search.observe(r, status="ok", mfu=0.3, step_time_s=float(0.25 * model.compute[r] + 4.0 * model.comm[r]))
    assert search.calibration.comm_scale == pytest.approx(4.0, rel=0.05)
    assert search.calibration.compute_scale == pytest.approx(0.25, rel=0.05)
    after = np.asarray([r for r in order_before if r not in taught])
    order_after = after[np.argsort(-search.pred_mfu[after], kind="stable")]
    assert list(order_after) != [r for r in order_before if r not in taught]
    # each layout's prediction falls the more it communicates
    ratio = search.pred_mfu[before] / pred_before[before]
    assert np.corrcoef(ratio, share)[0, 1] < -0.9


def test_stop_margin_stops_once_nothing_untried_can_beat_the_best():
    plan = _plan()
    for margin, measured_mfu, stops in [(0.02, 0.99, True), (0.02, 0.001, False), (None, 0.99, False)]:
        search = build_search(plan, sampler="auto", max_trials=10, seed=0)
        search.stop_margin = margin
        model_total = search.model.total
        for _ in range(3):
            p = search.ask()
            assert p is not None and not search.should_stop()
            # step times as predicted: the calibration stays at 1, the predictions where they were
            search.tell(p.optuna_trial, p.row, status="ok", mfu=measured_mfu, step_time_s=float(model_total[p.row]))
        assert search.should_stop() is stops, (margin, measured_mfu)


def test_measured_peaks_above_the_estimate_tighten_the_memory_check():
    from sweeper.estimate.memfit import refitted_total

    plan = _plan(space={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4]})
    mem = plan.memory
    tensors = (mem.total - mem.overhead) / 2**30
    for device, excludes in [("cuda:0", True), ("cpu", False)]:
        search = build_search(plan, sampler="auto", max_trials=10, seed=0)
        ran = []
        for _ in range(2):
            p = search.ask()
            assert p is not None
            ran.append(p.row)
            search.tell(
                p.optuna_trial, p.row, status="ok", mfu=0.4, peak_mem_gib=float(1.6 * tensors[p.row]), device=device
            )
        if not excludes:  # CPU RSS growth is no allocator peak: nothing learned from it
            assert search.excluded == {}
            continue
        fit = search.learning.memory_fit
        total = refitted_total(mem, fit)
        assert fit.points == 2 and all(total[r] > mem.total[r] for r in ran)  # the estimate was too low: raised
        margin = plan.sweep.memory.probe_margin
        over = (
            {int(r) for r in np.flatnonzero(plan.candidate_mask) if total[r] > mem.capacity_bytes * (1 + margin)}
            - set(ran)
            - search.learning.proven
        )
        # (a layout needing no more memory than one that ran is proven to fit, whatever the refit says)
        assert over, "the space must hold candidates that no longer fit after the refit"
        assert set(search.excluded) == over
        assert all(why.startswith("refit") for why in search.excluded.values())
        assert not set(search.untried()) & over
