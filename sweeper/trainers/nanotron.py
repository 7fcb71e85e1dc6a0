"""nanotron (huggingface/nanotron): its step-time traits, the knob values it cannot run, its YAML
config (`sweep best --format nanotron`) and its iteration log.

Everything here is read from nanotron at NANOTRON_COMMIT, the commit the Ultra-Scale Playbook sweep
ran (../shared/data/ultrascale/README.md): src/nanotron/config/ (the config's dataclasses, loaded
by `get_config_from_file` through dacite with strict=True), trainer.py, logging.py,
parallel/pipeline_parallel/engine.py, models/llama.py and parallel/tensor_parallel/functional.py.
Its model states are Megatron-LM's table (`NanotronRecipe`); its loss is its own.

A nanotron run reads one YAML file (`run_train.py --config-file F`; no other command-line
option), so as a workload it takes no `{flags}`: each trial's config is written into its folder as
`nanotron.yaml` (`Nanotron.files`), which the command names as `{workdir}/nanotron.yaml`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import yaml

from sweeper.errors import SweepError
from sweeper.estimate.memory import compute_bytes
from sweeper.spec.memory_options import NanotronMemory, StateBytes
from sweeper.spec.traits import PipelineStall, TimeTraits
from sweeper.text import for_comment
from sweeper.trainers.base import EnvNeeds, ParsedLog, Recipe, TableRecipe, Trainer
from sweeper.trainers.export import layout_record, provenance_suffix
from sweeper.trainers.export_changes import change_notes
from sweeper.trainers.export_model import model_fields

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep

NANOTRON_COMMIT = "c252843039cc167ff8d6894b87172af4637eb14b"  # 2025-03-10

# How nanotron's steps depart from Megatron-LM's (sweeper.estimate.step_time.TimeTraits). The costs were
# chosen on the FIT cells of the ultrascale sweep only (benchmarks/throughput_accuracy.py reports
# the held-out cells apart), by grids over their values or fits; the loss's bytes are counted from
# nanotron's code; the others are measured behaviours, not mechanisms traced to a line of nanotron.
NANOTRON_TIME = TimeTraits(
    # ZeRO-0 with pp > 1 pays its data-parallel gradient reduction every micro-batch: in the sweep,
    # ZeRO-1 over ZeRO-0 at the same layout is 1.0x (median) at pp = 1 and up to 63x at pp > 1,
    # growing with the micro-batches (64-128). ZeRO-0 wraps the model in DDP (trainer.py
    # `init_model`, `make_ddp`) and the pipeline engine decides per backward whether DDP syncs
    # (engine.py `_get_bwd_context`: `grad_accumulator.no_sync()`, `ddp_trigger_sync_in_bwd`)
    grad_sync_per_microbatch_pp=True,
    # its tensor-parallel collectives cost ~0.1 ms each (Megatron-LM's: 15 us) and ~0.3 ms under
    # the pipeline engine. 0.1 ms: the best median Spearman of the fit cells over a grid of
    # tp_collective_s {15, 50, 100, 200, 300 us} x microbatch_s {1, 3, 10, 30 ms} (fit 0.81 -> 0.82,
    # held-out 0.81 -> 0.82, held-out median |error| 39 % -> 35 %; microbatch_s stays 1 ms)
    tp_collective_s=1e-4,
    tp_collective_pp_s=3e-4,
    # at pp > 1 a run either takes its layout's time or ~1.2 s more on every micro-batch, at any
    # model size, tp, pp or micro-batch; the share that stalls grows with the nodes (the sweep's
    # pp > 1 rows: ~5 % on 1-2 nodes, ~20 % on 4-16, 44 % on 32, 97 % on 64). Fitted on the fit
    # cells' 495 pp > 1 rows, 131 of them stalled (benchmarks/throughput_stall.py prints the fit):
    # the share a logistic in the nodes, half at 33.9 nodes, width 14.6 (10 % on 1 node, 23 % on
    # 16, 47 % on 32, 89 % on 64); 1.15 s, the stalled rows' median excess per micro-batch. Priced
    # as the typical run's cost (1.15 s per micro-batch on 64 nodes, none below 33.9): priced as
    # its expected cost (share x 1.15 s) the held-out median Spearman is 0.72 (typical: 0.87) and
    # the median |error| 55 % (27 %), the 80-95 % of runs that do not stall paying for the others.
    # It replaces a cost of nodes^2 x 0.1 ms per micro-batch (0.4 s on 64 nodes)
    pp_stall=PipelineStall(seconds=1.15, half_nodes=33.9, width=14.6, priced="typical"),
    # the fp32 loss's elementwise passes over the last stage's vocab/tp logits (models/llama.py Loss
    # calls sharded_cross_entropy(..., dtype=torch.float); tensor_parallel/functional.py
    # _ShardedCrossEntropy), bytes per logit: forward the bf16 -> fp32 cast 2 + 4, max 4,
    # `- logits_max` 4 + 4, exp 4 + 4, sum 4, div_ 4 + 4; backward mul_ by the output's gradient
    # 4 + 4 and the cast back to bf16 4 + 2: 52. Counted, not fitted: on the sweep's pp = 1 runs
    # that did not stall the model was optimistic by 1.43x at 1B, 1.24x at 3B, 1.12x at 8B (the
    # 128k vocabulary weighs most on the smallest model)
    loss_traffic_per_logit=52.0,
    # within 10 % of the card its steps run up to 2x slower (the caching allocator's retries; the
    # sweep shows 4x at the median there, 1x chosen)
    memory_pressure=1.0,
)


class NanotronRecipe(TableRecipe):
    """nanotron with accumulate_grad_in_fp32 (the playbook's config, and the export's): bf16
    parameters 2, an fp32 gradient accumulation buffer 4 for every parameter (optim/
    gradient_accumulator.py FP32GradientAccumulator: "we need to accumulate gradients for all
    parameters", ZeRO-1 or not), fp32 master weights 4 and AdamW moments 8, both sharded over dp by
    ZeRO-1 (helpers.py init_optimizer_and_grad_accumulator builds the accumulator's master copies on
    the rank's shard): Megatron-LM's table with its distributed optimizer as `sharding` says. Under
    fp32 compute there is no separate master copy, as in the megatron recipe."""

    name = "nanotron"
    options = NanotronMemory
    reserved_factor = 1.10  # the megatron recipe's; nanotron leaves PYTORCH_CUDA_ALLOC_CONF alone too

    def table(self, sweep: Sweep, sharding: str) -> StateBytes:
        e = compute_bytes(sweep)
        params, master = (2.0, 4.0) if e < 4 else (4.0, 0.0)
        sharded = ["master", "optimizer"] if sharding != "none" else []
        return StateBytes.model_validate(
            {"params": params, "grads": 4.0, "master": master, "optimizer": 8.0, "sharded": sharded}
        )

    def loss_bytes(self, cols: Columns, sweep: Sweep) -> tuple[np.ndarray | float, np.ndarray | float]:
        # models/llama.py Loss calls sharded_cross_entropy(..., dtype=torch.float): the e-byte logits
        # cast to an fp32 copy that lives through the forward, then (tensor_parallel/functional.py
        # _ShardedCrossEntropy) `sharded_logits - logits_max` out of place, a second fp32 tensor,
        # exponentiated and normalised in place and kept for backward; backward works in place on
        # it. Peak: the logits, the cast and the kept softmax (e + 8), 4 of them kept. On the
        # sweep's pp = 1 runs (rank 0 holds the loss) this brings the allocated estimate's median
        # |error| from 12 % (Megatron-LM's in-place loss, e + 4) to 8 %
        return 4.0, float(compute_bytes(sweep)) + 4.0


# ---- the config file ------------------------------------------------------------------------
PP_ENGINE = {"1f1b": "1f1b", "gpipe": "afab"}  # config/utils_config.py cast_str_to_pipeline_engine
# config/models_config.py LlamaConfig's defaults: what a run gets for a value the sweep's model lacks
LLAMA_DEFAULTS: dict[str, Any] = {"bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
# the values of the user's run, not of the layout: the export marks each for replacing (YAML key -> what)
RUN_PLACEHOLDERS = {
    "train_steps": "the trial's step count; your run's steps",
    "lr_warmup_steps": "your run's warm-up",
    "learning_rate": "your run's learning rate",
    "tokenizer_name_or_path": "your tokenizer",
    "dataset": "null runs nanotron's dummy data; your dataset",
}


def nanotron_config(rec: Mapping[str, Any], sweep: Sweep) -> tuple[dict[str, Any], list[str]]:
    """A layout record (`export.layout_record`) as nanotron's config (the YAML's mapping), and the
    knob values and model settings it has no field for."""
    m = sweep.model
    if rec["sharding"] == "fsdp":  # zero_stage 0 or 1 would hold each stage's full weights and gradients
        raise SweepError(
            "sharding=fsdp: nanotron has no FSDP (its optimizer shards at most the optimizer state, "
            "zero_stage: 1), so this layout cannot be exported as run; export a sweep whose "
            "space.sharding is [none, zero1]"
        )
    if rec["pp"] > 1 and rec["pp_schedule"] not in PP_ENGINE:
        raise SweepError(
            f"pp_schedule={rec['pp_schedule']}: nanotron has no interleaved pipeline engine (pp_engine is 1f1b "
            "or afab), so this layout cannot be exported as run; export a sweep whose space.pp_schedule is "
            "[1f1b, gpipe]"
        )
    notes: list[str] = []
    sp = bool(rec["sequence_parallel"]) and rec["tp"] > 1
    notes += _dropped_knobs(rec)
    if rec["attention"] != "flash2":
        notes.append(
            f"attention={rec['attention']}: nanotron's Llama always calls flash-attn 2 (flash_attn_varlen_func)"
        )
    if rec["rmsnorm"] != "fused":
        notes.append(f"rmsnorm={rec['rmsnorm']}: nanotron's Llama always runs its fused TritonRMSNorm")
    if m.mlp != "swiglu" or m.norm != "rmsnorm" or m.position != "rope" or m.qk_norm:
        notes.append(
            f"model mlp={m.mlp}, norm={m.norm}, position={m.position}: nanotron's Llama is SwiGLU, RMSNorm, RoPE"
        )
    biases = [b for b in ("qkv_bias", "attention_bias", "mlp_bias") if getattr(m, b)]
    if biases:
        notes.append(f"model {', '.join(f'{b}=true' for b in biases)}: nanotron's Llama has no biases")
    if m.head_dim and m.head_dim * m.heads != m.hidden:
        notes.append(f"model head_dim={m.head_dim}: nanotron's LlamaConfig derives it as hidden / heads")
    shape = model_fields(sweep)
    given = ("norm_eps", "rope_theta", "max_positions")
    notes += [
        f"model {k}: not given by the sweep's model; nanotron's LlamaConfig value written"
        for k in given
        if shape[k] is None
    ]
    tokens, token_notes = _token_ids(sweep)
    notes += token_notes
    parallelism = {
        "dp": rec["dp"],
        "tp": rec["tp"],
        "pp": rec["pp"],
        "pp_engine": PP_ENGINE.get(rec["pp_schedule"], "1f1b"),  # at pp = 1 no engine runs
        # REDUCE_SCATTER is its sequence parallelism (parallelism_config.py docstring); the async
        # linear layers go with it, as in the playbook's generator (scripts/scaling_benchmarks.py)
        "tp_mode": "REDUCE_SCATTER" if sp else "ALL_REDUCE",
        "tp_linear_async_communication": sp,
        "recompute_layer": rec["activation_checkpointing"] == "full",  # the whole decoder layer
        "tp_recompute_allgather": True,
        "expert_parallel_size": 1,
    }
    model_config = {
        "bos_token_id": tokens["bos_token_id"],
        "eos_token_id": tokens["eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": m.hidden,
        "initializer_range": 0.02,
        "intermediate_size": m.ffn,
        "is_llama_config": True,
        "max_position_embeddings": max(rec["seq_len"], shape["max_positions"] or 0),
        "num_attention_heads": m.heads,
        "num_hidden_layers": m.layers,
        "num_key_value_heads": m.kv_heads,
        "pad_token_id": tokens.get("pad_token_id"),
        "pretraining_tp": 1,
        "rms_norm_eps": shape["norm_eps"] or LLAMA_DEFAULTS["rms_norm_eps"],
        "rope_scaling": shape["rope_scaling"],
        "rope_theta": shape["rope_theta"] or LLAMA_DEFAULTS["rope_theta"],
        "rope_interleaved": False,
        "tie_word_embeddings": bool(m.tied_embeddings),
        "use_cache": True,
        "vocab_size": m.vocab,
    }
    config = {
        "general": {
            "project": "sweep",
            "run": f"{rec['sweep']}-" + ("predicted" if rec.get("predicted") else f"trial{rec['trial_number']}"),
            "seed": 42,
        },
        "parallelism": parallelism,
        "model": {
            "ddp_bucket_cap_mb": 25,
            "dtype": "float32" if rec["precision"] == "fp32" else "bfloat16",
            "init_method": {"std": 0.02},
            "make_vocab_size_divisible_by": 1,
            "model_config": model_config,
        },
        "tokenizer": {"tokenizer_name_or_path": None},
        "checkpoints": {"checkpoints_path": "checkpoints", "checkpoint_interval": 1000, "save_final_state": False},
        "logging": {"iteration_step_info_interval": 1, "log_level": "info", "log_level_replica": "info"},
        "tokens": {
            "sequence_length": rec["seq_len"],
            "train_steps": sweep.trial.steps,
            "micro_batch_size": rec["micro_batch_size"],
            "batch_accumulation_per_replica": rec["grad_accum"],
        },
        "optimizer": {
            "optimizer_factory": {
                "name": "adamW",
                "adam_beta1": 0.9,
                "adam_beta2": 0.95,
                "adam_eps": 1e-8,
                "torch_adam_is_fused": True,
            },
            # ZeRO-1 shards the fp32 master weights and Adam moments over dp (optim/zero.py)
            "zero_stage": 1 if rec["sharding"] == "zero1" else 0,
            "weight_decay": 0.01,
            "clip_grad": 1.0,
            "accumulate_grad_in_fp32": True,  # what NanotronRecipe counts
            "learning_rate_scheduler": {
                "learning_rate": 3e-4,
                "lr_warmup_steps": 1,
                "lr_warmup_style": "linear",
                "lr_decay_style": "cosine",
                "min_decay_lr": 3e-5,
            },
        },
        # dataset null: run_train.py's dummy_infinite_data_generator (put your dataset here)
        "data_stages": [
            {
                "name": "stable",
                "start_training_step": 1,
                "data": {"dataset": None, "seed": 42, "num_loading_workers": 1},
            }
        ],
    }
    return config, notes


def _dropped_knobs(rec: Mapping[str, Any]) -> list[str]:
    """The knob values nanotron's config has no field for, each named (docs/exports.md: never dropped)."""
    out = []
    if rec["activation_checkpointing"] not in ("none", "full"):
        out.append(
            f"activation_checkpointing={rec['activation_checkpointing']}: nanotron recomputes whole layers "
            "(recompute_layer) or nothing; written as recompute_layer: false (more activation memory)"
        )
    if rec["compile"]:
        out.append("compile=true: nanotron has no torch.compile option")
    if rec["float8"]:
        out.append("float8=true: nanotron's Llama has no float8 option at this commit")
    return out


def _token_ids(sweep: Sweep) -> tuple[dict[str, Any], list[str]]:
    """bos, eos and pad ids as the config.json gives them, else LlamaConfig's; and what was not given
    or had to change (nanotron's eos_token_id is one integer: of a list the first is written)."""
    given = dict(sweep.model_file.token_ids) if sweep.model_file is not None else {}
    ids: dict[str, Any] = {k: given.get(k, LLAMA_DEFAULTS[k]) for k in ("bos_token_id", "eos_token_id")}
    if "pad_token_id" in given and not isinstance(given["pad_token_id"], list):
        ids["pad_token_id"] = given["pad_token_id"]
    missing = [k for k in ("bos_token_id", "eos_token_id") if k not in given]
    notes = [f"model {', '.join(missing)}: not given by a config.json; nanotron's LlamaConfig value written"]
    notes = notes if missing else []
    for key in ("bos_token_id", "eos_token_id"):
        if isinstance(ids[key], list):
            notes.append(f"model {key}={ids[key]}: nanotron takes one id; the first, {ids[key][0]}, written")
            ids[key] = ids[key][0]
    return ids, notes


def launch_command(rec: Mapping[str, Any], sweep: Sweep) -> str:
    """How the config runs: nanotron's run_train.py under torchrun on every node, with the
    environment its examples set (examples/train_tiny_llama.sh) and its async TP layers assert."""
    cl = sweep.cluster
    rdzv = " --rdzv_backend c10d --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT" if cl.nodes > 1 else ""
    return f"CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes {cl.nodes} --nproc_per_node {cl.gpus_per_node}{rdzv} run_train.py --config-file config.yaml"


def to_nanotron(row: Mapping[str, Any], sweep: Sweep) -> str:
    """nanotron's YAML config for the winner, with its launch command and notes as comments."""
    rec = layout_record(row, sweep)
    config, notes = nanotron_config(rec, sweep)
    lines = [
        f"# nanotron config: sweep {sweep.name}{provenance_suffix(rec)}",
        f"# fields of huggingface/nanotron src/nanotron/config/ at {NANOTRON_COMMIT[:8]}",
        f"# launch, on every node, from nanotron's repository: {launch_command(rec, sweep)}",
    ]
    lines += [f"# no nanotron field: {n}" for n in notes]
    lines += [f"# {n}" for n in change_notes(rec, sweep, "nanotron")]
    lines.append("# the values marked `# placeholder` are your run's, not the layout's: replace them")
    return "\n".join(for_comment(x) for x in lines) + "\n" + mark_placeholders(yaml.safe_dump(config, sort_keys=False))


def mark_placeholders(text: str) -> str:
    """The YAML with a `# placeholder: ...` comment after each value of the user's run (RUN_PLACEHOLDERS)."""
    out = []
    for line in text.splitlines():
        key = line.strip().split(":", 1)[0]
        what = RUN_PLACEHOLDERS.get(key)
        out.append(f"{line}  # placeholder: {what}" if what and not line.rstrip().endswith(":") else line)
    return "\n".join(out) + "\n"


# ---- the log --------------------------------------------------------------------------------
# logging.py LoggerWriter.add_scalars_from_list joins "iteration: {step} / {total}" and every
# LogItem of trainer.py train_step_logs as "tag: human_format(value)" with " | ":
#  "iteration: 3 / 10 | consumed_tokens: 3.15M | elapsed_time_per_iteration_ms: 1.23K | tokens_per_sec: 851K |
#   tokens_per_sec_per_gpu: 106K | global_batch_size: 768 | lm_loss: 11.4 | lr: 0.0003 | model_tflops_per_gpu: 389 |
#   hardware_tflops_per_gpu: 389 | grad_norm: 1.23 | cuda_memory_allocated: 12.3G | cuda_max_memory_reserved: 45.6G ..."
_VALUE = r"(-?[\d.]+(?:[eE][-+]?\d+)?)([KMGTPE]?)"
_ITER = re.compile(r"iteration: (\d+) / \d+ \|")
_FIELDS = {
    name: re.compile(rf"\| {name}: {_VALUE}(?: \||\s*$)")
    for name in ("elapsed_time_per_iteration_ms", "lm_loss", "model_tflops_per_gpu", "cuda_max_memory_reserved")
}
# logging.py log_memory (rank 0, the first five iterations, peak statistics reset after each):
#  " Memory usage: 1234.56MiB. Peak allocated 2345.67MiB. Peak reserved: 3456.78MiB"
_MEMORY = re.compile(r"Peak allocated ([\d.]+)MiB\. Peak reserved: ([\d.]+)MiB")
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}  # human_format divides by 1000


