"""Where a sweep over several node counts spends its trials (`sweeper.search.sizes`): each trial on the
layout whose trial most likely changes a served answer (`--by time`, and `--by cost` with a priced
goal) per GPU-hour, the leader refined like any challenger, a size dropped once settled within noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from sweeper.plan.plan import make_plan
from sweeper.plan.sizes import Winner
from sweeper.search.sizes import (
    CONFIRMATIONS,
    MARGIN,
    SETTLED,
    bars,
    change_chance,
    confirming,
    holders,
    in_play,
    reserved,
    served,
    size_chance,
    trial_value,
    trials_at,
)
from sweeper.spec.loader import parse_sweep
from tests.conftest import base_spec

SPACE = {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch_size": [1, 2], "attention": ["flash2"]}


def _sweep(tmp_path, **extra):
    spec = base_spec(
        name="trials",
        results_dir=str(tmp_path / "results"),
        space=SPACE,
        cluster={"nodes": [8, 16], "gpus_per_node": 8, "gpu": "a100-80gb"},
    )
    return parse_sweep(yaml.safe_dump(spec | extra))


def test_a_priced_goal_serves_both_answers_and_the_bar_is_what_sweep_best_names(tmp_path):
    plain = _sweep(tmp_path)
    priced = _sweep(tmp_path, goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0})
    assert served(plain) == (Winner.time,) and served(priced) == (Winner.time, Winner.cost)
    # 16 nodes (128 GPUs) is the fastest, 8 nodes (64 GPUs) the cheapest per GPU
    held = bars(priced, {8: 64_000.0, 16: 100_000.0})
    assert held[Winner.time] == 100_000.0 and held[Winner.cost] == pytest.approx(1000.0)
    # with max_days, a size whose best misses it holds no answer: 1e12 tokens at 64k tokens/s take 181 days
    timed = _sweep(tmp_path, goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0, "max_days": 100})
    assert bars(timed, {8: 64_000.0, 16: 200_000.0})[Winner.cost] == pytest.approx(200_000 / 128)


def test_the_chance_to_change_an_answer_is_by_more_than_noise_and_per_gpu_for_cost(tmp_path):
    sweep = _sweep(tmp_path, goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0})
    held = {Winner.time: 100_000.0, Winner.cost: 1000.0}
    sigma = np.full(3, 0.18)
    # at 16 nodes (time): expected at the bar, 20 % above it, 20 % below it
    got = change_chance(sweep, np.full(3, 16), np.array([100_000.0, 120_000.0, 80_000.0]), sigma, held)
    z = math.log(1 + MARGIN) / 0.18  # even a layout expected at the bar must beat it by the margin
    assert got[0] == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert got[1] > 0.8 and got[2] < 0.15
    # at 8 nodes (cost): 64 GPUs need 64k tokens/s x 1.03 to beat 1000 tokens/s per GPU; by time they cannot
    at8 = change_chance(sweep, np.array([8]), np.array([64_000.0 * (1 + MARGIN)]), np.array([0.18]), held)
    assert at8[0] == pytest.approx(0.5)
    # nothing measured yet: any layout that runs changes the answer
    first = change_chance(sweep, np.array([8, 16]), np.array([1.0, 1.0]), np.full(2, 0.18), bars(sweep, {}))
    assert first.tolist() == [1.0, 1.0]


def test_a_layout_that_would_miss_a_limit_cannot_change_the_answer(tmp_path):
    # max_days 100 for 1e12 tokens needs 115.7k tokens/s: a layout expected at 60k has no chance
    sweep = _sweep(tmp_path, goal={"tokens": 1.0e12, "max_days": 100})
    held = bars(sweep, {})  # nothing measured: only the limit stands in the way
    got = change_chance(sweep, np.array([8, 16]), np.array([60_000.0, 200_000.0]), np.full(2, 0.1), held)
    assert got[0] < 1e-4 and got[1] > 0.99


def test_the_upward_spread_is_never_wider_than_the_models_prior_nor_narrower_than_its_floor(tmp_path):
    sweep = _sweep(tmp_path)
    held = {Winner.time: 100_000.0}
    at = [change_chance(sweep, np.array([8]), np.array([80_000.0]), np.array([s]), held)[0] for s in (0.9, 0.2, 0.01)]
    assert at[0] == pytest.approx(at[1])  # a quirk-widened residual says nothing of being faster
    floor = change_chance(sweep, np.array([8]), np.array([80_000.0]), np.array([0.15]), held)[0]
    assert at[2] == pytest.approx(floor) and floor > 0.01  # an untried layout is never known closer


def test_a_trial_is_worth_its_chance_per_gpu_hour_and_its_chance_to_run():
    chance, ok = np.array([0.4, 0.4, 0.4]), np.array([1.0, 1.0, 0.5])
    value = trial_value(chance, ok, np.array([1.0, 8.0, 1.0]))
    assert value[1] == pytest.approx(value[0] / 8)  # 8x the GPU-hours: worth an eighth
    assert value[2] == pytest.approx(0.4 * 0.5 / (0.5 + 0.5 * 0.3))  # an OOM ends at its first step


def test_a_settled_size_gets_no_more_trials_and_all_settled_stops(tmp_path):
    sweep = _sweep(tmp_path)
    nodes = np.array([8, 8, 16, 16])
    rows = np.arange(4)
    chance = size_chance(nodes, np.array([0.02, 0.02, 0.3, 0.01]))
    assert chance[8] == pytest.approx(1 - 0.98**2) and chance[8] < SETTLED <= chance[16]
    assert in_play(sweep, nodes, rows, {}, chance).tolist() == [2, 3]
    assert in_play(sweep, nodes, rows, {16: "cannot win"}, chance).size == 0
    settled = size_chance(nodes, np.array([0.01, 0.01, 0.01, 0.01]))
    assert in_play(sweep, nodes, rows, {}, settled).size == 0


def _priced_search(tmp_path, max_trials=40):
    """A search over 8 and 16 nodes with a priced goal (both answers served): the plan, the search
    (`max_trials`), the model's step times and the candidate rows."""
    from sweeper.search.build import build_search

    space = SPACE | {"tp": [2, 4], "activation_checkpointing": ["none", "full"]}
    plan = make_plan(_sweep(tmp_path, space=space, goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0}))
    rows = [int(r) for r in np.flatnonzero(plan.candidate_mask)]
    return plan, build_search(plan, max_trials=max_trials, seed=0), plan.throughput.total, rows


