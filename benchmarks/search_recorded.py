"""`search_transfer.py --recorded`: learning across sweeps on recorded sweeps, the Ultra-Scale Playbook's.

The cells of ../shared/data/ultrascale (one per model and node count with at least 3 ok runs, built as
`../shared/checks/_ultrascale.py` builds them: nanotron's knobs and workload, statuses and step times
from the data) are sweeps of one cluster (8 H100 per node), one GPU and one trainer: one learned
profile key. Per seed:

1. History: every cell runs once, in an order the seed draws, as one cluster's sweeps one after
   another: each through the sweep loop (`prepare` and `step`, the replay launcher) with
   `search.learned_profile: true` and a budget of HISTORY_BUDGET trials, so each keeps what it taught
   in the cluster's learned profile and starts from what the sweeps before it left there.
2. Pairs: each cell again, as the sweep that comes after the other models' sweeps at its node count
   and after its own model's sweeps at other counts: its learned profile holds those sweeps' lessons
   from the history (in the history's order, dated by it, the most recent `learned.MAX_SWEEPS` kept),
   and the sweep runs until its best layout ran, once with that profile and once without any.

Trials to the best: until the layout of the best measured tokens/s/GPU ran; within 1 %: until a
layout within 1 % of its step time ran. A pair is (cell, seed): fewer, equal or more trials with
the learned profile than without, at the same seed. Without a profile the search draws nothing at
random (`auto`), so its count is the same at every seed: it runs once per cell.

Held out: pairs whose cell's CRC32 is 0 mod 3 (`search_public.held_out`) were not looked at while the
learned profile's weighing was chosen; they are reported apart.

Quick (`search_transfer.py --recorded --quick`): seed 0 only, the one cell with the fewest sources as
the later sweep (unless --cells names others), and a history of only those cells' own sweeps and the
sweeps they learn from (the others' lessons would not be read): the same sweeps, profiles and lines,
on one pair.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from search_public import KEYS, held_out, ultrascale_cells, ultrascale_sweep

from sweeper.launchers.replay import ReplayLauncher
from sweeper.results.identity import sweep_identity
from sweeper.run.orchestrator import plan_to_run
from sweeper.search.build import build_search
from sweeper.search.learned import LearnedKey, Lessons, learns, load, save
from sweeper.search.remember import Memory
from sweeper.search.search import LayoutSearch
from sweeper.search.stopping import mfu_seconds
from sweeper.spec.loader import load_sweep

SEEDS = (0, 1, 2)
HISTORY_BUDGET = 10
CLOSE = 0.01
COLS = [*KEYS, "sequence_parallel", "activation_checkpointing", "attention", "status", "step_time_mean_s"]


@dataclass(frozen=True)
class Cell:
    name: str
    model: str
    nodes: int
    table: pd.DataFrame  # the replay table: knobs, status, step_time_mean_s
    g: pd.DataFrame  # the cell's measured layouts (search_public.ultrascale_cells)

    @property
    def best(self) -> pd.Series:
        ok = self.table[self.table.status == "ok"]
        return ok.loc[ok.step_time_mean_s.idxmin()]


def cells() -> list[Cell]:
    out = []
    for name, g in ultrascale_cells():
        t = g.copy()
        t["sequence_parallel"] = t.tp > 1
        t["activation_checkpointing"], t["attention"] = "none", "flash2"
        t["status"] = t.status.map({"ok": "ok"}).fillna("oom")
        t["step_time_mean_s"] = t.gbs * t.seq / (t.tps * t.gpus)
        t.loc[t.status != "ok", "step_time_mean_s"] = np.nan
        out.append(Cell(name, str(g.model.iloc[0]), int(g.nodes.iloc[0]), t[COLS].reset_index(drop=True), g))
    return out


def sweep_file(cell: Cell, tmp: Path, tag: str, *, budget: int, learned: bool, seed: int) -> Path:
    spec = ultrascale_sweep(cell.g, cell.name) | {
        "workload": {
            "kind": "nanotron",
            "command": "torchrun --nproc-per-node {nproc} run_train.py --config-file {workdir}/nanotron.yaml",
        },
        "launcher": {"kind": "replay", "table": str(tmp / f"{cell.name}.csv")},
        "search": {"max_trials": budget, "parallel": 1, "seed": seed, "learned_profile": learned},
        "results_dir": str(tmp / f"results_{tag}"),
    }
    cell.table.to_csv(tmp / f"{cell.name}.csv", index=False)
    path = tmp / f"{cell.name}_{tag}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@dataclass
class Replayed:
    """A sweep's trials, in order: each plan row, its status and step time."""

    search: LayoutSearch
    memory: Memory
    order: list[tuple[int, str, float | None]]


