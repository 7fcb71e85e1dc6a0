"""Learning across sweeps: a sweep keeps what its trials taught in its cluster's learned profile, and
the next sweep there, of another model, starts from it and corrects it with its own trials.

Replayed through the sweep loop (`prepare`, `step`) with the replay launcher, as
tests/search/test_quirk.py replays a trainer quirk: one knob value runs several times slower than
the model predicts, on every model the cluster's trainer runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from sweeper.estimate.step_time import Calibration
from sweeper.knobs import KNOBS
from sweeper.launchers.replay import ReplayLauncher
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.results.identity import sweep_identity
from sweeper.run.orchestrator import prepare
from sweeper.run.orchestrator import step as loop_step
from sweeper.run.state import SweepRun
from sweeper.search.build import build_search
from sweeper.search.learned import LearnedKey, Lessons, learns, load, save
from sweeper.search.prior import LearnedEffect
from sweeper.search.remember import Memory, lessons_of
from sweeper.spec.hardware import GIB
from sweeper.spec.loader import load_sweep, parse_sweep
from sweeper.spec.sweep import Sweep

SPACE = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4], "sharding": ["none", "zero1"]}
# two models on one cluster (8 A100-80GB per node) and one trainer, at different node counts
FIRST, SECOND = ("llama-13b", 8), ("llama-65b", 16)


def _spec(tmp: Path, name: str, model: tuple[str, int], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": model[0],
        "seq_len": 2048,
        "global_batch_size": 2048,
        "cluster": {"nodes": model[1], "gpus_per_node": 8, "gpu": "a100-80gb"},
        "space": SPACE,
        "memory": {"headroom": 0.0},
        "results_dir": str(tmp / "results"),
        **extra,
    }


def _sweep(tmp: Path, spec: dict[str, Any], truth: dict[str, Any] | None) -> tuple[Sweep, Path, int]:
    """The sweep file, its replay table (the model's step times, `truth`'s knob value `slower` times
    slower; uncertain layouts run out of memory) and the plan row of the true best."""
    plan = make_plan(parse_sweep(yaml.safe_dump(spec)))
    rows = np.flatnonzero(plan.status == "candidate")
    step = plan.throughput.total[rows]
    if truth is not None:
        step = step * np.where(plan.cols[truth["knob"]][rows] == truth["value"], truth["slower"], 1.0)
    table = pd.DataFrame({k: plan.cols[k][rows] for k in SPACE})
    table["status"], table["step_time_mean_s"] = "ok", step
    over = np.flatnonzero(plan.status == "uncertain")
    oom = pd.DataFrame({k: plan.cols[k][over] for k in SPACE}).assign(status="oom")
    csv = tmp / f"{spec['name']}.csv"
    pd.concat([table, oom], ignore_index=True).to_csv(csv, index=False)
    spec = spec | {"search": spec.get("search", {}) | {"max_trials": len(rows), "seed": 0}}
    path = tmp / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_sweep(path), csv, int(rows[np.argmin(step)])


def _start(tmp: Path, sweep: Sweep, csv: Path) -> SweepRun:
    return prepare(sweep, ReplayLauncher(csv, sweep), storage=str(tmp / f"{sweep.name}.journal"))


def _ran(run: SweepRun) -> list[int | None]:
    rows = sorted(run.rows, key=lambda r: r["trial_number"])
    return [run.plan.row_of(Layout.from_mapping({k: r[k] for k in KNOBS})) for r in rows]


def _trials_to(run: SweepRun, best: int) -> int:
    while best not in _ran(run) and loop_step(run):
        pass
    return _ran(run).index(best) + 1


def _quirk(tmp: Path, knob: str, slower: float) -> dict[str, Any]:
    """The quirk: the value of `knob` that the second model's predicted best layout has runs `slower` x slower."""
    plan = make_plan(parse_sweep(yaml.safe_dump(_spec(tmp, "probe", SECOND))))
    rows = np.flatnonzero(plan.status == "candidate")
    return {
        "knob": knob,
        "value": plan.cols[knob][rows[np.argmin(plan.throughput.total[rows])]].item(),
        "slower": slower,
    }


