"""A sweep over several node counts replayed from a table whose answer is known (issue 45's tests):
every candidate layout of every size, 10 steps each with 1 % noise, so every trial has an interval."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sweeper.plan.plan import Plan, make_plan
from sweeper.spec.loader import parse_sweep
from tests.conftest import base_spec

SIZES = (8, 16, 32)
SPACE = {"tp": [2, 4], "pp": [1, 2], "micro_batch_size": [1], "attention": ["flash2"]}


def sizes_spec(tmp: Path, goal: dict[str, Any]) -> dict[str, Any]:
    return base_spec(
        name="sizes",
        results_dir=str(tmp / "results"),
        space=SPACE,
        cluster={"nodes": list(SIZES), "gpus_per_node": 8, "gpu": "a100-80gb"},
        goal=goal,
    )


def write_sizes_sweep(tmp: Path, goal: dict[str, Any], step_s: Callable[[Plan, int, int, int], float]) -> Path:
    """The sweep file of a replayed sweep over SIZES; `step_s(plan, row, nodes, i)` is the mean step of
    the i-th candidate of that size (plan row `row`). Its budget covers every candidate."""
    spec = sizes_spec(tmp, goal)
    plan = make_plan(parse_sweep(yaml.safe_dump(spec)))
    rng = np.random.default_rng(0)
    rows = []
    for n in SIZES:
        cands = [int(r) for r in ((plan.nodes == n) & plan.candidate_mask).nonzero()[0]]
        assert len(cands) >= 2, f"{n} nodes: fewer than two layouts fit"
        for i, r in enumerate(cands):
            times = [float(x) for x in step_s(plan, r, n, i) * (1 + 0.01 * rng.standard_normal(10))]
            rows.append(plan.layout(r).as_dict() | {"nodes": n, "status": "ok", "step_times_s": times})
    table = tmp / "table.parquet"
    pd.DataFrame(rows).to_parquet(table)
    budget = int(plan.candidate_mask.sum())
    path = tmp / "sizes.yaml"
    path.write_text(
        yaml.safe_dump(
            spec | {"launcher": {"kind": "replay", "table": str(table)}, "search": {"max_trials": budget, "seed": 0}}
        )
    )
    return path
