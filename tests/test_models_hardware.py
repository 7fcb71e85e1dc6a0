"""Presets: parameter counts computed from the shapes match the published sizes."""

import pytest

from sweeper.hardware import GPUS, lookup_gpu
from sweeper.models import PRESETS

# Published totals: LLaMA paper (Touvron et al. 2023, table 2), Llama 2 and Llama 3 model cards;
# exact counts as the released checkpoints report them.
PUBLISHED = {
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-30b": 32_528_943_616,
    "llama-65b": 65_285_660_672,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_release(name):
    assert PRESETS[name].num_params == PUBLISHED[name]


def test_gqa_presets_have_fewer_kv_heads():
    assert PRESETS["llama3-8b"].kv_heads == 8 and PRESETS["llama3-8b"].heads == 32
    assert PRESETS["llama-7b"].kv_heads == PRESETS["llama-7b"].heads


def test_tied_embeddings_drop_the_head():
    from dataclasses import replace

    m = PRESETS["llama-7b"]
    assert m.num_params - replace(m, tied_embeddings=True).num_params == m.vocab * m.hidden


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