def run(path: Path, *, until: pd.Series | None) -> Replayed:
    """The sweep as the sweep loop drives its search (`plan_to_run`, `Memory.of`, `build_search`, then
    `choose`, `observe` and `Memory.keep` per trial, with the replay launcher's answers), without the
    results folder's files (Parquet rows, the study's journal: a recorded sweep's answers cost no time,
    their writes would be most of the benchmark's): its whole budget, or until the layout `until` ran."""
    sweep = load_sweep(path)
    launcher = ReplayLauncher(path.parent / f"{sweep.name}.csv", sweep)
    plan, _ = plan_to_run(sweep, launcher)
    enabled = learns(sweep, measures_here=launcher.measures_here)
    memory = Memory.of(sweep, sweep_id=sweep_identity(sweep), cluster_name=launcher.cluster_name(), enabled=enabled)
    search = build_search(plan, prior=memory.prior)
    work = mfu_seconds(sweep)
    order: list[tuple[int, str, float | None]] = []
    while len(order) < sweep.search.max_trials and not search.should_stop():
        row = search.choose()
        if row is None:
            break
        answer = launcher.table[launcher._key({k: v[[row]] for k, v in plan.cols.items()})[0]]
        status = str(answer["status"])
        step = float(answer["step_time_mean_s"]) if status == "ok" else None
        search.observe(row, status=status, mfu=work / step if step else None, step_time_s=step)
        order.append((row, status, step))
        if until is not None and all(plan.cols[k][row] == until[k] for k in KEYS):
            break
    memory.keep(search, trials=len(order))
    return Replayed(search, memory, order)


def trials_to(r: Replayed, cell: Cell) -> tuple[int | None, int | None]:
    """Trials until the best ran, and until a layout within CLOSE of it ran (None: never)."""
    best, cols = cell.best, r.search.plan.cols
    hit = [i for i, (row, _, _) in enumerate(r.order) if all(cols[k][row] == best[k] for k in KEYS)]
    limit = best.step_time_mean_s * (1 + CLOSE)
    near = [i for i, (_, status, step) in enumerate(r.order) if status == "ok" and step is not None and step <= limit]
    return (hit[0] + 1 if hit else None), (near[0] + 1 if near else None)


def history(all_cells: Sequence[Cell], seed: int, tmp: Path) -> dict[str, Lessons]:
    """Every cell's sweep in the seed's order on one cluster, each starting from the learned profile the
    ones before it left; what each taught (its own entry in the profile), dated by its place."""
    os.environ["XDG_CACHE_HOME"] = str(tmp / "history_cache")
    order = np.random.default_rng(seed).permutation(len(all_cells))
    out: dict[str, Lessons] = {}
    for i, k in enumerate(order):
        cell = all_cells[int(k)]
        path = sweep_file(cell, tmp, f"h{seed}", budget=HISTORY_BUDGET, learned=True, seed=seed)
        r = run(path, until=None)
        profile = load(r.memory.key)
        found = [s for s in (profile.sweeps if profile else ()) if s.sweep_id == r.memory.sweep_id]
        if found:
            # dated by its place in the history, a minute apart (a learned profile's dates are ISO 8601 times)
            placed = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=i)
            out[cell.name] = replace(found[0], date=placed.isoformat())
    return out


def sources(cell: Cell, all_cells: Sequence[Cell]) -> list[Cell]:
    """The sweeps a cell's comes after: the other models' at its node count, its model's at other counts."""
    return [c for c in all_cells if c.name != cell.name and ((c.nodes == cell.nodes) != (c.model == cell.model))]