def test_a_search_whose_answer_is_settled_stops_and_one_in_doubt_goes_on(tmp_path):
    plan, search, model, rows = _priced_search(tmp_path)
    at8 = sorted((r for r in rows if plan.nodes[r] == 8), key=lambda r: -model[r])
    last = at8[:2]  # the two slowest at 8 nodes: full checkpointing, over 50 % slower than its best
    for r in [r for r in rows if r not in last and r != at8[-1]]:
        search.observe(r, status="ok", mfu=None, step_time_s=float(model[r]))
    # 8 nodes' fastest layout is untried: it may change the answer by cost, so the search goes on
    assert search.choose() == at8[-1] and not search.settled
    search.observe(at8[-1], status="ok", mfu=None, step_time_s=float(model[at8[-1]]))
    # what is left cannot beat either answer by more than noise: settled, nothing more is started
    assert search.choose() is None and search.settled and search.should_stop()
    assert sorted(search.untried()) == sorted(last)


def test_a_size_holding_an_answer_on_fewer_than_four_trials_is_never_settled(tmp_path):
    sweep = _sweep(tmp_path, goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0})
    seen = {8: 64_000.0, 16: 100_000.0}  # 16 nodes holds --by time, 8 nodes --by cost
    assert holders(sweep, seen) == {Winner.time: (16, 100_000.0), Winner.cost: (8, 1000.0)}
    assert trials_at(np.array([8, 16, 8])) == {8: 2, 16: 1}
    assert confirming(sweep, seen, {8: 5, 16: 2}) == {16}
    assert confirming(sweep, seen, {8: 2, 16: 2}) == {8, 16}
    assert confirming(sweep, seen, {8: CONFIRMATIONS, 16: CONFIRMATIONS}) == set()
    nodes, rows = np.array([8, 8, 16, 16]), np.arange(4)
    settled = size_chance(nodes, np.full(4, 0.01))  # no layout left may change an answer by more than noise
    assert in_play(sweep, nodes, rows, {}, settled).size == 0
    # ... but 16 nodes holds its answer on two trials: its layouts stay in play, 8 nodes' do not
    assert in_play(sweep, nodes, rows, {}, settled, {16}).tolist() == [2, 3]
    # a size that cannot win is left out even so
    assert in_play(sweep, nodes, rows, {16: "cannot win"}, settled, {16}).size == 0


