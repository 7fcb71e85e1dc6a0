"""A winning layout carried into the trainers people use: torchtitan TOML, Megatron-LM flags, data.

Pure functions of one results row and its sweep (no torch). A knob value that a trainer has no
option for is named in a comment of the output, never dropped in silence.

Names were checked against the trainers' sources:
- torchtitan: torchtitan/config/job_config.py (pytorch/torchtitan) — `Parallelism`, `Training`,
  `ActivationCheckpoint`, `Compile` and `Quantize.linear.float8` (`[quantize.linear.float8]`,
  enabled by `model.converters = ["quantize.linear.float8"]`; releases before the `quantize`
  section call it `[float8]` with `converters = ["float8"]`).
- Megatron-LM: megatron/training/arguments.py (NVIDIA/Megatron-LM) — `_add_distributed_args`,
  `_add_training_args`, `_add_network_size_args` (`--attention-backend`),
  `_add_transformer_engine_args` (`--fp8-format`, `--transformer-impl`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from sweeper.knobs import KNOBS
from sweeper.spec import Sweep

TORCHTITAN_SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
# our attention kernels -> Megatron-LM's --attention-backend (flash, fused = cuDNN via TE, unfused)
MEGATRON_ATTENTION = {"flash1": "flash", "flash2": "flash", "cudnn": "fused", "sdpa_efficient": "fused",
                      "fused_softmax": "unfused", "eager": "unfused", "sdpa_math": "unfused"}


def layout_record(row: Mapping[str, Any], sweep: Sweep) -> dict[str, Any]:
    """The layout of a results row as plain data: knobs, derived sizes, the sweep's fixed shape and its MFU."""
    knobs = {k: _plain(row.get(k)) for k in KNOBS}
    return {
        "sweep": sweep.name,
        "trial_number": _plain(row.get("trial_number")),
        "mfu": _plain(row.get("mfu")),
        **knobs,
        "dp": _plain(row.get("dp")),
        "grad_accum": _plain(row.get("grad_accum")),
        "num_devices": _plain(row.get("num_devices")),
        "seq_len": sweep.seq_len,
        "global_batch_size": sweep.global_batch_size,
        "layers": sweep.model.layers,
        "precision": sweep.trial.precision,
    }


def to_json(row: Mapping[str, Any], sweep: Sweep) -> str:
    return json.dumps(layout_record(row, sweep), indent=2)


def to_yaml(row: Mapping[str, Any], sweep: Sweep) -> str:
    import yaml

    return yaml.safe_dump(layout_record(row, sweep), sort_keys=False)


