"""Trials as torchx apps: one app per trial on Ray, Kubernetes, local Docker, AWS Batch or local processes.

torchx (the PyTorch project's job launcher) turns one `AppDef` into each scheduler's own job, and
answers status, cancel and logs for it by an app handle that outlives the process that submitted
it: that handle is the trial's job id. A trial is one app of one role, `trial`, with a replica per
node of the sweep's cluster; each replica runs `sweeper.launchers.replica`, which starts that node's
ranks (one per device) and ends its log with its report. Nothing is shared with the replicas but
what torchx carries: the sweep file goes in through the environment, the result comes back in the
log, which is fetched into the trial's folder.

torchx is imported where an app is built or asked about: the registry imports this module for
every sweep, and a sweep on SLURM or a dry run must not need it.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StringConstraints

from sweeper.errors import SpecError, SweepError
from sweeper.files import open_own, own_dir
from sweeper.launchers.base import (
    KILL_GRACE_S,
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
from sweeper.launchers.replica import SPEC_ENV, parse_reports
from sweeper.launchers.torchx_trials import PORTS, PortPool, reports_left, trial_outcome
from sweeper.results.trial import TrialResult
from sweeper.runtime.evidence import INFRASTRUCTURE_FAILURE
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

if TYPE_CHECKING:
    from torchx.runner import Runner
    from torchx.specs import AppDef, AppDryRunInfo, AppStatus

Scheduler = Literal["ray", "kubernetes", "local_docker", "local_cwd", "aws_batch"]
# Where the app's image is a folder the launcher makes for each trial (Ray uploads it as the job's
# working directory; local_cwd runs in it), not a container image the profile names
FOLDER_IMAGE: tuple[str, ...] = ("ray", "local_cwd")
# The run options a shared sweep file may set inline. Every other one (a privileged container, the
# submitting shell's environment copied in, a pip requirements file, a service account, an image
# repository to push to) only a site profile under launchers/ may set.
INLINE_CFG: dict[str, tuple[str, ...]] = {
    "ray": ("dashboard_address", "cluster_name"),
    "kubernetes": ("queue", "namespace", "priority_class"),
    "local_docker": (),
    "local_cwd": (),
    "aws_batch": ("queue", "priority", "share_id"),
}
# Where the scheduler keeps one log for the whole app (Ray: the job's, every replica's lines in it)
ONE_LOG: tuple[str, ...] = ("ray",)
# How long a replica stays after its report: Ray loses the last lines of a process that exits at once
# (seen in 3 of 5 runs here, from the job's log and the worker's log file alike)
LINGER_S: dict[str, float] = {"ray": 3.0}
# Where an app's status lists every replica the scheduler still has (Docker: a container each)
COUNTS_REPLICAS: tuple[str, ...] = ("local_docker",)
# What each scheduler needs installed beside torchx (pip), for the message when it is missing
EXTRA: dict[str, str] = {"ray": "ray", "kubernetes": "kubernetes"}
ROLE = "trial"
APP_FILE = "app.txt"  # in the trial's folder: the handle of the app it submitted, for re-attach
PORT_FILE = "master_port.txt"  # in the trial's folder: the offset of the master port it holds, for re-attach
# Between tries of a submission the scheduler refused (a Ray head that just started has no job agent
# yet: "please try again later"), within the profile's `submit_patience_s`
SUBMIT_WAITS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
UNREACHABLE_S = 120.0  # how long the scheduler may not answer before its app counts as vanished

ImageRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]*$", max_length=256)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
EnvValue = Annotated[str, StringConstraints(max_length=4096)]
CfgValue = SafeToken | int | float | bool | list[SafeToken]


class TorchxProfile(LauncherProfile):
    """Trials as torchx apps: a replica per node of the sweep's cluster, on the scheduler named."""

    kind: Literal["torchx"]
    scheduler: Scheduler
    image: ImageRef | None = Field(
        default=None,
        description="the container image with sweep installed (local_docker, kubernetes, aws_batch); "
        "ray and local_cwd run in a folder the launcher makes for each trial",
    )
    cfg: dict[OptionName, CfgValue] = Field(
        default_factory=dict,
        description="the scheduler's run options (`torchx runopts SCHEDULER`), e.g. dashboard_address, namespace, queue",
    )
    python: SafeToken | None = Field(
        default=None,
        description="the replicas' Python, where sweep is installed (default: python3; local_cwd: this Python)",
    )
    cpus_per_replica: int | None = Field(default=None, ge=1, le=1024, description="default: one per device of a node")
    memory_gb_per_replica: float | None = Field(
        default=None, gt=0, description="default: the scheduler's own (no limit on local_docker)"
    )
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="variables set in every replica")
    mounts: list[Annotated[str, StringConstraints(max_length=1000)]] = Field(
        default_factory=list, description="torchx mounts, e.g. type=bind,src=/data,dst=/data,readonly"
    )
    master_port: int = Field(
        default=29500,
        ge=1024,
        le=64535,
        description="node 0's port for a trial over several nodes (+ trial % 1000, or the next offset no trial in flight holds)",
    )
    poll_s: float = Field(default=2.0, gt=0, le=600, description="seconds between status checks")
    submit_patience_s: float = Field(
        default=60.0, ge=0, le=3600, description="how long a submission the scheduler refuses is tried again"
    )

    # a replica's environment and mounts reach into the machines it runs on
    site_only = ("env", "mounts")

    def cluster_name(self) -> str | None:
        # the Ray cluster or the queue the trials share: what a learned profile is about
        name = self.cfg.get("cluster_name") or self.cfg.get("queue") or self.cfg.get("dashboard_address")
        return f"{self.scheduler}-{name}" if isinstance(name, str) and name else None

    def site_only_settings(self) -> list[str]:
        allowed = INLINE_CFG[self.scheduler]
        return super().site_only_settings() + [f"cfg.{k}" for k in self.cfg if k not in allowed]

    def check(self, source: str) -> None:
        if self.scheduler in FOLDER_IMAGE and self.image is not None:
            raise SpecError(
                f"{source}: image: the {self.scheduler} scheduler runs in a folder the launcher makes for each "
                "trial; leave image out"
            )
        if self.scheduler not in FOLDER_IMAGE and self.image is None:
            raise SpecError(
                f"{source}: image: the {self.scheduler} scheduler needs a container image with sweep installed"
            )
        try:  # what torchx itself accepts, where it is installed (a dry run elsewhere needs no torchx)
            from torchx.runner import get_runner
            from torchx.specs import parse_mounts
        except ImportError:
            return
        try:
            for mount in self.mounts:  # one mount per entry: each starts with its type
                if not mount.startswith("type=") or len(parse_mounts(mount.split(","))) != 1:
                    raise ValueError(f"{mount!r} is not one mount")
        except (ValueError, KeyError) as e:
            raise SpecError(f"{source}: mounts: {e} (e.g. type=bind,src=/data,dst=/data,readonly)") from None
        with get_runner() as runner:
            try:
                known = runner.scheduler_run_opts(self.scheduler)
            except Exception:  # noqa: BLE001 - its own package is missing: said when the launcher is built
                return
        unknown = [k for k in self.cfg if known.get(k) is None]
        if unknown:
            names = ", ".join(name for name, _ in known)
            raise SpecError(f"{source}: cfg.{unknown[0]}: not a run option of {self.scheduler}; options: {names}")