def test_the_next_trial_goes_to_an_answer_resting_on_two_trials_not_to_a_settled_stop(tmp_path):
    from sweeper.search.over_sizes import Belief, next_over_sizes

    sweep = _sweep(tmp_path, goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0})
    plan = make_plan(sweep)
    model = plan.throughput.total
    rows = np.flatnonzero(plan.candidate_mask)
    at8, at16 = rows[plan.nodes[rows] == 8], sorted(rows[plan.nodes[rows] == 16], key=lambda r: model[r])
    # every 8-node layout and 16 nodes' two fastest ran at the model's time; what is left at 16 nodes
    # is expected 40 % slower than its best, surely: no layout left may change either answer
    measured = {int(r): float(model[r]) for r in [*at8, *at16[:2]]}
    untried = np.asarray(at16[2:], dtype=np.int64)
    slow = 1.4 * model[at16[0]] * np.ones(untried.size)
    belief = Belief(
        untried, slow, np.full(untried.size, 0.15), slow, np.ones(untried.size), np.ones(untried.size), measured
    )
    choice = next_over_sizes(plan, untried, belief, by_prior=False)
    # 16 nodes holds --by time on two trials: it is confirmed, not settled
    assert not choice.settled and choice.rows.size == 1 and plan.nodes[choice.rows[0]] == 16
    # with four trials there, the same belief is settled within noise
    measured |= {int(r): float(model[r]) * 1.5 for r in at16[2:4]}
    rest = untried[2:]
    belief = Belief(
        rest, slow[2:], np.full(rest.size, 0.15), slow[2:], np.ones(rest.size), np.ones(rest.size), measured
    )
    assert next_over_sizes(plan, rest, belief, by_prior=False).settled


def test_the_last_trials_are_kept_for_an_answer_that_lacks_its_confirmations():
    # 16 nodes holds an answer on 2 trials (1 more running): it lacks 1, then 2 with nothing running
    assert reserved({16}, {16: 3}, trials_left=1) == {16}
    assert reserved({16}, {16: 3}, trials_left=2) == set()  # a trial to spare: the rule as before
    assert reserved({8, 16}, {8: 3, 16: 2}, trials_left=3) == {8, 16}
    assert reserved({8, 16}, {8: 3, 16: 2}, trials_left=4) == set()
    assert reserved({16}, {16: 2}, trials_left=None) == set()  # no trial count: nothing kept
    assert reserved(set(), {}, trials_left=1) == set()


def test_in_play_keeps_the_last_trials_for_the_sizes_reserved(tmp_path):
    sweep = _sweep(tmp_path)
    nodes, rows = np.array([8, 8, 16, 16]), np.arange(4)
    open_both = size_chance(nodes, np.array([0.3, 0.3, 0.3, 0.3]))
    assert in_play(sweep, nodes, rows, {}, open_both, set(), {16}).tolist() == [2, 3]
    # a reserved size with no untried layout left keeps nothing back
    assert in_play(sweep, nodes, rows[:2], {}, open_both, set(), {16}).tolist() == [0, 1]


def test_at_the_end_of_the_budget_the_next_trial_confirms_the_answer_not_a_cheaper_size(tmp_path):
    chosen = {}
    for max_trials in (16, 8):  # after 6 trials: 10 left, or 2
        plan, search, model, rows = _priced_search(tmp_path, max_trials)
        at8 = sorted((r for r in rows if plan.nodes[r] == 8), key=lambda r: model[r])
        at16 = sorted((r for r in rows if plan.nodes[r] == 16), key=lambda r: model[r])
        # 16 nodes' two fastest ran at the model's time: it holds --by time on 2 trials; 8 nodes ran 4
        # of its slower layouts, and its fastest untried ones may still beat the cheapest
        for r in [*at16[:2], *at8[-4:]]:
            search.observe(r, status="ok", mfu=None, step_time_s=float(model[r]))
        chosen[max_trials] = search.choose()
    free, last = chosen[16], chosen[8]
    assert free is not None and plan.nodes[free] == 8  # cheaper trials that may change --by cost
    assert last is not None and plan.nodes[last] == 16  # two trials left, both lacking at 16 nodes
    assert search.trial_gpu_hours(np.array([last]))[0] > search.trial_gpu_hours(np.array([free]))[0]
