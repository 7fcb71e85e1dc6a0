"""What a learned profile says, for people: `sweep profile show FILE` and the dry run's line.

Every number with the sweep it came from (when and where that sweep ran), the prior a next sweep
starts from, and the numbers refused as implausible (`sweeper.search.learned`).
"""

from __future__ import annotations

import math
from pathlib import Path

from sweeper.estimate.step_time import Calibration
from sweeper.files import FileRefused
from sweeper.knobs import KNOBS
from sweeper.plan.plan import Plan
from sweeper.search.learned import (
    LEARNED,
    SCHEMA,
    LearnedKey,
    MemoryLesson,
    learned_dir,
    load,
    nodes_of,
    ratio_text,
    read,
    value_text,
)
from sweeper.search.prior import EFFECT_WEIGHT, EffectKey, LearnedEffect, Prior, python_value
from sweeper.spec.sweep import Sweep


def describe(path: Path) -> list[str]:
    """Every number of a learned profile with the sweep it came from, then the prior a next sweep starts from."""
    p = read(path)
    lines = [f"learned profile {path} (schema {SCHEMA}): {p.key}; {len(p.sweeps)} sweep(s)"]
    for s in p.sweeps:
        lines.append(
            f"sweep {s.origin}: model {s.model}, id {s.sweep_id}; {s.trials} trials, {s.measured} with a step time"
        )
        lines += [f"  {line} (from {s.name})" for line in _numbers(s.calibration, s.effects, s.memory)]
        lines += [f"  refused: {line}" for line in s.refused]
    prior = p.prior()
    if prior is not None:
        lines.append(f"a next sweep here starts from (combined over {', '.join(prior.sources)}):")
        lines += [f"  {line}" for line in _prior_numbers(prior)]
    return lines


def _numbers(
    cal: Calibration | None, effects: dict[EffectKey, LearnedEffect], memory: MemoryLesson | None
) -> list[str]:
    out = []
    if cal is not None:
        out.append(
            f"step time = {cal.compute_scale:.3f} x the model's compute + {cal.comm_scale:.3f} x its communication, "
            f"fitted to {cal.trials} measured step time(s)"
        )
    for (knob, value), e in sorted(effects.items(), key=lambda item: -abs(item[1].log_ratio)):
        out.append(f"{knob}={value_text(value)}: {ratio_text(e.log_ratio)} from {e.trials} measured layout(s)")
    if memory is not None:
        rf = f", reserved {memory.reserved_factor:.3f}x allocated" if memory.reserved_factor else ""
        out.append(
            f"memory: activations x{memory.act_scale:.3f} the estimate's, {memory.offset_gib:+.2f} GiB fixed{rf}, "
            f"fitted to {memory.peaks} measured peak(s)"
        )
    return out


def _prior_numbers(prior: Prior) -> list[str]:
    out = []
    if prior.calibration is not None:
        c = prior.calibration
        out.append(
            f"scales: compute x{c.compute_scale:.3f}, communication x{c.comm_scale:.3f}, "
            f"counted as {prior.calibration_weight:g} measured layout(s) of the new sweep"
        )
    for (knob, value), e in sorted(prior.effects.items(), key=lambda item: -abs(item[1].log_ratio)):
        out.append(
            f"{knob}={value_text(value)}: {ratio_text(e.log_ratio)}, counted as {min(e.trials, EFFECT_WEIGHT):g} layout(s)"
        )
    if prior.memory is not None:
        out.append(f"memory: {prior.memory.describe().split(' (from')[0]}, until the new sweep's own peaks tell")
    return out


def status_line(
    sweep: Sweep, *, sweep_id: str, cluster_name: str | None, enabled: bool, measures_here: bool = True
) -> str:
    """The dry run's one line: which learned profile the sweep would start from, or why none.

    `measures_here`: whether the sweep's launcher measures its cluster (`Launcher.measures_here`: not a replay)."""
    key = LearnedKey.of(sweep, cluster_name)
    if not enabled:
        why = (
            "search.learned_profile: false"
            if sweep.search.learned_profile is False
            else "off by default: on recorded sweeps it did not shorten the search, docs/profiles.md; "
            "search.learned_profile: true uses one"
        )
        return f"learned profile: not used ({why})"
    profile = load(key)
    if profile is None:
        return f"learned profile: none yet for {key}; this sweep's trials will start {key.path}"
    prior = profile.prior(exclude=sweep_id, nodes=nodes_of(sweep))
    if prior is None:  # a sweep never starts from its own lessons (a resumed one would count them twice)
        return f"learned profile: {key.path} holds only this sweep's own lessons; not used, kept for the next sweep"
    refused = "".join(f"; refused: {line}" for line in prior.refused)
    return (
        f"learned profile: {key.path}, from {len(prior.sources)} earlier sweep(s): {'; '.join(prior.origins)}; "
        f"used as the prior (not yours? `sweep profile forget --learned {key.slug}`){refused}"
    )


def moved_first_choice(plan: Plan, prior: Prior) -> list[str]:
    """What the learned profile changes in the search's first choice: the layout the search runs first
    with it and without it, and the learned effects that tell them apart (`sweep run` and the dry run
    print it, so a profile never steers a sweep without a word)."""
    from sweeper.search.build import build_search

    with_it = build_search(plan, sampler="auto", prior=prior).choose()
    without = build_search(plan, sampler="auto").choose()
    if with_it is None or without is None:
        return []
    first = _layout_text(plan, with_it)
    if with_it == without:
        return [f"learned profile: the first trial is the model's own first choice ({first})"]
    lines = [f"learned profile: the first trial is {first}, not the model's first choice {_layout_text(plan, without)}"]
    for knob in sorted({k for (k, _) in prior.effects}):
        for row in (with_it, without):
            value = python_value(plan.cols[knob][row]) if knob in plan.cols else None
            e = prior.effects.get((knob, value))
            other = with_it if row == without else without
            if e is None or abs(e.log_ratio) < 0.01 or python_value(plan.cols[knob][other]) == value:
                continue
            r = math.exp(e.log_ratio)
            how = f"{r:.2f}x slower" if r > 1 else f"{1 / r:.2f}x faster"
            lines.append(f"  it makes {knob}={value_text(value)} {how} than the model says, from {e.sweeps} sweep(s)")
    if prior.calibration is not None and len(lines) == 1:
        c = prior.calibration
        lines.append(
            f"  its scales (compute x{c.compute_scale:.2f}, communication x{c.comm_scale:.2f}) reorder the model's layouts"
        )
    return lines


def _layout_text(plan: Plan, row: int) -> str:
    """The searched knobs of a plan row (and its node count, over several): 'tp=2 pp=4 ...'."""
    knobs = [k for k in KNOBS if len(plan.sweep.space[k]) > 1]
    text = " ".join(f"{k}={value_text(python_value(plan.cols[k][row]))}" for k in knobs)
    return f"{text} at {plan.nodes_of(row)} nodes" if plan.sweep.several_sizes else text


def forget(key: LearnedKey | None = None) -> tuple[list[Path], list[str]]:
    """Remove the learned profile of `key` (every learned profile when None): the files removed, and
    a line for each file kept (not a regular learned profile of the user's in the real cache folder)."""
    from sweeper.profiles.cache import deletable

    folder = learned_dir()
    paths = [key.path] if key is not None else sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    removed, kept = [], []
    for p in paths:
        if not (p.exists() or p.is_symlink()):
            continue
        try:
            deletable(p, folder, LEARNED).unlink()
            removed.append(p)
        except FileRefused as e:
            kept.append(f"kept {p}: {e}")
    return removed, kept
