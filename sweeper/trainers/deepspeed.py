"""DeepSpeed: its ZeRO memory recipe, the layouts its engines refuse, and its ds_config.json.

As a workload it is a command of the user's own (a DeepSpeed training script, Megatron-DeepSpeed's
pretrain_gpt.py): the layout reaches the script's own parallelism (tp, its PipelineModule's stages)
through placeholders ({tp}, {pp}, ...), and DeepSpeed's part of it (ZeRO stage, batch sizes,
precision, checkpointing, pipeline) through a ds_config.json written into the trial's folder
(`DeepSpeed.files`), which the command names as `{workdir}/ds_config.json`; `sweep best --format
deepspeed` prints the same file. Its log is read as a plain command's (Megatron-DeepSpeed prints
Megatron-LM's iteration lines).

What its engines assert is read from DeepSpeed DEEPSPEED_VERSION (deepspeed/runtime/engine.py,
runtime/pipe/engine.py, runtime/pipe/schedule.py, runtime/config.py); the tests read every exported
ds_config back with that release's `DeepSpeedConfig`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sweeper.estimate.memory import compute_bytes
from sweeper.spec.memory_options import DeepSpeedMemory, MemoryOptions, StateBytes
from sweeper.trainers.base import TableRecipe
from sweeper.trainers.command import Command
from sweeper.trainers.export import layout_record, provenance_suffix

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep

DEEPSPEED_VERSION = "0.19.8"
# DeepSpeed ZeRO defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size and
# allgather_bucket_size 5e8 elements, stage3_prefetch_bucket_size 5e7 elements.
DEEPSPEED_REDUCE_BUCKET = 5e8
DEEPSPEED_PREFETCH_BUCKET = 5e7
# the ZeRO stage each value of the sharding knob is (`memory.zero_stage` may say another)
ZERO_STAGE = {"none": 0, "zero1": 1, "fsdp": 3}


def zero_stages(sweep: Sweep, sharding: np.ndarray) -> np.ndarray:
    """The ZeRO stage of every row: as `sharding` says, or `memory.zero_stage` where sharding is on."""
    by_knob = np.array([ZERO_STAGE[str(v)] for v in np.atleast_1d(sharding)], dtype=int)
    m = sweep.memory
    given = m.zero_stage if isinstance(m, DeepSpeedMemory) else None
    if given is None:
        return by_knob
    return np.where(np.atleast_1d(sharding) == "none", 0, given)


def grad_accum_dtype(sweep: Sweep) -> str:
    """The dtype DeepSpeed accumulates gradients in: `memory.grad_accum_dtype`, else the parameters'
    (engine.py get_data_types: grad_accum_dtype None is model_dtype)."""
    m = sweep.memory
    given = m.grad_accum_dtype if isinstance(m, DeepSpeedMemory) else None
    return given or ("bf16" if compute_bytes(sweep) < 4 else "fp32")


class DeepSpeedRecipe(TableRecipe):
    """deepspeed: 2 + 2 + 12 bytes per parameter (ZeRO paper, K = 12); stage 1 shards the
    optimizer (master + moments), 2 also gradients, 3 parameters; plus its gradient-reduction
    bucket (reduce_bucket_size elements) and, at stage 3, its prefetch bucket."""

    name = "deepspeed"
    options = DeepSpeedMemory
    # DeepSpeed logs typically show reserved 5-15 % above max allocated
    reserved_factor = 1.10

    def table(self, sweep: Sweep, sharding: str) -> StateBytes:
        e = compute_bytes(sweep)
        params, master = (2.0, 4.0) if e < 4 else (4.0, 0.0)
        grads = 4.0 if (grad_accum_dtype(sweep) == "fp32" or e == 4) else 2.0
        stage = int(zero_stages(sweep, np.array([sharding]))[0])
        sharded = ["master", "optimizer", "grads", "params"][: {0: 0, 1: 2, 2: 3, 3: 4}[stage]]
        return StateBytes.model_validate(
            {"params": params, "grads": grads, "master": master, "optimizer": 8.0, "sharded": sharded}
        )

    def buffers(self, sweep: Sweep, table: StateBytes, params: np.ndarray) -> np.ndarray:
        if not table.sharded:
            return np.zeros(np.shape(params))
        buffers = np.minimum(params, DEEPSPEED_REDUCE_BUCKET) * table.grads
        if "params" in table.sharded:
            buffers = buffers + np.minimum(params, DEEPSPEED_PREFETCH_BUCKET) * compute_bytes(sweep)
        return buffers

    def summary(self, options: MemoryOptions) -> list[str]:
        assert isinstance(options, DeepSpeedMemory)
        stage = options.zero_stage if options.zero_stage is not None else "as sharding says"
        return [f"ZeRO stage {stage}", f"grads {options.grad_accum_dtype or 'bf16'}"]


# ---- the ds_config --------------------------------------------------------------------------
def ds_config(rec: Mapping[str, Any], sweep: Sweep) -> tuple[dict[str, Any], list[str]]:
    """A layout record (`export.layout_record`) as DeepSpeed's config, and what the script, not the
    config, decides (each knob DeepSpeed's config has no field for is named, never dropped)."""
    stage = int(zero_stages(sweep, np.array([rec["sharding"]]))[0])
    zero: dict[str, Any] = {"stage": stage}
    if stage > 0:  # the buckets the memory recipe counts, written so the run holds what was counted
        zero["reduce_bucket_size"] = int(DEEPSPEED_REDUCE_BUCKET)
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = int(DEEPSPEED_PREFETCH_BUCKET)
    config: dict[str, Any] = {
        "train_batch_size": rec["global_batch_size"],
        "train_micro_batch_size_per_gpu": rec["micro_batch_size"],
        "gradient_accumulation_steps": rec["grad_accum"],
        "bf16": {"enabled": rec["precision"] == "bf16"},
        "zero_optimization": zero,
        "data_types": {"grad_accum_dtype": grad_accum_dtype(sweep)},
    }
    notes = [
        "tp, sequence_parallel, cp, attention, rmsnorm, compile and float8 are the script's own: "
        f"tp={rec['tp']}, sequence_parallel={str(bool(rec['sequence_parallel'])).lower()}, "
        f"attention={rec['attention']}, rmsnorm={rec['rmsnorm']}, compile={str(bool(rec['compile'])).lower()}, "
        f"float8={str(bool(rec['float8'])).lower()} (the {{tp}}, ... placeholders of the command)"
    ]
    mode = rec["activation_checkpointing"]
    if mode != "none":
        # deepspeed.checkpointing.checkpoint recomputes what the script wraps in it; this section
        # configures that function (runtime/activation_checkpointing/config.py), not what is wrapped
        config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False}
        wraps = {"full": "every block", "selective": "the attention's cheap ops", "ffn": "the MLP only"}[mode]
        notes.append(f"activation_checkpointing={mode}: the script wraps {wraps} in deepspeed.checkpointing.checkpoint")
    if rec["pp"] > 1:
        # pipe/engine.py reads activation_checkpoint_interval (layers per checkpoint, 0: none) into
        # the PipelineModule; the stage count is the PipelineModule's num_stages, the script's
        config["pipeline"] = {"stages": rec["pp"], "activation_checkpoint_interval": int(mode == "full")}
        notes.append(
            f"pp={rec['pp']}: the script's PipelineModule(num_stages={rec['pp']}, partition_method='uniform'), "
            "run by DeepSpeed's TrainSchedule (1F1B)"
        )
        if stage == 0 and rec["precision"] == "bf16":
            notes.append(
                "ZeRO stage 0 with bf16 under a pipeline: DeepSpeed picks its BF16_Optimizer, which partitions "
                "the fp32 master weights and moments over dp as ZeRO-1 does (the plan counted them whole: "
                "less memory than predicted)"
            )
    return config, notes


