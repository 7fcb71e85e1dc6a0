"""Trials as SLURM jobs through submitit: one job per trial on the nodes of the sweep's cluster, one task
on each node, which forks that node's ranks (`sweeper.launchers.task`)."""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StringConstraints

from sweeper.errors import SpecError, SweepError
from sweeper.files import own_dir
from sweeper.launchers.base import (
    Handle,
    JobOutcome,
    Launcher,
    LauncherProfile,
    OptionName,
    SafeToken,
    TrialJob,
    failure,
    tail,
)
from sweeper.launchers.netns import scheduled_node_environ
from sweeper.launchers.task import node0_result, rank0_result, run_task, with_nodes_oom
from sweeper.process import SERVER_VAR, read_result
from sweeper.results.folder import check_trusted_file
from sweeper.results.trial import TrialResult
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus
from sweeper.trainers import trainer_of

# submitit is imported where a job is submitted or read: the launcher registry imports this module
# for every sweep, and a local sweep or a dry run should not pay for (or need) submitit
if TYPE_CHECKING:
    import submitit

# Options that redirect a job's output, environment, folder or requeueing: a profile could
# append to ~/.bashrc, LD_PRELOAD a library or rerun jobs unseen. Denied unless a profile allows them.
DENIED_DIRECTIVES = ("output", "error", "export", "chdir", "requeue", "wrap")
_SHORT = {"o": "output", "e": "error", "D": "chdir"}
# SLURM job states that say the job died around the trial, not because of it: retried once.
INFRASTRUCTURE_STATES = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REQUEUED", "LAUNCH_FAILED")
# After rank 0 wrote the result, how long the job may take to end by itself (a task hung in NCCL
# teardown) before it is cancelled: it must not hold the nodes until its time limit.
RESULT_GRACE_S = 60.0
# Variables of a distributed launch in the submitting shell (a login shell inside torchrun, an
# salloc with a framework's exports) that sbatch would pass into the job, where they would
# override what submitit derives from SLURM: every task would think it is that one rank.
# CUDA_VISIBLE_DEVICES of the login node says nothing about the compute node's GPUs. A fork server
# the submitting process keeps (SERVER_VAR: the local launcher's, a test session's) is this machine's:
# a node's task forks its ranks from a zygote of its own, inside its job.
INHERITED_LAUNCH_VARS = (
    SERVER_VAR,
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)
INHERITED_LAUNCH_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")
# The master ports a job's rank 0 listens on, one drawn per job id. Below Linux's ephemeral range
# (ip_local_port_range, 32768-60999 by default), where any process's outgoing connection on the
# master node may hold the port: submitit's own draw (20000-60000) overlaps it, and a trial failed
# with EADDRINUSE before training. torchrun's default, 29500, lies in this range too.
MASTER_PORTS = range(20000, 32768)


@contextlib.contextmanager
def clean_submit_environment(environ: dict[str, str] | None = None) -> Iterator[list[str]]:
    """Hide inherited launch variables from sbatch (submitit runs it with this process's
    environment) for the time of one submission; yields the names hidden."""
    env = os.environ if environ is None else environ
    hidden = {k: env[k] for k in list(env) if k in INHERITED_LAUNCH_VARS or k.startswith(INHERITED_LAUNCH_PREFIXES)}
    for k in hidden:
        del env[k]
    try:
        yield sorted(hidden)
    finally:
        env.update(hidden)