@pytest.mark.parametrize("knob,slower", [("pp", 4.0), ("micro_batch_size", 3.0)])
def test_a_learned_quirk_shortens_the_next_sweep_of_another_model(tmp_path, monkeypatch, knob, slower):
    quirk = _quirk(tmp_path, knob, slower)
    on = {"search": {"learned_profile": True}}  # a replay learns only when asked
    # without a learned profile
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    sweep, csv, best = _sweep(tmp_path, _spec(tmp_path, "second_alone", SECOND, **on), quirk)
    run = _start(tmp_path, sweep, csv)
    assert run.memory is not None and run.memory.prior is None
    alone = _trials_to(run, best)
    # the first model's sweep (its whole budget of 12 trials), then the second with its learned profile
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, first_csv, _ = _sweep(tmp_path, _spec(tmp_path, "first", FIRST, **on), quirk)
    run = _start(tmp_path, first, first_csv)
    while len(run.rows) < 12 and loop_step(run):
        pass
    key = LearnedKey("8xa100-80gb", "a100-80gb", "builtin")
    learned = load(key)
    assert learned is not None and [s.name for s in learned.sweeps] == ["first"]
    effects = learned.sweeps[0].effects
    # the quirk, learned (shared with a knob value that every quirky layout measured also had, if one did)
    assert effects[(knob, quirk["value"])].log_ratio > 0.3
    assert effects[(knob, quirk["value"])].log_ratio >= sorted(e.log_ratio for e in effects.values())[-2]
    sweep, csv, best = _sweep(tmp_path, _spec(tmp_path, "second", SECOND, **on), quirk)
    run = _start(tmp_path, sweep, csv)
    assert run.memory is not None and run.memory.prior is not None and run.memory.prior.sources == ("first",)
    assert any("started from the learned profile" in n for n in run.notes)
    helped = _trials_to(run, best)
    print(f"{knob}: {alone} trials to the best alone, {helped} with the learned profile")
    assert helped < alone, (helped, alone)


def test_a_killed_sweep_has_kept_what_its_finished_trials_taught(tmp_path):
    sweep, csv, _ = _sweep(tmp_path, _spec(tmp_path, "first", FIRST, search={"learned_profile": True}), None)
    run = _start(tmp_path, sweep, csv)
    while len(run.rows) < 3 and loop_step(run):
        pass
    # killed here: nothing ran at the sweep's end, yet the profile holds its three trials
    learned = load(LearnedKey.of(sweep))
    assert learned is not None
    (entry,) = learned.sweeps
    assert (entry.name, entry.trials, entry.sweep_id) == ("first", 3, sweep_identity(sweep))
    assert entry.calibration is not None and entry.calibration.compute_scale == pytest.approx(1.0, rel=0.02)
    # resumed: it does not start from its own lessons, and keeps one entry, updated
    again = _start(tmp_path, sweep, csv)
    assert again.memory is not None and again.memory.prior is None
    while len(again.rows) < 4 and loop_step(again):
        pass
    (entry,) = load(LearnedKey.of(sweep)).sweeps  # type: ignore[union-attr]
    assert entry.trials == 4


def test_a_replay_neither_reads_nor_writes_a_learned_profile_unless_asked(tmp_path):
    sweep, csv, _ = _sweep(tmp_path, _spec(tmp_path, "first", FIRST), None)
    key = LearnedKey.of(sweep)
    save(key, _lessons({("pp", 4): LearnedEffect(1.4, 3)}))
    before = key.path.read_text()
    run = _start(tmp_path, sweep, csv)
    while len(run.rows) < 2 and loop_step(run):
        pass
    assert run.memory is not None and not run.memory.enabled and run.memory.prior is None
    assert key.path.read_text() == before
    assert not learns(sweep, measures_here=True)  # off by default, whatever the launcher (docs/profiles.md)
    on = parse_sweep(yaml.safe_dump(_spec(tmp_path, "on", FIRST, search={"learned_profile": True})))
    assert learns(on, measures_here=False) and learns(on, measures_here=True)
    off = parse_sweep(yaml.safe_dump(_spec(tmp_path, "off", FIRST, search={"learned_profile": False})))
    assert not learns(off, measures_here=True)


def _lessons(effects: dict, *, name: str = "earlier", sweep_id: str = "0123456789abcdef") -> Lessons:
    return Lessons(
        sweep_id, name, "llama-13b", 8, "2025-01-01T00:00:00+00:00", 12, 12, Calibration(1.0, 1.0, 12), effects, None
    )


