"""Where an export runs a layout otherwise than it was measured: what changes, in memory and time.

A trainer without an option for a knob value gets the nearest it has (torchtitan 0.3 has no
optimizer-only sharding and replicates; torchtitan 0.2 runs DDP only as the sole parallelism;
Megatron-LM runs 1F1B for GPipe; nanotron recomputes whole layers or nothing; torchtitan has no
MLP-only recompute). Each export then says, beside the knob, what the layout as written costs next to
the layout as measured: the memory model's per-GPU optimizer state and allocated peak, and the
throughput model's step time, both of the sweep (its memory recipe and its trainer's traits,
uncalibrated), so the numbers are the plan's own, moved by that one knob.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sweeper.estimate.memory import estimate
from sweeper.estimate.predict import predict
from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Layout

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

GIB = 2**30


def as_written(rec: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """The knob values the `fmt` export writes in place of the layout's ({}: it writes the layout as measured)."""
    out: dict[str, Any] = {}
    sharding, mode = rec["sharding"], rec["activation_checkpointing"]
    if fmt == "torchtitan-cli" and sharding == "zero1":
        out["sharding"] = "none"  # FSDP2 with shard degree 1: whole weights, gradients and optimizer state
    if fmt == "torchtitan" and sharding != "fsdp":
        out["sharding"] = "fsdp" if (rec["tp"] > 1 or rec["pp"] > 1) else "none"
        if out["sharding"] == sharding:
            del out["sharding"]
    if fmt in ("torchtitan", "torchtitan-cli") and mode == "ffn":
        out["activation_checkpointing"] = "selective"
    if fmt == "megatron" and rec["pp"] > 1 and rec["pp_schedule"] == "gpipe":
        out["pp_schedule"] = "1f1b"
    if fmt == "nanotron" and mode in ("selective", "ffn"):
        out["activation_checkpointing"] = "none"
    return out


# the trainer each export runs on (`workload.kind`)
FORMAT_TRAINER = {
    "torchtitan": "torchtitan",
    "torchtitan-cli": "torchtitan",
    "megatron": "megatron",
    "nanotron": "nanotron",
}
# what `selective` recomputes in each trainer, where it is not the built-in trainer's (which saves every
# matmul and attention output and recomputes the elementwise ops: sweeper/runtime/parallel.py SAC_SAVE_OPS)
SELECTIVE = {
    "torchtitan": "torchtitan's op-level selective checkpointing (SelectiveAC) also recomputes every second "
    "matmul: more time and less activation memory than the plan counts",
    "megatron": "Megatron-LM's --recompute-granularity selective recomputes the core attention "
    "(--recompute-modules core_attn) and keeps the elementwise ops: the attention kernel runs twice",
}


def change_notes(rec: Mapping[str, Any], sweep: Sweep, fmt: str) -> list[str]:
    """Comment lines (without `# `) for each knob the `fmt` export writes otherwise: the value written
    and what it changes per GPU (optimizer state, allocated peak against the card) and in step time, by
    the plan's models; and where `selective` means another recomputation than the sweep's trainer's."""
    trainer = FORMAT_TRAINER.get(fmt)
    other = trainer is not None and trainer != sweep.workload.kind
    # a layout measured by this trainer ran as written: then only the plan's count differs
    head = "runs otherwise than measured" if other else "runs otherwise than the plan counted"
    notes = []
    if trainer in SELECTIVE and rec["activation_checkpointing"] == "selective" and other:
        notes.append(f"{head}: activation_checkpointing=selective: {SELECTIVE[trainer]}")
    changes = as_written(rec, fmt)
    if not changes:
        return notes
    measured = Layout.from_mapping({k: rec[k] for k in KNOBS})
    written = Layout.from_mapping({k: rec[k] for k in KNOBS} | changes)
    before, after = _priced(measured, sweep), _priced(written, sweep)
    what = ", ".join(f"{k}={rec[k]} runs as {v}" for k, v in changes.items())
    card = after["card"]
    over = " (over the card)" if after["allocated"] > card else ""
    return notes + [
        f"{head}: {what}: per GPU, optimizer state {before['optimizer']:.2f} -> {after['optimizer']:.2f} GiB, allocated "
        f"{before['allocated']:.1f} -> {after['allocated']:.1f} GiB of {card:.1f} usable{over}; step time "
        f"{before['step_s']:.3g} -> {after['step_s']:.3g} s (the plan's models, uncalibrated)"
    ]


def _priced(layout: Layout, sweep: Sweep) -> dict[str, float]:
    cols = layout.columns(sweep)
    mem = estimate(cols, sweep)
    return {
        "optimizer": float(mem.optimizer[0]) / GIB,
        "allocated": float(mem.allocated[0]) / GIB,
        "card": mem.capacity_bytes / GIB,
        "step_s": float(predict(cols, sweep).total[0]),
    }
