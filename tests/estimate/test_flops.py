"""MFU and HFU: the PaLM formula against worked examples published by others."""

import pytest

from sweeper.estimate.flops import hardware_flops_per_token, model_flops_per_token, tflops_per_device, utilization
from sweeper.spec.hardware import GPUS
from sweeper.spec.models import PRESETS


def test_palm_formula_by_hand():
    m = PRESETS["llama-7b"]
    # 6 * 6,738,415,616 + 12 * 32 layers * 4096 hidden * 2048 tokens
    assert model_flops_per_token(m, 2048) == 6 * 6_738_415_616 + 12 * 32 * 4096 * 2048


def test_ibm_meta_fsdp_blog_7b():
    # "Maximizing training throughput using PyTorch FSDP" (IBM + Meta, PyTorch blog, 2024):
    # Llama 2 7B, seq 4096, 3,700 tokens/s per A100 -> 57% MFU (rounded).
    fpt = model_flops_per_token(PRESETS["llama2-7b"], 4096)
    mfu = utilization(3700 * 128, fpt, num_devices=128, peak_flops=GPUS["a100-80gb"].peak_flops("bf16"))
    assert mfu == pytest.approx(0.5562, abs=5e-4)
    assert 0.55 <= mfu <= 0.575


def test_torchtitan_llama3_8b_a100():
    # torchtitan docs/performance.md: Llama 3 8B, FSDP on 64 A100-80GB, local batch 1, seq 8192,
    # selective op AC: 2,973 tokens/s per GPU and 58.2% MFU (same formula, embeddings included).
    fpt = model_flops_per_token(PRESETS["llama3-8b"], 8192)
    mfu = utilization(2973, fpt, num_devices=1, peak_flops=312e12)
    assert mfu == pytest.approx(0.582, abs=1e-3)


def test_hfu_counts_recomputation():
    m, s = PRESETS["llama-13b"], 2048
    base = model_flops_per_token(m, s)
    assert hardware_flops_per_token(m, s, "none") == base
    assert hardware_flops_per_token(m, s, "selective") == base
    full = hardware_flops_per_token(m, s, "full")
    # one more forward of every block: 2 FLOPs per block weight + 4*L*h*s attention
    assert full - base == 2 * m.layers * m.layer_params + 4 * m.layers * m.hidden * s
    assert full / base == pytest.approx(4 / 3, rel=0.01)  # 8N vs 6N, the classic ratio
    assert hardware_flops_per_token(m, s, "ffn") - base == 2 * m.layers * m.mlp_params


def test_tflops_per_device():
    assert tflops_per_device(1000.0, 1e12, num_devices=4) == 250.0
