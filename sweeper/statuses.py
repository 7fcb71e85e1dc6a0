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

    def succeeded(self) -> bool:
        """It ran its steps and measured them."""
        return self is TrialStatus.OK

    def is_failure(self) -> bool:
        """Counts as MFU 0 for the search: anything but a measured run."""
        return self is not TrialStatus.OK

    def teaches_memory(self) -> bool:
        """Says something about the layout's memory need (an OOM bounds it from below, a run from above)."""
        return self in (TrialStatus.OK, TrialStatus.OOM)


class PlanStatus(StrEnum):
    """What the plan says of one layout of the cross product."""

    CANDIDATE = "candidate"  # valid and predicted to fit: may be run
    INVALID = "invalid"  # breaks a validity rule, or runs identically to another layout
    PRUNED = "pruned"  # valid, but predicted not to fit in GPU memory

    def runnable(self) -> bool:
        return self is PlanStatus.CANDIDATE
