"""The searchable knobs of a layout, each defined once: its type, allowed values, default and help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Knob:
    """One dimension of the search space."""

    name: str
    kind: type  # int, bool or str
    default: Any
    help: str
    choices: tuple[str, ...] = ()  # for str knobs: the allowed values, in a stable order


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        Knob("tp", int, 1, "tensor-parallel degree (within a node)"),
        Knob("pp", int, 1, "pipeline-parallel degree (number of pipeline stages)"),
        Knob("micro_batch_size", int, 1, "sequences per micro-batch on one data-parallel rank"),
        Knob("sequence_parallel", bool, False, "shard norms and residuals along the sequence (needs tp > 1)"),
        Knob(
            "activation_checkpointing",
            str,
            "none",
            "recompute in backward: none, selective (cheap ops only), ffn (the MLP only), full (every block)",
            ("none", "selective", "ffn", "full"),
        ),
        Knob(
            "attention",
            str,
            "flash2",
            "attention kernel; eager, fused_softmax and sdpa_math materialise the s x s scores",
            ("eager", "fused_softmax", "sdpa_math", "flash1", "flash2", "sdpa_efficient", "cudnn"),
        ),
        Knob("rmsnorm", str, "eager", "RMSNorm kernel: eager (plain ops) or fused", ("eager", "fused")),
        Knob(
            "sharding",
            str,
            "none",
            "data-parallel sharding: none (DDP), zero1 (optimizer states), fsdp (FSDP2, everything)",
            ("none", "zero1", "fsdp"),
        ),
        Knob(
            "pp_schedule",
            str,
            "1f1b",
            "pipeline schedule: 1f1b, gpipe, interleaved (1F1B with virtual stages)",
            ("1f1b", "gpipe", "interleaved"),
        ),
        Knob("virtual_stages", int, 1, "model chunks per pipeline rank for the interleaved schedule"),
        Knob("compile", bool, False, "torch.compile each transformer block"),
        Knob("float8", bool, False, "float8 matmuls (torchao; GPUs with fp8 only)"),
    ]
}

KNOB_NAMES: tuple[str, ...] = tuple(KNOBS)

# Attention kernels that never materialise the s x s score matrix (they keep a log-sum-exp per row).
FLASH_LIKE: frozenset[str] = frozenset({"flash1", "flash2", "sdpa_efficient", "cudnn"})

# Attention kernels each workload kind can run; the plan rejects the others for that kind (rule
# "kernel_not_in_workload"), so the search never spends a job on an answer known in advance.
# The built-in trainer has no flash-attn 1.x path and no fused scale-mask-softmax kernel;
# Megatron-LM maps every value to an --attention-backend and torchtitan picks its own (export.py).
WORKLOAD_ATTENTION: dict[str, frozenset[str]] = {
    "builtin": frozenset(KNOBS["attention"].choices) - {"flash1", "fused_softmax"},
    "megatron": frozenset(KNOBS["attention"].choices),
    "torchtitan": frozenset(KNOBS["attention"].choices),
    "command": frozenset(KNOBS["attention"].choices),
}
