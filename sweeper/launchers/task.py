"""What runs in each task of a job that a launcher started on a cluster: the sweep's trainer, for one layout.

No launcher owns this module: every launcher whose trials are jobs of tasks on nodes (SLURM
today; Kubernetes, Ray or a cloud batch service tomorrow) starts `tasks_per_node(sweep)` tasks on
each of the cluster's nodes, exports the torchrun-style variables in each (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and calls `run_task`. Rank 0 of the
built-in trainer writes `result.json` in the job's folder; every task returns its result as a
mapping, and rank 0's speaks for the trial. No torch and no submitit at import.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sweeper.spec.sweep import Sweep
from sweeper.trainers import trainer_of


def tasks_per_node(sweep: Sweep) -> int:
    """One task per GPU for the built-in trainer (each task is a rank); one per node for an
    external trainer, whose own command starts that node's ranks."""
    return trainer_of(sweep).tasks_per_node(sweep.cluster.gpus_per_node)


def task_count(sweep: Sweep) -> int:
    """The tasks of one trial's job, over all its nodes: what a submission starts and a re-attach waits for."""
    return sweep.cluster.nodes * tasks_per_node(sweep)


def node_rank(environ: dict[str, str] | None = None) -> int:
    """This task's node, from the torchrun-style variables (tasks are placed node by node)."""
    env = os.environ if environ is None else environ
    if "GROUP_RANK" in env:  # torchrun names the node's rank itself
        return int(env["GROUP_RANK"])
    return int(env.get("RANK", "0")) // max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))


def run_task(spec_path: str, layout: dict[str, Any], out_dir: str, nodes: int | None = None) -> dict[str, Any]:
    """Run this task's part of one trial: a rank of the built-in trainer, or a node's external command;
    `nodes`: the layout's node count in a sweep over several."""
    from sweeper.layouts.layout import Layout
    from sweeper.spec.loader import load_sweep

    sweep, lay = load_sweep(spec_path, profiles=False), Layout.from_mapping(layout)  # the model is not needed here
    sweep = sweep.at(nodes) if nodes is not None else sweep
    if trainer_of(sweep).runs_command:  # one task per node runs the trainer's own command
        from sweeper.runtime.workloads import run_external

        return asdict(run_external(sweep, lay, workdir=Path(out_dir) / f"node{node_rank()}"))
    from sweeper.runtime.runner import run_trial

    return asdict(run_trial(sweep, lay, out_dir=Path(out_dir)))
