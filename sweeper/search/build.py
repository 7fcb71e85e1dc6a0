"""The one constructor of a sweep's search (`build_search`): its sampler, its Optuna study, its policy.

The orchestrator, the benchmarks and the tests build a search here; `sweeper.search.search` holds
what it then does (which layout runs next, what the trials tell it).
"""

from __future__ import annotations

import logging

import optuna

from sweeper.plan.plan import Plan
from sweeper.search.prior import Prior
from sweeper.search.search import LayoutSearch
from sweeper.search.stopping import SlowerThanBest
from sweeper.search.study import open_study


def build_search(
    plan: Plan,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    sampler: str | None = None,
    max_trials: int | None = None,
    seed: int | None = None,
    own_file: bool = False,
    prior: Prior | None = None,
) -> LayoutSearch:
    """The search of a plan: its sampler, its study (in `storage`, or in memory when None), its policy.

    The one constructor the orchestrator, the benchmarks and the tests use; settings not given
    come from the sweep's `search` section; `own_file`: the storage is the results folder's own
    `optuna.db`, for this sweep's study alone. `prior`: what earlier sweeps taught (a learned profile).
    """
    settings = plan.sweep.search
    sampler = sampler or settings.sampler
    max_trials = settings.max_trials if max_trials is None else max_trials
    seed = settings.seed if seed is None else seed
    # every trial of the sweep's study is enqueued with the layout chosen here: its own sampler
    # never proposes, so it is the cheapest; the pruner stops clearly slow trials
    optuna_sampler = optuna.samplers.RandomSampler(seed=seed)
    name = study_name or plan.sweep.name
    if storage is None:
        optuna.logging.set_verbosity(logging.WARNING)
        study = optuna.create_study(
            study_name=name, direction="maximize", sampler=optuna_sampler, pruner=SlowerThanBest()
        )
    else:
        study = open_study(storage, name, sampler=optuna_sampler, own_file=own_file)
    return LayoutSearch(
        plan,
        study,
        sampler=sampler,
        max_trials=max_trials,
        seed=seed,
        seed_trials=settings.seed_trials,
        stop_margin=settings.stop_margin,
        prior=prior,
    )