def test_a_learned_profile_seeds_the_next_sweep_and_its_trials_correct_it(tmp_path):
    """The learned profile says pp=4 runs 4x slower than predicted; on this model it does not."""
    sweep = parse_sweep(yaml.safe_dump(_spec(tmp_path, "second", SECOND)))
    key = LearnedKey.of(sweep)
    save(key, _lessons({("pp", 4): LearnedEffect(float(np.log(4.0)), 3)}))
    prior = Memory.of(sweep, sweep_id=sweep_identity(sweep), cluster_name=None, enabled=True).prior
    plan = make_plan(sweep)
    plain = build_search(plan, sampler="auto", max_trials=40)
    seeded = build_search(plan, sampler="auto", max_trials=40, prior=prior)
    rows = np.flatnonzero(plan.status == "candidate")
    pp4 = rows[plan.cols["pp"][rows] == 4]
    # seeded: every pp=4 layout expected 4x slower than the model says, the others as the model says
    assert seeded.pred_mfu[pp4] == pytest.approx(plain.pred_mfu[pp4] / 4, rel=1e-4)  # (kept to 4 decimals)
    other = rows[plan.cols["pp"][rows] != 4]
    assert seeded.pred_mfu[other] == pytest.approx(plain.pred_mfu[other], rel=1e-9)
    # its first pick is no pp=4 layout, though the model's best is one here
    assert plan.cols["pp"][rows[np.argmax(plan.pred_mfu[rows])]] == 4
    first = seeded.ask()
    assert first is not None and plan.cols["pp"][first.row] != 4
    seeded.observe(first.row, status="ok", mfu=float(plan.pred_mfu[first.row]), step_time_s=_step(plan, first.row))
    # this sweep measures two pp=4 layouts at the model's speed: a measurement is never hidden, and the
    # learned effect is contradicted (pp=4 ran as fast as the rest): its trust falls to about 0, and the
    # rest of pp=4 is expected as without it
    for r in pp4[:2]:
        seeded.observe(int(r), status="ok", mfu=float(plan.pred_mfu[r]), step_time_s=_step(plan, int(r)))
    now = seeded.pred_mfu / plain.pred_mfu  # (the model's, unmeasured: the plain search's)
    measured = [first.row, *pp4[:2]]
    assert seeded.pred_mfu[measured] == pytest.approx(plan.pred_mfu[measured], rel=0.02)
    penalty = np.median(now[other]) / np.median(now[pp4[2:]])  # how much slower the rest of pp=4 is expected
    assert 1.0 <= penalty < 1.05, penalty  # from 4x: contradicted by two measurements
    assert seeded.effects is not None and seeded.effects.trust < 0.05


def _step(plan, row: int) -> float:
    return float(plan.throughput.total[row])


def test_measured_peaks_are_kept_and_raise_the_next_sweeps_chance_to_fit(tmp_path):
    """A sweep measured peaks 40 % under the estimate's activations; the next model's uncertain layouts
    are judged on the refitted estimate, and its candidates stay certain."""
    first = parse_sweep(yaml.safe_dump(_spec(tmp_path, "first", FIRST)))
    plan = make_plan(first)
    search = build_search(plan, sampler="auto", max_trials=40)
    mem = plan.memory
    act = mem.activations + mem.logits
    true_gib = (mem.allocated - 0.4 * act + 1.0 * GIB) / GIB
    for r in np.flatnonzero(plan.status == "candidate")[:3]:
        search.observe(
            int(r),
            status="ok",
            mfu=0.5,
            step_time_s=_step(plan, int(r)),
            peak_mem_gib=float(true_gib[r]),
            device="cuda",
        )
    kept = lessons_of(search, sweep_id=sweep_identity(first), trials=3)
    assert kept is not None and kept.memory is not None
    assert (kept.memory.act_scale, kept.memory.offset_gib, kept.memory.peaks) == pytest.approx((0.6, 1.0, 3))
    save(LearnedKey.of(first), kept)
    second = parse_sweep(yaml.safe_dump(_spec(tmp_path, "second", SECOND)))
    prior = Memory.of(second, sweep_id=sweep_identity(second), cluster_name=None, enabled=True).prior
    assert prior is not None and prior.memory is not None and prior.memory.act_scale == pytest.approx(0.6)
    plan = make_plan(second)
    doubt = np.flatnonzero(plan.status == "uncertain")
    certain = np.flatnonzero(plan.status == "candidate")
    plain = build_search(plan, sampler="auto", max_trials=40)
    seeded = build_search(plan, sampler="auto", max_trials=40, prior=prior)
    assert doubt.size and np.all(seeded.fit_chance(doubt) > plain.fit_chance(doubt))
    assert np.all(seeded.fit_chance(certain) == 1.0)
