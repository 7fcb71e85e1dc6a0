"""`model: {hf_config: config.json}`: the shape read from released configs (their fields as
published on the Hugging Face hub) against the presets and the published parameter counts; an
unknown architecture refused in one line; the file kept with the results and part of the identity."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.spec.loader import load_sweep, parse_sweep
from sweeper.spec.models import PRESETS
from tests.conftest import SPACES, base_spec, sweep_cli

# config.json of each release (the fields the shape reads, as published)
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}


def hf_sweep(tmp_path: Path, config: dict[str, Any], **overrides: Any):
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = base_spec(model={"hf_config": "config.json"}, **({"space": {"tp": [1]}} | overrides))
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_sweep(path)  # config.json beside the sweep file, whatever the current folder


@pytest.mark.parametrize(
    ("config", "preset"),
    [
        (LLAMA31_8B, "llama3.1-8b"),
        (MISTRAL_7B, "mistral-7b"),
        (QWEN3_8B, "qwen3-8b"),
        (MIXTRAL_8X7B, "mixtral-8x7b"),
        (QWEN3_30B_A3B, "qwen3-30b-a3b"),
    ],
)
def test_a_released_config_gives_the_presets_shape(tmp_path, config, preset):
    sweep = hf_sweep(tmp_path, config)
    assert sweep.model == replace(PRESETS[preset], name=config["architectures"][0])
    assert sweep.model_file is not None and sweep.model_file.architecture == config["architectures"][0]
    assert sweep.model_file.max_positions == config.get("max_position_embeddings")


def test_published_totals(tmp_path):
    assert hf_sweep(tmp_path, LLAMA31_8B).model.num_params == 8_030_261_248
    # Qwen/Qwen2.5-7B: 7,615,616,512 parameters, with biases on q, k and v (not o)
    qwen = hf_sweep(tmp_path, QWEN25_7B).model
    assert qwen.qkv_bias and not qwen.attention_bias and qwen.num_params == 7_615_616_512
    # Qwen/Qwen1.5-MoE-A2.7B (model card: 14.3B total, 2.7B activated): a shared expert of 4 x 1408
    moe = hf_sweep(tmp_path, QWEN15_MOE_A27B).model
    assert (moe.experts, moe.experts_per_token, moe.moe_ffn, moe.shared_experts) == (60, 4, 1408, 4)
    assert round(moe.num_params / 1e9, 1) == 14.3 and round(moe.active_params / 1e9, 1) == 2.7


def test_model_type_stands_in_for_architectures(tmp_path):
    config = {k: v for k, v in LLAMA31_8B.items() if k != "architectures"}
    assert hf_sweep(tmp_path, config).model.name == "LlamaForCausalLM"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"architectures": ["MambaForCausalLM"], "model_type": "mamba"},
            "architecture MambaForCausalLM is not supported; known: LlamaForCausalLM, MistralForCausalLM, "
            "Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM",
        ),
        ({"num_hidden_layers": None}, "num_hidden_layers is missing"),
        ({"hidden_size": "4096"}, "hidden_size must be a whole number, got '4096'"),
        ({"num_key_value_heads": 5}, "heads must be a multiple of kv_heads, but got heads=32, kv_heads=5"),
    ],
)
def test_a_config_the_model_cannot_describe_is_one_line(tmp_path, change, message):
    config = {k: v for k, v in {**LLAMA31_8B, **change}.items() if v is not None}
    with pytest.raises(SpecError) as info:
        hf_sweep(tmp_path, config)
    assert str(info.value) == f"{tmp_path / 'hf.yaml'}: model.hf_config: {tmp_path / 'config.json'}: {message}"


def test_a_dense_block_after_a_sparse_one_is_refused(tmp_path):
    config = {**QWEN3_30B_A3B, "mlp_only_layers": [0, 5]}
    with pytest.raises(SpecError, match=r"blocks \[0, 5\] have a dense MLP"):
        hf_sweep(tmp_path, config)
    leading = hf_sweep(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]}).model
    assert leading.dense_layers == 2


def test_a_file_that_is_not_there_or_not_json(tmp_path):
    with pytest.raises(SpecError, match="model.hf_config: .*config.json: cannot read: No such file"):
        parse_sweep(yaml.safe_dump(base_spec(model={"hf_config": str(tmp_path / "config.json")})))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="model.hf_config: .*config.json: not a JSON config"):
        parse_sweep(yaml.safe_dump(base_spec(model={"hf_config": str(tmp_path / "config.json")})))


def test_the_cli_shows_the_shape_and_refuses_an_unknown_architecture(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(json.dumps(LLAMA31_8B))
    text = (
        (SPACES / "llama13b_2k.yaml").read_text().replace("model: llama-13b", "model: {hf_config: models/config.json}")
    )
    (tmp_path / "hf.yaml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = sweep_cli("run", str(tmp_path / "hf.yaml"), "--dry-run", cwd=elsewhere)  # relative to the sweep file
    assert r.returncode == 0, r.stderr
    assert f"model: LlamaForCausalLM from {tmp_path / 'models' / 'config.json'}: 32 layers, hidden 4096, 32 heads " in (
        r.stdout
    )
    assert "(8 kv, head_dim 128), ffn 14336, vocab 128256, untied embeddings; 8.03B params" in r.stdout
    (tmp_path / "models" / "config.json").write_text(json.dumps({**LLAMA31_8B, "architectures": ["MambaForCausalLM"]}))
    bad = sweep_cli("run", str(tmp_path / "hf.yaml"), "--dry-run", cwd=elsewhere)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "architecture MambaForCausalLM is not supported; known: LlamaForCausalLM" in bad.stderr


def test_the_config_is_kept_with_the_results_and_a_change_is_noticed(tmp_path):
    config = {**LLAMA31_8B, "num_hidden_layers": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    table = tmp_path / "table.csv"
    table.write_text("tp,status,mfu\n1,ok,0.5\n2,ok,0.4\n")
    spec = base_spec(
        name="hf",
        model={"hf_config": "config.json"},
        space={"tp": [1, 2]},
        search={"max_trials": 2, "parallel": 1},
        launcher={"kind": "replay", "table": str(table)},
        results_dir=str(tmp_path / "results"),
    )
    (tmp_path / "hf.yaml").write_text(yaml.safe_dump(spec))
    assert sweep_cli("run", "hf.yaml", cwd=tmp_path).returncode == 0
    root = tmp_path / "results" / "hf"
    assert json.loads((root / "hf_config.json").read_text()) == config
    assert yaml.safe_load((root / "sweep.yaml").read_text())["model"] == {"hf_config": "hf_config.json"}
    assert load_sweep(root / "sweep.yaml").model == load_sweep(tmp_path / "hf.yaml").model
    # the results read from elsewhere, through the frozen copy
    best = sweep_cli("best", "x", "--results", str(root), "--format", "json", cwd=tmp_path / "results")
    assert best.returncode == 0 and json.loads(best.stdout)["layout"]["layers"] == 16
    # a changed config.json is a changed sweep: refused as such; the same one again runs
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 8}))
    changed = sweep_cli("run", "hf.yaml", cwd=tmp_path)
    assert changed.returncode == 2 and "hf.yaml changed since" in changed.stderr and "--fresh" in changed.stderr
    (tmp_path / "config.json").write_text(json.dumps(config, indent=4))  # the same fields, written another way
    assert sweep_cli("run", "hf.yaml", cwd=tmp_path).returncode == 0
