"""A winning layout carried into the trainers people use: torchtitan, Megatron-LM flags, data.

Pure functions of one results row and its sweep (no torch). A knob value that a trainer has no
option for is named in a comment of the output, never dropped in silence. Each export names the
trainer release it targets; the tests parse every one with that release's own parser.

- torchtitan 0.2.x (`--format torchtitan`): a TOML fragment for `--job.config_file`, names from
  torchtitan/config/job_config.py of 0.2.2 (`Parallelism`, `Training`, `ActivationCheckpoint`,
  `Compile`, `Quantize.linear.float8` enabled by `model.converters = ["quantize.linear.float8"]`).
- torchtitan 0.3.x (`--format torchtitan-cli`): 0.3 dropped TOML; a run is `--module M --config F`
  (a Python config function) plus tyro command-line overrides (`--section.field VALUE`,
  booleans as `--section.field` / `--section.no-field`, activation checkpointing as the
  subcommand `activation-checkpoint:{none,selective,full}`); names from torchtitan/config/configs.py,
  torchtitan/trainer.py and torchtitan/distributed/activation_checkpoint.py of 0.3.0.
- Megatron-LM: megatron/training/arguments.py (`add_megatron_arguments`, `validate_args`) at
  NVIDIA/Megatron-LM c1e938b (May 2026, the last commit before main required Python 3.12).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sweeper.knobs import KNOBS
from sweeper.layouts.stages import split_layers
from sweeper.text import for_comment, shell_word, toml_string
from sweeper.trainers.export_changes import change_notes
from sweeper.trainers.export_model import megatron_model_flags, model_comment, model_fields
from sweeper.trainers.export_moe import (
    megatron_cp_moe_args,
    megatron_recompute_modules,
    moe_fields,
    torchtitan_cp_ep,
    torchtitan_model,
)

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

TORCHTITAN_SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
# our attention kernels -> Megatron-LM's --attention-backend (flash, fused = cuDNN via TE, unfused)
MEGATRON_ATTENTION = {
    "flash1": "flash",
    "flash2": "flash",
    "cudnn": "fused",
    "sdpa_efficient": "fused",
    "fused_softmax": "unfused",
    "eager": "unfused",
    "sdpa_math": "unfused",
}
TORCHTITAN_TOML_VERSION = "0.2.2"  # the last release configured by TOML
TORCHTITAN_CLI_VERSION = "0.3.0"
MEGATRON_COMMIT = "c1e938b03902ab688cf4ac1ce1eaebe7a5a17dcf"
# the module that holds the output projection in torchtitan's Llama: renamed in 0.3
TORCHTITAN_OUTPUT = {TORCHTITAN_TOML_VERSION: "output", TORCHTITAN_CLI_VERSION: "lm_head"}


def layout_record(row: Mapping[str, Any], sweep: Sweep) -> dict[str, Any]:
    """The layout of a results row as plain data: knobs, derived sizes, the sweep's fixed shape and its MFU;
    a mixture of experts adds its model fields and total and active parameters (`export_moe.moe_fields`)."""
    knobs = {k: _plain(row.get(k)) for k in KNOBS}
    for k, knob in KNOBS.items():  # a row written before a knob existed ran at its default (etp: tp)
        if knobs[k] is None or (knob.follows and knobs[k] == knob.default):
            knobs[k] = knobs[knob.follows] if knob.follows else knob.default
    # a layout the plan predicts best (`sweep best --plan`) says so: no trial measured it
    predicted = {"predicted": True, "pred_mfu": _plain(row.get("pred_mfu"))} if row.get("predicted") else {}
    return {
        "sweep": sweep.name,
        "trial_number": _plain(row.get("trial_number")),
        "mfu": _plain(row.get("mfu")),
        **predicted,
        **knobs,
        "dp": _plain(row.get("dp")),
        "grad_accum": _plain(row.get("grad_accum")),
        "num_devices": _plain(row.get("num_devices")),
        "nodes": sweep.cluster.nodes,  # the node count the layout was chosen for, of this many GPUs each
        "gpus_per_node": sweep.cluster.gpus_per_node,
        "seq_len": sweep.seq_len,
        "global_batch_size": sweep.global_batch_size,
        "layers": sweep.model.layers,
        "precision": sweep.trial.precision,
        **moe_fields(sweep),
        "model_shape": model_fields(sweep),  # every model field, none dropped (export_model)
    }


def provenance(rec: Mapping[str, Any]) -> str:
    """Where an exported layout comes from, for its first comment line: its trial and MFU, or the
    plan's prediction, which no trial measured ("" for a layout of neither)."""
    if rec.get("predicted"):
        mfu = rec.get("pred_mfu")
        return "predicted by the plan, not measured (no trial ran it)" + (
            f", predicted MFU {100 * mfu:.1f}%" if mfu is not None else ""
        )
    if rec.get("trial_number") is None:
        return ""
    return f"trial {rec['trial_number']}" + (f", MFU {100 * rec['mfu']:.2f}%" if rec.get("mfu") is not None else "")


