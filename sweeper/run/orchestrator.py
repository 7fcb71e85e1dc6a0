"""The sweep loop: ask the search for layouts, run them through a launcher, record every outcome.

Restartable by construction: a trial's job id is persisted before the loop waits on it, a
finished trial is a Parquet file written atomically, and a new `sweep run` re-attaches to what
is still running, retries once what vanished, and never reruns what finished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from sweeper.errors import SweepError
from sweeper.launchers.base import JobOutcome, Launcher, TrialJob, failure
from sweeper.launchers.startup import trial_startup
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import Plan, leave_out, make_plan
from sweeper.plan.summary import no_candidates_message
from sweeper.results.folder import check_not_link, discard_own, preflight, remove_stale_temps
from sweeper.results.frozen import check_unchanged, digest, open_results
from sweeper.results.identity import sweep_identity
from sweeper.results.rows import InFlight, now_utc, row_from
from sweeper.results.study_guard import default_storage, set_aside, sqlite_path, storage_errors
from sweeper.results.trial import TrialResult, as_failed, impossible, stops_sweep
from sweeper.run.closing import closing_notes
from sweeper.run.rows_told import learn_rows, measured, rebuild_from_rows, row_attrs
from sweeper.run.slow_trials import crashed, judge, saved_gpu_hours
from sweeper.run.state import Running, SweepRun
from sweeper.run.unwritten import left_unwritten, not_written, unwritten
from sweeper.search.build import build_search
from sweeper.search.learned import learns
from sweeper.search.learned_show import moved_first_choice
from sweeper.search.remember import Memory
from sweeper.search.study import check_history
from sweeper.spec.sweep import Sweep
from sweeper.statuses import PlanStatus, TrialStatus

MAX_ATTEMPTS = 2  # an infrastructure failure (killed job, lost node, vanished process) is retried once


class Progress(Protocol):
    """What the loop reports as it goes (the CLI draws it; tests may record it)."""

    def started(self, run: SweepRun) -> None: ...
    def submitted(self, run: SweepRun, number: int, layout: Layout, job_id: str) -> None: ...
    def finished(self, run: SweepRun, row: dict[str, Any]) -> None: ...
    def tick(self, run: SweepRun) -> None: ...


def plan_to_run(sweep: Sweep, launcher: Launcher) -> tuple[Plan, int]:
    """The plan less the layouts the launcher cannot run, and how many valid ones that left out;
    refused, with the reason that removed the most, when it leaves the search nothing to run."""
    plan = make_plan(sweep)
    runnable = plan.status != PlanStatus.INVALID
    plan = leave_out(plan, launcher.cannot_run, launcher.cannot_run_reason)
    if not plan.candidate_mask.any():
        raise SweepError(no_candidates_message(plan))
    return plan, int((runnable & (plan.status == PlanStatus.INVALID)).sum())


def prepare(
    sweep: Sweep, launcher: Launcher, *, storage: str | None = None, planned: tuple[Plan, int] | None = None
) -> SweepRun:
    """Plan the sweep (unless `planned` by `plan_to_run`), open its study and results, and pick up
    what an earlier run left. The plan comes first: a sweep with nothing to run creates nothing."""
    plan, left_out = planned or plan_to_run(sweep, launcher)
    storage = storage or preflight(sweep)
    identity = sweep_identity(sweep)
    store, spec_path = open_results(sweep, identity)
    enabled = learns(sweep, measures_here=launcher.measures_here)
    memory = Memory.of(sweep, sweep_id=identity, cluster_name=launcher.cluster_name(), enabled=enabled)
    with storage_errors(storage):
        own_file = storage == default_storage(store.root)
        search = build_search(plan, storage=storage, own_file=own_file, prior=memory.prior)
        search.startup_s = trial_startup(sweep).seconds  # what a trial costs besides its steps, in GPU-hours
        study = search.study
        run = SweepRun(
            sweep,
            plan,
            store,
            search,
            launcher,
            spec_path,
            identity=identity,
            spec_digest=digest(spec_path),
            memory=memory,
        )
        if memory.prior is not None:
            run.notes.append(
                f"started from the learned profile {memory.key.path} ({len(memory.prior.sources)} earlier "
                f"sweep(s): {'; '.join(memory.prior.origins)}); this sweep's trials correct it"
            )
            run.notes += [f"learned profile: refused {line}" for line in memory.prior.refused]
            if not run.search.done:  # a resumed sweep's first trial is long past
                run.notes += moved_first_choice(plan, memory.prior)
        if left_out:
            run.notes.append(f"{left_out} valid layout(s) left out: {launcher.cannot_run_reason}")
        run.rows.extend(store.rows())
        learn_rows(search, plan, run.rows)
        # a study copied in from another sweep, or another history under this sweep's name: refused
        check_history(study, storage, identity=identity, rows=run.rows, numbers=store.numbers())
        if run.rows and not study.trials:  # the study was deleted or set aside: tell it every row
            records = [InFlight.from_json(d) for d in store.inflight()]
            n = rebuild_from_rows(search, plan, run.rows, records, count=store.next_trial_number())
            run.notes.append(
                f"the Optuna study had no trials but trials/ holds {len(run.rows)} rows: "
                f"rebuilt it from them ({n} told, numbered like the sweep); new trials continue the numbering after them"
            )
        _resume_inflight(run)
    return run


def _resume_inflight(run: SweepRun) -> None:
    """Re-attach to trials an earlier run left in flight; retry once those that vanished."""
    finished = {r["trial_number"] for r in run.rows}
    keep: set[int] = set()
    records = [InFlight.from_json(data) for data in run.store.inflight()]
    named = {
        _job(run, r.trial_number, Layout.from_mapping(r.layout), attempt=r.attempt, row=r.row).workdir
        for r in records
        if r.trial_number not in finished
    }
    ended = run.launcher.end_strays(run.store.jobs_dir, named)
    if ended:
        run.notes.append(f"ended {len(ended)} trial process(es) of this sweep that no record names: {', '.join(ended)}")
    for rec in records:
        number = rec.trial_number
        if number in finished:  # written but not told or cleared before a crash: finish both
            row = next(r for r in run.rows if r["trial_number"] == number)
            _tell(run, rec, row)
            run.store.clear_inflight(number)
            continue
        job = _job(run, number, Layout.from_mapping(rec.layout), attempt=rec.attempt, row=rec.row)
        # its study trial: the one recorded, or the one made before a kill, or made now (killed before it)
        optuna_trial = run.search.enqueue(rec.row, trial_number=number, known=rec.optuna_trial)
        if optuna_trial != rec.optuna_trial:
            rec = replace(rec, optuna_trial=optuna_trial)
            run.store.record_inflight(number, rec.to_json())
        keep.add(rec.optuna_trial)
        if rec.job_id is None:  # killed between saving the record and starting the job
            found = run.launcher.find(job)
            if found is None:  # it never started: start it now, same attempt, same folder
                _submit(
                    run,
                    number,
                    job.layout,
                    optuna_trial=rec.optuna_trial,
                    row=rec.row,
                    attempt=rec.attempt,
                    started_at=rec.started_at,
                    previous_error=rec.previous_error,
                )
                continue
            rec = replace(rec, job_id=found)
            run.store.record_inflight(number, rec.to_json())
        job_id = str(rec.job_id)
        handle = run.launcher.reattach(job_id, job)
        if handle is not None:
            run.running[number] = Running(handle, rec)
        elif left_unwritten(job):  # not a vanished job: the disk kept it from writing its result
            _resubmit(
                run, rec, f"job {job_id} could not write its result: the disk was full (see {job.workdir / 'log.txt'})"
            )
        elif job.attempt < MAX_ATTEMPTS:
            _resubmit(run, rec, f"job {job_id} vanished")
        else:
            outcome = JobOutcome(failure(TrialStatus.FAILED, f"job {job_id} vanished twice", job), job_id)
            _record(run, rec, outcome)
    run.search.fail_stale_running(keep)


def _job(run: SweepRun, number: int, layout: Layout, *, attempt: int, row: int) -> TrialJob:
    return TrialJob(
        number=number,
        layout=layout,
        spec_path=run.spec_path.resolve(),
        # the folder resolved, not the trial's own name in it: a link planted there is refused, not followed
        workdir=run.store.jobs_dir.resolve() / f"trial-{number:05d}-a{attempt}",
        timeout_s=run.sweep.trial.timeout_min * 60,
        attempt=attempt,
        # a sweep over several node counts runs each layout at its own (the plan row's)
        nodes=run.plan.nodes_of(row) if run.sweep.several_sizes else None,
    )


def _submit(
    run: SweepRun,
    number: int,
    layout: Layout,
    *,
    optuna_trial: int | None,
    row: int,
    attempt: int = 1,
    started_at: str | None = None,
    previous_error: str | None = None,
) -> None:
    """Start a trial. A new one (`optuna_trial` None) gets its study trial only once its in-flight
    record is saved: killed in between, the restart makes it from the record, numbered like the sweep,
    where a study trial made first would be left without a row and shift every number after it."""
    job = _job(run, number, layout, attempt=attempt, row=row)
    check_not_link(job.workdir)  # the trial writes its result and logs there
    # the trial re-reads the recorded sweep file: edited since, it would measure another sweep under this one's id
    run.spec_digest = check_unchanged(run.spec_path, run.spec_digest, identity=run.identity, source=run.sweep.source)
    submitted = now_utc().isoformat()
    rec = InFlight(
        trial_number=number,
        optuna_trial=number if optuna_trial is None else optuna_trial,  # the number it is to have
        row=row,
        attempt=attempt,
        job_id=None,
        layout=layout.as_dict(),
        submitted_at=submitted,
        started_at=started_at or submitted,
        previous_error=previous_error,
    )
    # saved before the job starts: a `sweep run` killed in between leaves a record, and the
    # restart finds the job by its folder instead of starting the same trial a second time
    run.store.record_inflight(number, rec.to_json())
    if optuna_trial is None:
        rec = replace(rec, optuna_trial=run.search.enqueue(row, trial_number=number))
    handle = run.launcher.submit(job)
    rec = replace(rec, job_id=handle.job_id)
    run.store.record_inflight(number, rec.to_json())  # before anything waits on the job
    run.running[number] = Running(handle, rec)


def _resubmit(run: SweepRun, rec: InFlight, error: str) -> None:
    """The second and last attempt of a trial whose first one died around it."""
    _submit(
        run,
        rec.trial_number,
        Layout.from_mapping(rec.layout),
        optuna_trial=rec.optuna_trial,
        row=rec.row,
        attempt=rec.attempt + 1,
        started_at=rec.started_at,
        previous_error=error,
    )


def _record(run: SweepRun, rec: InFlight, outcome: JobOutcome) -> dict[str, Any]:
    """Write the trial's row, tell the search, forget the in-flight record (in that order)."""
    plan_row = rec.row
    if (why := impossible(outcome.result.to_dict())) is not None:  # never a row the search learns from
        outcome = replace(outcome, result=TrialResult.from_dict(as_failed(outcome.result.to_dict(), why)))
    values = outcome.result.to_dict()
    values.update(
        run.plan.layout(plan_row).as_dict(),
        trial_number=rec.trial_number,
        dp=int(run.plan.cols["dp"][plan_row]),
        grad_accum=int(run.plan.cols["grad_accum"][plan_row]),
        pred_mem_gib=float(run.plan.memory.total[plan_row] / 1024**3),
        job_id=outcome.job_id,
        nodelist=outcome.nodelist,
        log_path=outcome.log_path,
        launcher=run.launcher.kind,
        attempt=rec.attempt,
        optuna_trial=rec.optuna_trial,
        sweep_id=run.identity,
        started_at=_ts(rec.started_at),
        finished_at=now_utc(),
        gpu_hours_saved=saved_gpu_hours(run.plan.sweep_of(plan_row), outcome.result),
        nodes=run.plan.nodes_of(plan_row),
    )
    if rec.previous_error and values.get("error"):
        values["error"] = f"{values['error']} (attempt {rec.attempt - 1}: {rec.previous_error})"
    run.store.write_row(values)
    row = row_from(values)
    _tell(run, rec, values)
    run.store.clear_inflight(rec.trial_number)
    run.rows.append(row)
    _remember(run)
    return row


