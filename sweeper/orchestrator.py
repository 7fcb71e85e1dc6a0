"""The sweep loop: ask the search for layouts, run them through a launcher, record every outcome.

Restartable by construction: a trial's job id is persisted before the loop waits on it, a
finished trial is a Parquet file written atomically, and a new `sweep run` re-attaches to what
is still running, retries once what vanished, and never reruns what finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sweeper.errors import SweepError
from sweeper.launchers.base import Handle, Launcher, Outcome, TrialJob
from sweeper.layout import Layout
from sweeper.plan import Plan, make_plan
from sweeper.results import COLUMNS, ResultsStore, now_utc, row_from
from sweeper.search import LayoutSearch, make_sampler, open_study
from sweeper.spec import Sweep, parse_sweep

FROZEN_SPEC = "sweep.yaml"
MAX_ATTEMPTS = 2  # an infrastructure failure (killed job, lost node, vanished process) is retried once


class Progress(Protocol):
    """What the loop reports as it goes (the CLI draws it; tests may record it)."""

    def started(self, run: SweepRun) -> None: ...
    def submitted(self, run: SweepRun, number: int, layout: Layout, job_id: str) -> None: ...
    def finished(self, run: SweepRun, row: dict[str, Any]) -> None: ...
    def tick(self, run: SweepRun) -> None: ...


@dataclass
class Running:
    handle: Handle
    record: dict[str, Any]


@dataclass
class SweepRun:
    """The state of one `sweep run`: plan, study, launcher, and the trials in flight."""

    sweep: Sweep
    plan: Plan
    store: ResultsStore
    search: LayoutSearch
    launcher: Launcher
    spec_path: Path
    running: dict[int, Running] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    stop_requested: bool = False
    fatal: str | None = None  # why the sweep stopped on its own (this machine cannot run any trial)
    warnings: list[str] = field(default_factory=list)

    @property
    def budget(self) -> int:
        return self.sweep.search.max_trials

    @property
    def launched(self) -> int:
        return len(self.rows) + len(self.running)


def freeze_spec(sweep: Sweep, store: ResultsStore) -> Path:
    """Keep the sweep file beside its results; refuse to continue a sweep whose file changed."""
    frozen = store.root / FROZEN_SPEC
    if sweep.source is None:
        raise SweepError("a sweep run needs a sweep file (got a sweep without a source path)")
    text = Path(sweep.source).read_bytes()
    if frozen.exists():
        old = parse_sweep(frozen.read_bytes(), source=str(frozen))
        if _identity(old) != _identity(sweep):
            raise SweepError(
                f"{sweep.source} changed since {frozen} was recorded (model, batch, cluster, space or "
                "trial settings differ); run with --fresh to start over, or give the sweep a new name"
            )
    tmp = frozen.with_name(".sweep.yaml.tmp")
    tmp.write_bytes(text)
    tmp.replace(frozen)
    return frozen


def _identity(s: Sweep) -> tuple:
    """What makes results comparable: everything but the search budget, launcher and paths."""
    return (s.name, s.model, s.seq_len, s.global_batch_size, s.cluster, s.space, s.trial, s.memory, s.workload)


def prepare(sweep: Sweep, launcher: Launcher) -> SweepRun:
    """Plan the sweep, open its study and results, and pick up what an earlier run left."""
    store = ResultsStore(sweep.results_path)
    store.ensure()
    spec_path = freeze_spec(sweep, store)
    plan = make_plan(sweep)
    n_cand = int(plan.candidate_mask.sum())
    if n_cand == 0:
        raise SweepError(f"{sweep.name}: no candidate layout is left after the plan (see `sweep run --dry-run`)")
    exhaustive = sweep.search.sampler == "grid" or (sweep.search.sampler == "auto" and n_cand <= sweep.search.max_trials)
    sampler = make_sampler(sweep.search.sampler, seed=sweep.search.seed, exhaustive=exhaustive,
                           budget=sweep.search.max_trials)
    storage = sweep.search.storage or f"sqlite:///{(store.root / 'optuna.db').resolve()}"
    study = open_study(storage, sweep.name, sampler=sampler)
    search = LayoutSearch(plan, study, sampler=sweep.search.sampler, max_trials=sweep.search.max_trials,
                          seed=sweep.search.seed, seed_trials=sweep.search.seed_trials,
                          stop_margin=sweep.search.stop_margin)
    run = SweepRun(sweep, plan, store, search, launcher, spec_path)
    _load_finished(run)
    _resume_inflight(run)
    return run


def _load_finished(run: SweepRun) -> None:
    for r in run.store.rows():
        run.rows.append(r)
        layout = Layout.from_mapping({k: r[k] for k in Layout.__dataclass_fields__ if r.get(k) is not None})
        row = run.search.row_of(layout)
        if row is not None:
            run.search.observe(row, **_measured(r))


def _resume_inflight(run: SweepRun) -> None:
    """Re-attach to trials an earlier run left in flight; retry once those that vanished."""
    finished = {r["trial_number"] for r in run.rows}
    keep: set[int] = set()
    for rec in run.store.inflight():
        number = int(rec["trial_number"])
        if number in finished:  # written but not told or cleared before a crash: finish both
            row = next(r for r in run.rows if r["trial_number"] == number)
            run.search.tell(int(rec["optuna_trial"]), int(rec["row"]), **_measured(row))
            run.store.clear_inflight(number)
            continue
        job = _job(run, number, Layout.from_mapping(rec["layout"]), attempt=int(rec["attempt"]))
        handle = run.launcher.reattach(str(rec["job_id"]), job)
        keep.add(int(rec["optuna_trial"]))
        run.search.running.add(int(rec["row"]))
        if handle is not None:
            run.running[number] = Running(handle, rec)
        elif job.attempt < MAX_ATTEMPTS:
            _submit(run, number, job.layout, rec | {"attempt": job.attempt + 1,
                                                    "previous_error": f"job {rec['job_id']} vanished"})
        else:
            outcome = Outcome({"status": "failed", "error": f"job {rec['job_id']} vanished twice",
                               **job.layout.as_dict()}, str(rec["job_id"]))
            _record(run, number, rec, outcome)
    run.search.fail_stale_running(keep)


def _job(run: SweepRun, number: int, layout: Layout, *, attempt: int) -> TrialJob:
    return TrialJob(
        number=number, layout=layout, spec_path=run.spec_path.resolve(),
        workdir=(run.store.jobs_dir / f"trial-{number:05d}-a{attempt}").resolve(),
        timeout_s=run.sweep.trial.timeout_min * 60, attempt=attempt,
    )


def _submit(run: SweepRun, number: int, layout: Layout, rec: dict[str, Any]) -> None:
    job = _job(run, number, layout, attempt=int(rec["attempt"]))
    handle = run.launcher.submit(job)
    rec = rec | {"trial_number": number, "job_id": handle.job_id, "layout": layout.as_dict(),
                 "submitted_at": now_utc().isoformat()}
    rec.setdefault("started_at", rec["submitted_at"])
    run.store.record_inflight(number, rec)  # before anything waits on the job
    run.running[number] = Running(handle, rec)


def _record(run: SweepRun, number: int, rec: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """Write the trial's row, tell the search, forget the in-flight record (in that order)."""
    plan_row = int(rec["row"])
    values = {k: v for k, v in outcome.result.items() if k in COLUMNS}
    values.update(
        run.plan.layout(plan_row).as_dict(),
        trial_number=number,
        dp=int(run.plan.cols["dp"][plan_row]),
        grad_accum=int(run.plan.cols["grad_accum"][plan_row]),
        pred_mem_gib=float(run.plan.memory.total[plan_row] / 1024**3),
        job_id=outcome.job_id, nodelist=outcome.nodelist, log_path=outcome.log_path,
        launcher=run.launcher.kind, attempt=int(rec["attempt"]), optuna_trial=int(rec["optuna_trial"]),
        started_at=_ts(rec.get("started_at")), finished_at=now_utc(),
    )
    if rec.get("previous_error") and values.get("error"):
        values["error"] = f"{values['error']} (attempt 1: {rec['previous_error']})"
    run.store.write_row(values)
    row = row_from(values)
    run.search.tell(int(rec["optuna_trial"]), plan_row, **_measured(values))
    run.store.clear_inflight(number)
    run.rows.append(row)
    return row


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    """What the search learns from a result row."""
    return {"status": row["status"], "mfu": row.get("mfu"), "step_time_s": row.get("step_time_mean_s"),
            "peak_mem_gib": row.get("peak_mem_gib"), "device": row.get("device")}