def app_name(sweep_name: str, number: int) -> str:
    """A name every scheduler takes (Kubernetes: lower case, digits and '-'): the sweep's and the trial's."""
    base = re.sub(r"[^a-z0-9-]+", "-", sweep_name.lower()).strip("-")[:30] or "sweep"
    return f"sweep-{base}-{number}"


def app_def(
    profile: TorchxProfile, sweep: Sweep, job: TrialJob, image: str, spec_text: str, *, port_offset: int | None = None
) -> AppDef:
    """The torchx app of one trial: a replica per node, each running its node's ranks."""
    from torchx import specs

    cluster = sweep.cluster
    devices = cluster.gpus_per_node if cluster.gpu.name != "cpu" else 0
    memory = round(profile.memory_gb_per_replica * 1024) if profile.memory_gb_per_replica else -1
    args = [
        "-m",
        "sweeper.launchers.replica",
        *("--layout", json.dumps(job.layout.as_dict(), separators=(",", ":"))),
        *("--node-rank", specs.macros.replica_id),
        *("--rank0-env", specs.macros.rank0_env),  # the variable's name: each scheduler has its own
        *("--nodes", str(cluster.nodes)),
        *("--timeout-s", f"{job.timeout_s:g}"),
        # one port per trial in flight (TorchxLauncher.port_offset): trials of one sweep may share node 0's machine
        *("--master-port", str(profile.master_port + (job.number % PORTS if port_offset is None else port_offset))),
        *("--source", str(job.spec_path)),
        *("--workdir", str(job.workdir)),
        *("--linger-s", f"{LINGER_S.get(profile.scheduler, 0.0):g}"),
    ]
    role = specs.Role(
        name=ROLE,
        image=image,
        entrypoint=profile.python or (sys.executable if profile.scheduler == "local_cwd" else "python3"),
        args=args,
        env={SPEC_ENV: spec_text, "PYTHONUNBUFFERED": "1", **profile.env},
        num_replicas=cluster.nodes,
        max_retries=0,  # a failed replica is the sweep's to retry, once, as a new app
        resource=specs.Resource(cpu=profile.cpus_per_replica or cluster.gpus_per_node, gpu=devices, memMB=memory),
        mounts=specs.parse_mounts([opt for mount in profile.mounts for opt in mount.split(",")]),
    )
    return specs.AppDef(name=app_name(sweep.name, job.number), roles=[role])


