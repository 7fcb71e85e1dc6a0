"""A Hugging Face `config.json` as the model of a sweep (`model: {hf_config: path}`).

The fields each architecture's configuration class defines (transformers' `LlamaConfig`,
`MistralConfig`, `Qwen2Config`, `Qwen3Config`, `MixtralConfig`, `Qwen2MoeConfig`,
`Qwen3MoeConfig`), read into the fields of the sweep file's model mapping (`ModelSpec`), which
validates them as it validates a hand-written shape. Pure: json and the standard library.

Not modelled, as for the presets (`sweeper.spec.models`): Mistral's sliding window (counted as full
causal attention), Qwen2-MoE's shared-expert gate (one hidden x 1 projection per block, under
0.001 % of the parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.errors import SpecError, one_line
from sweeper.files import FileRefused, parse_json, read_limited

MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; anything bigger is not one
# the model's own limit on blocks (ModelSpec.layers), checked before anything loops over them
MAX_LAYERS = 100_000
# the copy of the file beside a sweep's results (`sweeper.results.frozen`), which its frozen sweep file names
FROZEN_NAME = "hf_config.json"

Config = Mapping[str, Any]


class _Refused(ValueError):
    """A config.json whose content the model cannot describe (the caller names the file)."""


@dataclass(frozen=True)
class ModelFile:
    """The config.json a sweep's model was read from: where, its bytes as read, and what it said
    beside the shape (for the dry run, and the copy kept with the results)."""

    path: Path
    text: bytes
    architecture: str
    max_positions: int | None  # max_position_embeddings: the longest sequence it was trained on
    # what the exports write beside the shape (sweeper.trainers.export_model): None where the file
    # gives none (each trainer's default then applies, and the export says so)
    rope_theta: float | None = None
    rope_scaling: dict[str, Any] | None = None
    norm_eps: float | None = None  # rms_norm_eps (Llama, Mistral, Qwen) or layer_norm_eps
    # bos_token_id, eos_token_id, pad_token_id as the file gives them (an eos list kept whole: Llama
    # 3.1's instruct models end on any of three); a trainer's config that names them takes these
    token_ids: dict[str, int | list[int]] = field(default_factory=dict)


def _dense(c: Config) -> dict[str, Any]:
    """The fields every architecture here shares (LlamaConfig's names)."""
    heads = _int(c, "num_attention_heads")
    layers = _int(c, "num_hidden_layers")
    if not 1 <= layers <= MAX_LAYERS:
        raise _Refused(f"num_hidden_layers = {layers}; allowed: 1 to {MAX_LAYERS}")
    fields: dict[str, Any] = {
        "layers": layers,
        "hidden": _int(c, "hidden_size"),
        "heads": heads,
        # LlamaConfig: "If it is not specified, will default to `num_attention_heads`"
        "kv_heads": _int(c, "num_key_value_heads", heads),
        "ffn": _int(c, "intermediate_size"),
        "vocab": _int(c, "vocab_size"),
        "tied_embeddings": _bool(c, "tie_word_embeddings"),  # False in each class's defaults
    }
    if c.get("head_dim") is not None:  # Qwen3, Mistral-Nemo; else hidden / heads
        fields["head_dim"] = _int(c, "head_dim")
    return fields


def _llama(c: Config) -> dict[str, Any]:
    # LlamaConfig's attention_bias: q, k, v and o; mlp_bias: the three MLP projections
    return {**_dense(c), "attention_bias": _bool(c, "attention_bias"), "mlp_bias": _bool(c, "mlp_bias")}


def _qwen2(c: Config) -> dict[str, Any]:
    # Qwen2Attention: q_proj, k_proj and v_proj with bias=True, o_proj without (no config field)
    return {**_dense(c), "qkv_bias": True}


def _qwen3(c: Config) -> dict[str, Any]:
    # Qwen3Attention: q_norm and k_norm (RMSNorm over head_dim); attention_bias as Llama's (default false)
    return {**_dense(c), "qk_norm": True, "attention_bias": _bool(c, "attention_bias")}


def _mixtral(c: Config) -> dict[str, Any]:
    # MixtralSparseMoeBlock in every block: num_local_experts experts of intermediate_size, top-k softmax
    experts = {"experts": _int(c, "num_local_experts"), "experts_per_token": _int(c, "num_experts_per_tok")}
    return {**_dense(c), **experts, "moe_ffn": _int(c, "intermediate_size")}


def _qwen_moe(c: Config, *, qwen3: bool) -> dict[str, Any]:
    """Qwen2-MoE and Qwen3-MoE: num_experts of moe_intermediate_size, top num_experts_per_tok; blocks
    listed in mlp_only_layers, or off the decoder_sparse_step, have a dense MLP of intermediate_size."""
    base = _qwen3(c) if qwen3 else _qwen2(c)
    moe: dict[str, Any] = {
        "experts": _int(c, "num_experts"),
        "experts_per_token": _int(c, "num_experts_per_tok"),
        "moe_ffn": _int(c, "moe_intermediate_size"),
        "dense_layers": _leading_dense(c, base["layers"]),
    }
    if moe["moe_ffn"] < 1:
        raise _Refused(f"moe_intermediate_size = {moe['moe_ffn']}; an expert's MLP is at least 1 wide")
    shared = _int(c, "shared_expert_intermediate_size") if c.get("shared_expert_intermediate_size") is not None else 0
    if shared:  # Qwen2-MoE: one shared MLP of that width = shared_experts experts of moe_ffn (as Megatron-LM counts it)
        if shared % moe["moe_ffn"]:
            raise _Refused(
                f"shared_expert_intermediate_size = {shared} is not a whole number of experts of "
                f"moe_intermediate_size = {moe['moe_ffn']}; the model has no field for such a shared expert"
            )
        moe["shared_experts"] = shared // moe["moe_ffn"]
    return {**base, **moe}


def _leading_dense(c: Config, layers: int) -> int:
    """How many leading blocks have a dense MLP; refused where a dense block follows a sparse one."""
    step = _int(c, "decoder_sparse_step", 1)
    listed = c.get("mlp_only_layers") or []
    if not isinstance(listed, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
        raise _Refused(f"mlp_only_layers must be a list of block numbers, got {str(listed)[:60]}")
    only = set(listed)
    dense = [i for i in range(layers) if i in only or (i + 1) % max(step, 1) != 0]
    if dense != list(range(len(dense))):
        raise _Refused(
            f"blocks {dense} have a dense MLP (decoder_sparse_step = {step}, mlp_only_layers = {sorted(only)}); "
            "the model counts dense blocks only before the sparse ones (dense_layers)"
        )
    return len(dense)


# architectures[0] of config.json -> the shape's fields
ARCHITECTURES: dict[str, Callable[[Config], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _llama,  # MistralConfig: Llama's fields, no biases
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "MixtralForCausalLM": _mixtral,
    "Qwen2MoeForCausalLM": lambda c: _qwen_moe(c, qwen3=False),
    "Qwen3MoeForCausalLM": lambda c: _qwen_moe(c, qwen3=True),
}
# model_type -> architecture, for a config.json without `architectures`
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def _int(c: Config, key: str, default: int | None = None) -> int:
    v = c.get(key, default)
    if v is None:
        raise _Refused(f"{key} is missing")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _Refused(f"{key} must be a whole number, got {str(v)[:40]!r}")
    return v


def _bool(c: Config, key: str) -> bool:
    """A true/false field (False where missing, as in each class's defaults); "false" is text, not false."""
    v = c.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _Refused(f"{key} must be true or false, got {v!r}")
    return v


def architecture(c: Config) -> str:
    """The architecture the file names (architectures[0], else from model_type)."""
    names = c.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    model_type = c.get("model_type")
    if isinstance(model_type, str):
        return MODEL_TYPES.get(model_type, model_type)
    raise _Refused("it names no architecture (no `architectures` and no `model_type`)")


def shape_fields(c: Config) -> tuple[str, dict[str, Any]]:
    """The architecture and the model fields (`ModelSpec`'s names) a config.json gives; _Refused
    (a ValueError) for an architecture not known here or content the model cannot describe."""
    arch = architecture(c)
    read = ARCHITECTURES.get(arch)
    if read is None:
        raise _Refused(f"architecture {arch} is not supported; known: {', '.join(ARCHITECTURES)}")
    return arch, read(c)


def resolve(path: str, base: Path) -> Path:
    """The file a sweep file names: a relative path is its folder's (`base`), `~` the user's home."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def read_config(path: Path) -> tuple[ModelFile, dict[str, Any]]:
    """The file and the model fields it gives; every problem is a SpecError naming model.hf_config and the file."""
    where = f"model.hf_config: {path}"
    try:
        text = read_limited(path, max_bytes=MAX_CONFIG_BYTES)
        data = parse_json(text, path, what="a JSON config")
    except FileRefused as e:
        raise SpecError(f"model.hf_config: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a JSON object of fields, got {type(data).__name__}")
    try:
        arch, fields = shape_fields(data)
        max_positions = _int(data, "max_position_embeddings") if data.get("max_position_embeddings") else None
        beside = _beside_shape(data)
    except _Refused as e:
        raise SpecError(f"{where}: {e}") from None
    return ModelFile(path, text, arch, max_positions, *beside, token_ids=_token_ids(data)), fields


def _token_ids(c: Config) -> dict[str, int | list[int]]:
    """The special tokens' ids the file gives (an id that is no integer, or a list of them, is left out)."""
    out: dict[str, int | list[int]] = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = c.get(name)
        ids = [i for i in (v if isinstance(v, list) else [v]) if isinstance(i, int) and not isinstance(i, bool)]
        if ids and len(ids) == (len(v) if isinstance(v, list) else 1):
            out[name] = ids if isinstance(v, list) else ids[0]
    return out


def _beside_shape(c: Config) -> tuple[float | None, dict[str, Any] | None, float | None]:
    """rope_theta, rope_scaling and the norm's epsilon as the file gives them (None: not given)."""
    theta, eps = c.get("rope_theta"), c.get("rms_norm_eps", c.get("layer_norm_eps"))
    scaling = c.get("rope_scaling")
    if isinstance(scaling, dict):
        _check_scaling(scaling)
    return (
        float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None,
        dict(scaling) if isinstance(scaling, dict) else None,
        float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None,
    )


# rope_scaling's fields that transformers' rope initialisations read as numbers (llama3, linear,
# dynamic, yarn, longrope): an export writes them as a trainer's numeric option, so a string is refused
_SCALING_NUMBERS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
)


def _check_scaling(scaling: Config) -> None:
    """rope_scaling's numeric fields are numbers (its other strings are written escaped, as data)."""
    for key in _SCALING_NUMBERS:
        v = scaling.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _Refused(f"rope_scaling.{key} must be a number, got {type(v).__name__} {one_line(repr(v), 60)}")
