"""The torch side of `sweep profile` on this CPU, each function the GPU run calls: fp8 GEMMs and casts,
compiled memory-bound work, the block compiled and checkpointed, and a kernel the device lacks."""

from __future__ import annotations

import pytest
import torch

from sweeper.runtime.profile_block import measure_blocks
from sweeper.runtime.profiling import (
    Timer,
    measure_attention,
    measure_compiled,
    measure_fp8_cast,
    measure_gemm,
    measure_gemm_fp8,
)
from sweeper.spec.models import ModelShape

CPU = torch.device("cpu")
TIMER = Timer(CPU, budget_s=0.002, max_reps=3)
SHAPE = ModelShape(1, 64, 4, 2, 128, 256, name="tiny")


def test_gemms_in_fp32_and_fp8_with_backward_apart():
    notes: list[str] = []
    (fp32,) = measure_gemm([(32, 64, 48)], dtype="fp32", timer=TIMER, progress=notes.append)
    assert (fp32.dtype, fp32.m, fp32.n, fp32.k) == ("fp32", 32, 64, 48) and fp32.fwd_s > 0 and fp32.bwd_s > 0
    # fp8 takes dimensions in multiples of 16 only: the others are left out
    fp8 = measure_gemm_fp8([(32, 64, 48), (30, 64, 48)], timer=TIMER, progress=notes.append)
    assert [(g.dtype, g.m) for g in fp8] == [("fp8", 32)] and fp8[0].bwd_s > 0
    (cast,) = measure_fp8_cast([("add", 32, 64), ("rope", 32, 64)], timer=TIMER)
    assert (cast.op, cast.elements) == ("fp8_cast", 32 * 64) and cast.fwd_s > 0
    assert notes == ["GEMM fp32 1/1", "GEMM fp8 1/1"]


def test_a_kernel_this_device_lacks_is_left_out_with_why():
    points, skipped = measure_attention(
        [(1, 4, 2, 16, 32)], kernel_names=("flash2", "cudnn"), dtype="fp32", timer=TIMER, progress=lambda _: None
    )
    assert {p.kernel for p in points} == {"flash2"}
    assert "cudnn" in skipped and "cpu" in skipped["cudnn"]


@pytest.mark.slow  # two torch.compile builds on the CPU (C++): a minute
def test_compiled_memory_bound_work_and_the_compiled_checkpointed_block():
    compiled, failed = measure_compiled([("add", 16, 64), ("add", 8, 64)], dtype="fp32", timer=TIMER, progress=print)
    assert failed is None
    assert [(p.op, p.mode, p.elements) for p in compiled] == [("add", "compiled", 16 * 64)]  # the largest only
    values = {"attention": ("flash2",), "rmsnorm": ("eager",), "activation_checkpointing": ("none", "selective")}
    values["compile"] = ("false", "true")
    points, skipped = measure_blocks(SHAPE, values, rows=16, precision="fp32", timer=TIMER, progress=print)
    assert not skipped
    got = {(p.knob, p.value) for p in points}
    assert got == {("base", "base"), ("activation_checkpointing", "selective"), ("compile", "true")}
    assert all(p.seconds > 0 for p in points)