def provenance_suffix(rec: Mapping[str, Any]) -> str:
    """`, trial 12, MFU 45.00%, chosen for 8 node(s)` (or the prediction) to follow the sweep's name in a header."""
    source = provenance(rec)  # and the node count it was chosen for: at another size it has another dp
    chosen = f", chosen for {rec['nodes']} node(s)" if rec.get("nodes") is not None else ""
    return (f", {source}" if source else "") + chosen


def to_json(row: Mapping[str, Any], sweep: Sweep) -> str:
    return json.dumps(layout_record(row, sweep), indent=2)


def to_yaml(row: Mapping[str, Any], sweep: Sweep) -> str:
    import yaml

    rec = layout_record(row, sweep)
    note = for_comment(f"# sweep {sweep.name}: {provenance(rec)}") + "\n" if rec.get("predicted") else ""
    return note + yaml.safe_dump(rec, sort_keys=False)


def pipeline_stages(rec: Mapping[str, Any]) -> tuple[int, ...]:
    """Layers of every pipeline stage in order (pp*virtual_stages of them when interleaved); () without pp."""
    pp = rec["pp"]
    if pp <= 1:
        return ()
    chunks = rec["virtual_stages"] if rec["pp_schedule"] == "interleaved" else 1
    return split_layers(rec["layers"], pp * chunks)


# ---- torchtitan -------------------------------------------------------------------------
def _torchtitan_dp(rec: Mapping[str, Any], version: str) -> tuple[int, int, list[str]]:
    """(replicate degree, shard degree, notes): DDP only where torchtitan accepts it."""
    tp, pp, dp, sharding = rec["tp"], rec["pp"], rec["dp"], rec["sharding"]
    if sharding == "fsdp":
        return 1, dp, []
    if version == TORCHTITAN_CLI_VERSION:
        # models/llama3/parallelize.py (0.3.0) has no DDP path: it always applies fully_shard over the
        # dp_replicate x fsdp mesh, so shard degree 1 keeps whole weights and all-reduces gradients
        kept = (
            "the weights the same way" if sharding == "none" else "the whole optimizer state on every rank (no ZeRO-1)"
        )
        return (
            dp,
            1,
            [f"sharding={sharding}: torchtitan 0.3 has no DDP; replicate degree = dp, shard degree 1 keeps {kept}"],
        )
    if tp > 1 or pp > 1:
        # models/llama3/infra/parallelize.py (0.2.2): DDP only when the dp_replicate mesh is the
        # whole world, else RuntimeError("DDP has not supported > 1D parallelism")
        return (
            1,
            dp,
            [
                (
                    f'sharding={sharding} with tp/pp > 1: torchtitan raises "DDP has not supported > 1D '
                    'parallelism"; written as FSDP over dp (data_parallel_shard_degree)'
                )
            ],
        )
    notes = (
        [
            (
                "sharding=zero1: torchtitan has no optimizer-only sharding; written as DDP "
                "(data_parallel_replicate_degree), FSDP is data_parallel_shard_degree"
            )
        ]
        if sharding == "zero1"
        else []
    )
    return dp, 1, notes


