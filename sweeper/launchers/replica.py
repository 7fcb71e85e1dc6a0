"""What each replica of a torchx app runs: its node's part of one trial, its result as one line on stdout.

`python -m sweeper.launchers.replica --layout JSON --node-rank N --nodes K --timeout-s T --master-port P`,
with the frozen sweep file's text in `SWEEP_TRIAL_SPEC`. A replica shares no folder with the
machine that submitted it (a Kubernetes pod, a Ray actor on another host, a container): the sweep
comes in through the environment, and everything that goes back goes through the replica's log,
which torchx fetches: the ranks' logs, then one `SWEEP_REPLICA <json>` line. Node 0's line holds the
trial's result (`sweeper.results.trial.TrialResult`); another node's holds how its ranks ended, with the
evidence of an OOM kill its own ranks left (cgroup counter, kernel log), so the launcher can tell
an OOM on any node from a rank that died of something else.

No torch at import: the ranks import it (`sweeper.runtime.worker`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sweeper.files import open_own
from sweeper.layouts.layout import Layout
from sweeper.process import die_with_parent
from sweeper.spec.sweep import Sweep
from sweeper.trainers import trainer_of

MARK = "SWEEP_REPLICA"  # the line a replica ends its log with
SPEC_ENV = "SWEEP_TRIAL_SPEC"  # the frozen sweep file's text
RANK0_HOST_ENV = "TORCHX_RANK0_HOST"  # where replica 0 runs, on Ray and Docker (`--rank0-env` names another)
LOG_LINES = 200  # the last lines of each rank's log that the replica's own log repeats


def report_line(node: int, payload: dict[str, Any]) -> str:
    """The line the launcher looks for: node and payload as one JSON object after the mark."""
    return f"{MARK} {json.dumps({'node': node, **payload}, separators=(',', ':'))}"


def parse_reports(lines: list[str]) -> dict[int, dict[str, Any]]:
    """Each node's report found in log lines (a scheduler may prefix lines, as Ray does); the last wins."""
    found: dict[int, dict[str, Any]] = {}
    for line in lines:
        at = line.find(MARK + " {")
        if at < 0:
            continue
        try:
            report = json.loads(line[at + len(MARK) + 1 :].strip())
        except ValueError:
            continue  # a line cut by the scheduler's log: as if absent
        if isinstance(report, dict) and isinstance(report.get("node"), int):
            found[report["node"]] = report
    return found


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.getppid() != 1:  # a container's PID 1, or a child of its init, has no parent to outlive
        die_with_parent(os.getppid())
    # `docker stop`, a Kubernetes pod's deletion and Ray's job stop send SIGTERM: end the ranks with us
    # (each rank has its own session and dies with this process: `ranks._die_with_parent`)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    text = os.environ.get(SPEC_ENV)
    if not text:
        print(f"{SPEC_ENV} is not set: this replica has no sweep to run", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="sweep-replica-"))
    try:
        sweep = _sweep(text, args.source, args.nodes)
        layout = Layout.from_mapping(json.loads(args.layout))
        line = report_line(args.node_rank, _run(sweep, layout, args, workdir))
        print(line, flush=True)  # first: a log whose end is lost still holds it
        _repeat_logs(workdir, args.node_rank)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _leave_report(Path(args.workdir), args.node_rank, line)
    print(line, flush=True)
    time.sleep(args.linger_s)  # Ray drops the last lines of a process that exits at once
    return 0


def report_file(folder: Path, node: int) -> Path:
    """Where a replica that can reach the trial's folder (one machine, a shared file system) leaves its report."""
    return folder / f"replica-{node}.json"


def _leave_report(folder: Path, node: int, line: str) -> None:
    """The report in the trial's folder too, where this replica sees that folder: no log can lose it there."""
    if not folder.is_dir() or folder.is_symlink():
        return
    tmp = folder / f".replica-{node}.{os.getpid()}"
    try:
        with open_own(tmp) as f:  # a link planted at the name is replaced, never written through
            f.write(line.encode())
        os.replace(tmp, report_file(folder, node))
    except OSError:
        tmp.unlink(missing_ok=True)  # not ours to write (another machine's same path): the log carries it


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sweeper.launchers.replica", description=__doc__)
    p.add_argument("--layout", required=True, help="the layout's knobs as a JSON object")
    p.add_argument("--node-rank", type=int, required=True, help="this replica's node (torchx: ${replica_id})")
    p.add_argument("--nodes", type=int, required=True, help="the trial's node count (one replica each)")
    p.add_argument("--timeout-s", type=float, required=True, help="the trial's wall-clock limit")
    p.add_argument("--master-port", type=int, required=True, help="where node 0's rank 0 listens (several nodes)")
    p.add_argument(
        "--rank0-env",
        default=RANK0_HOST_ENV,
        help="the variable holding node 0's host (torchx: ${rank0_env}; Kubernetes' Volcano sets its own)",
    )
    p.add_argument("--workdir", default="", help="the trial's folder where it was submitted (written if reachable)")
    p.add_argument("--linger-s", type=float, default=0.0, help="seconds to stay after the report (Ray)")
    p.add_argument("--source", default="sweep.yaml", help="the sweep file's path where it was submitted")
    return p


def _sweep(text: str, source: str, nodes: int) -> Sweep:
    from sweeper.spec.loader import parse_sweep

    return parse_sweep(text.encode(), source=source, profiles=False).at(nodes)


def _run(sweep: Sweep, layout: Layout, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """This node's part of the trial: the trial's result on node 0, how its ranks ended elsewhere."""
    from sweeper.launchers.task import run_node

    node, nodes = args.node_rank, args.nodes
    if trainer_of(sweep).runs_command:  # an external trainer's command, once per node
        return {"result": _run_external(sweep, layout, node, nodes, args, workdir)}
    master = "127.0.0.1" if node == 0 else os.environ.get(args.rank0_env, "")
    if nodes > 1 and not master:
        return {"error": f"{args.rank0_env} is not set: node {node} cannot find node 0"}
    return run_node(
        sweep,
        layout,
        node=node,
        nodes=nodes,
        master_addr=master,
        master_port=args.master_port,
        timeout_s=args.timeout_s,
        workdir=workdir / "ranks",
    )


def _run_external(
    sweep: Sweep, layout: Layout, node: int, nodes: int, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """The trainer's own command on this node, with torchrun-style variables naming the node."""
    from sweeper.runtime.workloads import run_external

    master = "127.0.0.1" if node == 0 else os.environ.get(args.rank0_env, "127.0.0.1")
    os.environ.update(
        RANK=str(node),
        WORLD_SIZE=str(nodes),
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=str(node),
        MASTER_ADDR=master,
        MASTER_PORT=str(args.master_port),
    )
    return run_external(sweep, layout, workdir=workdir / f"node{node}", timeout_s=args.timeout_s).to_dict()


def _repeat_logs(workdir: Path, node: int) -> None:
    """The end of each rank's (or the workload's) log into this replica's own: the scheduler keeps that."""
    logs = sorted((workdir / "ranks" / "logs").glob("rank*.log")) + sorted(workdir.glob("node*/workload.log"))
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()[-LOG_LINES:]
        except OSError:
            continue
        print(f"----- node {node}: {path.name} (last {len(lines)} lines) -----")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
