"""The validity rule: which layouts break it, over columns, and why, for one row.

Below `sweeper.layouts.layout` (which lists every rule in `RULES`) and the modules that hold groups of
rules (`sweeper.layouts.moe`), so that those can build rules without importing the list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.knobs import Columns
from sweeper.statuses import PlanReason

if TYPE_CHECKING:
    # the sweep file's loader checks sweeps against the rules: no import of the spec at run time
    from sweeper.spec.sweep import Sweep


@dataclass(frozen=True)
class Rule:
    """A validity rule: `broken` marks the rows that violate it; `explain` says why for one row;
    `detail`, where given, says it shorter after `summary` in the dry run's count of the reason
    (the value and the limit: `flash1 (builtin trainer has: ...)`); else `explain` does."""

    code: PlanReason
    summary: str
    broken: Callable[[Columns, Sweep], np.ndarray]
    explain: Callable[[Columns, Sweep, int], str]
    detail: Callable[[Columns, Sweep, int], str] | None = None


def scalar(v: Any) -> Any:
    """A numpy scalar as the Python value it holds; anything else as it is."""
    return v.item() if isinstance(v, np.generic) else v


def at(cols: Columns, name: str, i: int) -> Any:
    """Column `name` in row `i`, as a Python value (what a rule's message shows)."""
    return scalar(cols[name][i])
