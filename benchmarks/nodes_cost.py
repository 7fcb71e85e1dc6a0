"""Which node count: the Ultra-Scale Playbook's models measured from 1 to 64 nodes at one global batch
(../shared/data/ultrascale/runs.csv), each replayed as ONE sweep over all its node counts.

Per model: one sweep file with `cluster.nodes: [1, 2, ..., 64]`, a token goal and a price, the
layouts and trainer as `../shared/checks/_ultrascale.py` builds a cell (nanotron's knobs and
workload; tp above a node or more stages than layers left out), a replay table of every measured
layout with its node count, and a budget of PER_SIZE trials per node count, run through `prepare` and
`run_loop` (what `sweep run` runs) with the replay launcher. The answer is `sweep best`'s
(`sweeper.plan.sizes.answers` and `winner`): the node count named `--by cost` and `--by time`, against
the truth (the best measured tokens/s of each size over the whole table: the fastest run, and the
fewest GPU-hours per token). Trials, and the GPU-hours they take (`sweeper.search.budget.spent_gpu_hours`: each trial's GPUs x
its steps at its measured step time; a replay has no start-up), are counted against running every
measured layout at every size.

usage: python benchmarks/nodes_cost.py [--models 1B,8B] [--per-size N] [--quick]; prints a table and a last line.
--quick: the 1B model only, 2 trials per node count (--models 1B --per-size 2; either flag still overrides).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from search_public import ultrascale_space  # one space per ultrascale cell (benchmarks/ is on sys.path)

from sweeper.launchers.replay import ReplayLauncher
from sweeper.plan.sizes import Winner, answers, winner
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.search.budget import spent_gpu_hours
from sweeper.spec.loader import load_sweep

CSV = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "ultrascale" / "runs.csv"
KEYS = ["tp", "pp", "micro_batch_size", "sharding"]
GOAL = {"tokens": 1.0e12, "gpu_hour_cost": 2.0}
PER_SIZE = 6


def measured(model: str) -> pd.DataFrame:
    """One row per (nodes, layout) of a model: ok when any run of it was, its mean tokens/s per GPU."""
    d = pd.read_csv(CSV)
    d = d[d.model == model].copy()
    d["sharding"] = d.zero_stage.map({0: "none", 1: "zero1"})
    d = d[(d.tp <= 8) & (d.pp <= d.layers)]
    key = ["nodes", *KEYS]
    g = d.groupby(key, as_index=False).agg(
        ok=("status", lambda s: bool((s == "ok").any())),
        tps=("tokens_per_s_per_gpu", "mean"),
        gpus=("gpus", "first"),
        gbs=("global_batch_size", "first"),
        seq=("seq_len", "first"),
    )
    first = d.iloc[0]
    g.attrs |= {k: first[k] for k in ("layers", "hidden", "heads", "ffn", "vocab", "tied_embeddings")}
    return g


def sweep_file(g: pd.DataFrame, name: str, table: Path, results: Path, per_size: int) -> dict[str, Any]:
    a = g.attrs
    sizes = sorted(int(n) for n in g.nodes.unique())
    return {
        "name": name,
        "model": {
            "layers": int(a["layers"]),
            "hidden": int(a["hidden"]),
            "heads": int(a["heads"]),
            "kv_heads": int(a["heads"]),
            "ffn": int(a["ffn"]),
            "vocab": int(a["vocab"]),
            "tied_embeddings": bool(a["tied_embeddings"]),
        },
        "seq_len": int(g.seq.iloc[0]),
        "global_batch_size": int(g.gbs.iloc[0]),
        "cluster": {"nodes": sizes, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": ultrascale_space(g),
        "workload": {
            "kind": "nanotron",
            "command": "torchrun --nproc-per-node {nproc} run_train.py --config-file {workdir}/nanotron.yaml",
        },
        "goal": GOAL,
        "launcher": {"kind": "replay", "table": str(table)},
        "search": {"max_trials": per_size * len(sizes), "parallel": 1, "seed": 0},
        "results_dir": str(results),
    }


def replay_table(g: pd.DataFrame, path: Path) -> None:
    t = g.copy()
    t["sequence_parallel"] = t.tp > 1
    t["activation_checkpointing"], t["attention"] = "none", "flash2"
    t["status"] = t.ok.map({True: "ok", False: "oom"})
    t["step_time_mean_s"] = t.gbs * t.seq / (t.tps * t.gpus)
    t.loc[~t.ok, "step_time_mean_s"] = None
    t[
        ["nodes", *KEYS, "sequence_parallel", "activation_checkpointing", "attention", "status", "step_time_mean_s"]
    ].to_csv(path, index=False)


def truth(g: pd.DataFrame) -> tuple[int, int]:
    """The truly fastest node count (best tokens/s) and the truly cheapest (best tokens/s per GPU)."""
    ok = g[g.ok]
    best = ok.loc[ok.groupby("nodes").tps.idxmax()]
    fastest = int(best.loc[(best.tps * best.gpus).idxmax()].nodes)
    cheapest = int(best.loc[best.tps.idxmax()].nodes)
    return fastest, cheapest


def one_model(model: str, tmp: Path, per_size: int) -> dict[str, Any]:
    g = measured(model)
    name = "nodes_" + model.split("-")[-1]
    table, path = tmp / f"{name}.csv", tmp / f"{name}.yaml"
    replay_table(g, table)
    path.write_text(yaml.safe_dump(sweep_file(g, name, table, tmp / "results", per_size), sort_keys=False))
    sweep = load_sweep(path)
    start = time.perf_counter()
    run = prepare(sweep, ReplayLauncher(table, sweep))
    run_loop(run, poll_s=0.0)
    found = answers(run.plan, run.rows)
    by_time, by_cost = winner(found, Winner.time), winner(found, Winner.cost)
    fastest, cheapest = truth(g)
    ran = pd.DataFrame(run.rows)
    steps, gpn = sweep.trial, sweep.cluster.gpus_per_node
    every = [{"nodes": n, "step_time_mean_s": t} for n, t in zip(g.nodes, g.gbs * g.seq / (g.tps * g.gpus))]
    every = [r if ok else {"nodes": r["nodes"]} for r, ok in zip(every, g.ok)]
    return {
        "model": model.split("-")[-1],
        "sizes": len(sweep.node_counts),
        "true fastest": fastest,
        "--by time": by_time.nodes if by_time else None,
        "true cheapest": cheapest,
        "--by cost": by_cost.nodes if by_cost else None,
        "trials": len(run.rows),
        "every size": len(g),
        "GPU-h": round(spent_gpu_hours(run.rows, gpn, steps, run.search.startup_s), 1),
        "GPU-h every": round(spent_gpu_hours(every, gpn, steps, run.search.startup_s), 1),
        "sizes run": int(ran.nodes.nunique()),
        "left out": len(run.search.left_out),
        "s": round(time.perf_counter() - start, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None, help="default 1B,3B,8B,80B (--quick: 1B)")
    ap.add_argument("--per-size", type=int, default=None, help=f"default {PER_SIZE} (--quick: 2)")
    ap.add_argument("--quick", action="store_true", help="the 1B model, 2 trials per node count")
    args = ap.parse_args()
    models = args.models or ("1B" if args.quick else "1B,3B,8B,80B")
    per_size = args.per_size or (2 if args.quick else PER_SIZE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # never the user's cache: learned profiles
        for m in models.split(","):
            rows.append(one_model(f"nanotron-llama-{m}", Path(tmp), per_size))
    t = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(t.to_string(index=False))
    right_time = int((t["--by time"] == t["true fastest"]).sum())
    right_cost = int((t["--by cost"] == t["true cheapest"]).sum())
    share = t.trials.sum() / t["every size"].sum()
    hours = t["GPU-h"].sum() / t["GPU-h every"].sum()
    print(
        f"nodes_cost: --by time names the truly fastest node count in {right_time}/{len(t)} models, --by cost the "
        f"truly cheapest in {right_cost}/{len(t)}; {t.trials.sum()} trials against {t['every size'].sum()} "
        f"for every layout at every size ({100 * share:.0f}%), {t['GPU-h'].sum():,.0f} GPU-hours against "
        f"{t['GPU-h every'].sum():,.0f} ({100 * hours:.0f}%)"
    )
    return 0 if right_time == right_cost == len(t) else 1


if __name__ == "__main__":
    sys.exit(main())