def pair(cell: Cell, all_cells: Sequence[Cell], lessons: dict[str, Lessons], seed: int, tmp: Path) -> dict[str, Any]:
    """The cell's sweep with the learned profile of its sources' lessons (from the seed's history)."""
    cache = tmp / f"pair_cache_{seed}_{cell.name}"
    os.environ["XDG_CACHE_HOME"] = str(cache)
    taught = sorted((lessons[c.name] for c in sources(cell, all_cells) if c.name in lessons), key=lambda s: s.date)
    path = sweep_file(cell, tmp, f"w{seed}", budget=len(cell.table), learned=True, seed=seed)
    key = LearnedKey.of(load_sweep(path))
    for s in taught:
        save(key, s)
    r = run(path, until=cell.best)
    best, close = trials_to(r, cell)
    return {"with": best, "with 1%": close, "learned from": len(taught)}


def alone(cell: Cell, tmp: Path) -> tuple[int | None, int | None]:
    os.environ["XDG_CACHE_HOME"] = str(tmp / "alone_cache")  # never the user's cache; nothing read or kept
    path = sweep_file(cell, tmp, "alone", budget=len(cell.table), learned=False, seed=0)
    return trials_to(run(path, until=cell.best), cell)


def compare(without: pd.Series, with_: pd.Series) -> tuple[int, int, int, float, float]:
    w, h = without.fillna(999).astype(float), with_.fillna(999).astype(float)
    return int((h < w).sum()), int((h == w).sum()), int((h > w).sum()), float(w.mean()), float(h.mean())


def summary(res: pd.DataFrame) -> str:
    fewer, equal, more, a, b = compare(res["without"], res["with"])
    f1, e1, m1, a1, b1 = compare(res["without 1%"], res["with 1%"])
    n = len(res)
    return (
        f"recorded transfer: fewer in {fewer}/{n}, equal in {equal}/{n}, more in {more}/{n}; "
        f"mean {a:.2f} -> {b:.2f} trials to the best; within 1 %: fewer in {f1}/{n}, equal in {e1}/{n}, "
        f"more in {m1}/{n}, mean {a1:.2f} -> {b1:.2f}"
    )


def fewest_sources(all_cells: Sequence[Cell]) -> Cell:
    """The cell whose sweep learns from the fewest others (then the smallest grid): the quickest pair."""
    return min(all_cells, key=lambda c: (len(sources(c, all_cells)), len(c.table)))


def main(seeds: Sequence[int] = SEEDS, only: str | None = None, quick: bool = False) -> int:
    t0 = time.time()
    all_cells = cells()
    if quick and only is None:
        only = fewest_sources(all_cells).name
    targets = [c for c in all_cells if only is None or c.name in only.split(",")]
    # quick: the history holds only the sweeps the targets learn from (and each target's own)
    taught = {s.name for c in targets for s in sources(c, all_cells)} | {c.name for c in targets}
    past = [c for c in all_cells if c.name in taught] if quick else all_cells
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base = {c.name: alone(c, tmp) for c in targets}
        print(f"  {len(targets)} cells alone ({time.time() - t0:.0f} s)", flush=True)
        for seed in seeds:
            lessons = history(past, seed, tmp)
            print(f"  seed {seed}: history of {len(lessons)} sweeps ({time.time() - t0:.0f} s)", flush=True)
            for c in targets:
                got = pair(c, all_cells, lessons, seed, tmp)
                rows.append(
                    {
                        "cell": c.name,
                        "seed": seed,
                        "held out": held_out(c.name),
                        "grid": len(c.table),
                        "without": base[c.name][0],
                        "with": got["with"],
                        "without 1%": base[c.name][1],
                        "with 1%": got["with 1%"],
                        "learned from": got["learned from"],
                    }
                )
    res = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print(res.to_string(index=False))
    for part, sub in res.groupby("held out"):
        print(f"{'held out' if part else 'looked at'}: " + summary(sub).removeprefix("recorded transfer: "))
    print(f"({time.time() - t0:.0f} s)")
    print(summary(res))
    return 0
