"""Trials as SLURM jobs through submitit: one job per trial, nodes x GPUs of the sweep's cluster."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from sweeper.errors import SweepError
from sweeper.folder import check_trusted_file
from sweeper.launchers.base import Handle, JobOutcome, Launcher, TrialJob, failure, tail
from sweeper.launchers.process import read_result
from sweeper.launchers.profiles import SlurmProfile
from sweeper.spec import Sweep
from sweeper.statuses import TrialStatus
from sweeper.trial import TrialResult

# SLURM job states that say the job died around the trial, not because of it: retried once.
INFRASTRUCTURE_STATES = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REQUEUED", "LAUNCH_FAILED")


def slurm_trial(spec_path: str, layout: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Runs in every task of the job: the ranks find each other from SLURM's variables."""
    from dataclasses import asdict

    from sweeper.layout import Layout
    from sweeper.spec import load_sweep

    sweep, lay = load_sweep(spec_path), Layout.from_mapping(layout)
    if sweep.workload.kind != "builtin":  # one task per node runs the trainer's own command
        from submitit.helpers import TorchDistributedEnvironment

        from sweeper.workloads import run_external

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)  # MASTER_ADDR/PORT
        node = os.environ.get("SLURM_NODEID", "0")
        return asdict(run_external(sweep, lay, workdir=Path(out_dir) / f"node{node}"))
    from sweeper.trainer.runner import run_trial

    return asdict(run_trial(sweep, lay, out_dir=Path(out_dir)))


class SlurmLauncher(Launcher):
    """Submits with submitit's SLURM executor; re-attaches by job id after a restart."""

    kind = "slurm"

    def __init__(self, profile: SlurmProfile, sweep: Sweep) -> None:
        self.profile = profile
        self.sweep = sweep
        self.poll_s = profile.poll_s

    def _executor(self, job: TrialJob) -> submitit.AutoExecutor:
        p, cluster = self.profile, self.sweep.cluster
        ex = submitit.AutoExecutor(folder=job.workdir / "slurm", cluster="slurm")
        params: dict[str, Any] = dict(
            nodes=cluster.nodes,
            # one rank per GPU; an external trainer's command runs once per node and starts its ranks
            tasks_per_node=cluster.gpus_per_node if self.sweep.workload.kind == "builtin" else 1,
            timeout_min=max(1, math.ceil(self.sweep.trial.timeout_min)),  # the trial's limit is the job's
            name=f"sweep-{self.sweep.name}-{job.number}",
            slurm_signal_delay_s=0,  # no checkpoint/requeue: a time limit is a TIMEOUT, predictably
            slurm_setup=list(p.setup),
            slurm_srun_args=list(p.srun_args),
            # SLURM would requeue a job whose node fails under the same id, unseen; the sweep keeps
            # its own count instead (NODE_FAIL -> one retry), so the job must not requeue itself
            slurm_additional_parameters={"no_requeue": True, **p.sbatch_extra},
        )
        if cluster.gpu.name != "cpu":
            params["gpus_per_node"] = cluster.gpus_per_node
        if p.cpus_per_task:
            params["cpus_per_task"] = p.cpus_per_task
        if p.mem_gb:
            params["mem_gb"] = p.mem_gb
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(p, key):
                params[f"slurm_{key}"] = getattr(p, key)
        if p.exclusive:
            params["slurm_exclusive"] = True
        ex.update_parameters(**params)
        return ex

    def submit(self, job: TrialJob) -> Handle:
        job.workdir.mkdir(parents=True, exist_ok=True)
        sj = self._executor(job).submit(slurm_trial, str(job.spec_path), job.layout.as_dict(), str(job.workdir))
        return Handle(str(sj.job_id), job, sj)

    def poll(self, handle: Handle) -> JobOutcome | None:
        sj: submitit.Job = handle.native
        # submitit's own sacct polling backs off to minutes; the loop already paces itself
        if not sj.done(force_check=True):
            return None
        job, node = handle.job, _nodelist(sj)
        log = str(sj.paths.stderr) if sj.paths else None
        written = read_result(job.workdir / "result.json")
        if written is not None:  # rank 0 writes it even when a stuck peer made a task exit early
            return JobOutcome(TrialResult.from_dict(written), handle.job_id, node, log)
        state = (sj.state or "UNKNOWN").upper()
        rank0 = sj.task(0) if sj.num_tasks > 1 else sj
        if not state.startswith("COMPLETED") and not rank0.paths.result_pickle.exists():
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
            result = sj.results()[0]  # every task returns its rank's result; rank 0 speaks for the trial
        except FailedJobError as e:
            return JobOutcome(failure(TrialStatus.FAILED, _last_lines(str(e)), job), handle.job_id, node, log)
        except UncompletedJobError:
            return self._uncompleted(handle, state, node, log)
        if not isinstance(result, dict):
            return JobOutcome(failure(TrialStatus.FAILED, f"the job returned {type(result).__name__}, not a result", job),
                           handle.job_id, node, log)
        return JobOutcome(TrialResult.from_dict(result), handle.job_id, node, log)

    def _uncompleted(self, handle: Handle, state: str, node: str | None, log: str | None) -> JobOutcome:
        status = TrialStatus.TIMEOUT if state.startswith("TIMEOUT") else TrialStatus.FAILED
        reason = f"SLURM job {handle.job_id} ended {state} without a result"
        if state.startswith("CANCELLED"):
            reason = f"SLURM job {handle.job_id} was cancelled ({state})"
        err = tail(Path(log), 5) if log else ""
        return JobOutcome(failure(status, f"{reason}\n{err}".strip(), handle.job), handle.job_id, node, log,
                       infrastructure_failure=state.startswith(INFRASTRUCTURE_STATES))

    def cancel(self, handle: Handle) -> None:
        handle.native.cancel(check=False)

    def reattach(self, job_id: str, job: TrialJob) -> Handle | None:
        folder = job.workdir / "slurm"
        if not folder.is_dir():
            return None
        ntasks = self.sweep.cluster.world
        sj: submitit.SlurmJob[Any] = submitit.SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(ntasks)))
        return Handle(job_id, job, sj)


def _nodelist(sj: submitit.Job) -> str | None:
    try:
        return sj.get_info().get("NodeList")
    except Exception:  # noqa: BLE001 - sacct may be slow or missing; the node list is informative only
        return None


def _last_lines(text: str, n: int = 20) -> str:
    """The last `n` lines: the end of a traceback says what failed."""
    return "\n".join(text.strip().splitlines()[-n:])