def _human(m: re.Match[str]) -> float:
    return float(m.group(1)) * _SCALE[m.group(2)]


def parse_nanotron(text: str) -> ParsedLog:
    """Step times (elapsed_time_per_iteration_ms, 3 significant digits), losses, model TFLOP/s and
    the peak memory of nanotron's log (run with logging.iteration_step_info_interval 1)."""
    out = ParsedLog()
    for line in text.splitlines():
        mem = _MEMORY.search(line)
        if mem:
            out.peak_mem_gib = max(out.peak_mem_gib or 0.0, float(mem.group(1)) / 1024)
            out.peak_mem_reserved_gib = max(out.peak_mem_reserved_gib or 0.0, float(mem.group(2)) / 1024)
            continue
        if not _ITER.search(line):
            continue
        found = {name: pattern.search(line) for name, pattern in _FIELDS.items()}
        if (ms := found["elapsed_time_per_iteration_ms"]) is None:
            continue
        out.step_times_s.append(_human(ms) / 1000)
        if (loss := found["lm_loss"]) is not None:
            out.losses.append(_human(loss))
        if (tf := found["model_tflops_per_gpu"]) is not None:
            out.reported_tflops.append(_human(tf))
        if (reserved := found["cuda_max_memory_reserved"]) is not None:  # bytes
            out.peak_mem_reserved_gib = max(out.peak_mem_reserved_gib or 0.0, _human(reserved) / 2**30)
    return out


