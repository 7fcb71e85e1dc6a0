"""Every place that lists the knobs is pinned to `sweeper.knobs.KNOBS`: names, order, types, defaults."""

from __future__ import annotations

import typing
from dataclasses import fields

from sweeper.estimate.memory import SCORE_KERNELS
from sweeper.knobs import KNOBS, LABELS, NO_EFFECT_VALUE, label
from sweeper.layouts.layout import Layout
from sweeper.results.rows import SCHEMA
from sweeper.results.trial import TrialResult
from sweeper.spec.schema import SpaceSpec


def test_layout_fields_are_the_knobs_with_their_types_and_defaults():
    hints = typing.get_type_hints(Layout)
    assert [f.name for f in fields(Layout)] == list(KNOBS)
    for f in fields(Layout):
        assert hints[f.name] is KNOBS[f.name].kind and f.default == KNOBS[f.name].default, f.name
    assert Layout() == Layout.from_mapping({k: knob.default for k, knob in KNOBS.items()})


def test_space_spec_lists_each_knob_as_a_list_of_its_type():
    assert list(SpaceSpec.model_fields) == list(KNOBS)
    for name, info in SpaceSpec.model_fields.items():
        assert info.annotation == list[KNOBS[name].kind] | None, name
        assert info.description == KNOBS[name].help


def test_trial_result_and_schema_hold_every_knob_in_order():
    names = [f.name for f in fields(TrialResult)]
    knob_pos = [names.index(k) for k in KNOBS]
    assert knob_pos == sorted(knob_pos) and knob_pos[-1] - knob_pos[0] == len(KNOBS) - 1
    hints = typing.get_type_hints(TrialResult)
    for k, knob in KNOBS.items():
        assert hints[k] == knob.kind | None, k
        assert k in SCHEMA.names


def test_labels_and_no_effect_values_come_from_the_knobs():
    assert label("micro_batch_size") == "mbs" and label("activation_checkpointing") == "ckpt"
    assert label("dp") == "dp" and set(LABELS) == set(KNOBS)
    assert len(set(LABELS.values())) == len(LABELS)  # one label names one knob
    assert NO_EFFECT_VALUE == {
        "sequence_parallel": False,
        "sharding": "none",
        "pp_schedule": "1f1b",
        "virtual_stages": 1,
    }
    # the kernels that keep the s x s scores: the memory model asks the knob
    assert set(SCORE_KERNELS) == {"eager", "fused_softmax", "sdpa_math"}
    assert set(SCORE_KERNELS) <= set(KNOBS["attention"].choices)