def cpus_per_task_for(node_cpus: int | None, tasks_per_node: int) -> int | None:
    """The node's cores shared evenly among its tasks: the default cpus_per_task (a trial's job runs
    one task a node; a profile's, one per GPU)."""
    if not node_cpus:
        return None
    return max(1, node_cpus // max(1, tasks_per_node))


def node_cpus(partition: str | None) -> int | None:
    """The fewest CPUs of a node in the partition (the default one when None), from sinfo."""
    cmd = ["sinfo", "-h", "-o", "%c"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    counts = [int(v.rstrip("+")) for v in out.split() if v.rstrip("+").isdigit()]
    return min(counts) if counts else None


class SlurmProfile(LauncherProfile):
    """Trials as SLURM jobs through submitit: nodes and tasks from the sweep's cluster."""

    kind: Literal["slurm"]
    partition: SafeToken | None = None
    account: SafeToken | None = None
    qos: SafeToken | None = None
    constraint: SafeToken | None = None
    exclusive: bool = False
    cpus_per_task: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=(
            "CPUs for each rank (one per GPU; for a trainer's own command, for its one task a node); "
            "default: the node's CPUs (sinfo) shared among its ranks; OMP_NUM_THREADS follows it"
        ),
    )
    mem_gb: float | None = Field(default=None, gt=0)
    setup: list[Annotated[str, StringConstraints(max_length=1000)]] = Field(
        default_factory=list, description="shell lines run before the trial (module loads, env)"
    )
    sbatch_extra: dict[OptionName, SafeToken | int | bool] = Field(default_factory=dict)
    srun_args: list[SafeToken] = Field(default_factory=list)
    allow_directives: list[Literal[DENIED_DIRECTIVES]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="denied sbatch/srun options this site profile may set anyway"
    )
    poll_s: float = Field(default=5.0, gt=0, le=600, description="seconds between status checks")
    result_grace_s: float = Field(
        default=RESULT_GRACE_S,
        ge=0,
        le=3600,
        description="seconds a job may run on after its result was written before it is cancelled (a task hung in teardown)",
    )

    site_only = ("setup", "sbatch_extra", "srun_args", "allow_directives")

    def cluster_name(self) -> str | None:
        # a partition is a set of like nodes on one interconnect: what a learned profile is about
        return self.partition

    def check(self, source: str) -> None:
        """Deny options that redirect a job's output, environment, folder or requeueing."""
        allowed = set(self.allow_directives)
        given = [(f"sbatch_extra.{k}", _directive(k)) for k in self.sbatch_extra]
        given += [(f"srun_args {a!r}", _directive(a)) for a in self.srun_args if a.startswith("-")]
        for where, name in given:
            bare = name.removeprefix("no-")  # --no-requeue is requeueing too (and the launcher sets it itself)
            if bare in DENIED_DIRECTIVES and bare not in allowed:
                raise SpecError(
                    f"{source}: {where}: the {bare!r} option redirects a job's output, environment, folder or "
                    f"requeueing and is denied; a site profile may allow it with `allow_directives: [{bare}]`"
                )


def _directive(option: str) -> str:
    """`--open-mode`, `output`, `-o`, `no_requeue` -> the option's long name with dashes."""
    name = option.lstrip("-").split("=", 1)[0].replace("_", "-")
    return _SHORT.get(name[:1], name) if option.startswith("-") and not option.startswith("--") else name


def slurm_task(spec_path: str, layout: dict[str, Any], out_dir: str, nodes: int | None = None) -> dict[str, Any]:
    """Runs in every task of the job: torchrun-style variables from SLURM's, then the shared entry point."""
    export_task_environ()
    return run_task(spec_path, layout, out_dir, nodes)


def slurm_call(target: str, kwargs: dict[str, Any], out_dir: str) -> None:
    """Runs in every task of a job that is no trial (`sweep profile --nodes N`): the torchrun-style
    variables as for a trial, then `target` ("module:function") called with `out_dir` and `kwargs`."""
    export_task_environ()
    module, name = target.split(":")
    getattr(importlib.import_module(module), name)(out_dir=Path(out_dir), **kwargs)


def master_port_for(job_id: str) -> int:
    """The master port of the job `job_id` (an array's task: "123_4"): the same in every task of the
    job, on every node, with nothing exchanged; below the ephemeral ports (`MASTER_PORTS`)."""
    return random.Random(job_id).choice(MASTER_PORTS)  # seeded by a string: the same in every process


def export_task_environ() -> None:
    """RANK, WORLD_SIZE, MASTER_ADDR/PORT, ... from SLURM's variables, in this task's environment."""
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    if "RANK" not in os.environ:  # a profile's setup line may have set them itself
        torch_env = TorchDistributedEnvironment()
        # a master address or port a setup line exported is kept (submitit would refuse to export over
        # it); submitit's own draw of the port is not
        torch_env.master_addr = os.environ.get("MASTER_ADDR", torch_env.master_addr)
        if "MASTER_PORT" not in os.environ:
            torch_env.master_port = master_port_for(JobEnvironment().job_id)
        torch_env.export(set_cuda_visible_devices=False, overwrite=True)  # RANK, MASTER_ADDR/PORT, ...
    # a node of the local cluster of network namespaces (SLURM_NETNS=1 scripts/slurm/start.sh): gloo
    # on the node's end of the shaped link, not on the loopback the host name resolves to
    os.environ.update(scheduled_node_environ(os.environ))


class SlurmLauncher(Launcher):
    """Submits with submitit's SLURM executor; re-attaches by job id after a restart."""

    kind = "slurm"
    profile_model = SlurmProfile

    @classmethod
    def from_profile(cls, profile: LauncherProfile, sweep: Sweep) -> SlurmLauncher:
        assert isinstance(profile, SlurmProfile)
        return cls(profile, sweep)

    def __init__(self, profile: SlurmProfile, sweep: Sweep) -> None:
        self.profile = profile
        self.sweep = sweep
        self.poll_s = profile.poll_s
        # trial number -> the nodes (a SLURM host list, as sacct names them) of its attempt that
        # died around it: the retry is submitted excluding them
        self.failed_nodes: dict[int, str] = {}
        self.result_grace_s = profile.result_grace_s

    def cluster_name(self) -> str | None:
        return self.profile.cluster_name()

    def _executor(self, job: TrialJob) -> submitit.AutoExecutor:
        exclude = self.failed_nodes.get(job.number) if job.attempt > 1 else None
        # one task a node: the built-in trainer's forks the node's ranks (one per GPU), a trainer's
        # own command starts them itself
        ranks = 1 if trainer_of(self.sweep).runs_command else self.sweep.cluster.gpus_per_node
        return self.executor(
            job.workdir / "slurm",
            nodes=self._sweep_of(job).cluster.nodes,  # the layout's node count, not the smallest
            tasks=1,
            ranks_per_task=ranks,
            timeout_min=self.sweep.trial.timeout_min,  # the trial's limit is the job's
            name=f"sweep-{self.sweep.name}-{job.number}",
            exclude=exclude,
        )

    def executor(
        self,
        folder: Path,
        *,
        nodes: int,
        tasks: int,
        timeout_min: float,
        name: str,
        exclude: str | None = None,
        ranks_per_task: int = 1,
    ) -> submitit.AutoExecutor:
        """An executor of jobs of `nodes` x `tasks` on the profile's partition, account, ... with the
        sweep's GPUs per node, job files in `folder`, each task running `ranks_per_task` ranks (a
        trial's task forks its node's); `exclude`: a SLURM host list to keep off."""
        import submitit

        p, cluster = self.profile, self.sweep.cluster
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
        params: dict[str, Any] = dict(
            nodes=nodes,
            tasks_per_node=tasks,
            timeout_min=max(1, math.ceil(timeout_min)),
            name=name,
            slurm_signal_delay_s=0,  # no checkpoint/requeue: a time limit is a TIMEOUT, predictably
            # OpenMP threads: each rank's share of its task's cores, not every core of the node per rank
            slurm_setup=[omp_threads_line(ranks_per_task), *p.setup],
            slurm_srun_args=list(p.srun_args),
            # SLURM would requeue a job whose node fails under the same id, unseen; the sweep keeps
            # its own count instead (NODE_FAIL -> one retry), so the job must not requeue itself
            slurm_additional_parameters={"no_requeue": True, **p.sbatch_extra},
        )
        if cluster.gpu.name != "cpu":
            params["gpus_per_node"] = cluster.gpus_per_node
        cpus = p.cpus_per_task * ranks_per_task if p.cpus_per_task else cpus_per_task_for(node_cpus(p.partition), tasks)
        if cpus:
            params["cpus_per_task"] = cpus
        if exclude:
            params["slurm_exclude"] = exclude
        if p.mem_gb:
            params["mem_gb"] = p.mem_gb
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(p, key):
                params[f"slurm_{key}"] = getattr(p, key)
        if p.exclusive:
            params["slurm_exclusive"] = True
        ex.update_parameters(**params)
        return ex

    def _sweep_of(self, job: TrialJob) -> Sweep:
        """The sweep at the job's node count (a sweep over several asks each job for its layout's)."""
        return self.sweep.at(job.nodes) if job.nodes is not None else self.sweep

    def submit(self, job: TrialJob) -> Handle:
        own_dir(job.workdir)  # a link planted at the job's folder is replaced, never followed
        executor = self._executor(job)
        with clean_submit_environment():
            sj = executor.submit(slurm_task, str(job.spec_path), job.layout.as_dict(), str(job.workdir), job.nodes)
        return Handle(str(sj.job_id), job, sj)

    def submit_call(
        self,
        target: str,
        kwargs: dict[str, Any],
        *,
        folder: Path,
        nodes: int,
        tasks: int,
        timeout_min: float,
        name: str,
    ) -> SlurmCall:
        """One job of `nodes` x `tasks` on the sweep's partition (as its trials' jobs are asked for) whose
        every task runs `target(out_dir=folder/"out", **kwargs)` with the torchrun-style variables set.
        `folder` must be one the nodes share: the tasks write there."""
        from submitit.core.utils import FailedJobError

        own_dir(folder)
        executor = self.executor(folder / "slurm", nodes=nodes, tasks=tasks, timeout_min=timeout_min, name=name)
        try:
            with clean_submit_environment():
                sj = executor.submit(slurm_call, target, kwargs, str(folder / "out"))
        except (FailedJobError, OSError) as e:  # sbatch refused it (a partition, a limit) or is missing
            raise SweepError(
                f"sbatch did not take the job of {nodes} nodes x {tasks} tasks: {_last_lines(str(e), 3)}"
            ) from None
        return SlurmCall(sj)

    def poll(self, handle: Handle) -> JobOutcome | None:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        sj: submitit.Job = handle.native
        job = handle.job
        written = read_result(rank0_result(job.workdir))
        # submitit's own sacct polling backs off to minutes; the loop already paces itself
        if not sj.done(force_check=True):
            if written is None:
                return None
            seen = handle.info.setdefault("result_seen", time.monotonic())
            if time.monotonic() - seen < self.result_grace_s:
                return None
            sj.cancel(check=False)  # the result is in; a task is stuck (e.g. in NCCL teardown)
        node = _nodelist(sj)
        log = str(sj.paths.stderr) if sj.paths else None
        if written is not None:  # rank 0 writes it even when a stuck peer made a task exit early
            return JobOutcome(TrialResult.from_dict(written), handle.job_id, node, log)
        state = (sj.state or "UNKNOWN").upper()
        node0 = sj.task(0) if sj.num_tasks > 1 else sj
        if not state.startswith("COMPLETED") and not node0.paths.result_pickle.exists():
            # killed around the trial: do not let submitit wait for a result that cannot come
            return self._uncompleted(handle, state, node, log)
        try:  # unpickled next: only private files of ours, of the recorded job id
            for task in range(sj.num_tasks):
                pkl = (sj.task(task) if sj.num_tasks > 1 else sj).paths.result_pickle
                if pkl.exists() or pkl.is_symlink():
                    check_trusted_file(pkl)
        except SweepError as e:
            return JobOutcome(failure(TrialStatus.FAILED, str(e), job), handle.job_id, node, log)
        try:
            reports = sj.results()  # every node's task returns its report (`task.run_node`), node 0's first
        except FailedJobError as e:
            return JobOutcome(failure(TrialStatus.FAILED, _last_lines(str(e)), job), handle.job_id, node, log)
        except UncompletedJobError:
            return self._uncompleted(handle, state, node, log)
        return JobOutcome(_trial_result(reports, job), handle.job_id, node, log)

    def _uncompleted(self, handle: Handle, state: str, node: str | None, log: str | None) -> JobOutcome:
        status = TrialStatus.TIMEOUT if state.startswith("TIMEOUT") else TrialStatus.FAILED
        reason = f"SLURM job {handle.job_id} ended {state} without a result"
        if state.startswith("CANCELLED"):
            reason = f"SLURM job {handle.job_id} was cancelled ({state})"
        infrastructure = state.startswith(INFRASTRUCTURE_STATES)
        if infrastructure and node:
            self.failed_nodes[handle.job.number] = node
            reason += f" on {node}; a retry excludes {node}"
        err = tail(Path(log), 5) if log else ""
        return JobOutcome(
            failure(status, f"{reason}\n{err}".strip(), handle.job),
            handle.job_id,
            node,
            log,
            infrastructure_failure=infrastructure,
        )

    def cancel(self, handle: Handle) -> None:
        handle.native.cancel(check=False)

    def reattach(self, job_id: str, job: TrialJob) -> Handle | None:
        folder = job.workdir / "slurm"
        if not folder.is_dir():
            return None
        import submitit

        ntasks = self._sweep_of(job).cluster.nodes  # as many as `submit` started: one a node
        sj: submitit.SlurmJob[Any] = submitit.SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(ntasks)))
        return Handle(job_id, job, sj)


