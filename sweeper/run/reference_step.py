"""The reference step of a profile whose ranks share cores: real steps of the built-in trainer on the
profile's own ranks, priced by the profile just measured (`sweeper.profiles.profile.ReferenceStep`).

A profile times each part of a step apart, every rank doing the same thing at once. A trial's ranks do
different things at once and wait on each other at every collective; where they outnumber the cores
(namespaces of one machine as nodes, more ranks than cores), each wait is for a rank the scheduler runs
elsewhere, and whole steps take longer than their parts add up to. How much is measured here, on a
layout the sweep itself need not contain: plain data parallelism over every rank, two micro-batches of
one sequence each, on the sweep's model cut to one block and to three (the sweep's own layouts are not
the yardstick of the model that prices them). Two depths part what a step waits once from what each
block pass adds (`sweeper.profiles.profile.host_costs`).
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sweeper.estimate.predict import predict
from sweeper.layouts.layout import Layout
from sweeper.profiles.lookup import MeasuredProfile
from sweeper.profiles.profile import HOST_STEP_BOUNDS, Profile, ReferenceStep
from sweeper.results.trial import OK, TrialResult

if TYPE_CHECKING:
    from sweeper.launchers.netns import LocalNodes
    from sweeper.spec.sweep import Sweep

# runs one trial and returns its result: a SLURM job's (`sweeper.run.profiler.slurm_trial`)
TrialRunner = Callable[["Sweep", Layout], TrialResult]

REFERENCE_DEPTHS = (1, 3)  # blocks of the model cut short: two depths, a step's waits apart from a pass's
REFERENCE_MICRO_BATCHES = 2
REFERENCE_MIN_STEPS = 10  # the protocol's steps, for a median that one disturbed step does not move
# every knob the reference sets; the others take the sweep's first value
REFERENCE_KNOBS = {
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "ep": 1,
    "micro_batch_size": 1,
    "sharding": "none",
    "activation_checkpointing": "none",
    "compile": False,
    "float8": False,
}


def wants_reference(profile: Profile, sweep: Sweep | None) -> bool:
    """A CPU profile of the built-in trainer whose ranks outnumber the cores (with --quick too: without
    it every step on such ranks is priced a quarter to a half short)."""
    return (
        sweep is not None
        and profile.gpu == "cpu"
        and sweep.workload.kind == "builtin"
        and profile.processes > profile.cpus
    )


def reference_depths(layers: int) -> tuple[int, ...]:
    """The depths the reference steps run at for a model of `layers` blocks (one, where it has one)."""
    return tuple(sorted({min(d, layers) for d in REFERENCE_DEPTHS}))


def reference_sweep(sweep: Sweep, profile: Profile, path: Path, blocks: int) -> tuple[Sweep, Layout]:
    """The sweep of the reference step at `blocks` blocks, priced by `profile` (read from `path`), and its layout."""
    world = sweep.cluster.world
    model = replace(sweep.model, layers=blocks)
    cluster = replace(sweep.cluster, profile=MeasuredProfile(profile, str(path)))
    ref = replace(
        sweep,
        model=model,
        trial=sweep.trial.model_copy(update={"steps": max(sweep.trial.steps, REFERENCE_MIN_STEPS)}),
        global_batch_size=world * REFERENCE_MICRO_BATCHES,
        cluster=cluster,
        space={**sweep.space, **{k: (v,) for k, v in REFERENCE_KNOBS.items()}},
        sizes=(),
    )
    layout = Layout.from_mapping({k: v[0] for k, v in ref.space.items()})
    return ref, layout


def measure_reference(
    profile: Profile,
    sweep: Sweep,
    *,
    path: Path,
    nodes: LocalNodes | None,
    progress: Callable[[str], None],
    runner: TrialRunner | None = None,
    env: dict[str, str] | None = None,
) -> tuple[tuple[ReferenceStep, ...], str]:
    """The reference steps on the profile's ranks (in the namespaces of `nodes`, if any; through `runner`,
    e.g. a SLURM job, when given), one per depth, or none and why not: a depth that fails fails them all,
    since one depth alone would put a pass's waits on every step. `env`: the local launches' extra
    environment (a warm zygote's, `forking.warm_zygote`)."""
    steps = []
    for blocks in reference_depths(sweep.model.layers):
        step, why = _measure_depth(
            profile, sweep, blocks, path=path, nodes=nodes, progress=progress, runner=runner, env=env
        )
        if step is None:
            return (), why
        steps.append(step)
    return tuple(steps), ""


def _measure_depth(
    profile: Profile,
    sweep: Sweep,
    blocks: int,
    *,
    path: Path,
    nodes: LocalNodes | None,
    progress: Callable[[str], None],
    runner: TrialRunner | None,
    env: dict[str, str] | None = None,
) -> tuple[ReferenceStep | None, str]:
    from sweeper.launchers.ranks import launch_trial

    ref, layout = reference_sweep(sweep, profile, path, blocks)
    rejection = layout.rejection(ref)
    if rejection is not None:
        return None, f"the reference layout does not run here: {rejection.message}"
    what = (
        f"dp={ref.cluster.world}, {REFERENCE_MICRO_BATCHES} micro-batches of 1, {blocks} of the model's "
        f"{sweep.model.layers} blocks"
    )
    progress(f"reference step: {ref.trial.steps} real steps of the built-in trainer ({what})")
    with tempfile.TemporaryDirectory(prefix="sweep-reference-") as work:
        result = (
            runner(ref, layout)
            if runner is not None
            else launch_trial(ref, layout, workdir=Path(work), nodes=nodes, extra_env=env)
        )
    if result.status != OK or not result.step_times_s:
        return None, f"the reference trial at {blocks} blocks ended {result.status}: {(result.error or '')[:160]}"
    measured = statistics.median(result.step_times_s)
    predicted = float(predict(layout.columns(ref), ref).total[0])
    low, high = HOST_STEP_BOUNDS
    if not low <= measured / predicted <= high:
        return None, f"measured {measured:.4g} s against {predicted:.4g} s priced: outside {low}-{high}, left out"
    passes = blocks * REFERENCE_MICRO_BATCHES
    return ReferenceStep(layout=what, passes=passes, measured_s=measured, predicted_s=predicted), ""