class Nanotron(Trainer):
    """nanotron's run_train.py on its YAML config."""

    kind = "nanotron"
    recipe: ClassVar[Recipe] = NanotronRecipe()
    # models/llama.py CausalSelfAttention calls flash_attn_varlen_func (flash-attn 2) and nothing else
    attention: ClassVar[frozenset[str]] = frozenset({"flash2"})
    # engine.py OneForwardOneBackwardPipelineEngine.train_batch_iter warms up pp - rank - 1 forwards
    # and asserts "Number of microbatches (m) must be at least PP_SIZE-1": m = pp - 1 runs (the
    # sweep has 50 such runs, pp 2 with one micro-batch), fewer is refused (`fewest_1f1b_microbatches`)
    runs_short_1f1b = True
    lacks: ClassVar[Mapping[str, Mapping[Any, str]]] = {
        "sharding": {"fsdp": "no FSDP; optimizer.zero_stage is 0 or 1 (ZeroDistributedOptimizer is ZeRO-1)"},
        "pp_schedule": {"interleaved": "parallelism.pp_engine is 1f1b or afab, no interleaved engine"},
        "activation_checkpointing": {
            "selective": "parallelism.recompute_layer recomputes whole decoder layers only (full)",
            "ffn": "parallelism.recompute_layer recomputes whole decoder layers only (full)",
        },
        "compile": {True: "no torch.compile in its config or its Llama"},
        "float8": {True: "no float8 field in its config; its Llama builds bf16 linear layers"},
    }
    time = NANOTRON_TIME
    exports = {"nanotron": to_nanotron}

    def fewest_1f1b_microbatches(self, pp: np.ndarray) -> np.ndarray:
        return np.maximum(np.asarray(pp) - 1, 1)

    def env(self, rec: Mapping[str, Any]) -> EnvNeeds:
        # parallel/utils.py assert_cuda_max_connections_set_to_1 guards its async TP linear layers
        # (tensor_parallel/functional.py), which the config turns on with sequence parallelism
        if rec["tp"] > 1 and rec["sequence_parallel"]:
            return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, [
                "CUDA_DEVICE_MAX_CONNECTIONS=1: nanotron's async tensor-parallel linear layers assert it"
            ]
        return {}, []

    def files(self, rec: Mapping[str, Any], sweep: Sweep) -> dict[str, str]:
        return {"nanotron.yaml": to_nanotron(rec, sweep)}

    def parse_log(self, text: str, sweep: Sweep) -> ParsedLog:
        return parse_nanotron(text)
