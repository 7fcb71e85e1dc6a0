"""The sweep's Optuna study: opened in any storage URL, told how each sweep trial ended, with its
attributes, and numbered like the sweep.

The study mirrors the sweep: Optuna trial N is sweep trial N. Optuna numbers trials 0, 1, 2, ... as
they are made and never skips one, so a sweep trial's study trial is made only once its in-flight
record is saved (a kill in between makes it on restart, never twice: `mirror_trial` adopts the one
made before the kill), a number the study lacks is filled by a failed placeholder saying why, and a
rebuilt study has one trial per sweep number, in the state its row says (`rebuild_study`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.errors import SweepError
from sweeper.layouts.layout import Layout
from sweeper.results.study_guard import sqlite_path
from sweeper.search.stopping import SlowerThanBest
from sweeper.statuses import TrialStatus

METRIC = "mfu"  # the objective's name in the study (optuna-dashboard's axis label)


def open_study(
    storage: str, name: str, *, sampler: optuna.samplers.BaseSampler, own_file: bool = False
) -> optuna.Study:
    """Create or load the sweep's study (maximising MFU) in an Optuna storage URL. `own_file`: the
    results folder's own `optuna.db`, which holds this sweep's study alone (a copied-in study of
    another sweep is refused, not joined by a second one)."""
    optuna.logging.set_verbosity(logging.WARNING)
    if storage.endswith(".journal") or storage.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = storage.removeprefix("journal:")
        store: Any = JournalStorage(JournalFileBackend(path))
    else:
        store = storage
    try:
        if own_file:
            others = sorted(set(optuna.get_all_study_names(store)) - {name})
            if others:
                raise SweepError(
                    not_this_sweeps(storage, f"holds the study {others[0]!r} of another sweep, not {name!r}")
                )
        study = optuna.create_study(
            study_name=name,
            storage=store,
            direction="maximize",
            sampler=sampler,
            pruner=SlowerThanBest(),
            load_if_exists=True,
        )
        return study  # marked as the sweep's (`check_history`) once it is known to be
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise SweepError(f"search.storage {storage!r}: cannot open the Optuna study: {e}") from None


def name_metric(study: optuna.Study) -> None:
    """The objective named `mfu` (optuna-dashboard's axis label)."""
    if study.metric_names != [METRIC]:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC])


def tell_study(
    study: optuna.Study, trial: optuna.trial.Trial | int, *, status: str, value: float | None, attrs: dict[str, Any]
) -> None:
    """Tell Optuna how one sweep trial ended, with its user attributes (status, error line, layout, job id, ...).

    ok: COMPLETE with its MFU; stopped early: PRUNED (its per-step MFU were reported as it ran);
    anything else that ran and failed: FAIL, so optuna-dashboard shows it as failed with its error.
    """
    if isinstance(trial, int):  # resumed after a crash: only the number survives
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, trial)
        if study._storage.get_trial(trial_id).state.is_finished():
            return  # told before the crash: nothing left to say (Optuna's skip_if_finished)
        trial = optuna.trial.Trial(study, trial_id)
    known = trial.user_attrs  # set when the trial was made (layout, trial number): not written again
    for key, v in (attrs | {"status": str(status)}).items():
        if known.get(key) != v:
            trial.set_user_attr(key, v)
    state = study_state(status, value)
    study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)


def study_state(status: str, value: float | None) -> TrialState:
    """ok: COMPLETE (with its MFU); stopped early: PRUNED; anything else that ran and failed: FAIL."""
    if status == TrialStatus.OK and value is not None:
        return TrialState.COMPLETE
    return TrialState.PRUNED if status == TrialStatus.STOPPED_EARLY else TrialState.FAIL


