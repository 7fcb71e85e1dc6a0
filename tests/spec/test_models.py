"""Presets: parameter counts computed from the shapes match the published sizes."""

import pytest

from sweeper.spec.models import PRESETS

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


# Exact totals as the released safetensors report them (Hugging Face model pages):
# meta-llama/Llama-3.2-1B 1,235,814,400 and -3B 3,212,749,824 (tied embeddings);
# mistralai/Mistral-7B-v0.1 7,241,732,096; Llama 3.1 and 3.3 share the Llama 3 shapes.
EXACT_NEW = {
    "llama3.1-8b": 8_030_261_248,
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "llama3.3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
}


@pytest.mark.parametrize("name", sorted(EXACT_NEW))
def test_new_llama_and_mistral_presets_match_release(name):
    assert PRESETS[name].num_params == EXACT_NEW[name]


# Qwen3 model cards (Qwen/Qwen3-*/README.md, "Number of Parameters" and "(Non-Embedding)"),
# in billions as the cards round them: the q/k norms and head_dim 128 are needed to hit them.
QWEN3_CARDS = {
    "qwen3-0.6b": (0.6, 0.44),
    "qwen3-1.7b": (1.7, 1.4),
    "qwen3-4b": (4.0, 3.6),
    "qwen3-8b": (8.2, 6.95),
    "qwen3-14b": (14.8, 13.2),
    "qwen3-32b": (32.8, 31.2),
}


@pytest.mark.parametrize("name", sorted(QWEN3_CARDS))
def test_qwen3_presets_match_the_model_cards(name):
    m = PRESETS[name]
    total, non_embedding = QWEN3_CARDS[name]
    digits = len(str(total).split(".")[1])
    assert round(m.num_params / 1e9, digits) == total
    embeddings = m.embedding_params + m.head_params
    assert round((m.num_params - embeddings) / 1e9, len(str(non_embedding).split(".")[1])) == non_embedding


def test_qwen3_8b_exact_count():
    # Qwen/Qwen3-8B safetensors: 8,190,735,360 (per layer q/k norms of 128 each included)
    assert PRESETS["qwen3-8b"].num_params == 8_190_735_360


# GPT-3 (Brown et al. 2020, Table 2.1, "n_params"), at the precision the paper prints them
GPT3 = {
    "gpt3-1.3b": (1.3, 1),
    "gpt3-2.7b": (2.7, 1),
    "gpt3-6.7b": (6.7, 1),
    "gpt3-13b": (13.0, 0),
    "gpt3-175b": (175.0, 0),
}


@pytest.mark.parametrize("name", sorted(GPT3))
def test_gpt3_presets_match_the_paper(name):
    published, digits = GPT3[name]
    assert round(PRESETS[name].num_params / 1e9, digits) == published


def test_gpt_block_parameters_by_hand():
    from sweeper.spec.models import ModelShape

    # h=8, 2 heads, ffn 32, vocab 10, 2 layers, 16 positions, tied:
    # attention 4*8*8 weights + 8+8+8+8 biases = 288; MLP 2*8*32 + 32 + 8 = 552;
    # two LayerNorms 2*(8+8) = 32 -> 872 per block; embedding 80, positions 16*8 = 128,
    # final LayerNorm 16: 2*872 + 80 + 128 + 16 = 1968
    m = ModelShape(
        2, 8, 2, 2, 32, 10, tied_embeddings=True, mlp="gelu", norm="layernorm", position="learned", max_positions=16
    )
    assert m.layer_params == 872
    assert m.num_params == 1968


def test_head_dim_sets_the_projection_widths():
    from sweeper.spec.models import ModelShape

    m = ModelShape(1, 64, 4, 2, 128, 10, head_dim=32)  # q 4*32 = 128 wide, kv 2*32 = 64
    assert (m.q_dim, m.kv_dim) == (128, 64)
    assert m.attention_params == 2 * 64 * 128 + 2 * 64 * 64