def _remember(run: SweepRun) -> None:
    """Keep what the finished trials taught in the learned profile, after each one (a killed sweep keeps
    it too); a profile that cannot be written costs the next sweep its prior, not this sweep its run."""
    if run.memory is None:
        return
    try:
        run.memory.keep(run.search, trials=len(run.rows))
    except (OSError, SweepError) as e:
        warning = f"the learned profile {run.memory.key.path} was not updated: {e}"
        if not any(w.startswith("the learned profile") for w in run.warnings):
            run.warnings.append(warning)


def _tell(run: SweepRun, rec: InFlight, row: dict[str, Any]) -> None:
    """Tell the search a recorded trial; one the full disk kept from writing its result teaches
    nothing about its layout (abandoned in Optuna, left untried for the next run)."""
    if not_written(row):
        run.search.abandon(rec.optuna_trial)
        run.search.running.discard(rec.row)
    else:
        run.search.tell(rec.optuna_trial, rec.row, attrs=row_attrs(row), **measured(row))


def _ts(value: Any) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(value) if isinstance(value, str) else value


def step(run: SweepRun, progress: Progress | None = None) -> bool:
    """Submit into free slots, collect what finished. False when nothing is left to do."""
    while (
        not run.stop_requested
        and len(run.running) < run.sweep.search.parallel
        and run.launched < run.budget
        and not run.search.should_stop()
    ):
        number = run.store.next_trial_number()
        chosen = run.search.choose(gpu_hours_left=run.gpu_hours_left())
        if chosen is None:
            break
        _submit(run, number, run.plan.layout(chosen), optuna_trial=None, row=chosen)
        if progress:
            progress.submitted(run, number, run.plan.layout(chosen), run.running[number].handle.job_id)
    for number, item in list(run.running.items()):
        outcome = judge(run, item, run.launcher.poll(item.handle))  # a clearly slow trial is stopped
        if outcome is None:
            continue
        del run.running[number]
        full = unwritten(item.handle, outcome)
        if full is not None:  # no retry on a full disk: the row says why, the sweep stops
            try:
                _record(run, item.record, full)
            except SweepError:  # nor the row: its in-flight record stays, the next run runs it again
                pass
            raise SweepError(
                f"trial {number}: {full.result.error}. Free the space and run `sweep run` again; "
                "the results already written are intact"
            )
        if stops_sweep(outcome.result.to_dict()):  # the machine's fault, never the layout's
            _machine_fault(run, item.record, outcome)
            continue
        # a crash that is not the layout's memory, kernel or time limit may be the node's: once more
        retry = outcome.infrastructure_failure or crashed(run, outcome)
        if retry and item.record.attempt < MAX_ATTEMPTS and not run.stop_requested:
            err = (outcome.result.error or "").splitlines()
            _resubmit(run, item.record, err[0] if err else "infrastructure failure")
            continue
        row = _record(run, item.record, outcome)
        _check_environment(run, row)
        if progress:
            progress.finished(run, row)
    if progress:
        progress.tick(run)
    return bool(run.running) or (
        not run.stop_requested
        and run.launched < run.budget
        and run.search.remaining() > 0
        and not run.search.should_stop()
    )