def mirror_trial(study: optuna.Study, template: FrozenTrial, *, number: int, known: int | None = None) -> int:
    """The study's trial of sweep trial `number` (`template`: RUNNING, with its layout and number);
    returns its Optuna number, `number` itself unless the study was numbered otherwise before.

    `known`, a number recorded for it, is kept while that trial is still running as this one;
    else the trial made for it before a kill is adopted; else numbers the study lacks are filled
    by failed placeholders, and the trial is made."""
    trials = study.get_trials(deepcopy=False)
    if known is not None and known < len(trials):
        t = trials[known]
        if t.state == TrialState.RUNNING and t.user_attrs.get("trial_number", number) == number:
            return known
    for t in trials:
        if t.state == TrialState.RUNNING and t.user_attrs.get("trial_number") == number and t.params == template.params:
            return t.number
    study.add_trials([placeholder(n) for n in range(len(trials), number)])
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return study._storage.get_trial_number_from_id(trial_id)


def placeholder(number: int, **attrs: Any) -> FrozenTrial:
    """A failed trial that stands for a sweep number with no readable row or in-flight record (an
    unreadable file, a record lost): it keeps the numbers after it the sweep's."""
    why = f"sweep trial {number} has no readable row or in-flight record; it holds the number"
    return optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"trial_number": number, "error": why} | attrs)


def rebuild_study(study: optuna.Study, count: int, made: Mapping[int, FrozenTrial]) -> None:
    """Give a study that has no trials one per sweep number below `count`: `made[n]` (a row's trial
    in its state with its attributes, an in-flight trial's RUNNING one), a placeholder for the rest."""
    study.add_trials([made[n] if n in made else placeholder(n, kind="rebuilt") for n in range(count)])


def not_this_sweeps(storage: str, what: str) -> str:
    """The refusal of a study that is not the sweep's own: what it is, and the way out."""
    db = sqlite_path(storage)
    if db is not None:
        return (
            f"the Optuna study {db} {what}; it was not made by this sweep. Run `sweep run ... --rebuild-study` "
            "to set it aside and rebuild the study from trials/"
        )
    return (
        f"the Optuna study in {storage} {what}; it was not made by this sweep. Delete that study "
        "(`optuna delete-study`) or give this sweep another name"
    )


def trial_attrs(
    layout: Layout | None, *, error: str | None = None, job_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The user attributes of a told trial: the layout's knobs, the error's first line, the job id."""
    attrs: dict[str, Any] = dict(extra)
    if layout is not None:
        attrs["layout"] = " ".join(f"{k}={_python(v)}" for k, v in layout.as_dict().items())
    lines = (error or "").strip().splitlines()
    if lines:
        attrs["error"] = lines[0][:500]
    if job_id:
        attrs["job_id"] = str(job_id)
    return attrs


def _python(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def check_history(
    study: optuna.Study, storage: str, *, identity: str, rows: Sequence[Mapping[str, Any]], numbers: set[int]
) -> None:
    """Refuse a study of the sweep's name that is not its own: made by another sweep (its `sweep_id`),
    or holding another history (a finished trial for a number the sweep never gave out, a row whose
    trial is of another layout). Once it passes it is marked as the sweep's (`sweep_id`, the metric's
    name), which nothing may write before: a refused study is left as it was."""
    found = study.user_attrs.get("sweep_id")
    if found not in (None, identity):
        raise SweepError(not_this_sweeps(storage, f"is of the sweep {found}, not of this one ({identity})"))
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        number = t.user_attrs.get("trial_number", t.number)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and number not in numbers:
            why = f"has trial {t.number} finished as sweep trial {number}, which this sweep never ran"
            raise SweepError(not_this_sweeps(storage, why))
    mine: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        mine.setdefault(t.user_attrs.get("trial_number", t.number), []).append(t)
    for r in rows if trials else ():  # an empty study is rebuilt from the rows
        number = int(r["trial_number"])
        if not any(all(r.get(k) == v for k, v in t.params.items()) for t in mine.get(number, [])):
            why = f"has no trial of the layout that sweep trial {number} ran (trials/trial-{number:05d}.parquet)"
            raise SweepError(not_this_sweeps(storage, why))
    if found is None:
        study.set_user_attr("sweep_id", identity)
    name_metric(study)
