"""The GPU table: the cards a sweep file may name, their peak FLOP/s and memory, and name aliases."""

import pytest

from sweeper.spec.hardware import GPUS, lookup_gpu


def test_gpu_table_has_the_required_cards():
    for name in ["a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x", "l40s"]:
        g = GPUS[name]
        assert g.memory_gib > 0 and g.bf16_tflops > 0
    assert GPUS["a100-80gb"].peak_flops("bf16") == 312e12
    assert GPUS["h100-sxm"].peak_flops("bf16") == pytest.approx(989.4e12)
    assert GPUS["a100-80gb"].peak_flops("fp32") == 156e12  # tf32 tensor cores
    assert not GPUS["a100-80gb"].supports_fp8 and GPUS["h100-sxm"].supports_fp8


def test_gpu_lookup_aliases():
    assert lookup_gpu("A100_80GB").name == "a100-80gb"
    assert lookup_gpu("h100").name == "h100-sxm"
    assert lookup_gpu("v100") is None
