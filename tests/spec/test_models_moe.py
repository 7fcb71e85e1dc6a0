"""Mixture-of-experts presets: total and active parameter counts against the published figures,
each at the precision and with the rounding its publisher uses."""

import math

import pytest

from sweeper.spec.models import PRESETS, ModelShape

# (total, active) in billions.
# Mixtral: Mistral AI, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts, 2023-12-11): "46.7B
#   total parameters but only uses 12.9B parameters per token"; rounded to the nearest 0.1 B.
# Qwen3 MoE: Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B README "Number of Parameters: 30.5B in
#   total and 3.3B activated", "235B in total and 22B activated"; the cards cut (3.353 B reads 3.3 B).
# GPT-OSS: OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925), Table 1: total
#   116.83 B / 20.91 B, active per token 5.13 B / 3.61 B (the Hugging Face cards round them to
#   117 B / 5.1 B and 21 B / 3.6 B); its active count leaves the embedding table out (a lookup, no
#   matmul) and keeps the unembedding.
ROUNDED = {"mixtral-8x7b": ((46.7, 12.9), 1)}
CUT = {"qwen3-30b-a3b": ((30.5, 3.3), 1), "qwen3-235b-a22b": ((235.0, 22.0), 0)}
GPT_OSS = {"gpt-oss-20b": (20.91, 3.61), "gpt-oss-120b": (116.83, 5.13)}


@pytest.mark.parametrize("name", sorted(ROUNDED))
def test_rounded_cards(name):
    (total, active), digits = ROUNDED[name]
    m = PRESETS[name]
    assert round(m.num_params / 1e9, digits) == total
    assert round(m.active_params / 1e9, digits) == active


@pytest.mark.parametrize("name", sorted(CUT))
def test_qwen3_moe_cards(name):
    (total, active), digits = CUT[name]
    m, scale = PRESETS[name], 10**digits
    assert math.floor(m.num_params / 1e9 * scale) / scale == total
    assert math.floor(m.active_params / 1e9 * scale) / scale == active


@pytest.mark.parametrize("name", sorted(GPT_OSS))
def test_gpt_oss_model_card(name):
    total, active = GPT_OSS[name]
    m = PRESETS[name]
    assert round(m.num_params / 1e9, 2) == total
    assert round((m.active_params - m.embedding_params) / 1e9, 2) == active


def test_gpt_oss_biases_and_sinks_are_counted():
    # per block of gpt-oss-20b: q/k/v/o biases 4096 + 512 + 512 + 2880, 64 sinks; each expert's
    # gate/up bias 2*2880 and down bias 2880; the router's bias, one per expert (32)
    m = PRESETS["gpt-oss-20b"]
    bare = ModelShape(24, 2880, 64, 8, 2880, 201088, head_dim=64, experts=32, experts_per_token=4, moe_ffn=2880)
    per_block = 8000 + 64 + 32 * 3 * 2880 + 32
    assert m.num_params - bare.num_params == 24 * per_block


def test_every_moe_preset_is_checked():
    moe = {n for n, m in PRESETS.items() if m.is_moe}
    assert moe == set(ROUNDED) | set(CUT) | set(GPT_OSS)
