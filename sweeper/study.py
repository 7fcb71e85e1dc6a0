"""The sweep's Optuna study: opened in any storage URL, told how each sweep trial ended, with its attributes."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from sweeper.errors import SweepError
from sweeper.layout import Layout
from sweeper.statuses import TrialStatus
from sweeper.stopping import SlowerThanBest

METRIC = "mfu"  # the objective's name in the study (optuna-dashboard's axis label)


def open_study(storage: str, name: str, *, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create or load the sweep's study (maximising MFU) in an Optuna storage URL."""
    optuna.logging.set_verbosity(logging.WARNING)
    if storage.endswith(".journal") or storage.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = storage.removeprefix("journal:")
        store: Any = JournalStorage(JournalFileBackend(path))
    else:
        store = storage
    try:
        study = optuna.create_study(
            study_name=name,
            storage=store,
            direction="maximize",
            sampler=sampler,
            pruner=SlowerThanBest(),
            load_if_exists=True,
        )
        if study.metric_names != [METRIC]:
            with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([METRIC])
        return study
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise SweepError(f"search.storage {storage!r}: cannot open the Optuna study: {e}") from None


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
    if status == TrialStatus.OK and value is not None:
        study.tell(trial, value)
    elif status == TrialStatus.STOPPED_EARLY:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


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
