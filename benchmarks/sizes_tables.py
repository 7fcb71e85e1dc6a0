"""The measured answer over node counts, on many tables whose truth is known: the measured-sizes
check's replay tables, each replayed as ONE sweep through `prepare` and `run_loop` (what `sweep run`
runs, two trials in flight).

The sweep is the check's (an 8B model over 4, 8, 16 and 32 nodes of 8 H100s, 48 layouts a size, a
token goal with a price and `max_days`, 24 trials). Its table is built by the check's own code
(`../shared/checks/_sizes_table.py`): every runnable layout of the plan at the model's step time x a
factor drawn per layout and size (0.75-1.10) x a per-size efficiency (EFF less per doubling), with
3 % noise. Per table (SEED, EFF): the node count `sweep best --by time` and `--by cost` name
(`sweeper.plan.sizes.answers` and `winner`), how far the named trial is from the table's best by
that measure, the trials spent at each answer's size, and whether the check's bar holds (within
5 %, at least 4 trials at the answering size). The check's truth is the cheapest size whatever
its days; `sweep best --by cost` names the cheapest of the sizes that meet the goal's `max_days`
(30): where the two differ (`in limits`, the truth's cheapest within max_days), the bar is also
judged against the latter (`holds in limits`): a 70B model's 4 and 8 nodes take 77 and 40 days,
and the check's bar asks for an answer the goal rules out. `doubt` marks a table whose best by cost is a layout
the plan holds in doubt (`uncertain`: its memory estimate within the error band of the card): the
table runs every such layout, while the search, rightly for a real cluster, spends few trials on a
layout its memory estimate gives a few % to fit.

Looked at while the search over sizes was last changed: seeds 0-7 (and offline 100-129); report
other seeds as held out.

usage: python benchmarks/sizes_tables.py [--seeds 0-7] [--effs 0,0.04,0.1] [--model llama3.1-8b] [--quick]
--quick: the check's default table only (seed 0, EFF 0.04).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sweeper.launchers.replay import ReplayLauncher
from sweeper.plan.plan import make_plan
from sweeper.plan.sizes import Winner, answers, winner
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.spec.loader import load_sweep

TABLE_CODE = Path(__file__).resolve().parents[1] / ".." / "shared" / "checks" / "_sizes_table.py"
BAR, CONFIRMATIONS = 0.05, 4  # the check's: within 5 % of the truth's best, 4 trials at the answering size


def sweep_file(model: str, results: Path) -> dict[str, Any]:
    """The measured-sizes check's sweep (a local launcher until its table exists)."""
    return {
        "name": "sizes",
        "model": model,
        "seq_len": 8192,
        "global_batch_size": 512,
        "cluster": {"nodes": [4, 8, 16, 32], "gpus_per_node": 8, "gpu": "h100"},
        "goal": {"tokens": 2.0e11, "gpu_hour_cost": 2.5, "max_days": 30},
        "space": {
            "tp": [1, 2, 4],
            "pp": [1, 2],
            "micro_batch_size": [1, 2],
            "activation_checkpointing": ["none", "full"],
            "sharding": ["zero1", "fsdp"],
        },
        "trial": {"steps": 10, "warmup_steps": 1, "timeout_min": 20, "precision": "bf16"},
        "search": {"max_trials": 24, "parallel": 2, "seed": 0},
        "launcher": "local",
        "results_dir": str(results),
    }


