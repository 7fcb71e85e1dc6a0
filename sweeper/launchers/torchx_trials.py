"""What the torchx launcher decides about its trials without asking torchx: node 0's master port of
each trial in flight (no two on one), and a trial's result from its replicas' reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sweeper.errors import SweepError
from sweeper.launchers.base import TrialJob, failure
from sweeper.launchers.replica import parse_reports
from sweeper.launchers.task import node0_result, nodes_oom, with_nodes_oom
from sweeper.results.trial import TrialResult
from sweeper.runtime.evidence import INFRASTRUCTURE_FAILURE
from sweeper.statuses import TrialStatus

PORTS = 1000  # master ports a sweep's trials take turns on: master_port to master_port + 999


class PortPool:
    """The master port offset each trial in flight holds (trial number -> offset below PORTS)."""

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def take(self, number: int) -> int:
        """Trial `number`'s offset: its number modulo PORTS where no trial in flight holds that, else
        the next free one (trials 1000 apart collided on `master_port + trial % 1000`)."""
        if number not in self.held:
            taken = set(self.held.values())
            free = next((o for k in range(PORTS) if (o := (number + k) % PORTS) not in taken), None)
            if free is None:
                raise SweepError(f"launcher: {PORTS} torchx trials in flight hold every master port; run fewer at once")
            self.held[number] = free
        return self.held[number]

    def get(self, number: int) -> int | None:
        return self.held.get(number)

    def keep(self, number: int, offset: int) -> None:
        """A re-attached trial's offset, as its submit recorded it."""
        self.held[number] = offset % PORTS

    def free(self, number: int) -> None:
        self.held.pop(number, None)


def trial_outcome(
    reports: dict[int, dict[str, Any]], job: TrialJob, *, app: str, state: str, cancelled: bool, log_tail: str = ""
) -> tuple[TrialResult, bool]:
    """The trial's result from its replicas' reports (`replica.parse_reports`) once its app ended in
    `state`, and whether it failed around the trial (retried once). Node 0 speaks for the trial; a rank
    any node saw killed for memory (its own evidence) makes a failure an OOM."""
    oom = nodes_oom(reports)
    result = node0_result(reports[0], job) if 0 in reports else None
    if result is None:
        if cancelled:
            reason, infrastructure = f"torchx app {app} was cancelled ({state})", False
        else:  # a replica died without its report, or the scheduler lost it: retried once
            reason = f"{INFRASTRUCTURE_FAILURE}: torchx app {app} ended {state} without a result from node 0"
            infrastructure = oom is None
        result = failure(TrialStatus.OOM if oom else TrialStatus.FAILED, f"{reason}\n{log_tail}".strip(), job)
        if oom:
            result.error = f"{oom}; {result.error}"
        return result, infrastructure
    result = with_nodes_oom(result, reports)  # another node's rank killed for memory: an OOM, not retried
    return result, result.status == TrialStatus.FAILED and str(result.error or "").startswith(INFRASTRUCTURE_FAILURE)


def reports_left(folder: Path) -> dict[int, dict[str, Any]]:
    """The reports replicas left in the trial's folder, where they could reach it (`replica._leave_report`)."""
    lines = []
    for path in sorted(folder.glob("replica-*.json")):
        try:
            lines.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return parse_reports(lines)