class SlurmCall:
    """A job of `SlurmLauncher.submit_call`: its id, rank 0's output, its state and nodes; its result
    is what its tasks wrote, never unpickled."""

    def __init__(self, native: submitit.Job[Any]) -> None:
        self.native = native

    @property
    def job_id(self) -> str:
        return str(self.native.job_id)

    @property
    def stdout(self) -> Path:
        return Path(self.native.paths.stdout)  # task 0's: rank 0, whose lines say how far it got

    def done(self) -> bool:
        return bool(self.native.done(force_check=True))  # submitit's own sacct polling backs off to minutes

    def state(self) -> str:
        return (self.native.state or "UNKNOWN").upper()

    def nodelist(self) -> str | None:
        return _nodelist(self.native)

    def error_tail(self, lines: int = 5) -> str:
        return tail(Path(self.native.paths.stderr), lines)

    def cancel(self) -> None:
        self.native.cancel(check=False)


def omp_threads_line(ranks_per_task: int) -> str:
    """The job script's line that gives each of a task's ranks its share of the task's CPUs as OpenMP
    threads (one at least); a setup line after it may set its own."""
    if ranks_per_task <= 1:
        return "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"
    share = f"${{SLURM_CPUS_PER_TASK:-1}} / {ranks_per_task}"
    return f"export OMP_NUM_THREADS=$(( {share} > 1 ? {share} : 1 ))"


def _trial_result(reports: list[Any], job: TrialJob) -> TrialResult:
    """The trial's result from its nodes' reports (`task.NodeReport`, node 0's first): node 0's result,
    an OOM where it failed and another node's rank was killed for memory."""
    first = reports[0] if reports else None
    report = first if isinstance(first, dict) else {"error": f"its task returned {type(first).__name__}, not a report"}
    return with_nodes_oom(node0_result(report, job), {n: r for n, r in enumerate(reports) if isinstance(r, dict)})


def _nodelist(sj: submitit.Job) -> str | None:
    try:
        return sj.get_info().get("NodeList")
    except Exception:  # noqa: BLE001 - sacct may be slow or missing; the node list is informative only
        return None


def _last_lines(text: str, n: int = 20) -> str:
    """The last `n` lines: the end of a traceback says what failed."""
    return "\n".join(text.strip().splitlines()[-n:])
