"""The sweep file's cluster sizes and the run's goal: `cluster.nodes` as one node count or a list of
them, and `goal:`, the training run a layout is chosen for (its tokens, the price of a GPU-hour, the
limits on days and cost), which `sweeper.estimate.cost` turns into days, GPU-hours and cost."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_NODES = 100_000


def node_counts(v: Any) -> Any:
    """`cluster.nodes` checked before pydantic: one line naming the field, whatever is wrong. A list
    is sorted; each count is a whole number 1 to MAX_NODES, given once."""
    values = v if isinstance(v, list) else [v]
    bad = [x for x in values if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_NODES]
    if not values or bad:
        raise ValueError(
            f"cluster.nodes: {bad[0] if bad else '[]'!r} not allowed; allowed: a whole number of nodes "
            f"1 to {MAX_NODES}, or a list of them"
        )
    if len(set(values)) != len(values):
        raise ValueError(f"cluster.nodes lists a node count twice: {values}")
    return sorted(values) if isinstance(v, list) else v


class GoalSpec(BaseModel):
    """The training run the layout is for: its tokens, and what a GPU-hour costs (any currency)."""

    # as strict as the rest of the sweep file (sweeper.spec.schema._Strict)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    tokens: float = Field(gt=0, le=1e18, description="tokens the whole training run processes")
    gpu_hour_cost: float | None = Field(default=None, ge=0, le=1e9, description="price of one GPU-hour")
    max_days: float | None = Field(default=None, gt=0, le=1e6, description="the run must end within this many days")
    max_cost: float | None = Field(default=None, gt=0, le=1e18, description="the run must cost at most this")

    @model_validator(mode="after")
    def _cost_needs_price(self) -> GoalSpec:
        if self.max_cost is not None and self.gpu_hour_cost is None:
            raise ValueError("goal.max_cost needs goal.gpu_hour_cost (the price of one GPU-hour)")
        return self


def goal_line(goal: GoalSpec) -> str:
    """`goal: 1e+12 tokens, 2 per GPU-hour, max_days 30, max_cost 2.5e+05`: every field the goal sets."""
    parts = [f"{goal.tokens:.3g} tokens"]
    parts += [] if goal.gpu_hour_cost is None else [f"{goal.gpu_hour_cost:g} per GPU-hour"]
    parts += [] if goal.max_days is None else [f"max_days {goal.max_days:g}"]
    parts += [] if goal.max_cost is None else [f"max_cost {goal.max_cost:g}"]
    return "goal: " + ", ".join(parts)
