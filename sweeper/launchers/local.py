"""Trials as local processes: `python -m sweeper.cli trial ... --json` in its own session per trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from sweeper.errors import SpecError, SweepError
from sweeper.files import open_own, own_dir
from sweeper.launchers.base import KILL_GRACE_S, Handle, JobOutcome, Launcher, LauncherProfile, TrialJob, failure, tail
from sweeper.launchers.forking import WarmZygote, callers_server, forks_ranks
from sweeper.launchers.netns import LocalNodes, local_nodes, refuse_another_link
from sweeper.process import alive, group_alive, kill_group, read_result
from sweeper.results.trial import TrialResult
from sweeper.runtime.evidence import INFRASTRUCTURE_FAILURE
from sweeper.spec.sweep import Sweep
from sweeper.spec.traits import BUILTIN_KIND
from sweeper.statuses import TrialStatus
from sweeper.trainers import trainer_of

MAX_LOCAL_PROCESSES = 64  # the local launcher starts one process per device of the cluster
STRAY_EXIT_WAIT_S = 30.0  # how long a restart waits for the stray trials it killed to be gone
ARGS_WAIT_S = 2.0  # how long a process may show no command line (its exec or exit under way) before it is not ours


class LocalProfile(LauncherProfile):
    """Trials as processes on this machine."""

    kind: Literal["local"]


def check_local_capacity(sweep: Sweep) -> None:
    """The local launcher starts one process per device: refuse a cluster it cannot stand in for.

    Checked when a sweep is about to run (not for a dry run, which plans any cluster), before
    anything is created.
    """
    largest = sweep.at(max(sweep.node_counts))  # a sweep over several node counts: its largest
    if largest.cluster.world > MAX_LOCAL_PROCESSES:
        raise SpecError(
            f"launcher: the local launcher starts one process per device ({largest.cluster.nodes} x "
            f"{sweep.cluster.gpus_per_node} = {largest.cluster.world}), more than {MAX_LOCAL_PROCESSES}; use a SLURM profile"
        )


def check_local_device(sweep: Sweep) -> None:
    """The local launcher runs trials on this machine: a GPU sweep needs CUDA and the named GPU here.

    Checked before the first trial (and before the results folder is made): otherwise each run
    would record the machine's fault as the failure of a layout, the plan's best first. Only the
    built-in trainer runs on this interpreter's torch: another trainer's command brings its own
    environment (its torch, its CUDA), which this process cannot judge."""
    gpu = sweep.cluster.gpu
    if gpu.name == "cpu" or sweep.workload.kind != BUILTIN_KIND:
        return
    from sweeper.runtime.env import cuda_unusable_reason

    reason = cuda_unusable_reason()
    if reason is not None:
        raise SweepError(
            f"cluster.gpu: {gpu.name} needs CUDA, and this machine cannot run it ({reason}); the local "
            "launcher runs trials here: run on a GPU node, use launcher: slurm, or plan with --dry-run"
        )
    import torch

    from sweeper.spec.hardware import gpu_matches

    found = torch.cuda.get_device_name(0)
    if not gpu_matches(gpu, found):
        raise SweepError(
            f"cluster.gpu: {gpu.name}, but this machine's GPU is {found!r}; set cluster.gpu to the card "
            "the trials run on (MFU and memory are computed against it)"
        )


def check_local_link(sweep: Sweep, nodes: LocalNodes) -> None:
    """The links a sweep names (its `cluster.link`, the one its profile was measured across) against
    the local nodes' link, before the first trial (`netns.refuse_another_link`)."""
    named = [("cluster.link", sweep.cluster.link)]
    if (measured := sweep.cluster.profile) is not None:
        named.append((f"cluster.profile: {measured.path} was measured across", measured.profile.link))
    refuse_another_link(nodes, *named)


def trial_command(job: TrialJob) -> list[str]:
    """The command that runs one trial: every knob given explicitly, the result as JSON on stdout."""
    sets = [arg for k, v in job.layout.as_dict().items() for arg in ("--set", f"{k}={_cli_value(v)}")]
    return [
        sys.executable,
        "-m",
        "sweeper.cli",
        "trial",
        str(job.spec_path),
        *sets,
        "--json",
        "--timeout-s",
        f"{job.timeout_s:g}",
        "--workdir",
        str(job.workdir / "ranks"),
        *(["--nodes", str(job.nodes)] if job.nodes is not None else []),
    ]


