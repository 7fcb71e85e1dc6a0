"""Memory learned both ways: refits from measured peaks (Megatron-LM's log line), the mirror
rule, probe trials. Real plans, a real Optuna study (SQLite), the real Megatron log parser."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.estimate.memfit import (
    MemoryFit,
    mirror,
    needs_at_most,
    probe_rows,
    refit,
    refitted_total,
)
from sweeper.plan.plan import make_plan
from sweeper.search.build import build_search
from sweeper.spec.hardware import GIB
from sweeper.trainers.megatron import parse_megatron
from tests.conftest import make_sweep


def _search(tmp_path, plan, sampler="tpe", max_trials=8):
    return build_search(
        plan, storage=f"sqlite:///{tmp_path}/o.db", study_name="t", sampler=sampler, max_trials=max_trials, seed=0
    )


def megatron_plan():
    # 13B on 64 A100-80GB, the Megatron recipe: many layouts pruned by memory
    return make_plan(
        make_sweep(
            memory={"recipe": "megatron"}, space={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4]}
        )
    )


def test_refit_recovers_a_known_scale_and_offset():
    plan = megatron_plan()
    mem = plan.memory
    rows = [int(r) for r in np.flatnonzero(plan.candidate_mask)[:4]]
    act = mem.activations + mem.logits
    true = (mem.allocated - act + 0.7 * act + 1.5 * GIB) / GIB
    fit = refit(mem, rows, [float(true[r]) for r in rows], [None] * 4)
    assert fit.act_scale == pytest.approx(0.7, rel=1e-6)
    assert fit.offset_bytes == pytest.approx(1.5 * GIB, rel=1e-6)
    assert refitted_total(mem, MemoryFit())[rows] == pytest.approx(mem.total[rows])


def test_a_learned_fit_fills_what_one_peak_cannot_tell_and_yields_to_two():
    plan = megatron_plan()
    mem = plan.memory
    rows = [int(r) for r in np.flatnonzero(plan.candidate_mask)[:4]]
    act = mem.activations + mem.logits
    true = (mem.allocated - act + 0.7 * act + 1.5 * GIB) / GIB
    learned = MemoryFit(0.8, 1.5 * GIB, 1.1, 0)  # from other sweeps: the right fixed part, a scale off
    one = refit(mem, rows[:1], [float(true[rows[0]])], [None], prior=learned)
    assert one.offset_bytes == pytest.approx(1.5 * GIB) and one.act_scale == pytest.approx(0.7, rel=1e-6)
    assert one.reserved_factor == 1.1 and one.points == 1  # the learned reserved factor, until a peak gives one
    alone = refit(mem, rows[:1], [float(true[rows[0]])], [None])
    assert alone.offset_bytes == pytest.approx(0.0, abs=1.0) and alone.act_scale != pytest.approx(0.7, rel=0.01)
    both = refit(mem, rows, [float(true[r]) for r in rows], [None] * 4, prior=MemoryFit(2.0, 9 * GIB, None, 0))
    assert both.act_scale == pytest.approx(0.7, rel=1e-6) and both.offset_bytes == pytest.approx(1.5 * GIB, rel=1e-6)
    assert refit(mem, [], [], [], prior=learned) == learned


def test_megatron_memory_line_refits_and_readmits_a_pruned_layout(tmp_path):
    plan = megatron_plan()
    search = _search(tmp_path, plan)
    mem = plan.memory
    pruned_before = set(np.flatnonzero(plan.status == "pruned").tolist())
    assert pruned_before
    # a candidate ran under Megatron-LM and logged its peak at 55 % of the allocated estimate
    # (the line as megatron/training/utils.py report_memory prints it)
    ran = int(np.flatnonzero(plan.candidate_mask)[0])
    alloc_mb = 0.55 * float(mem.allocated[ran]) / 2**20
    log = (
        f"[Rank 0] (after 10 iterations) memory (MB) | allocated: {alloc_mb * 0.8:.1f} | "
        f"max allocated: {alloc_mb:.1f} | reserved: {alloc_mb * 1.05:.1f} | max reserved: {alloc_mb * 1.08:.1f}\n"
    )
    parsed = parse_megatron(log)
    assert parsed.peak_mem_gib == pytest.approx(alloc_mb / 1024, rel=1e-5)
    search.observe(
        ran,
        status="ok",
        mfu=0.4,
        step_time_s=10.0,
        peak_mem_gib=parsed.peak_mem_gib,
        peak_mem_reserved_gib=parsed.peak_mem_reserved_gib,
        device="megatron workload",
    )
    fit = search.learning.memory_fit
    assert fit.points == 1 and fit.act_scale < 1.0
    assert fit.reserved_factor == pytest.approx(1.08, rel=1e-3)
    readmitted = [r for r in search.learning.readmitted if r in pruned_before]
    assert readmitted, "the refit re-admitted no pruned layout"
    total = refitted_total(mem, fit)
    for r in readmitted:
        assert total[r] <= mem.capacity_bytes and r in search.untried()
        assert search.learning.readmitted[r].startswith("refit")
    # the refitted estimate explains the measurement it came from
    assert (
        float(mem.allocated[ran] - mem.activations[ran] - mem.logits[ran])
        + fit.act_scale * float(mem.activations[ran] + mem.logits[ran])
        + fit.offset_bytes
    ) / GIB == pytest.approx(parsed.peak_mem_gib, rel=1e-6)


def test_a_peak_above_the_estimate_excludes_untried_layouts(tmp_path):
    plan = megatron_plan()
    search = _search(tmp_path, plan)
    mem = plan.memory
    cands = np.flatnonzero(plan.candidate_mask)
    order = cands[np.argsort(-mem.total[cands])]
    n_before = len(search.untried())
    # one peak above the estimate excludes nothing yet (a prediction, not a fact)...
    search.observe(
        int(order[0]), status="ok", mfu=0.4, peak_mem_gib=1.6 * float(mem.allocated[order[0]]) / GIB, device="cuda"
    )
    assert not [r for r, why in search.excluded.items() if why.startswith("refit")]
    # ...two do: the hungriest candidates measured at 1.6x the estimate
    search.observe(
        int(order[1]), status="ok", mfu=0.4, peak_mem_gib=1.6 * float(mem.allocated[order[1]]) / GIB, device="cuda"
    )
    refit_total = refitted_total(mem, search.learning.memory_fit)
    assert refit_total[order[0]] > mem.total[order[0]] and refit_total[order[1]] > mem.total[order[1]]
    excluded = [r for r, why in search.excluded.items() if why.startswith("refit")]
    assert excluded and len(search.untried()) < n_before - 2
    total = refitted_total(mem, search.learning.memory_fit)
    assert all(total[r] > mem.capacity_bytes * 1.05 for r in excluded)


def test_mirror_rule_readmits_what_needs_no_more_memory(tmp_path):
    plan = megatron_plan()
    search = _search(tmp_path, plan)
    pruned = np.flatnonzero(plan.status == "pruned")
    # a pruned layout ran fine (say, as a probe): the pruned layouts that need no more memory
    # than it (same parallel shape, micro-batch no larger, ...) are re-admitted
    big = int(pruned[np.argmax(plan.cols["micro_batch_size"][pruned])])
    below = pruned[needs_at_most(plan.cols, pruned, big)]
    assert len(below) >= 2 and big in below
    search.observe(big, status="ok", mfu=0.4)
    for r in below:
        if r != big:
            assert int(r) in search.learning.readmitted and int(r) in search.untried()
    why = search.learning.readmitted[int(next(r for r in below if r != big))]
    over = (plan.memory.total[big] - plan.memory.capacity_bytes) / GIB
    assert f"at least {over:.1f} GiB" in why
    m = mirror(plan.cols, plan.memory.total, plan.memory.capacity_bytes, big, pruned)
    assert m.too_high_bytes == pytest.approx(over * GIB)


def test_needs_at_most_mirrors_needs_at_least():
    from sweeper.search.learn import needs_at_least

    plan = megatron_plan()
    rows = np.flatnonzero(plan.status != "invalid")
    for ref in rows[:20]:
        for r in rows:
            assert bool(needs_at_most(plan.cols, np.asarray([r]), int(ref))[0]) == bool(
                needs_at_least(plan.cols, np.asarray([ref]), int(r))[0]
            )


def test_probe_only_for_a_clearly_faster_layout_near_the_card():
    total = np.array([70.0, 79.0, 82.0, 100.0]) * GIB
    cap = 76.0 * GIB
    pruned = np.array([False, True, True, True])
    cands = ~pruned
    mfu = np.array([0.50, 0.52, 0.60, 0.70])
    # 5 % of 76 GiB: up to 79.8 GiB -> row 1 only; it beats 0.50 by more than 3 %
    assert probe_rows(total, cap, 0.05, pruned, cands, mfu, limit=3) == [1]
    assert probe_rows(total, cap, 0.10, pruned, cands, mfu, limit=3) == [2, 1]
    # 0.51 is not clearly above 0.50 (needs > 0.515); row 3 is far over the card
    assert probe_rows(total, cap, 0.10, pruned, cands, np.array([0.5, 0.51, 0.51, 0.9])) == []


def test_dry_run_counts_layouts_near_the_card():
    plan = megatron_plan()
    near = plan.near_card()
    cap = plan.memory.capacity_bytes
    assert near.sum() == int(((plan.status == "pruned") & (plan.memory.total <= cap * 1.05)).sum())


def test_what_ran_and_what_ran_out_of_memory_move_every_layouts_chance_to_fit():
    from math import erf, log, sqrt

    from sweeper.estimate.memfit import MEMORY_LOG_SIGMA, fit_chance, fit_chance_given

    card = 80 * GIB
    est = np.array([60.0, 75.0, 86.0, 94.0]) * GIB
    none = np.zeros(0)
    # nothing told: the estimate's own band
    assert fit_chance_given(est, card, none, none) == pytest.approx(fit_chance(est, card), abs=1e-6)
    # errors wholly the layouts' own: another layout's fate says nothing
    assert fit_chance_given(est, card, est[2:3], none, shared=0.0) == pytest.approx(fit_chance(est, card), abs=1e-6)

    # errors (nearly) wholly shared: a layout estimated at 86 GiB ran, so the estimate is at least
    # ln(86/80) too high everywhere; at 94 GiB: P(s <= ln(80/94)) / P(s <= ln(80/86)), by hand
    def phi(z: float) -> float:
        return 0.5 * (1 + erf(z / sqrt(2)))

    got = fit_chance_given(est, card, est[2:3], none, shared=0.9999)
    by_hand = phi(log(80 / 94) / MEMORY_LOG_SIGMA) / phi(log(80 / 86) / MEMORY_LOG_SIGMA)
    assert got[3] == pytest.approx(by_hand, abs=0.01) and got[3] > 2 * fit_chance(est, card)[3]
    assert got[1] > 0.999  # needs less than what ran

    # the measured share (0.85): what ran raises the chance of a layout estimated higher, less than wholly
    # shared errors would; an OOM at 75 GiB lowers the chance of one estimated at 86 GiB
    shared = fit_chance_given(est, card, est[2:3], none)
    assert fit_chance(est, card)[3] < shared[3] < got[3]
    oom = fit_chance_given(est, card, none, est[1:2])
    assert oom[2] < 0.5 * fit_chance(est, card)[2] and oom[0] < fit_chance(est, card)[0]


def test_a_layout_over_the_card_that_ran_without_a_peak_raises_the_others_chance_to_fit():
    # 8B at 8192 tokens on 80 GiB cards: layouts without checkpointing sit around the card (uncertain);
    # a replay or a CPU trial reports no peak, so only that they ran or ran out of memory is learned
    plan = make_plan(
        make_sweep(
            model="llama3.1-8b",
            seq_len=8192,
            global_batch_size=512,
            cluster={"nodes": 4, "gpus_per_node": 8, "gpu": "h100"},
            space={"tp": [1, 2, 4], "pp": [1, 2], "micro_batch_size": [1, 2], "sharding": ["zero1", "fsdp"]},
        )
    )
    uncertain = np.flatnonzero(plan.status == "uncertain")
    assert uncertain.size >= 3
    ran = int(uncertain[np.argmax(plan.memory.total[uncertain])])  # the most memory of them all
    for status, rises in (("ok", True), ("oom", False)):
        search = build_search(plan, sampler="auto", max_trials=10, seed=0)
        before = search.fit_chance(uncertain)
        number = search.enqueue(ran)
        search.tell(number, ran, status=status, mfu=0.4 if status == "ok" else None, step_time_s=10.0)
        after = search.fit_chance(uncertain)
        others = uncertain != ran
        assert (after[others] > before[others]).all() if rises else (after[others] < before[others]).all()
