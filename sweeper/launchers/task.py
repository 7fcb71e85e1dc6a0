"""What runs in the task a launcher started on each node of a trial's job: that node's part of the trial.

No launcher owns this module: a launcher whose trials are jobs of one task per node (SLURM's tasks, a
torchx app's replicas; Kubernetes or a cloud batch service tomorrow) starts a task on each of the
trial's nodes, and each runs `run_node`: the built-in trainer's ranks of its node, forked from one
process that imported torch once (`sweeper.launchers.ranks.launch`, as on one machine), meeting the
other nodes' ranks at node 0's address; or the trainer's own command, which starts its node's ranks
itself. Every task returns a report: node 0's holds the trial's result (`NodeReport`), another node's
says how its ranks ended, with the evidence of an OOM kill they left, so that an OOM on any node can be
told from a rank that died of something else (`with_nodes_oom`). No torch and no submitit at import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sweeper.launchers.base import TrialJob, failure
from sweeper.layouts.layout import Layout
from sweeper.results.trial import TrialResult
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus
from sweeper.trainers import trainer_of

# A node's report: {"result": the trial's result as a mapping} from node 0 (and from every node of a
# trainer's own command); {"returncodes": [...], "timed_out": bool, "oom_evidence": str | None} from
# another node of the built-in trainer, or {"error": why} from a task that could not start its part.
NodeReport = dict[str, Any]


def node_folder(out_dir: Path, node: int) -> Path:
    """Node `node`'s folder in the trial's: its ranks' task, logs and outputs (`ranks.launch`); one
    folder per node, so that nodes sharing a file system write apart."""
    return out_dir / f"node{node}"


def rank0_result(out_dir: Path) -> Path:
    """Where rank 0 writes the trial's result (`sweeper.runtime.runner`), in node 0's folder, as soon
    as the trial ends: before its node's task returns, and even when a rank elsewhere hangs."""
    return node_folder(out_dir, 0) / "out" / "result.json"


def node_rank(environ: Mapping[str, str] | None = None) -> int:
    """This task's node, from the torchrun-style variables (tasks are placed node by node)."""
    env = os.environ if environ is None else environ
    if "GROUP_RANK" in env:  # torchrun names the node's rank itself
        return int(env["GROUP_RANK"])
    return int(env.get("RANK", "0")) // max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))


def run_node(
    sweep: Sweep,
    layout: Layout,
    *,
    node: int,
    nodes: int,
    master_addr: str,
    master_port: int,
    timeout_s: float,
    workdir: Path,
) -> NodeReport:
    """Node `node`'s ranks of the built-in trainer (`gpus_per_node` of them, forked from one process
    that imported torch once), meeting the other nodes' at `master_addr:master_port` (one node: a free
    port of this machine); node 0's report holds the trial's result, another node's how its ranks ended."""
    from sweeper.launchers.ranks import Rendezvous, launch, launch_trial

    rendezvous = Rendezvous(node, nodes, master_addr, master_port) if nodes > 1 else None
    if node == 0:
        result = launch_trial(sweep, layout, workdir=workdir, timeout_s=timeout_s, rendezvous=rendezvous)
        return {"result": result.to_dict()}
    done = launch(
        {"kind": "trial", "sweep": sweep, "layout": layout},
        nprocs=sweep.cluster.gpus_per_node,
        timeout_s=timeout_s,
        workdir=workdir,
        rendezvous=rendezvous,
    )
    oom = done.oom()
    return {
        "returncodes": done.returncodes,
        "timed_out": done.timed_out,
        "oom_evidence": f"rank {node * sweep.cluster.gpus_per_node + oom[0]}: {oom[1]}" if oom else None,
    }


def node0_result(report: Mapping[str, Any], job: TrialJob) -> TrialResult:
    """The trial's result from node 0's report; a report that holds none is said as the trial's failure."""
    if isinstance(report.get("result"), dict):
        try:
            return TrialResult.from_dict(report["result"])
        except (TypeError, ValueError) as e:
            return failure(TrialStatus.FAILED, f"node 0 reported an unreadable result: {e}", job)
    return failure(TrialStatus.FAILED, f"node 0: {report.get('error') or 'no result in its report'}", job)


def nodes_oom(reports: Mapping[int, Mapping[str, Any]]) -> str | None:
    """The first evidence of an OOM kill a node's report holds, naming the node."""
    return next((f"{r['oom_evidence']} (node {n})" for n, r in sorted(reports.items()) if r.get("oom_evidence")), None)


def with_nodes_oom(result: TrialResult, reports: Mapping[int, Mapping[str, Any]]) -> TrialResult:
    """Node 0's `result`, an OOM where it failed and a rank of any node was killed for memory (its
    node's own evidence: a failed collective is all node 0 sees of it)."""
    oom = nodes_oom(reports)
    if result.status == TrialStatus.FAILED and oom:
        result.status, result.error = TrialStatus.OOM, f"{oom}; then: {result.error}"
    return result


def run_task(spec_path: str, layout: dict[str, Any], out_dir: str, nodes: int | None = None) -> NodeReport:
    """This node's part of one trial, in the one task a job runs on each node, with the torchrun-style
    variables of a task per node set (RANK: the node, WORLD_SIZE: the nodes, MASTER_ADDR, MASTER_PORT):
    the built-in trainer's ranks (`run_node`), or the trainer's own command; `nodes`: the layout's node
    count in a sweep over several."""
    from sweeper.spec.loader import load_sweep

    sweep, lay = load_sweep(spec_path, profiles=False), Layout.from_mapping(layout)  # the model is not needed here
    sweep = sweep.at(nodes) if nodes is not None else sweep
    node = node_rank()
    if trainer_of(sweep).runs_command:
        from sweeper.runtime.workloads import run_external

        return {"result": asdict(run_external(sweep, lay, workdir=node_folder(Path(out_dir), node)))}
    return run_node(
        sweep,
        lay,
        node=node,
        nodes=sweep.cluster.nodes,
        master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(os.environ.get("MASTER_PORT", "0")),
        timeout_s=sweep.trial.timeout_min * 60,
        workdir=node_folder(Path(out_dir), node),
    )