# ---- torchtitan -------------------------------------------------------------------------
def torchtitan_sections(rec: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """torchtitan config sections for a layout, and the knob values it has no option for."""
    tp, pp, dp, mbs = rec["tp"], rec["pp"], rec["dp"], rec["micro_batch_size"]
    sharding, mode = rec["sharding"], rec["activation_checkpointing"]
    notes: list[str] = []
    par: dict[str, Any] = {
        "tensor_parallel_degree": tp,
        "pipeline_parallel_degree": pp,
        "data_parallel_shard_degree": dp if sharding == "fsdp" else 1,
        "data_parallel_replicate_degree": 1 if sharding == "fsdp" else dp,
        "enable_async_tensor_parallel": False,
        "disable_loss_parallel": False,  # the built-in trainer computes the loss vocab-parallel too
        "pipeline_parallel_schedule": TORCHTITAN_SCHEDULE[rec["pp_schedule"]],
        "pipeline_parallel_microbatch_size": mbs,
    }
    if rec["pp_schedule"] == "interleaved":
        par["pipeline_parallel_layers_per_stage"] = rec["layers"] // (pp * rec["virtual_stages"])
    if sharding == "zero1":
        notes.append("sharding=zero1: torchtitan has no optimizer-only sharding; written as DDP "
                     "(data_parallel_replicate_degree), FSDP is data_parallel_shard_degree")
    if tp > 1 and not rec["sequence_parallel"]:
        notes.append("sequence_parallel=false: torchtitan always shards norms along the sequence under TP")
    # with pipelining torchtitan splits local_batch_size into micro-batches; without, it accumulates
    local = mbs * rec["grad_accum"] if pp > 1 else mbs
    training = {"local_batch_size": local, "global_batch_size": rec["global_batch_size"], "seq_len": rec["seq_len"],
                "mixed_precision_param": "float32" if rec["precision"] == "fp32" else "bfloat16"}
    ac: dict[str, Any] = {"mode": {"ffn": "selective"}.get(mode, mode)}
    if mode in ("selective", "ffn"):
        ac["selective_ac_option"] = "op"
    if mode == "ffn":
        notes.append("activation_checkpointing=ffn (recompute the MLP only): no torchtitan mode; "
                     "per-op selective is the nearest")
    sections = {"parallelism": par, "training": training, "activation_checkpoint": ac,
                "compile": {"enable": bool(rec["compile"])}}
    if rec["compile"]:
        sections["compile"]["components"] = ["model", "loss"]
    if rec["float8"]:
        sections["model"] = {"converters": ["quantize.linear.float8"]}
        sections["quantize.linear.float8"] = {"enable_fsdp_float8_all_gather": sharding == "fsdp"}
    notes.append(f"attention={rec['attention']}: torchtitan picks its attention kernel (SDPA/flex) itself")
    notes.append(f"rmsnorm={rec['rmsnorm']}: no torchtitan option for the RMSNorm kernel")
    return sections, notes


def to_torchtitan(row: Mapping[str, Any], sweep: Sweep) -> str:
    """A TOML fragment to merge into a torchtitan train config."""
    rec = layout_record(row, sweep)
    sections, notes = torchtitan_sections(rec)
    lines = [f"# torchtitan config fragment: sweep {sweep.name}, trial {rec['trial_number']}"
             + (f", MFU {100 * rec['mfu']:.2f}%" if rec["mfu"] is not None else ""),
             "# names from pytorch/torchtitan torchtitan/config/job_config.py"]
    lines += [f"# no torchtitan option: {n}" for n in notes]
    if not rec["float8"]:
        lines.append('# float8=false (to enable: [model] converters = ["quantize.linear.float8"])')
    for name, values in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


# ---- Megatron-LM ------------------------------------------------------------------------
def megatron_args(rec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Megatron-LM command-line arguments for a layout, and the knob values it has no flag for."""
    tp, pp, mode = rec["tp"], rec["pp"], rec["activation_checkpointing"]
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--micro-batch-size", str(rec["micro_batch_size"]), "--global-batch-size", str(rec["global_batch_size"]),
            "--seq-length", str(rec["seq_len"])]
    notes: list[str] = []
    if rec["pp_schedule"] == "interleaved":
        args += ["--num-layers-per-virtual-pipeline-stage", str(rec["layers"] // (pp * rec["virtual_stages"]))]
    elif rec["pp_schedule"] == "gpipe" and pp > 1:
        notes.append("pp_schedule=gpipe: Megatron-LM runs 1F1B (same bubble, less activation memory)")
    if rec["sequence_parallel"]:
        args.append("--sequence-parallel")
    if mode == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif mode == "selective":
        args += ["--recompute-granularity", "selective"]
    elif mode == "ffn":
        args += ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]
    args += ["--transformer-impl", "transformer_engine", "--attention-backend", MEGATRON_ATTENTION[rec["attention"]]]
    if rec["attention"] == "eager":
        args.append("--no-masked-softmax-fusion")
    if rec["attention"] in ("sdpa_efficient", "sdpa_math", "flash1"):
        notes.append(f"attention={rec['attention']}: mapped to --attention-backend {MEGATRON_ATTENTION[rec['attention']]}")
    args += ["--normalization", "RMSNorm"]
    notes.append(f"rmsnorm={rec['rmsnorm']}: no flag; Transformer Engine fuses RMSNorm itself")
    if rec["sharding"] == "zero1":
        args.append("--use-distributed-optimizer")
    elif rec["sharding"] == "fsdp":
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    if rec["precision"] == "bf16":
        args.append("--bf16")
    elif rec["precision"] == "fp32":
        notes.append("precision=fp32: Megatron-LM's default (no --bf16/--fp16)")
    if rec["float8"]:
        args += ["--fp8-format", "hybrid"]
    if rec["compile"]:
        notes.append("compile=true: Megatron-LM has no torch.compile flag")
    return args, notes


def to_megatron(row: Mapping[str, Any], sweep: Sweep) -> str:
    """Megatron-LM flags as a shell fragment: comment lines, then the flags one per line."""
    rec = layout_record(row, sweep)
    args, notes = megatron_args(rec)
    lines = [f"# Megatron-LM flags: sweep {sweep.name}, trial {rec['trial_number']}"
             + (f", MFU {100 * rec['mfu']:.2f}%" if rec["mfu"] is not None else ""),
             "# names from NVIDIA/Megatron-LM megatron/training/arguments.py"]
    lines += [f"# no Megatron-LM flag: {n}" for n in notes]
    flags = _pair_flags(args)
    lines += [" ".join(shlex.quote(a) for a in f) + (" \\" if i < len(flags) - 1 else "") for i, f in enumerate(flags)]
    return "\n".join(lines) + "\n"


def _pair_flags(args: list[str]) -> list[list[str]]:
    """Group a flat argument list as [flag, value...] so each flag gets its own line."""
    groups: list[list[str]] = []
    for a in args:
        if a.startswith("--") or not groups:
            groups.append([a])
        else:
            groups[-1].append(a)
    return groups


def _plain(v: Any) -> Any:
    """numpy and pandas scalars as plain Python values (for JSON, YAML and TOML)."""
    return v.item() if hasattr(v, "item") else v


EXPORTERS = {"torchtitan": to_torchtitan, "megatron": to_megatron, "json": to_json, "yaml": to_yaml}
