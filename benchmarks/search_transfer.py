"""Learning across sweeps: trials until the second sweep on a cluster runs its best layout, without and
with the learned profile the first sweep (another model) left.

Per truth, quirk and model pair: the first model's sweep runs its budget (FIRST_BUDGET trials) through
the sweep loop with the replay launcher and `search.learned_profile: true`, which keeps what it
learned in a learned profile; the second model's sweep then runs until its best layout ran, once
with an empty cache and once with that profile. Both models run on the same cluster (8 A100-80GB
per node, at their own node counts) and trainer, and share the trainer's quirk: one knob value (the
one the second model's predicted best layout has) runs QUIRK x slower than the model predicts.

Truths: `model` (the throughput model's step times, but for the quirk; uncertain layouts run out
of memory) and `simulated` (benchmarks/search_bench.py's simulator: other functional forms, knob
interactions, noise and a true memory off the estimate, the same for both models, as a cluster
and trainer the model does not know are), times the quirk.

With --recorded: the same question on recorded sweeps, the Ultra-Scale Playbook's cells replayed in
sequence on one cluster (benchmarks/search_recorded.py); its last line is `recorded transfer: ...`.

usage: python benchmarks/search_transfer.py [--quick] [--recorded [--seeds 0,1,2] [--cells us_1B_8n,...]]

--quick: one model pair (llama-7b on 4 nodes, then llama-13b on 8), one quirk (pp) under both truths
and a first sweep of QUICK_FIRST_BUDGET trials: the same replays through the sweep loop and the same
lines; with --recorded, seed 0 and one cell (search_recorded.py says which).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import yaml
from search_bench import simulate, step_time_s  # benchmarks/ is on sys.path when run as a script

from sweeper.knobs import KNOBS
from sweeper.launchers.replay import ReplayLauncher
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import Plan, make_plan
from sweeper.run.orchestrator import prepare
from sweeper.run.orchestrator import step as loop_step
from sweeper.run.state import SweepRun
from sweeper.spec.loader import load_sweep, parse_sweep

SPACE = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4], "sharding": ["none", "zero1"]}
PAIRS = (
    (("llama-13b", 8), ("llama-65b", 16)),
    (("llama-65b", 16), ("llama-13b", 8)),
    (("llama-7b", 4), ("llama-13b", 8)),
)
QUIRKS = (("none", 1.0), ("pp", 4.0), ("micro_batch_size", 3.0), ("tp", 2.5), ("sharding", 2.0))
FIRST_BUDGET = 12
QUICK_FIRST_BUDGET = 4  # --quick: the first sweep's budget


def spec(name: str, model: tuple[str, int], results: Path) -> dict[str, Any]:
    return {
        "name": name,
        "model": model[0],
        "seq_len": 2048,
        "global_batch_size": 2048,
        "cluster": {"nodes": model[1], "gpus_per_node": 8, "gpu": "a100-80gb"},
        "space": SPACE,
        "memory": {"headroom": 0.0},
        "results_dir": str(results),
        "search": {"learned_profile": True, "seed": 0},
    }


def truth(plan: Plan, kind: str, quirk: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows the replay table holds, their step times (NaN: out of memory), whether each ran)."""
    if kind == "model":
        rows = np.flatnonzero(plan.candidate_mask)
        ok = plan.status[rows] == "candidate"
        step = plan.throughput.total[rows].copy()
    else:
        mfu, oom, _ = simulate(plan, 0)
        rows = np.flatnonzero(plan.status != "invalid")
        ok = ~oom[rows]
        step = np.asarray([step_time_s(plan.sweep, float(m)) for m in mfu[rows]])
    if quirk["knob"] != "none":
        step = step * np.where(plan.cols[quirk["knob"]][rows] == quirk["value"], quirk["slower"], 1.0)
    return rows, np.where(ok, step, np.nan), ok