def _torchtitan_parts(rec: Mapping[str, Any], version: str) -> list[list[str]] | None:
    """Module names of every pipeline stage: our split (`sweeper.layouts.stages.split_layers`) spelled out.

    torchtitan's own split counts the embedding and the output as layers
    (pipeline_parallel_first/last_stage_less_layers) and derives the stage count from
    pipeline_parallel_layers_per_stage by ceil((layers + 2) / per_stage), which need not be
    pp*virtual_stages; naming the modules of each stage makes it exactly the split that was measured.
    """
    counts = pipeline_stages(rec)
    if not counts:
        return None
    parts, start = [], 0
    for i, n in enumerate(counts):
        names = [f"layers.{j}" for j in range(start, start + n)]
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(counts) - 1:
            names += ["norm", TORCHTITAN_OUTPUT[version]]
        parts.append(names)
        start += n
    return parts


def _torchtitan_common(rec: Mapping[str, Any], version: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The parallelism and training fields both torchtitan forms share, and notes."""
    tp, pp, mbs = rec["tp"], rec["pp"], rec["micro_batch_size"]
    replicate, shard, notes = _torchtitan_dp(rec, version)
    cp_ep, replicate, shard, cp_ep_notes = torchtitan_cp_ep(rec, replicate, shard, version == TORCHTITAN_TOML_VERSION)
    notes += cp_ep_notes
    par: dict[str, Any] = {
        "tensor_parallel_degree": tp,
        "pipeline_parallel_degree": pp,
        "data_parallel_shard_degree": shard,
        "data_parallel_replicate_degree": replicate,
        **cp_ep,
    }
    if pp > 1:
        par["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULE[rec["pp_schedule"]]
        par["pipeline_parallel_microbatch_size"] = mbs
        par["module_fqns_per_model_part"] = _torchtitan_parts(rec, version)
        counts = pipeline_stages(rec)
        if len(set(counts)) > 1:
            notes.append(
                f"uneven pipeline split {'/'.join(map(str, counts))} layers per stage, "
                "written as module_fqns_per_model_part"
            )
    # with pipelining torchtitan splits local_batch_size into micro-batches; without, it accumulates
    local = mbs * rec["grad_accum"] if pp > 1 else mbs
    training = {
        "local_batch_size": local,
        "global_batch_size": rec["global_batch_size"],
        "seq_len": rec["seq_len"],
        "mixed_precision_param": "float32" if rec["precision"] == "fp32" else "bfloat16",
    }
    if rec["activation_checkpointing"] == "ffn":
        notes.append(
            "activation_checkpointing=ffn (recompute the MLP only): no torchtitan mode; selective is the nearest"
        )
    notes.append(f"attention={rec['attention']}: torchtitan picks its attention kernel (SDPA/flex) itself")
    notes.append(f"rmsnorm={rec['rmsnorm']}: no torchtitan option for the RMSNorm kernel")
    return par, training, notes


def torchtitan_sections(rec: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """torchtitan 0.2.x TOML sections for a layout, and the knob values it has no option for."""
    par, training, notes = _torchtitan_common(rec, TORCHTITAN_TOML_VERSION)
    model, model_notes = torchtitan_model(rec, version_02=True)
    notes += model_notes
    mode = rec["activation_checkpointing"]
    par["enable_async_tensor_parallel"] = False
    par["disable_loss_parallel"] = False  # the built-in trainer computes the loss vocab-parallel too
    if rec["tp"] > 1 and not rec["sequence_parallel"]:
        notes.append("sequence_parallel=false: torchtitan 0.2 always shards norms along the sequence under TP")
    ac: dict[str, Any] = {"mode": {"ffn": "selective"}.get(mode, mode)}
    if mode in ("selective", "ffn"):
        ac["selective_ac_option"] = "op"
    sections: dict[str, dict[str, Any]] = {
        "parallelism": par,
        "training": training,
        "activation_checkpoint": ac,
        "compile": {"enable": bool(rec["compile"])},
    }
    if rec["compile"]:
        sections["compile"]["components"] = ["model", "loss"]
    if model:
        sections["model"] = dict(model)
    if rec["float8"]:
        sections.setdefault("model", {})["converters"] = ["quantize.linear.float8"]
        sections["quantize.linear.float8"] = {"enable_fsdp_float8_all_gather": par["data_parallel_shard_degree"] > 1}
    return sections, notes


def to_torchtitan(row: Mapping[str, Any], sweep: Sweep) -> str:
    """A TOML fragment to merge into a torchtitan 0.2.x train config (`--job.config_file`)."""
    rec = layout_record(row, sweep)
    sections, notes = torchtitan_sections(rec)
    lines = [
        f"# torchtitan {TORCHTITAN_TOML_VERSION} config fragment: sweep {sweep.name}{provenance_suffix(rec)}",
        (
            f"# names from pytorch/torchtitan {TORCHTITAN_TOML_VERSION} torchtitan/config/job_config.py; "
            f"torchtitan {TORCHTITAN_CLI_VERSION} and later take no TOML: see --format torchtitan-cli"
        ),
    ]
    lines += [f"# no torchtitan option: {n}" for n in notes]
    lines += [f"# {n}" for n in change_notes(rec, sweep, "torchtitan")]
    lines += [f"# {n}" for n in model_comment(sweep, "torchtitan")]
    if not rec["float8"]:
        lines.append('# float8=false (to enable: [model] converters = ["quantize.linear.float8"])')
    lines = [for_comment(x) for x in lines]  # text from elsewhere (a sweep's, a file's) ends no comment
    for name, values in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def torchtitan_cli_args(rec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """torchtitan 0.3.x command-line overrides for a layout (tyro syntax), and notes.

    The activation-checkpointing subcommand comes last: tyro reads what follows it as its own options.
    """
    par, training, notes = _torchtitan_common(rec, TORCHTITAN_CLI_VERSION)
    args: list[str] = []
    for key, value in par.items():
        if key == "module_fqns_per_model_part":
            args += [f"--parallelism.{key}", *(",".join(part) for part in value)]
        else:
            args += [f"--parallelism.{key}", str(value)]
    if rec["tp"] > 1:
        args.append(_tyro_bool("parallelism.enable_sequence_parallel", bool(rec["sequence_parallel"])))
    if rec["cp"] > 1:
        # distributed/full_dtensor.py validate_config: the default spmd_types backend refuses cp with
        # SDPA ("Use FlexAttention + CP"); partial_dtensor wraps SDPA in context parallelism itself
        args += ["--parallelism.spmd_backend", "partial_dtensor"]
    for key, value in training.items():
        args += [f"--training.{key}", str(value)]
    if rec["pp"] > 1 or rec["ep"] > 1:
        # Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet",
        # nor expert parallel with the all-to-all token dispatcher (its CPU synchronization)
        args.append("--training.disable_cuda_graphs")
    args.append(_tyro_bool("compile.enable", bool(rec["compile"])))
    if rec["compile"]:
        args += ["--compile.components", "model,loss"]
    if rec["float8"]:
        notes.append(
            "float8=true: torchtitan 0.3 has no command-line switch; pick a --config function whose "
            "model_spec has converters=[Float8LinearConverter.Config()] (e.g. llama3_debugmodel_float8)"
        )
    mode = rec["activation_checkpointing"]
    args.append(f"activation-checkpoint:{ {'ffn': 'selective'}.get(mode, mode) }")
    return args, notes


def to_torchtitan_cli(row: Mapping[str, Any], sweep: Sweep) -> str:
    """torchtitan 0.3.x overrides as a shell fragment: comments, then one override per line."""
    rec = layout_record(row, sweep)
    args, notes = torchtitan_cli_args(rec)
    model, model_notes = torchtitan_model(rec, version_02=False)
    module, config = model.get("module", "llama3"), model.get("config", "<your config function>")
    lines = [
        f"# torchtitan {TORCHTITAN_CLI_VERSION} overrides: sweep {sweep.name}{provenance_suffix(rec)}",
        f"# append to: torchrun ... -m torchtitan.train --module {module} --config {config}",
        f"# names from pytorch/torchtitan {TORCHTITAN_CLI_VERSION} torchtitan/config/configs.py and trainer.py",
    ]
    lines += [f"# no torchtitan option: {n}" for n in notes + model_notes]
    lines += [f"# {n}" for n in change_notes(rec, sweep, "torchtitan-cli")]
    lines += [f"# {n}" for n in model_comment(sweep, "torchtitan")]
    return "\n".join([for_comment(x) for x in lines] + _shell_lines(args)) + "\n"


def _tyro_bool(name: str, value: bool) -> str:
    """tyro's boolean flags: --a.b sets it, --a.no-b clears it (there is no --a.b=false)."""
    section, _, field = name.rpartition(".")
    return f"--{name}" if value else f"--{section}.no-{field}"


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


# ---- Megatron-LM ------------------------------------------------------------------------
def megatron_args(rec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Megatron-LM command-line arguments for a layout, and the knob values it has no flag for."""
    tp, pp, mode = rec["tp"], rec["pp"], rec["activation_checkpointing"]
    args = [
        "--tensor-model-parallel-size",
        str(tp),
        "--pipeline-model-parallel-size",
        str(pp),
        "--micro-batch-size",
        str(rec["micro_batch_size"]),
        "--global-batch-size",
        str(rec["global_batch_size"]),
        "--seq-length",
        str(rec["seq_len"]),
    ]
    notes: list[str] = []
    pipe, notes_pp = _megatron_pipeline(rec)
    args += pipe
    notes += notes_pp
    if rec["sequence_parallel"]:
        args.append("--sequence-parallel")
    args += megatron_cp_moe_args(rec)
    if mode == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif mode == "selective":
        args += ["--recompute-granularity", "selective"]
    elif mode == "ffn":
        args += ["--recompute-granularity", "selective", "--recompute-modules", *megatron_recompute_modules(rec)]
    args += ["--transformer-impl", "transformer_engine", "--attention-backend", MEGATRON_ATTENTION[rec["attention"]]]
    if rec["attention"] == "eager":
        args.append("--no-masked-softmax-fusion")
    if rec["attention"] in ("sdpa_efficient", "sdpa_math", "flash1"):
        notes.append(
            f"attention={rec['attention']}: mapped to --attention-backend {MEGATRON_ATTENTION[rec['attention']]}"
        )
    args += ["--normalization", "RMSNorm"]
    notes.append(f"rmsnorm={rec['rmsnorm']}: no flag; Transformer Engine fuses RMSNorm itself")
    if rec["sharding"] == "zero1":
        args.append("--use-distributed-optimizer")
    elif rec["sharding"] == "fsdp":
        # validate_args: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format."
        args += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            "optim_grads_params",
            "--ckpt-format",
            "fsdp_dtensor",
        ]
    if rec["precision"] == "bf16":
        args.append("--bf16")
    elif rec["precision"] == "fp32":
        notes.append("precision=fp32: Megatron-LM's default (no --bf16/--fp16)")
    if rec["float8"]:
        args += ["--fp8-format", "hybrid"]
    if rec["compile"]:
        notes.append("compile=true: Megatron-LM has no torch.compile flag")
    return args, notes


def _megatron_pipeline(rec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Pipeline flags: the classic ones for even splits, else the explicit stage layout.

    --decoder-first/last-pipeline-num-layers only make the first and last stage differ, while
    split_layers puts the remainder on middle stages; --pipeline-model-parallel-layout names every
    stage ("E" embedding, "t" a layer, "L" the loss, stages split by "|", pp*v of them when interleaved).
    """
    counts = pipeline_stages(rec)
    if not counts:
        return [], []
    interleaved = len(counts) > rec["pp"]
    args: list[str] = []
    notes: list[str] = []
    if len(set(counts)) > 1:
        stages = [
            ("E" if i == 0 else "") + f"t*{n}" + (",L" if i == len(counts) - 1 else "") for i, n in enumerate(counts)
        ]
        args += ["--pipeline-model-parallel-layout", "|".join(stages)]
        notes.append(
            f"uneven pipeline split {'/'.join(map(str, counts))} layers per stage, "
            "written as --pipeline-model-parallel-layout"
        )
    elif interleaved:
        args += ["--num-layers-per-virtual-pipeline-stage", str(counts[0])]
    if rec["pp_schedule"] == "gpipe":
        notes.append("pp_schedule=gpipe: Megatron-LM runs 1F1B (same bubble, less activation memory)")
    return args, notes


def megatron_env(rec: Mapping[str, Any]) -> tuple[dict[str, str | None], list[str]]:
    """Environment a Megatron-LM run of this layout needs (None = must be unset), with the reasons.

    validate_args (GPUs before Blackwell): tensor or context parallelism without FSDP asserts
    CUDA_DEVICE_MAX_CONNECTIONS == "1"; Megatron-FSDP asserts it is not "1".
    """
    if rec["sharding"] == "fsdp":
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}, [
            "CUDA_DEVICE_MAX_CONNECTIONS must not be 1: Megatron-FSDP refuses it"
        ]
    if rec["tp"] > 1 or rec["cp"] > 1:
        what = "tensor parallelism" if rec["tp"] > 1 else "context parallelism"
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, [
            f"CUDA_DEVICE_MAX_CONNECTIONS=1: {what} needs it on GPUs before Blackwell"
        ]
    return {}, []


def to_megatron(row: Mapping[str, Any], sweep: Sweep) -> str:
    """Megatron-LM flags as a shell fragment: comment lines, then the flags one per line."""
    rec = layout_record(row, sweep)
    args, notes = megatron_args(rec)
    _, env_notes = megatron_env(rec)
    lines = [
        f"# Megatron-LM flags: sweep {sweep.name}{provenance_suffix(rec)}",
        f"# names from NVIDIA/Megatron-LM megatron/training/arguments.py at {MEGATRON_COMMIT[:7]}",
    ]
    lines += [f"# environment: {n}" for n in env_notes]
    lines += [f"# no Megatron-LM flag: {n}" for n in notes]
    lines += [f"# {n}" for n in change_notes(rec, sweep, "megatron")]
    lines.append(f"# the model (add to your command): {' '.join(megatron_model_flags(sweep))}")
    return "\n".join([for_comment(x) for x in lines] + _shell_lines(args)) + "\n"


def _shell_lines(args: list[str]) -> list[str]:
    """Arguments as shell lines, one flag and its values a line, joined by continuations."""
    flags = _pair_flags(args)
    return [" ".join(shell_word(a) for a in f) + (" \\" if i < len(flags) - 1 else "") for i, f in enumerate(flags)]


def _pair_flags(args: list[str]) -> list[list[str]]:
    """Group a flat argument list as [flag, value...] so each flag gets its own line."""
    groups: list[list[str]] = []
    for a in args:
        if a.startswith("--") or not groups or ":" in a:
            groups.append([a])
        else:
            groups[-1].append(a)
    return groups


def _plain(v: Any) -> Any:
    """numpy and pandas scalars as plain Python values (for JSON, YAML and TOML)."""
    return v.item() if hasattr(v, "item") else v
