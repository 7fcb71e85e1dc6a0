"""The measured answer of a sweep, computed once: which trial wins `--by` time or cost, at which node
count, the trials it is ranked among, and its lead over the runner-up. Every output of a finished
sweep (`sweep best` in each format, `sweep run`'s closing lines, `status`, `report`, `compare`)
takes its winner from `measured_answer`, so none can name another.

Over several node counts the winner is the size `plan.sizes.winner` names (the fastest, or the
cheapest, of the measured sizes meeting the goal's limits) and its best trial; it is ranked only
among the trials of its own node count, and the noise and tie lines compare it with the runner-up
of that same size (a 16-node trial's MFU says nothing of a 32-node answer). A sweep of one size
without a goal is ranked by MFU, as ever. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sweeper.plan.sizes import Marks, SizeAnswer, Winner, answers, marks, winner
from sweeper.statuses import TrialStatus

if TYPE_CHECKING:
    from sweeper.results.noise import Margin
    from sweeper.spec.sweep import Sweep

# `--by` when none is given (sweep best's default; what status, run and report answer for)
DEFAULT_BY = Winner.time


@dataclass(frozen=True)
class Answer:
    """The winner of a finished sweep for one `--by`, and the trials it was ranked among."""

    by: Winner
    sweep: Sweep  # the sweep at the answer's node count: what its exports are written for
    nodes: int | None  # the node count it answers for; None: no measured size meets the goal's limits
    ranked: list[Mapping[str, Any]]  # the ok trials of that node count, best first (the winner first)
    found: list[SizeAnswer] | None = None  # the answer per node count (None: one size, no goal)
    marks: Marks | None = None
    several: bool = False  # the sweep runs over several node counts

    @property
    def row(self) -> Mapping[str, Any] | None:
        """The winning trial's row (None: no ok trial, or no size meets the goal's limits)."""
        return self.ranked[0] if self.ranked else None

    def top(self, n: int) -> list[Mapping[str, Any]]:
        return self.ranked[:n]

    def margin(self) -> Margin | None:
        """The winner against the runner-up of its own node count (None with fewer than two)."""
        from sweeper.results.noise import margin

        return margin(self.ranked[0], self.ranked[1]) if len(self.ranked) >= 2 else None

    def where(self) -> str:
        """` at 32 nodes` over several node counts (the node count the answer is for), else ``."""
        return f" at {self.nodes} node(s)" if self.several and self.nodes is not None else ""

    def line(self) -> str:
        """One line naming the answer: `--by time: 32 node(s), trial 3, the fastest measured run`."""
        if self.row is None:
            if self.found is not None and any(a.measured for a in self.found):
                return f"--by {self.by.value}: no measured node count meets the goal's limits"
            return f"--by {self.by.value}: no successful trial"
        what = "fastest" if self.by is Winner.time else "cheapest"
        size = f"{self.nodes} node(s), " if self.nodes is not None else ""
        return f"--by {self.by.value}: {size}trial {self.row['trial_number']}, the {what} measured run"


def measured_answer(rows: Sequence[Mapping[str, Any]], sweep: Sweep, by: Winner | None = None) -> Answer:
    """The answer of `rows` (a sweep's results) `--by` time or cost (`DEFAULT_BY` when None)."""
    by = by or DEFAULT_BY
    ok = [r for r in rows if r.get("status") == TrialStatus.OK and r.get("mfu") is not None and r["mfu"] == r["mfu"]]
    if not sweep.several_sizes and sweep.goal is None:
        ranked = sorted(ok, key=lambda r: (-r["mfu"], r["trial_number"]))
        return Answer(by, sweep, sweep.cluster.nodes, ranked)
    from sweeper.plan.plan import make_plan

    found = answers(make_plan(sweep), rows)
    chosen = winner(found, by)
    marked = marks(found, sweep.goal)
    if chosen is None or chosen.trial_number is None:
        return Answer(by, sweep, None, [], found, marked, sweep.several_sizes)
    nodes = chosen.nodes
    same = [r for r in ok if _nodes(r, sweep) == nodes]
    # the order measured_best ranks by: tokens/s (at one node count, MFU's order), the earlier on a tie
    ranked = sorted(same, key=lambda r: (-_speed(r, sweep), r["trial_number"]))
    first = next(i for i, r in enumerate(ranked) if r["trial_number"] == chosen.trial_number)
    ranked.insert(0, ranked.pop(first))
    return Answer(by, sweep.at(nodes), nodes, ranked, found, marked, sweep.several_sizes)


def _nodes(row: Mapping[str, Any], sweep: Sweep) -> int:
    n = row.get("nodes")
    return sweep.cluster.nodes if n is None or n != n else int(n)


def _speed(row: Mapping[str, Any], sweep: Sweep) -> float:
    """Tokens/s as `plan.sizes.measured_best` reads it: the column, else the batch over the mean step."""
    v = row.get("tokens_per_s")
    if v is not None and v == v:
        return float(v)
    step = row.get("step_time_mean_s")
    return sweep.global_batch_size * sweep.seq_len / float(step) if step and step == step else 0.0
