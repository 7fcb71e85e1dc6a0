"""Where an export runs a layout otherwise than it was measured, it says what changes, in numbers:
torchtitan 0.3 writes ZeRO-1 as replicate (the optimizer state whole: dp times the plan's), 0.2
writes DDP at tp or pp > 1 as FSDP, Megatron-LM runs GPipe as 1F1B, nanotron recomputes whole
layers or nothing."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sweeper.layouts.layout import Layout
from sweeper.trainers import EXPORTERS
from sweeper.trainers.export import layout_record
from tests.conftest import make_sweep

NUMBERS = re.compile(
    r"per GPU, optimizer state ([\d.]+) -> ([\d.]+) GiB, allocated ([\d.]+) -> ([\d.]+) GiB of ([\d.]+) usable"
    r"(?: \(over the card\))?; step time ([\d.e+-]+) -> ([\d.e+-]+) s"
)


def changes(fmt: str, **knobs: Any) -> list[str]:
    sweep = make_sweep()  # LLaMA-13B on 64 A100-80GB, 2048 sequences of 2048
    row = Layout(**knobs).resolve(sweep).as_fields() | {"trial_number": 1, "mfu": 0.4}
    text = EXPORTERS[fmt](row, sweep)
    return [ln for ln in text.splitlines() if ln.startswith("# runs otherwise than measured: ")]


def numbers(line: str) -> list[float]:
    m = NUMBERS.search(line)
    assert m, line
    return [float(x) for x in m.groups()]


def test_torchtitan_03_zero1_holds_the_whole_optimizer_state():
    """tp 2, pp 1 on 64 GPUs: dp 32, so replicate holds 32 times the ZeRO-1 shard (+15 GiB and more on 13B)."""
    (line,) = changes("torchtitan-cli", tp=2, sharding="zero1")
    assert "sharding=zero1 runs as none" in line
    opt_before, opt_after, alloc_before, alloc_after, _, _, _ = numbers(line)
    assert opt_after == pytest.approx(32 * opt_before, rel=0.01)
    assert alloc_after - alloc_before == pytest.approx(opt_after - opt_before, abs=0.2)


def test_torchtitan_02_writes_ddp_under_tp_as_fsdp():
    (line,) = changes("torchtitan", tp=2, sharding="none")
    assert "sharding=none runs as fsdp" in line
    _, _, alloc_before, alloc_after, _, step_before, step_after = numbers(line)
    assert alloc_after < alloc_before / 2 and step_after != step_before


def test_megatron_runs_gpipe_as_1f1b():
    (line,) = changes("megatron", pp=4, tp=4, pp_schedule="gpipe", micro_batch_size=1)
    assert "pp_schedule=gpipe runs as 1f1b" in line
    _, _, alloc_before, alloc_after, _, _, _ = numbers(line)
    assert alloc_after < alloc_before  # one stage's warm-up in flight, not every micro-batch


@pytest.mark.parametrize(
    ("fmt", "knobs"),
    [
        ("torchtitan-cli", {"tp": 2, "sharding": "none"}),  # replicate is DDP's memory
        ("torchtitan", {"sharding": "fsdp"}),
        ("megatron", {"pp": 4, "tp": 4, "pp_schedule": "1f1b"}),
        ("json", {"sharding": "zero1"}),
    ],
)
def test_a_layout_written_as_measured_says_nothing(fmt, knobs):
    assert changes(fmt, **knobs) == []


def test_the_record_is_unchanged():
    """The change is said, not made: the exported record keeps the measured layout."""
    sweep = make_sweep()
    row = Layout(tp=2, sharding="zero1").resolve(sweep).as_fields()
    assert layout_record(row, sweep)["sharding"] == "zero1"


def test_nanotron_writes_selective_as_no_recompute():
    (line,) = changes("nanotron", tp=4, pp=2, activation_checkpointing="selective")
    assert "activation_checkpointing=selective runs as none" in line
    _, _, alloc_before, alloc_after, _, step_before, step_after = numbers(line)
    assert alloc_after > alloc_before and step_after <= step_before  # more kept, nothing recomputed


def test_selective_says_what_the_trainer_recomputes():
    """The built-in trainer's selective recomputes the elementwise ops only; torchtitan's also every
    second matmul, Megatron-LM's the core attention: a layout measured on the one says so on the others."""
    (titan,) = changes("torchtitan-cli", tp=2, activation_checkpointing="selective")
    assert "SelectiveAC) also recomputes every second matmul" in titan
    (megatron,) = changes("megatron", tp=2, activation_checkpointing="selective")
    assert "recomputes the core attention" in megatron


def test_a_trainers_own_layout_ran_as_written():
    """A torchtitan sweep's ZeRO-1 trial ran as replicate: the export says what the plan counted otherwise."""
    sweep = make_sweep(workload={"kind": "torchtitan", "command": "torchrun -m torchtitan.train {flags}"})
    row = Layout(tp=2, sharding="zero1").resolve(sweep).as_fields()
    text = EXPORTERS["torchtitan-cli"](row, sweep)
    assert "# runs otherwise than the plan counted: sharding=zero1 runs as none" in text
    assert "than measured" not in text
