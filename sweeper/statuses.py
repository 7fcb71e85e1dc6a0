"""The statuses of the domain, each defined once: what a trial ended as, and what the plan said of a layout.

`StrEnum`, so a status is stored in Parquet and JSON as its plain string and compares equal to
it; the questions the rest of the code asks of a status are methods here, in the manner of
Optuna's `TrialState`.
"""

from __future__ import annotations

from enum import StrEnum


class TrialStatus(StrEnum):
    """How one trial ended."""

    OK = "ok"
    OOM = "oom"
    KERNEL_UNAVAILABLE = "kernel_unavailable"
    TIMEOUT = "timeout"
    FAILED = "failed"
    STOPPED_EARLY = "stopped_early"  # its first steps were clearly slower than the best so far: stopped

    def succeeded(self) -> bool:
        """It ran its steps and measured them."""
        return self is TrialStatus.OK

    def is_failure(self) -> bool:
        """Counts as MFU 0 for the search: anything but a measured run."""
        return self is not TrialStatus.OK

    def was_stopped(self) -> bool:
        """Stopped by the search (Optuna's PRUNED): its steps were measured, slower than the best."""
        return self is TrialStatus.STOPPED_EARLY

    def retried(self) -> bool:
        """A crash that is not the layout's memory, kernel or time: run once more before writing the layout off."""
        return self is TrialStatus.FAILED

    def is_oom(self) -> bool:
        """Ran out of device memory: every layout that needs at least as much would too."""
        return self is TrialStatus.OOM

    def teaches_memory(self) -> bool:
        """Says something about the layout's memory need (an OOM bounds it from below, a run from above)."""
        return self in (TrialStatus.OK, TrialStatus.OOM)


class PlanStatus(StrEnum):
    """What the plan says of one layout of the cross product."""

    CANDIDATE = "candidate"  # valid and predicted to fit: may be run
    INVALID = "invalid"  # breaks a validity rule, runs identically to another layout, or the launcher cannot run it
    PRUNED = "pruned"  # valid, but predicted not to fit in GPU memory
    UNCERTAIN = "uncertain"  # predicted over the card, but within the estimate's measured error: may be run

    def runnable(self) -> bool:
        return self in (PlanStatus.CANDIDATE, PlanStatus.UNCERTAIN)


class PlanReason(StrEnum):
    """Why the plan did not make a layout a candidate: one code per validity rule, and two more."""

    WORLD_NOT_DIVISIBLE = "world_not_divisible"
    TP_EXCEEDS_NODE = "tp_exceeds_node"
    HEADS_NOT_DIVISIBLE = "heads_not_divisible"
    KV_HEADS_NOT_DIVISIBLE = "kv_heads_not_divisible"
    FFN_NOT_DIVISIBLE = "ffn_not_divisible"
    PP_EXCEEDS_LAYERS = "pp_exceeds_layers"
    BATCH_NOT_DIVISIBLE = "batch_not_divisible"
    SEQ_NOT_DIVISIBLE = "seq_not_divisible"
    TOO_FEW_MICROBATCHES = "too_few_microbatches"
    INTERLEAVED_VIRTUAL_STAGES = "interleaved_virtual_stages"
    INTERLEAVED_LAYERS = "interleaved_layers"
    INTERLEAVED_MICROBATCHES = "interleaved_microbatches"
    KERNEL_NOT_IN_WORKLOAD = "kernel_not_in_workload"
    KNOB_NOT_IN_TRAINER = "knob_not_in_trainer"
    COMBINATION_NOT_IN_TRAINER = "combination_not_in_trainer"
    FLOAT8_UNSUPPORTED = "float8_unsupported"
    CP_SEQ_NOT_DIVISIBLE = "cp_seq_not_divisible"
    CP_NOT_IN_WORKLOAD = "cp_not_in_workload"
    EP_WITHOUT_EXPERTS = "ep_without_experts"
    EP_EXPERTS_NOT_DIVISIBLE = "ep_experts_not_divisible"
    EP_NOT_IN_DP_CP = "ep_not_in_dp_cp"
    ETP_FFN_NOT_DIVISIBLE = "etp_ffn_not_divisible"
    EXPERT_WORLD_NOT_DIVISIBLE = "expert_world_not_divisible"
    EXPERTS_NOT_IN_WORKLOAD = "experts_not_in_workload"
    EP_NEEDS_SP = "ep_needs_sp"
    DUPLICATE = "duplicate"  # runs identically to another layout (a knob with no effect there)
    LAUNCHER_CANNOT_RUN = "launcher_cannot_run"  # the sweep's launcher cannot run it (a replay table lacks it)
    MEMORY = "memory"  # predicted not to fit: the layout is pruned, not invalid
    MEMORY_UNCERTAIN = "memory_uncertain"  # predicted over the card within the estimate's error: uncertain

    def status(self) -> PlanStatus:
        """The plan status this reason gives a layout."""
        if self is PlanReason.MEMORY_UNCERTAIN:
            return PlanStatus.UNCERTAIN
        return PlanStatus.PRUNED if self is PlanReason.MEMORY else PlanStatus.INVALID
