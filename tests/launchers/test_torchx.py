"""The torchx launcher without a remote engine: its profile's checks, the Kubernetes job it would
submit (materialised by torchx's own dry run, field by field), the replicas' reports, and a trial over
two nodes on torchx's local_cwd scheduler (two replicas, each its node's ranks, meeting over TCP).

Its contract with the sweep loop (submit, poll, cancel, re-attach, limits) runs in
tests/launchers/test_contract.py on a real Ray head, a real Docker daemon and local_cwd.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.launchers import TrialJob, make_launcher, resolve_profile
from sweeper.launchers.replica import _parser, parse_reports, report_line
from sweeper.launchers.torchx import TorchxLauncher
from sweeper.launchers.torchx_trials import trial_outcome
from sweeper.layouts.layout import Layout
from sweeper.results.trial import TrialResult
from sweeper.spec.loader import load_sweep, parse_sweep
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus
from tests.conftest import SPACES, sweep_cli

LAYOUT = Layout(tp=2, pp=1, micro_batch_size=1)


def _sweep(tmp_path: Path, launcher: dict[str, Any] | str, **cluster: Any) -> Sweep:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name="Tiny_CPU", results_dir=str(tmp_path / "results"), launcher=launcher)
    spec["cluster"].update(cluster)
    if cluster.get("gpus_per_node") == 1:  # one rank per node: no model split
        spec["space"].update(tp=[1], pp=[1])
    spec["trial"].update(steps=3)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_sweep(path)


def _job(sweep: Sweep, tmp_path: Path, number: int = 7, layout: Layout = LAYOUT) -> TrialJob:
    assert sweep.source is not None
    return TrialJob(number, layout, Path(sweep.source), tmp_path / "jobs" / f"trial-{number:05d}-a1", 300.0)


def test_the_kubernetes_job_is_a_replica_per_node_each_running_its_nodes_ranks(tmp_path: Path) -> None:
    # no Kubernetes server can run here: torchx materialises the Volcano job it would create
    sweep = _sweep(
        tmp_path,
        {
            "kind": "torchx",
            "scheduler": "kubernetes",
            "image": "ghcr.io/acme/sweep:1.2",
            "cfg": {"queue": "research", "namespace": "ml"},
            "memory_gb_per_replica": 512,
        },
        nodes=2,
        gpus_per_node=8,
        gpu="h100-sxm",
    )
    launcher = make_launcher(sweep)
    assert isinstance(launcher, TorchxLauncher)
    job = _job(sweep, tmp_path)
    resource = launcher.request(job).request.resource
    spec = resource["spec"]
    assert resource["kind"] == "Job" and resource["apiVersion"].startswith("batch.volcano.sh/")
    assert resource["metadata"]["name"].startswith("sweep-tiny-cpu-7-")
    assert spec["queue"] == "research" and spec["maxRetry"] == 0  # a failed replica is the sweep's to retry
    assert [t["name"] for t in spec["tasks"]] == ["trial-0", "trial-1"] and all(
        t["replicas"] == 1 for t in spec["tasks"]
    )
    for node, task in enumerate(spec["tasks"]):
        pod = task["template"].spec
        (container,) = pod.containers
        assert container.image == "ghcr.io/acme/sweep:1.2" and pod.restart_policy == "Never"
        limits, requests = container.resources.limits, container.resources.requests
        assert limits["nvidia.com/gpu"] == "8" and requests["nvidia.com/gpu"] == "8"  # the node's devices
        assert limits["cpu"] == "8000m"  # one core per device by default
        assert limits["memory"] == f"{512 * 1024}M"
        # the command is the replica's entry point, and the replica's own parser reads it
        assert container.command[:3] == ["python3", "-m", "sweeper.launchers.replica"]
        args = _parser().parse_args(container.command[3:])
        assert (args.node_rank, args.nodes, args.timeout_s) == (node, 2, 300.0)
        assert Layout.from_mapping(json.loads(args.layout)) == LAYOUT
        assert args.master_port == 29500 + 7  # one port per trial number
        # node 1 finds node 0 through the variable Volcano's svc plugin sets, named by torchx
        assert args.rank0_env == ("TORCHX_RANK0_HOST" if node == 0 else "VC_TRIAL_0_HOSTS")
        env = {e.name: e.value for e in container.env}
        assert env["SWEEP_TRIAL_SPEC"] == Path(job.spec_path).read_text()  # the frozen sweep file, whole
        assert parse_sweep(env["SWEEP_TRIAL_SPEC"].encode(), source="x", profiles=False).name == "Tiny_CPU"
        assert env["PYTHONUNBUFFERED"] == "1"


def test_a_sweep_files_inline_launcher_cannot_set_what_reaches_into_the_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = _sweep(tmp_path, "local")
    refused = {
        "cfg.privileged": {"kind": "torchx", "scheduler": "local_docker", "image": "x:1", "cfg": {"privileged": True}},
        "cfg.requirements": {"kind": "torchx", "scheduler": "ray", "cfg": {"requirements": "r.txt"}},
        "env": {"kind": "torchx", "scheduler": "ray", "env": {"LD_PRELOAD": "/tmp/x.so"}},
        "mounts": {"kind": "torchx", "scheduler": "local_docker", "image": "x:1", "mounts": ["type=bind,src=/,dst=/h"]},
    }
    for field, launcher in refused.items():
        with pytest.raises(SpecError, match=rf"^launcher\.{field}: not allowed in a sweep file's inline launcher"):
            resolve_profile(replace(sweep, launcher=launcher))
    # the same in a site profile under launchers/ is the site's to give
    site = tmp_path / "launchers"
    site.mkdir()
    (site / "docker_site.yaml").write_text(
        yaml.safe_dump(refused["cfg.privileged"] | {"mounts": ["type=bind,src=/data,dst=/data,readonly"]})
    )
    monkeypatch.chdir(tmp_path)
    profile = resolve_profile(replace(sweep, launcher="docker_site"))
    assert profile.cfg == {"privileged": True}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "launcher, message",
    [
        (
            {"kind": "torchx", "scheduler": "slurmish"},
            r"scheduler: Input should be 'ray', 'kubernetes', 'local_docker'",
        ),
        ({"kind": "torchx", "scheduler": "local_docker"}, r"image: the local_docker scheduler needs a container image"),
        ({"kind": "torchx", "scheduler": "ray", "image": "x:1"}, r"image: the ray scheduler runs in a folder"),
        (
            {"kind": "torchx", "scheduler": "ray", "cfg": {"dashbord_address": "h:1"}},
            r"cfg\.dashbord_address: not a run option of ray; options: cluster_config_file, cluster_name, dashboard_address",
        ),
        (
            {"kind": "torchx", "scheduler": "kubernetes", "image": "x:1; rm -rf /"},
            r"image: String should match pattern",
        ),
        ({"kind": "torchx", "scheduler": "ray", "cfg": {"dashboard_address": "$(id)"}}, r"cfg\.dashboard_address"),
        (
            {"kind": "torchx", "scheduler": "ray", "master_port": 80},
            r"master_port: Input should be greater than or equal to 1024",
        ),
    ],
)
def test_a_bad_torchx_profile_is_one_line_naming_the_field(
    tmp_path: Path, launcher: dict[str, Any], message: str
) -> None:
    sweep = _sweep(tmp_path, "local")
    with pytest.raises(SpecError, match=message):
        resolve_profile(replace(sweep, launcher=launcher))


def test_the_dry_run_of_a_torchx_sweep_refuses_an_inline_privileged_container_with_nothing_written(
    tmp_path: Path,
) -> None:
    sweep = _sweep(
        tmp_path, {"kind": "torchx", "scheduler": "local_docker", "image": "x:1", "cfg": {"privileged": True}}
    )
    done = sweep_cli("run", str(sweep.source), "--dry-run", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "launcher.cfg.privileged: not allowed in a sweep file's inline launcher" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "results").exists()


def test_reports_are_found_in_a_schedulers_log_whatever_it_puts_before_them() -> None:
    result = TrialResult(status="ok", tp=2, step_time_mean_s=0.5)
    lines = [
        "\x1b[36m(CommandActor pid=15361)\x1b[0m " + report_line(0, {"result": result.to_dict()}),  # Ray's prefix
        "noise "
        + report_line(1, {"returncodes": [0], "timed_out": False, "oom_evidence": None})[:-3],  # cut by the log
        report_line(1, {"returncodes": [-9], "timed_out": False, "oom_evidence": "rank 3: cgroup oom_kill 1"}),
        "SWEEP_REPLICA not json",
    ]
    reports = parse_reports(lines)
    assert set(reports) == {0, 1}
    assert TrialResult.from_dict(reports[0]["result"]).step_time_mean_s == 0.5
    assert reports[1]["oom_evidence"] == "rank 3: cgroup oom_kill 1"


def test_the_outcome_says_oom_only_with_a_nodes_own_evidence_and_retries_a_replica_that_died(tmp_path: Path) -> None:
    job = _job(_sweep(tmp_path, "local"), tmp_path)
    failed = TrialResult(status="failed", tp=2, error="rank 0: gloo connection closed by peer").to_dict()
    other = {
        "returncodes": [-9],
        "timed_out": False,
        "oom_evidence": "rank 3: the memory cgroup's oom_kill counter rose",
    }
    # node 0's ranks failed because a rank on node 1 was killed for memory: an OOM
    result, retry = trial_outcome(
        {0: {"node": 0, "result": failed}, 1: other}, job, app="a", state="SUCCEEDED", cancelled=False
    )
    assert result.status == TrialStatus.OOM and not retry
    assert result.error is not None and result.error.startswith(
        "rank 3: the memory cgroup's oom_kill counter rose (node 1)"
    )
    # the same without evidence stays the trainer's failure, not retried
    no_oom = dict(other, oom_evidence=None)
    result, retry = trial_outcome(
        {0: {"node": 0, "result": failed}, 1: no_oom}, job, app="a", state="SUCCEEDED", cancelled=False
    )
    assert result.status == TrialStatus.FAILED and not retry
    # no report from node 0: the replica died around the trial, retried once
    result, retry = trial_outcome({}, job, app="a", state="FAILED", cancelled=False, log_tail="Killed")
    assert result.status == TrialStatus.FAILED and retry and result.error is not None and "Killed" in result.error
    assert "without a result from node 0" in result.error and result.tp == 2
    # cancelled by the sweep: a failure, not retried
    result, retry = trial_outcome({}, job, app="a", state="CANCELLED", cancelled=True)
    assert result.status == TrialStatus.FAILED and not retry and "cancelled" in (result.error or "")


@pytest.mark.slow
def test_a_trial_over_two_nodes_meets_across_its_replicas(tmp_path: Path) -> None:
    # two replicas of one app (torchx's local_cwd: two processes here), one rank each: node 1's rank
    # finds node 0's by the rendezvous the replica sets up, and node 0 reports the trial
    sweep = _sweep(
        tmp_path,
        {"kind": "torchx", "scheduler": "local_cwd", "cpus_per_replica": 1, "poll_s": 0.2},
        nodes=2,
        gpus_per_node=1,
    )
    launcher = make_launcher(sweep)
    job = _job(sweep, tmp_path, layout=Layout(tp=1, pp=1, micro_batch_size=1))
    handle = launcher.submit(job)
    deadline = time.monotonic() + 240
    while (done := launcher.poll(handle)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done is not None, "no outcome in 240 s"
    assert done.result.status == TrialStatus.OK, done.result.error
    assert done.result.num_devices == 2 and done.result.dp == 2  # one data-parallel group over both nodes
    logs = {p.name: p.read_text() for p in (job.workdir / "logs").glob("*.log")}
    assert set(logs) == {"trial-0.log", "trial-1.log"}  # each replica's log, fetched into the trial's folder
    reports = parse_reports(logs["trial-1.log"].splitlines())
    assert reports[1]["returncodes"] == [0] and reports[1]["oom_evidence"] is None
    assert "rank0.log" in logs["trial-0.log"]  # the ranks' logs travel in the replica's


def test_a_scheduler_that_cannot_be_reached_stops_the_run_in_one_line(tmp_path: Path) -> None:
    from sweeper.process import free_port

    launcher = {
        "kind": "torchx",
        "scheduler": "ray",
        "submit_patience_s": 3,
        "cfg": {"dashboard_address": f"127.0.0.1:{free_port()}"},
    }
    sweep = _sweep(tmp_path, launcher)
    done = sweep_cli("run", str(sweep.source), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    tried = re.match(r"error: launcher: torchx could not submit trial 0 to ray \((\d+) tries\): ConnectionError", last)
    assert tried and int(tried[1]) >= 2, last  # tried again within submit_patience_s, then said once
    assert "Traceback" not in done.stderr
    # the trial's record stays in flight: the next `sweep run` submits it again
    assert [p.name for p in (tmp_path / "results" / "Tiny_CPU" / "inflight").iterdir()] == ["trial-00000.json"]