def _machine_fault(run: SweepRun, rec: InFlight, outcome: JobOutcome) -> None:
    """A trial that found no usable GPU: retried once (another node may have one); then the sweep
    stops, and no row is written: the layout is left untried for the next run, not failed."""
    error = (outcome.result.error or "").splitlines()[0]
    if rec.attempt < MAX_ATTEMPTS and not run.stop_requested:
        _resubmit(run, rec, error)
        return
    run.search.abandon(rec.optuna_trial)
    run.search.running.discard(rec.row)
    run.store.clear_inflight(rec.trial_number)
    run.stop_requested = True
    run.fatal = f"trial {rec.trial_number}: {error} (no result recorded: its layout stays untried)"


def _check_environment(run: SweepRun, row: dict[str, Any]) -> None:
    """Stop on a trial that found no usable GPU; warn once when the GPU found is not the sweep file's."""
    from sweeper.spec.hardware import gpu_matches

    if stops_sweep(row):
        run.stop_requested = True
        run.fatal = f"trial {row['trial_number']}: {row['error']}"
    name, gpu = row.get("gpu_name"), run.sweep.cluster.gpu
    if name and not gpu_matches(gpu, name) and not any("detected GPU" in w for w in run.warnings):
        run.warnings.append(
            f"detected GPU {name!r} is not the sweep file's {gpu.name!r}: MFU is computed "
            f"against {gpu.name}'s peak; fix cluster.gpu if that is wrong"
        )