def replay(tmp: Path, s: dict[str, Any], kind: str, quirk: dict[str, Any], *, budget: int | None) -> int | None:
    """Run the sweep through the sweep loop: its whole `budget`, or (None) until its best layout ran;
    the trials until the best ran (None: never)."""
    plan = make_plan(parse_sweep(yaml.safe_dump(s)))
    rows, step, ok = truth(plan, kind, quirk)
    runnable = ok & plan.candidate_mask[rows]
    best = int(rows[runnable][np.argmin(step[runnable])])
    table = pd.DataFrame({k: plan.cols[k][rows] for k in SPACE})
    table["status"], table["step_time_mean_s"] = np.where(ok, "ok", "oom"), step
    csv = tmp / f"{s['name']}.csv"
    table.to_csv(csv, index=False)
    s = s | {"search": s["search"] | {"max_trials": budget or len(rows)}}
    path = tmp / f"{s['name']}.yaml"
    path.write_text(yaml.safe_dump(s))
    sweep = load_sweep(path)
    run = prepare(sweep, ReplayLauncher(csv, sweep), storage=str(tmp / f"{s['name']}.journal"))
    while (budget is not None or best not in ran(run)) and loop_step(run):
        pass
    order = ran(run)
    return order.index(best) + 1 if best in order else None


def ran(run: SweepRun) -> list[int | None]:
    rows = sorted(run.rows, key=lambda r: r["trial_number"])
    return [run.plan.row_of(Layout.from_mapping({k: r[k] for k in KNOBS})) for r in rows]


def pair_row(
    kind: str, knob: str, slower: float, first: tuple[str, int], second: tuple[str, int], first_budget: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        probe = make_plan(parse_sweep(yaml.safe_dump(spec("probe", second, tmp))))
        rows = np.flatnonzero(probe.status == "candidate")
        value = probe.cols[knob][rows[np.argmin(probe.throughput.total[rows])]].item() if knob != "none" else None
        quirk = {"knob": knob, "value": value, "slower": slower}
        os.environ["XDG_CACHE_HOME"] = str(tmp / "empty")  # never the user's cache
        alone = replay(tmp, spec("alone", second, tmp / "r0"), kind, quirk, budget=None)
        os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
        replay(tmp, spec("first", first, tmp / "r1"), kind, quirk, budget=first_budget)
        helped = replay(tmp, spec("second", second, tmp / "r2"), kind, quirk, budget=None)
    what = "no quirk" if knob == "none" else f"{knob}={value} {slower:g}x slower"
    return {
        "truth": kind,
        "quirk": what,
        "first -> second": f"{first[0]} ({first[1]}n) -> {second[0]} ({second[1]}n)",
        "without": alone,
        "with": helped,
    }


def main(quick: bool = False) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.time()
    out = []
    quirks, pairs = (QUIRKS[1:2], PAIRS[2:]) if quick else (QUIRKS, PAIRS)
    for kind in ("model", "simulated"):
        for knob, slower in quirks:
            for first, second in pairs:
                out.append(pair_row(kind, knob, slower, first, second, QUICK_FIRST_BUDGET if quick else FIRST_BUDGET))
                print(f"  {out[-1]} ({time.time() - t0:.0f} s)", flush=True)
    res = pd.DataFrame(out)
    with pd.option_context("display.width", 200, "display.max_rows", 100):
        print(res.to_string(index=False))
    for kind, sub in res.groupby("truth", sort=False):
        w, h = sub["without"].fillna(999), sub["with"].fillna(999)
        print(
            f"learned profile ({kind} truth): the second sweep ran its best in fewer trials with it in "
            f"{int((h < w).sum())}/{len(sub)} pairs, as many in {int((h == w).sum())}, more in {int((h > w).sum())}; "
            f"mean trials to the best {statistics.mean(w):.2f} without, {statistics.mean(h):.2f} with"
        )
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    ap = argparse.ArgumentParser()
    ap.add_argument("--recorded", action="store_true", help="the Ultra-Scale Playbook's recorded sweeps in sequence")
    ap.add_argument("--seeds", default=None, help="with --recorded: the histories' seeds (default 0,1,2; --quick 0)")
    ap.add_argument("--quick", action="store_true", help="one pair, one quirk (with --recorded: one seed, one cell)")
    ap.add_argument("--cells", default=None, help="with --recorded: only these cells as the later sweep")
    args = ap.parse_args()
    if args.recorded:
        import search_recorded

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        seeds = args.seeds or ("0" if args.quick else "0,1,2")
        raise SystemExit(search_recorded.main([int(s) for s in seeds.split(",")], args.cells, args.quick))
    raise SystemExit(main(args.quick))