def _cli_value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


class LocalLauncher(Launcher):
    """Runs each trial as a local process group; one process per device of the sweep's cluster."""

    kind = "local"
    profile_model = LocalProfile
    # a local trial's processes start in about 8 s (tiny_cpu on 2 CPU cores: interpreter, torch import, gloo)
    default_startup_s = 10.0
    default_startup_why = "assumed for local processes: interpreter, torch import, process group"

    def __init__(self, *, forks: bool = True) -> None:
        self.forks = forks  # the built-in trainer's ranks (not an external trainer's command)
        self.warm: WarmZygote | None = None  # started at the first trial
        self.env: dict[str, str] | None = None  # every trial's: the server's, fixed at the first trial

    @classmethod
    def from_profile(cls, profile: LauncherProfile, sweep: Sweep) -> LocalLauncher:
        check_local_capacity(sweep)
        check_local_device(sweep)
        nodes = local_nodes()
        if nodes is not None and nodes.nodes in sweep.node_counts:  # its trials run across the namespaces' link
            check_local_link(sweep, nodes)
        return cls(forks=not trainer_of(sweep).runs_command)

    def submit(self, job: TrialJob) -> Handle:
        # the job folder's own names are the tool's: a link at any of them is replaced, never written through
        own_dir(job.workdir)
        own_dir(job.workdir / "ranks")  # `sweep trial --workdir` writes the ranks' task and logs there
        with open_own(job.workdir / "result.json") as stdout, open_own(job.workdir / "log.txt", append=True) as stderr:
            proc = subprocess.Popen(
                trial_command(job),
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=self._environ(job),
                start_new_session=True,  # its own process group: cancel kills every rank
            )
        return Handle(f"local-{proc.pid}", job, proc, {"started": time.time(), "pid": proc.pid})

    def _environ(self, job: TrialJob) -> dict[str, str]:
        """A trial's environment: the sweep's, with the socket of a zygote kept warm across the sweep
        (`forking.WarmZygote`), its ranks forked from it: each trial after the first starts without
        importing torch, dynamo and the trainer again (about 5 s of CPU, more than a tiny trial's steps on
        2 cores). Every trial then runs in the environment the server was started with; where the sweep's
        own environment names a server already (`process.SERVER_VAR`), in the sweep's, from that server.
        Not for an external trainer's command, nor where ranks are not forked (SWEEP_FORK_RANKS=0)."""
        if not self.forks or not forks_ranks(os.environ):
            return dict(os.environ)
        if self.env is None:
            # one its caller keeps warm across several sweeps (a script's, a test session's) serves this one
            # too, if it takes this sweep's environment
            self.warm = None if callers_server(os.environ) else WarmZygote(job.workdir.parent)
            self.env = dict(os.environ) if self.warm is None else self.warm.environ()
        return self.env

    def close(self) -> None:
        if self.warm is not None:
            self.warm.close()
            self.warm = None
        self.env = None

    def poll(self, handle: Handle) -> JobOutcome | None:
        proc = handle.native
        if proc is not None:
            if proc.poll() is None:
                return self._enforce_limit(handle)
        elif not handle.info.get("ended") and alive(handle.info["pid"]):
            return self._enforce_limit(handle)
        return self._collect(handle)

    def _enforce_limit(self, handle: Handle) -> JobOutcome | None:
        if time.time() - handle.info["started"] <= handle.job.timeout_s + KILL_GRACE_S:
            return None
        self.cancel(handle)
        msg = f"no result {handle.job.timeout_s + KILL_GRACE_S:.0f} s after start; killed"
        return JobOutcome(
            failure(TrialStatus.TIMEOUT, msg, handle.job), handle.job_id, os.uname().nodename, _log(handle)
        )

    def _collect(self, handle: Handle) -> JobOutcome:
        job = handle.job
        result = read_result(job.workdir / "result.json")
        node = os.uname().nodename
        if result is not None:  # a rank killed from outside without a sign of OOM: retried once
            infra = str(result.get("error") or "").startswith(INFRASTRUCTURE_FAILURE)
            return JobOutcome(
                TrialResult.from_dict(result), handle.job_id, node, _log(handle), infrastructure_failure=infra
            )
        rc = handle.native.returncode if handle.native is not None else None
        how = (
            f"exit code {rc}"
            if rc is not None and rc >= 0
            else (f"killed by {signal.Signals(-rc).name}" if rc is not None else "its process is gone")
        )
        err = f"the trial process ended without a result ({how})"
        last = tail(job.workdir / "log.txt", 8)
        return JobOutcome(
            failure(TrialStatus.FAILED, f"{err}\n{last}".strip(), job),
            handle.job_id,
            node,
            _log(handle),
            infrastructure_failure=True,
        )

    def cancel(self, handle: Handle) -> None:
        kill_group(handle.info["pid"])
        if handle.native is not None:
            handle.native.wait()

    def reattach(self, job_id: str, job: TrialJob) -> Handle | None:
        """A local trial survives its `sweep run` (own session): find it by pid and command line."""
        pid = int(job_id.removeprefix("local-"))
        if pid > 0 and _runs_trial(pid, job.workdir):
            return Handle(job_id, job, None, {"started": time.time(), "pid": pid})
        if (
            read_result(job.workdir / "result.json") is not None
        ):  # it finished while no `sweep run` watched: collect, do not rerun
            return Handle(job_id, job, None, {"started": time.time(), "pid": pid, "ended": True})
        return None

    def find(self, job: TrialJob) -> str | None:
        """A trial started by a `sweep run` killed before it saved the pid: found by its folder."""
        pid = trial_processes(job.workdir.parent).get(job.workdir)
        if pid is not None:
            return f"local-{pid}"
        if read_result(job.workdir / "result.json") is not None:
            return "local-0"  # it ran and finished: reattach collects the result
        return None

    def end_strays(self, jobs_dir: Path, known: set[Path]) -> list[str]:
        """Kill trial processes of this sweep that no record names: they would measure on the
        same cores as the trials we run, and nobody would collect them."""
        ended, killed = [], []
        for workdir, pid in trial_processes(jobs_dir.resolve()).items():
            if workdir not in known:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
                killed.append(pid)
                ended.append(f"local-{pid} ({workdir.name})")
        # SIGKILL is delivered, not done: a loaded machine can take a while to end a process (its
        # memory to free, a disk read to finish). Return once they are gone, so that no trial
        # started next (in the same folder, maybe) ever runs beside one of them, nor their ranks:
        # the whole group, since a rank forked by the trial can outlive its parent by a moment.
        deadline = time.monotonic() + STRAY_EXIT_WAIT_S
        while any(group_alive(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ended


def trial_processes(jobs_dir: Path) -> dict[Path, int]:
    """Live trial processes (`sweep trial`, not their ranks) started for folders under `jobs_dir`."""
    found: list[tuple[Path, int]] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        cmd = _cmdline(pid)
        if "sweeper.cli" not in cmd or "trial" not in cmd or "--workdir" not in cmd:
            continue
        ranks = Path(cmd[cmd.index("--workdir") + 1]) if cmd.index("--workdir") + 1 < len(cmd) else None
        # trial_command passes <job folder>/ranks: the job folder is its parent
        if ranks is not None and ranks.parent.parent == jobs_dir and alive(pid):
            found.append((ranks.parent, pid))
    # a rank between fork and exec (its preexec_fn runs Python there) still looks like its parent
    # `sweep trial`, with the same folder and a higher pid: keep the parent, whichever comes first
    pids = {pid for _, pid in found}
    return {w: pid for w, pid in found if _ppid(pid) not in pids}


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _runs_trial(pid: int, workdir: Path) -> bool:
    """Whether process `pid` runs the trial of `workdir`: alive, its command line naming the folder. A
    process shows an empty command line for a moment while its exec is under way (Popen has returned
    by then) or its exit is: asked again until it shows one or has ended (`ARGS_WAIT_S`), so that a
    trial looked for just after its start is not taken for one gone (a loaded machine once made the
    moment long enough for the contract test's reattach, right after its submit, to find nothing)."""
    deadline = time.monotonic() + ARGS_WAIT_S
    while alive(pid):
        args = [a for a in _cmdline(pid) if a]
        if args or time.monotonic() > deadline:
            return str(workdir / "ranks") in args
        time.sleep(0.01)
    return False


def _cmdline(pid: int) -> list[str]:
    """The arguments a process runs with, to recognise our trials by their --workdir."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _log(handle: Handle) -> str:
    return str(handle.job.workdir / "log.txt")