def _ts(value: Any) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(value) if isinstance(value, str) else value


def step(run: SweepRun, progress: Progress | None = None) -> bool:
    """Submit into free slots, collect what finished. False when nothing is left to do."""
    while (not run.stop_requested and len(run.running) < run.sweep.search.parallel
           and run.launched < run.budget and not run.search.should_stop()):
        proposal = run.search.ask()
        if proposal is None:
            break
        number = run.store.next_trial_number()
        _submit(run, number, proposal.layout,
                {"optuna_trial": proposal.optuna_trial, "row": proposal.row, "attempt": 1})
        if progress:
            progress.submitted(run, number, proposal.layout, run.running[number].handle.job_id)
    for number, item in list(run.running.items()):
        outcome = run.launcher.poll(item.handle)
        if outcome is None:
            continue
        del run.running[number]
        attempt = int(item.record["attempt"])
        if outcome.infrastructure_failure and attempt < MAX_ATTEMPTS and not run.stop_requested:
            err = (outcome.result.get("error") or "").splitlines()
            _submit(run, number, item.handle.job.layout,
                    item.record | {"attempt": attempt + 1, "previous_error": err[0] if err else "infrastructure failure"})
            continue
        row = _record(run, number, item.record, outcome)
        _check_environment(run, row)
        if progress:
            progress.finished(run, row)
    if progress:
        progress.tick(run)
    return bool(run.running) or (
        not run.stop_requested and run.launched < run.budget and run.search.remaining() > 0
        and not run.search.should_stop()
    )


def _check_environment(run: SweepRun, row: dict[str, Any]) -> None:
    """Stop on a trial that found no usable GPU; warn once when the GPU found is not the sweep file's."""
    from sweeper.hardware import gpu_matches
    from sweeper.trial import stops_sweep

    if stops_sweep(row):
        run.stop_requested = True
        run.fatal = f"trial {row['trial_number']}: {row['error']}"
    name, gpu = row.get("gpu_name"), run.sweep.cluster.gpu
    if name and not gpu_matches(gpu, name) and not any("detected GPU" in w for w in run.warnings):
        run.warnings.append(f"detected GPU {name!r} is not the sweep file's {gpu.name!r}: MFU is computed "
                            f"against {gpu.name}'s peak; fix cluster.gpu if that is wrong")


def run_loop(run: SweepRun, *, progress: Progress | None = None, poll_s: float | None = None) -> None:
    """Drive the sweep until the budget is spent, every candidate ran, or a stop was requested
    (then trials in flight are left running for the next `sweep run` to re-attach)."""
    if progress:
        progress.started(run)
    while step(run, progress) and not run.stop_requested:
        time.sleep(run.launcher.poll_s if poll_s is None else poll_s)
