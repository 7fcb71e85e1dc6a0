"""The knob lists of tables and one-line layouts come from the knob table: a new knob shows up
in them without an edit there."""

from __future__ import annotations

from sweeper.cli.progress import describe
from sweeper.knobs import ALWAYS_SHOWN, KNOBS, SUMMARY_KNOBS, label, layout_line
from sweeper.layouts.layout import Layout


def test_always_shown_and_summary_knobs_are_flags_of_the_table():
    assert ALWAYS_SHOWN == ("tp", "pp", "micro_batch_size")
    assert SUMMARY_KNOBS == (
        "tp",
        "pp",
        "micro_batch_size",
        "sequence_parallel",
        "activation_checkpointing",
        "attention",
        "rmsnorm",
    )
    assert all(KNOBS[k].in_summary for k in ALWAYS_SHOWN)  # a table's fixed columns are in every summary


def test_layout_line_names_every_knob_once_with_its_value():
    values = {**Layout(tp=2, sharding="fsdp", virtual_stages=2).as_dict(), "dp": 4, "grad_accum": 8}
    words = layout_line(values).split()
    assert words[:5] == ["tp=2", "pp=1", "dp=4", "mbs=1", "grad_accum=8"]
    named = [w.split("=")[0] for w in words]
    assert sorted(named) == sorted([label(k) for k in KNOBS] + ["dp", "grad_accum"])
    assert "sharding=fsdp" in words and "v=2" in words and "sp=False" in words


def test_a_one_line_summary_names_the_summary_knobs():
    line = describe(Layout(tp=4, attention="sdpa_math", sharding="fsdp"))
    assert line == "tp=4 pp=1 mbs=1 sp=off ckpt=none attn=sdpa_math rmsnorm=eager"
