"""The model's fields in the exports: every field of the sweep's model (shape, positions and RoPE,
norm, biases, tied embeddings, vocab) either set as the trainer's own option or named in a comment,
never dropped (docs/exports.md).

The shape is `sweep.model`; RoPE's theta and scaling and the norm's epsilon come from the
config.json a `model: {hf_config: ...}` names (`spec.hf_config.ModelFile`); a preset or a shape
written out gives none, and the export says the trainer's default applies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweeper.text import for_comment

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep


def model_fields(sweep: Sweep) -> dict[str, Any]:
    """The sweep's model as plain data (`model_shape` in the yaml/json exports); None: not given."""
    m, f = sweep.model, sweep.model_file
    return {
        "name": m.name,
        "from": str(f.path) if f is not None else ("preset" if m.name != "custom" else "shape"),
        "layers": m.layers,
        "hidden": m.hidden,
        "heads": m.heads,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim or m.hidden // m.heads,
        "ffn": m.ffn,
        "vocab": m.vocab,
        "tied_embeddings": bool(m.tied_embeddings),
        "mlp": m.mlp,
        "norm": m.norm,
        "norm_eps": f.norm_eps if f is not None else None,
        "qk_norm": m.qk_norm,
        "position": m.position,
        "max_positions": (f.max_positions if f is not None else None) or m.max_positions or None,
        "rope_theta": f.rope_theta if f is not None and m.position == "rope" else None,
        "rope_scaling": f.rope_scaling if f is not None and m.position == "rope" else None,
        "qkv_bias": m.qkv_bias,
        "attention_bias": m.attention_bias,
        "mlp_bias": m.mlp_bias,
    }


def model_comment(sweep: Sweep, trainer: str, *, set_here: tuple[str, ...] = ()) -> list[str]:
    """Comment lines (without `# `) naming the model fields the export does not set (`set_here`:
    those it does): what to give `trainer`'s model definition, and which it leaves at its default."""
    fields = model_fields(sweep)
    named = [f"{k}={_text(v)}" for k, v in fields.items() if k not in ("name", "from", *set_here) and v is not None]
    out = [f"model {fields['name']} ({fields['from']}), set in {trainer}'s model definition: {', '.join(named)}"]
    unknown = [k for k in ("norm_eps", "rope_theta", "rope_scaling", "max_positions") if fields[k] is None]
    if fields["position"] != "rope":
        unknown = [k for k in unknown if not k.startswith("rope")]
    unknown = [k for k in unknown if k not in set_here]
    if unknown:
        why = "" if sweep.model_file is not None else " (no config.json)"
        out.append(f"model {', '.join(unknown)}: not given by the sweep's model{why}: {trainer}'s default applies")
    # a config.json's strings are data: no newline in them may end the comment line
    return [for_comment(line) for line in (out if named else out[1:])]


def megatron_model_flags(sweep: Sweep) -> list[str]:
    """The model's Megatron-LM flags (arguments.py and the flags generated from TransformerConfig
    at the commit the export targets), for the export's comment: the layout flags are what it sets."""
    f = model_fields(sweep)
    flags = [
        f"--num-layers {f['layers']}",
        f"--hidden-size {f['hidden']}",
        f"--ffn-hidden-size {f['ffn']}",
        f"--num-attention-heads {f['heads']}",
        f"--kv-channels {f['head_dim']}",
    ]
    if f["kv_heads"] != f["heads"]:
        flags.append(f"--group-query-attention --num-query-groups {f['kv_heads']}")
    flags.append("--normalization " + ("RMSNorm" if f["norm"] == "rmsnorm" else "LayerNorm"))
    if f["norm_eps"] is not None:
        flags.append(f"--layernorm-epsilon {f['norm_eps']:g}")
    if f["qk_norm"]:
        flags.append("--qk-layernorm")
    if f["mlp"] == "swiglu":
        flags.append("--swiglu")
    if not (f["attention_bias"] or f["mlp_bias"]):
        flags.append("--disable-bias-linear")
    if f["qkv_bias"]:
        flags.append("--add-qkv-bias")
    flags.append("--position-embedding-type " + ("rope" if f["position"] == "rope" else "learned_absolute"))
    if f["rope_theta"] is not None:
        flags.append(f"--rotary-base {f['rope_theta']:g}")
    scaling = f["rope_scaling"] or {}
    factor = scaling.get("factor", 8.0)
    if scaling.get("rope_type", scaling.get("type")) == "llama3" and isinstance(factor, (int, float)):
        flags.append(f"--use-rope-scaling --rope-scaling-factor {factor:g}")
    if f["max_positions"]:
        flags.append(f"--max-position-embeddings {max(f['max_positions'], sweep.seq_len)}")
    if not f["tied_embeddings"]:
        flags.append("--untie-embeddings-and-output-weights")
    flags.append(f"--vocab-size {f['vocab']}")
    return flags


def _text(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v).lower() if isinstance(v, bool) else str(v)
