"""A rule's message shows the values of the row it rejects, for every knob of the table, with no
list of "knobs that messages name" to keep up to date (sweeper.plan.plan.messages groups rows by the
columns a message reads)."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Rule, with_derived
from sweeper.plan.plan import CANDIDATE, INVALID, cross_product, make_plan, messages, reject
from sweeper.statuses import PlanReason
from tests.conftest import make_sweep

# two values of every knob: the cross product then holds 2**len(KNOBS) rows
TWO_VALUES = {
    k: list(knob.choices[:2]) if knob.kind is str else [False, True] if knob.kind is bool else [1, 2]
    for k, knob in KNOBS.items()
}


# a mixture of experts, so that ep and etp may take two values
MOE = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 512, "vocab": 1024, "experts": 4}
MOE |= {"experts_per_token": 2}


def _columns():
    sweep = make_sweep(space=TWO_VALUES, model=MOE)
    raw, codes = cross_product(sweep.space)
    return sweep, with_derived(raw, sweep), codes


def _reject(rule: Rule):
    sweep, cols, codes = _columns()
    n = len(cols["tp"])
    status = np.full(n, CANDIDATE, dtype=object)
    code, reason = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
    reject(cols, codes, sweep, status, code, reason, rules=(rule,))
    return cols, status, reason


@pytest.mark.parametrize("knob", list(KNOBS))
def test_a_rule_message_naming_any_knob_shows_each_rows_value(knob):
    rule = Rule(
        PlanReason.WORLD_NOT_DIVISIBLE,
        f"names {knob}",
        lambda c, s: np.ones(len(c["tp"]), dtype=bool),
        lambda c, s, i: f"{knob} = {c[knob][i]}",
    )
    cols, status, reason = _reject(rule)
    assert (status == INVALID).all()
    assert reason.tolist() == [f"{knob} = {v}" for v in cols[knob]]
    assert {str(v) for v in reason} == {f"{knob} = {v}" for v in TWO_VALUES[knob]}


def test_a_message_that_reads_a_knob_only_on_some_rows_still_shows_it():
    # the first row's message reads tp alone; rows with pp = 2 also name the attention kernel
    def explain(c, s, i):
        return f"tp = {c['tp'][i]}" + (f", attention = {c['attention'][i]}" if c["pp"][i] == 2 else "")

    rule = Rule(PlanReason.WORLD_NOT_DIVISIBLE, "branches", lambda c, s: np.ones(len(c["tp"]), dtype=bool), explain)
    cols, _, reason = _reject(rule)
    expected = [
        f"tp = {t}" + (f", attention = {a}" if p == 2 else "")
        for t, p, a in zip(cols["tp"], cols["pp"], cols["attention"])
    ]
    assert reason.tolist() == expected
    assert len(set(expected)) == 2 + 2 * 2  # pp=1: tp only; pp=2: tp x attention


def test_messages_calls_explain_once_per_distinct_value_read():
    cols = {"a": np.array([1, 1, 2, 2, 1]), "b": np.array(["x", "y", "x", "y", "z"])}
    calls = []

    def explain(c, j):
        calls.append(j)
        return f"a={c['a'][j]}"

    out = messages(explain, cols, np.arange(5))
    assert out.tolist() == ["a=1", "a=1", "a=2", "a=2", "a=1"]
    assert len(calls) == 1 + 2  # one to find what it reads, then one per value of a


def test_every_plan_message_is_the_one_layout_rejection_gives():
    # grouped messages (plan) against one-at-a-time messages (Layout.rejection) on a space that
    # breaks many rules and marks duplicates
    sweep = make_sweep(
        space={
            "tp": [1, 2, 4, 8],
            "pp": [1, 2, 4, 8, 16],
            "micro_batch_size": [1, 2, 3],
            "sequence_parallel": [False, True],
            "sharding": ["none", "fsdp"],
            "pp_schedule": ["1f1b", "interleaved"],
            "virtual_stages": [1, 2],
            "attention": ["flash1", "flash2"],
            "float8": [False, True],
        }
    )
    plan = make_plan(sweep)
    invalid = np.flatnonzero(plan.status == INVALID)
    assert len(set(plan.reason_code[invalid])) >= 5
    for i in invalid:
        layout = plan.layout(int(i))
        rejection = layout.rejection(sweep)
        if plan.reason_code[i] == PlanReason.DUPLICATE:
            assert rejection is None and plan.reason[i].startswith("same run as ")
            cols = plan.cols
            assert f"tp={cols['tp'][i]}, pp={cols['pp'][i]}, dp={cols['dp'][i]}" in plan.reason[i]
        else:
            assert rejection is not None
            assert (rejection.code, rejection.message) == (plan.reason_code[i], plan.reason[i]), i