def run_loop(run: SweepRun, *, progress: Progress | None = None, poll_s: float | None = None) -> None:
    """Drive the sweep until the budget is spent, every candidate ran, or a stop was requested
    (then trials in flight are left running for the next `sweep run` to re-attach)."""
    if progress:
        progress.started(run)
    storage = run.sweep.search.storage or default_storage(run.store.root)
    with storage_errors(storage):  # a full disk or lost database at any tell: one line, rows kept
        while step(run, progress) and not run.stop_requested:
            time.sleep(run.launcher.poll_s if poll_s is None else poll_s)


def run_sweep(
    sweep: Sweep,
    *,
    launcher: Launcher | None = None,
    fresh: bool = False,
    rebuild_study: bool = False,
    confirm: Callable[[str], bool] = lambda question: False,
    progress: Progress | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> SweepRun:
    """The whole `sweep run`: check folder and storage before creating anything, hold the sweep's
    lock, start over when asked (and confirmed), set an unreadable study aside when asked, plan, loop.

    The first Ctrl-C (SIGINT) stops new submissions and returns with the trials in flight left
    running for the next `sweep run` to re-attach; `on_interrupt` is told. A second one quits at once.
    """
    import signal

    from sweeper.launchers import make_launcher
    from sweeper.results.folder import foreign_entries
    from sweeper.results.lock import SweepLock

    root = sweep.results_path
    os.umask(0o077)  # a results folder is trusted like code: everything in it is its owner's alone
    # the trust check first, whatever the flags: --fresh deletes and --rebuild-study renames only in
    # a folder that passed it; those two repair an unreadable study, so only that is let through
    storage = preflight(sweep, repair=fresh or rebuild_study)
    launcher = launcher or make_launcher(sweep)  # a launcher that cannot run the sweep: refused before the lock
    # nothing to run: refused before the lock and the results folder exist, so that the corrected
    # sweep file then runs without --fresh
    planned = plan_to_run(sweep, launcher)
    with SweepLock(root):
        stale = remove_stale_temps(root)  # a live writer's (a `sweep report` beside this run) is kept
        if fresh and any(p.name != "run.lock" for p in root.iterdir()):
            # a folder holding others' files is refused below before anything is asked or deleted
            if not foreign_entries(root) and not confirm(f"delete every result of {sweep.name} under {root}?"):
                raise SweepError("--fresh: not confirmed; nothing deleted")
            discard_results(sweep)
        db = sqlite_path(sweep.search.storage or default_storage(root))
        aside = set_aside(db) if (rebuild_study and not fresh and db is not None and db.exists()) else None
        run = prepare(sweep, launcher, storage=None if (fresh or rebuild_study) else storage, planned=planned)
        if aside is not None:
            run.notes.insert(0, f"--rebuild-study: {db} set aside as {aside.name}")
        if stale:
            run.notes.insert(0, f"removed {stale} temp file(s) that a killed writer left in {root}")
        previous = signal.getsignal(signal.SIGINT)

        def stop(signum: int, frame: Any) -> None:
            if run.stop_requested:
                raise KeyboardInterrupt
            run.stop_requested = True
            if on_interrupt is not None:
                on_interrupt()

        signal.signal(signal.SIGINT, stop)
        try:
            run_loop(run, progress=progress)
        finally:
            signal.signal(signal.SIGINT, previous)
            launcher.close()
    for n, why in run.search.left_out.items():  # a sweep over several node counts: sizes it stopped spending on
        run.notes.append(f"{n} node(s): no more trials spent there: {why}")
    run.notes += closing_notes(run)
    return run


def discard_results(sweep: Sweep) -> None:
    """Remove what the sweep created but its lock (held by the caller), and its study in external storage;
    refuse, deleting nothing, when the folder holds anything else."""
    discard_own(sweep.results_path)
    if sweep.search.storage:
        import optuna

        try:
            optuna.delete_study(study_name=sweep.name, storage=sweep.search.storage)
        except KeyError:
            pass