class TorchxLauncher(Launcher):
    """Submits each trial as a torchx app; re-attaches by its handle after a restart."""

    kind = "torchx"
    profile_model = TorchxProfile

    @classmethod
    def from_profile(cls, profile: LauncherProfile, sweep: Sweep) -> TorchxLauncher:
        assert isinstance(profile, TorchxProfile)
        extra = EXTRA.get(profile.scheduler)
        try:
            import torchx  # noqa: F401

            if extra:
                __import__(extra)
        except ImportError as e:
            needs = f"torchx and {extra}" if extra else "torchx"
            raise SpecError(
                f"launcher: the torchx launcher on {profile.scheduler} needs {needs} ({e.msg}): "
                f"pip install 'sweep[{extra or 'torchx'}]'"
            ) from None
        return cls(profile, sweep)

    def __init__(self, profile: TorchxProfile, sweep: Sweep) -> None:
        self.profile = profile
        self.sweep = sweep
        self.poll_s = profile.poll_s
        self._runner: Runner | None = None
        self._ports = PortPool()  # each trial in flight's master port

    def port_offset(self, number: int) -> int:
        """The master port offset trial `number` holds while in flight (`PortPool.take`)."""
        return self._ports.take(number)

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            from torchx.runner import get_runner

            _quiet_scheduler_logs()
            self._runner = get_runner()
        return self._runner

    def cluster_name(self) -> str | None:
        return self.profile.cluster_name()

    def request(self, job: TrialJob, image: str | None = None) -> AppDryRunInfo[Any]:
        """What torchx would submit for the trial, as the scheduler's own request (a Kubernetes job,
        Docker containers, Ray actors): `submit` schedules exactly this."""
        sweep = self.sweep.at(job.nodes) if job.nodes is not None else self.sweep
        offset = self._ports.get(job.number)  # held from submit to the trial's end (a dry run holds none)
        app = app_def(
            self.profile, sweep, job, image or self._image(job), Path(job.spec_path).read_text(), port_offset=offset
        )
        return self.runner.dryrun(app, self.profile.scheduler, cfg=dict(self.profile.cfg))

    def submit(self, job: TrialJob) -> Handle:
        own_dir(job.workdir)  # a link planted at the job's folder is replaced, never followed
        offset = self.port_offset(job.number)
        with open_own(job.workdir / PORT_FILE) as f:  # a re-attached trial keeps holding its port
            f.write(str(offset).encode())
        try:
            app_id = self._schedule(job)
        except BaseException:
            self._ports.free(job.number)
            raise
        with open_own(job.workdir / APP_FILE) as f:  # before anything else can fail: `find` reads it
            f.write(app_id.encode())
        return Handle(app_id, job, None, {"submitted": time.time()})

    def _schedule(self, job: TrialJob) -> str:
        """Schedule the trial's app; a refusal is tried again within `submit_patience_s`, then said in one line."""
        give_up = time.monotonic() + self.profile.submit_patience_s
        for tries in itertools.count():
            image = self._image(job)
            try:
                return self.runner.schedule(self.request(job, image))
            except Exception as e:  # noqa: BLE001 - the scheduler's client refused or cannot be reached
                wait = SUBMIT_WAITS_S[min(tries, len(SUBMIT_WAITS_S) - 1)]
                if time.monotonic() + wait > give_up:
                    raise SweepError(
                        f"launcher: torchx could not submit trial {job.number} to {self.profile.scheduler} "
                        f"({tries + 1} tries): {type(e).__name__}: {' '.join(str(e).split())[:400]}"
                    ) from None
            finally:
                if self.profile.scheduler == "ray":  # uploaded (torchx removes it itself when under /tmp)
                    shutil.rmtree(image, ignore_errors=True)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _image(self, job: TrialJob) -> str:
        if self.profile.scheduler == "ray":
            return tempfile.mkdtemp(prefix="sweep-app-")  # the job's working directory, uploaded
        if self.profile.scheduler == "local_cwd":
            return str(own_dir(job.workdir / "app"))  # the replicas' working directory
        assert self.profile.image is not None
        return self.profile.image

    def poll(self, handle: Handle) -> JobOutcome | None:
        if "outcome" in handle.info:
            return handle.info["outcome"]
        try:
            status = self.runner.status(handle.job_id)
        except Exception as e:  # noqa: BLE001 - any scheduler's client error: unreachable or the app unknown
            return self._unanswered(handle, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        handle.info.pop("unanswered_since", None)
        if status is None or _vanished(self.profile.scheduler, status):
            return self._ended(handle, failure(TrialStatus.FAILED, self._gone(handle), handle.job), True)
        if not status.is_terminal():
            if status.state.name == "RUNNING":
                handle.info.setdefault("running_since", time.monotonic())
            return self._enforce_limit(handle)
        return self._collect(handle, status)

    def _gone(self, handle: Handle, why: str = "") -> str:
        return f"{INFRASTRUCTURE_FAILURE}: torchx app {handle.job_id} vanished: {self.profile.scheduler} no longer knows it{why}"

    def _unanswered(self, handle: Handle, error: str) -> JobOutcome | None:
        since = handle.info.setdefault("unanswered_since", time.monotonic())
        if time.monotonic() - since < UNREACHABLE_S:
            return None
        why = f" (no answer for {UNREACHABLE_S:.0f} s: {error})"
        return self._ended(handle, failure(TrialStatus.FAILED, self._gone(handle, why), handle.job), True)

    def _enforce_limit(self, handle: Handle) -> JobOutcome | None:
        since = handle.info.get("running_since")
        limit = handle.job.timeout_s + KILL_GRACE_S  # counted from RUNNING: waiting for resources is not the trial's
        if since is None or time.monotonic() - since <= limit:
            return None
        self.cancel(handle)
        msg = f"no result {limit:.0f} s after the app started running; cancelled"
        return self._ended(handle, failure(TrialStatus.TIMEOUT, msg, handle.job), False)

    def _collect(self, handle: Handle, status: AppStatus) -> JobOutcome:
        """The ended app's logs into the trial's folder, and its outcome from the replicas' reports."""
        lines, log = self._fetch_logs(handle)
        reports = parse_reports(lines) | reports_left(handle.job.workdir)
        if self.profile.scheduler == "local_docker":  # logs and reports are in: the containers go
            remove_containers(handle.job_id)
        result, infrastructure = trial_outcome(
            reports,
            handle.job,
            app=handle.job_id,
            state=status.state.name,
            cancelled=bool(handle.info.get("cancelled")),
            log_tail=tail(log, 5) if log else "",
        )
        return self._ended(handle, result, infrastructure, status=status, log=log)

    def _fetch_logs(self, handle: Handle) -> tuple[list[str], Path | None]:
        """Each replica's log, as the scheduler keeps it, into logs/ of the trial's folder."""
        folder = own_dir(handle.job.workdir / "logs")
        lines: list[str] = []
        first: Path | None = None
        roles = [(ROLE, 1)]
        if self.profile.scheduler not in ONE_LOG:
            try:
                app = self.runner.describe(handle.job_id)
                roles = [(r.name, r.num_replicas) for r in app.roles] if app else roles
            except Exception:  # noqa: BLE001 - a scheduler that cannot describe an ended app: the trial's role
                pass
        for role, replicas in roles:
            for k in range(max(1, replicas)):
                try:
                    got = [line.rstrip("\n") for line in self.runner.log_lines(handle.job_id, role, k)]
                except Exception as e:  # noqa: BLE001 - logs purged or the replica never started
                    got = [f"sweep: no log of {role}/{k}: {type(e).__name__}: {' '.join(str(e).split())[:300]}"]
                path = folder / f"{role}-{k}.log"
                with open_own(path) as f:
                    f.write(("\n".join(got) + "\n").encode(errors="replace"))
                first = first or path
                lines += got
        return lines, first

    def _ended(
        self,
        handle: Handle,
        result: TrialResult,
        infrastructure: bool,
        *,
        status: AppStatus | None = None,
        log: Path | None = None,
    ) -> JobOutcome:
        replicas = [r for role in (status.roles if status else []) for r in role.replicas]
        hosts = [r.hostname for r in replicas if r.hostname and r.hostname != "<NONE>"]  # torchx.specs.NONE
        outcome = JobOutcome(result, handle.job_id, ",".join(hosts) or None, str(log) if log else None, infrastructure)
        handle.info["outcome"] = outcome  # an ended trial stays ended
        self._ports.free(handle.job.number)  # its port is free for the next trial
        return outcome

    def cancel(self, handle: Handle) -> None:
        handle.info["cancelled"] = True
        try:
            self.runner.cancel(handle.job_id)
        except Exception:  # noqa: BLE001 - already gone: nothing left to stop
            pass

    def reattach(self, job_id: str, job: TrialJob) -> Handle | None:
        if self.find(job) != job_id:  # only the app this trial's folder submitted
            return None
        try:
            status = self.runner.status(job_id)
        except Exception:  # noqa: BLE001 - unknown to the scheduler, or it cannot be reached: gone
            return None
        if status is None or _vanished(self.profile.scheduler, status):
            return None
        try:  # the port it holds, as submit recorded it
            self._ports.keep(job.number, int((job.workdir / PORT_FILE).read_text()))
        except (OSError, ValueError):
            self._ports.keep(job.number, job.number)  # recorded before ports were: the old rule's
        return Handle(job_id, job, None, {"submitted": time.time()})

    def find(self, job: TrialJob) -> str | None:
        try:
            return (job.workdir / APP_FILE).read_text().strip() or None
        except OSError:
            return None


def _vanished(scheduler: str, status: AppStatus) -> bool:
    """An ended app without a replica left: Docker's answer for an app whose containers were removed
    (local_cwd describes an ended app without its replicas too, and keeps it: not gone)."""
    return scheduler in COUNTS_REPLICAS and status.is_terminal() and not any(role.replicas for role in status.roles)


def remove_containers(app_handle: str) -> int:
    """Remove the Docker containers of an ended torchx app (`local_docker://session/app_id`), once its
    logs are in the trial's folder (they stayed until pruned); the number removed. A container Docker
    cannot remove now is left to `docker container prune`, never an error of the trial."""
    import docker
    from torchx.schedulers.docker_scheduler import LABEL_APP_ID
    from torchx.specs import parse_app_handle

    app_id = parse_app_handle(app_handle).app_id
    removed = 0
    try:
        for container in docker.from_env().containers.list(all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"}):
            container.remove(force=True)
            removed += 1
    except docker.errors.DockerException:
        pass
    return removed


def _quiet_scheduler_logs() -> None:
    """torchx and Ray's job client log every upload and pull at INFO (a failed pull of a local image is
    only a warning): the sweep's own progress display says what matters."""
    import logging

    for name in ("torchx", "ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.ERROR)