def to_deepspeed(row: Mapping[str, Any], sweep: Sweep) -> str:
    """The winner's ds_config.json: DeepSpeed's fields, and under `_sweep` where it comes from and what
    the script decides (DeepSpeedConfig reads no such key; JSON has no comments)."""
    rec = layout_record(row, sweep)
    config, notes = ds_config(rec, sweep)
    source = f"sweep {sweep.name}{provenance_suffix(rec)}; fields of DeepSpeed {DEEPSPEED_VERSION} runtime/config.py"
    config["_sweep"] = {"source": source, "not_in_ds_config": notes}
    return json.dumps(config, indent=2) + "\n"


# ---- the trainer ----------------------------------------------------------------------------
class DeepSpeed(Command):
    """A DeepSpeed training script run as the sweep's command, its memory held as ZeRO holds it."""

    kind = "deepspeed"
    recipe = DeepSpeedRecipe()
    # pipe/schedule.py TrainSchedule steps 2 * (micro_batches + stages - 1) with any number of
    # micro-batches (one per stage or fewer included: each stage runs its m forwards and backwards)
    runs_short_1f1b = True
    lacks: ClassVar[Mapping[str, Mapping[Any, str]]] = {
        "pp_schedule": {
            "interleaved": "its PipelineEngine runs one schedule, TrainSchedule (1F1B), with no virtual stages",
            "gpipe": "its PipelineEngine runs one schedule, TrainSchedule (1F1B), no all-forward-all-backward",
        },
    }
    exports = {"deepspeed": to_deepspeed}

    def refuses(self, cols: Columns, sweep: Sweep) -> np.ndarray:
        """pipe/engine.py PipelineEngine.__init__ asserts "ZeRO-2 and ZeRO-3 are incompatible with
        pipeline parallelism"; engine.py _do_optimizer_sanity_check raises "unsupported mix of
        model_dtype and grad_accum_dtype" without ZeRO where the two differ."""
        stages = zero_stages(sweep, cols["sharding"])
        mixed = grad_accum_dtype(sweep) != ("bf16" if compute_bytes(sweep) < 4 else "fp32")
        return ((cols["pp"] > 1) & (stages >= 2)) | ((stages == 0) & mixed)

    def refusal(self, cols: Columns, sweep: Sweep, i: int) -> str:
        stage = int(zero_stages(sweep, cols["sharding"])[i])
        pp, sharding = int(cols["pp"][i]), cols["sharding"][i]
        m = sweep.memory
        given = "memory.zero_stage" if isinstance(m, DeepSpeedMemory) and m.zero_stage is not None else ""
        what = f"ZeRO stage {stage} (sharding = {sharding}{', ' + given if given else ''})"
        if pp > 1 and stage >= 2:
            return (
                f"the deepspeed trainer cannot run pp = {pp} with {what}: its PipelineEngine asserts "
                '"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" (ZeRO-1 runs)'
            )
        return (
            f"the deepspeed trainer cannot run {what} with gradients accumulated in {grad_accum_dtype(sweep)} "
            f'and {sweep.trial.precision} parameters: its engine raises "unsupported mix of model_dtype and '
            'grad_accum_dtype" without ZeRO'
        )

    def cp_refusal(self, cols: Columns, i: int) -> str:
        return (
            "the deepspeed trainer runs no context parallelism (cp > 1): its sequence parallelism is "
            "Ulysses (sequence_parallel_size, an all-to-all over heads), not the ring or all-gather the plan prices"
        )

    def files(self, rec: Mapping[str, Any], sweep: Sweep) -> dict[str, str]:
        return {"ds_config.json": to_deepspeed(rec, sweep)}
