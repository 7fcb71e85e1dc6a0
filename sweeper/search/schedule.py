"""How the search schedules its trials: which the model picks, which an Optuna sampler proposes,
and the sampler that proposes (in the search's scratch study)."""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from sweeper.errors import SweepError

SAMPLERS = ("auto", "grid", "random", "tpe", "gp")


def is_exhaustive(sampler: str, n_candidates: int, max_trials: int) -> bool:
    """Whether the search runs every candidate (grid always; auto when they fit in the budget)."""
    return sampler == "grid" or (sampler == "auto" and n_candidates <= max_trials)


def make_sampler(name: str, *, seed: int, budget: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler that proposes for search.sampler tpe, gp or random (in the scratch study)."""
    if name in ("random", "grid", "auto"):
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        startup = max(2, min(10, budget // 4))
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=max(2, min(10, budget // 4)))
    raise SweepError(f"search.sampler: {name!r} not allowed; allowed: {', '.join(SAMPLERS)}")


@dataclass(frozen=True)
class Schedule:
    """The scheduling policy: which trials the search's model picks, which an Optuna sampler proposes.

    grid: every candidate in plan order. auto: every trial the layout of highest expected
    speed (the first `seed_trials`, when set, the model's best predicted). tpe, gp,
    random: the sampler alone.
    """

    sampler: str
    exhaustive: bool
    seed_trials: int

    @classmethod
    def of(cls, sampler: str, *, n_candidates: int, max_trials: int, seed_trials: int | None = None) -> Schedule:
        seeds = (seed_trials or 0) if sampler == "auto" else 0
        return cls(sampler, is_exhaustive(sampler, n_candidates, max_trials), seeds)

    @property
    def in_plan_order(self) -> bool:
        return self.sampler == "grid"

    def exploit(self, *, started: int) -> bool:
        """Whether the next trial (after `started` ones) is the search's own pick (not a sampler's)."""
        return self.sampler in ("auto", "grid")

    def by_prior(self, *, started: int) -> bool:
        """Whether the next trial is the prior's best predicted layout (the seed trials)."""
        return started < self.seed_trials