def one_table(model: str, seed: int, eff: float, tmp: Path) -> dict[str, Any]:
    """One replayed sweep over the check's table for `seed` and `eff`: its answers against the truth."""
    folder = tmp / f"{model}-{seed}-{eff:g}"
    folder.mkdir()
    spec = sweep_file(model, folder / "results")
    plain = folder / "plan.yaml"
    plain.write_text(yaml.safe_dump(spec, sort_keys=False))
    plan = make_plan(load_sweep(plain))
    plan.to_frame().to_csv(folder / "plan.csv", index=False)  # what `sweep run --dry-run --out` writes
    table = folder / "table.parquet"
    tokens = spec["global_batch_size"] * spec["seq_len"]
    made = subprocess.run(
        [sys.executable, str(TABLE_CODE), str(folder / "plan.csv"), str(table), str(tokens), str(seed), str(eff)],
        capture_output=True,
        text=True,
        check=True,
    )
    truth = json.loads(made.stdout)
    spec["launcher"] = {"kind": "replay", "table": str(table)}
    path = folder / "sizes.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    sweep = load_sweep(path)
    start = time.perf_counter()
    run = prepare(sweep, ReplayLauncher(table, sweep))
    run_loop(run, poll_s=0.0)
    found = answers(run.plan, run.rows)
    rows = pd.DataFrame(run.rows)
    per_size = rows.groupby("nodes").size().to_dict()
    step_of = dict(zip(rows.trial_number, rows.step_time_mean_s))
    best_step, best_cost = min(truth["best_step"].values()), min(truth["cost"].values())
    timely = _timely(truth, sweep.goal.tokens / tokens, sweep.goal.max_days)
    cost_in_limits = min((c for n, c in truth["cost"].items() if n in timely), default=best_cost)
    out: dict[str, Any] = {"seed": seed, "eff": eff}
    holds = in_limits = True
    for by, short in ((Winner.time, "time"), (Winner.cost, "cost")):
        a = winner(found, by)
        if a is None or a.trial_number is None:
            out |= {short: None, f"{short} gap %": None, f"{short} trials": 0}
            holds = in_limits = False
            continue
        step = float(step_of[a.trial_number])
        gap = step / best_step - 1 if by is Winner.time else a.nodes * step / best_cost - 1
        gap_in_limits = gap if by is Winner.time else a.nodes * step / cost_in_limits - 1
        trials = int(per_size.get(a.nodes, 0))
        out |= {short: a.nodes, f"{short} gap %": round(100 * gap, 1), f"{short} trials": trials}
        holds = holds and gap <= BAR and trials >= CONFIRMATIONS
        in_limits = in_limits and gap_in_limits <= BAR and trials >= CONFIRMATIONS
    cheapest_in_limits = min(timely, key=lambda n: truth["cost"][n], default=None)
    out |= {
        "truth": f"{truth['fastest']}/{truth['cheapest']}",
        "in limits": cheapest_in_limits,
        "doubt": _best_in_doubt(folder / "plan.csv", table),
        "trials": len(rows),
        "holds": holds,
        "holds in limits": in_limits,
        "s": round(time.perf_counter() - start, 1),
    }
    return out


def _timely(truth: dict[str, Any], steps: float, max_days: float | None) -> list[str]:
    """The truth's node counts (keys as its JSON has them) whose best step meets `max_days` over the
    goal's `steps` (its tokens / the tokens of a step); all of them without a deadline."""
    best = truth["best_step"]
    return [n for n, s in best.items() if max_days is None or steps * s / 86_400 <= max_days]


def _best_in_doubt(plan_csv: Path, table: Path) -> bool:
    """Whether the table's best layout by cost (GPU-seconds per step) is one the plan holds in doubt."""
    t = pd.read_parquet(table)
    cost = t.nodes * t.step_times_s.apply(lambda s: sum(s[1:]) / len(s[1:]))
    best = t.loc[cost.idxmin()]
    plan = pd.read_csv(plan_csv)
    keys = [k for k in t.columns if k in plan.columns and k != "status"]  # the layout's knobs
    match = plan.loc[(plan[keys] == best[keys]).all(axis=1)]
    return bool((match.status == "uncertain").any())


def _seeds(text: str) -> list[int]:
    """`0-7` or `0,3,5`."""
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=None, help="a range 0-7 or a list 0,3,5 (default 0-7; --quick: 0)")
    ap.add_argument("--effs", default=None, help="efficiency lost per doubling (default 0,0.04,0.1; --quick: 0.04)")
    ap.add_argument("--model", default="llama3.1-8b")
    ap.add_argument("--quick", action="store_true", help="the check's default table only")
    args = ap.parse_args()
    seeds = _seeds(args.seeds or ("0" if args.quick else "0-7"))
    effs = [float(e) for e in (args.effs or ("0.04" if args.quick else "0,0.04,0.1")).split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # never the user's cache: learned profiles
        for seed in seeds:
            for eff in effs:
                rows.append(one_table(args.model, seed, eff, Path(tmp)))
                print(rows[-1], file=sys.stderr, flush=True)  # progress: a table takes 10-30 s
    t = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(t.to_string(index=False))
    print(
        f"sizes_tables: the check's bar holds on {int(t.holds.sum())}/{len(t)} tables "
        f"({int(t['holds in limits'].sum())}/{len(t)} against the cheapest within max_days); the best by cost is a layout "
        f"the plan holds in doubt on {int(t.doubt.sum())}/{len(t)}; mean gap by time {t['time gap %'].mean():.1f} %, "
        f"by cost {t['cost gap %'].mean():.1f} %; {t.trials.sum()} trials"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
