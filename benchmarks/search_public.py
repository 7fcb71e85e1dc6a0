"""`search_bench.py --public`: the search on published sweeps, replayed through the sweep loop.

- Ultra-Scale Playbook (../shared/data/ultrascale): every (model, nodes) cell with at least 3 ok
  runs, as `../shared/checks/_ultrascale.py` builds it (nanotron's knobs, `memory.recipe:
  megatron`, statuses and step times from the data, budget = the whole grid), run with `prepare`
  and `run_loop` (what `sweep run` runs) and the replay launcher. Per cell: trials and GPU-hours
  until the best layout (by tokens/s/GPU) ran, against the whole grid and a random order (mean of
  RANDOM_SEEDS). A trial costs its GPUs x (STARTUP_S + its steps x its step time); an OOM the
  start-up; a trial stopped early its steps so far.
- Held out: cells whose CRC32 of the name is 0 mod 3 were not looked at while the search's
  settings (residual prior, stop ratio; later its scoring rule, the calibration's priors and the
  OOM rule of its chance to run) were chosen; they are reported apart.
- The replay launcher leaves out of each cell's plan the layouts the playbook did not measure
  (`Launcher.cannot_run`): the grid and random-order baselines count the measured layouts too.
- A trainer quirk: a replayed sweep whose truth is the throughput model, except that one value of
  one knob (the predicted best's pipeline degree) runs QUIRK times slower.
- llm-foundry (../shared/data/llm-foundry): every published MPT layout (all ran) as a one-layout
  sweep; how many the plan prunes (the goal: none; uncertain at worst).

    python benchmarks/search_public.py [--quick]   (or search_bench.py --public [--quick])

--quick: two ultrascale cells (the smallest grid of the tuned part and of the held-out part), the
quirk replay stopped after QUICK_QUIRK_TRIALS trials, every QUICK_EVERY-th llm-foundry layout; the
same replays through the sweep loop, the same table and lines, over fewer cases.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from throughput_accuracy import mpt_spec  # one builder of the MPT sweep files (benchmarks/ is on sys.path)

from sweeper.launchers.replay import ReplayLauncher
from sweeper.plan.plan import make_plan
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.spec.loader import load_sweep, parse_sweep

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
KEYS = ["tp", "pp", "micro_batch_size", "sharding"]
STARTUP_S = 120.0
RANDOM_SEEDS = range(5)
QUIRK = 4.0
CLOSE = 0.01
QUICK_QUIRK_TRIALS = 8  # --quick: the quirk replay's budget (its best ran after 4 when this was written)
QUICK_EVERY = 10  # --quick: every 10th llm-foundry layout


def held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % 3 == 0


def ultrascale_cells() -> list[tuple[str, pd.DataFrame]]:
    d = pd.read_csv(DATA / "ultrascale" / "runs.csv")
    d["sharding"] = d.zero_stage.map({0: "none", 1: "zero1"})
    key = ["model", "nodes", *KEYS]
    ok_keys = set(map(tuple, d[d.status == "ok"][key].values.tolist()))
    d = d[(d.status == "ok") | ~d[key].apply(tuple, axis=1).isin(ok_keys)]  # crashed once, ran once: ok
    g_all = d.groupby(key, as_index=False).agg(
        status=("status", "first"),
        tps=("tokens_per_s_per_gpu", "mean"),
        layers=("layers", "first"),
        hidden=("hidden", "first"),
        heads=("heads", "first"),
        ffn=("ffn", "first"),
        vocab=("vocab", "first"),
        tied=("tied_embeddings", "first"),
        gpus=("gpus", "first"),
        gbs=("global_batch_size", "first"),
        seq=("seq_len", "first"),
    )
    out = []
    for (model, nodes), g in g_all.groupby(["model", "nodes"]):
        g = g[(g.tp <= 8) & (g.pp <= g.layers)]
        if (g.status == "ok").sum() >= 3:
            out.append((f"us_{model.split('-')[-1]}_{nodes}n", g))
    return out


def ultrascale_space(g: pd.DataFrame) -> dict[str, Any]:
    """The knobs an ultrascale cell's runs varied (nanotron: sequence parallel on, no checkpointing, flash2)."""
    return {
        "tp": sorted(int(v) for v in g.tp.unique()),
        "pp": sorted(int(v) for v in g.pp.unique()),
        "micro_batch_size": sorted(int(v) for v in g.micro_batch_size.unique()),
        "sharding": sorted(g.sharding.unique()),
        "sequence_parallel": [True],
        "activation_checkpointing": ["none"],
        "attention": ["flash2"],
    }


def ultrascale_sweep(g: pd.DataFrame, name: str) -> dict[str, Any]:
    """What an Ultra-Scale cell's rows say of its sweep: model, sequence, batch, cluster and space."""
    f = g.iloc[0]
    return {
        "name": name,
        "model": {
            "layers": int(f.layers),
            "hidden": int(f.hidden),
            "heads": int(f.heads),
            "kv_heads": int(f.heads),
            "ffn": int(f.ffn),
            "vocab": int(f.vocab),
            "tied_embeddings": bool(f.tied),
        },
        "seq_len": int(f.seq),
        "global_batch_size": int(f.gbs),
        "cluster": {"nodes": int(f.gpus) // 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": ultrascale_space(g),
    }


def cell_spec(g: pd.DataFrame, name: str, table: str, results: str) -> dict[str, Any]:
    return ultrascale_sweep(g, name) | {
        "memory": {"recipe": "megatron"},
        "launcher": {"kind": "replay", "table": table},
        "search": {"max_trials": len(g), "parallel": 1, "seed": 0},
        "results_dir": results,
    }


def replay(tmp: Path, name: str, spec: dict[str, Any], table: pd.DataFrame) -> pd.DataFrame:
    """Run the sweep through the sweep loop with the replay launcher; its result rows in trial order."""
    table.to_csv(spec["launcher"]["table"], index=False)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    # a journal file holds the study: the same Optuna trials as the default SQLite file, without a
    # disk sync per write (on a loaded machine those dominate a replay's time)
    run = prepare(sweep, ReplayLauncher(Path(spec["launcher"]["table"]), sweep), storage=str(tmp / f"{name}.journal"))
    run_loop(run, poll_s=0)
    return pd.DataFrame(run.rows).sort_values("trial_number").reset_index(drop=True)


def zero_pair_spread() -> str:
    """How far apart two runs of what should be the same step time are, by node count: pp = 1
    layouts measured with ZeRO-0 and with ZeRO-1 (nanotron shards only the optimizer state there:
    the same step within a few %). Where they differ several-fold, the cell's best is its luckiest run."""
    d = pd.read_csv(DATA / "ultrascale" / "runs.csv")
    d = d[(d.status == "ok") & (d.pp == 1)]
    key = ["model", "nodes", "tp", "micro_batch_size"]
    p = d.pivot_table(index=key, columns="zero_stage", values="tokens_per_s_per_gpu", aggfunc="mean").dropna()
    ratio = np.exp(np.abs(np.log(p[0] / p[1])))
    by = ratio.groupby(level="nodes").agg(["count", "median", "max"])
    cells = ", ".join(f"{n}n {r['median']:.2f}x (max {r['max']:.1f}x, {int(r['count'])})" for n, r in by.iterrows())
    return f"same layout, ZeRO-0 vs ZeRO-1 at pp = 1, median ratio of tokens/s (max, pairs): {cells}"


def cost_h(gpus: int, status: str, step_s: float, steps: float) -> float:
    """GPU-hours of one trial: start-up, and its steps unless it ran out of memory."""
    return gpus * (STARTUP_S + (steps * step_s if status != "oom" else 0.0)) / 3600


def row_cost(r: Any, gpus: int, steps: int) -> float:
    """GPU-hours of a result row: its measured steps (a stopped trial's are fewer), else steps x mean."""
    times = list(r.step_times_s) if isinstance(r.step_times_s, list | np.ndarray) else []
    mean = r.step_time_mean_s if r.step_time_mean_s == r.step_time_mean_s else None  # NaN: not measured
    ran = float(np.sum(times)) if times else float(mean or 0.0) * steps
    return cost_h(gpus, r.status, ran, 1.0)


def is_layout(frame: pd.DataFrame, best: Any) -> np.ndarray:
    return (
        (frame.tp == best.tp)
        & (frame.pp == best.pp)
        & (frame.micro_batch_size == best.micro_batch_size)
        & (frame.sharding == best.sharding)
    ).to_numpy()


def until(costs: list[float], hit: np.ndarray) -> tuple[int | None, float]:
    """(trials until the first hit, GPU-hours spent until then; all of them when never)."""
    idx = np.flatnonzero(hit)
    if not idx.size:
        return None, float(np.sum(costs))
    return int(idx[0]) + 1, float(np.sum(costs[: idx[0] + 1]))


def run_cell(tmp: Path, name: str, g: pd.DataFrame) -> dict[str, Any]:
    t = g.copy()
    t["sequence_parallel"] = t.tp > 1
    t["activation_checkpointing"], t["attention"] = "none", "flash2"
    t["status"] = t.status.map({"ok": "ok"}).fillna("oom")
    t["step_time_mean_s"] = t.gbs * t.seq / (t.tps * t.gpus)
    cols = [*KEYS, "sequence_parallel", "activation_checkpointing", "attention", "status", "step_time_mean_s"]
    spec = cell_spec(g, name, str(tmp / f"{name}.csv"), str(tmp / f"{name}_results"))
    steps = parse_sweep(yaml.safe_dump(spec)).trial.steps
    gpus = int(g.gpus.iloc[0])
    ok = t[t.status == "ok"]
    best = ok.loc[ok.tps.idxmax()]
    rows = replay(tmp, name, spec, t[cols])
    costs = [row_cost(r, gpus, steps) for r in rows.itertuples()]
    n, gpu_h = until(costs, is_layout(rows, best))
    # a layout within CLOSE of the best's step time (a tie the data's rounding or its noise decides)
    close, _ = until(
        costs, ((rows.status == "ok") & (rows.step_time_mean_s <= best.step_time_mean_s * (1 + CLOSE))).to_numpy()
    )
    grid = [cost_h(gpus, r.status, r.step_time_mean_s, steps) for r in t.itertuples()]
    rand_n, rand_h = [], []
    for seed in RANDOM_SEEDS:
        order = np.random.default_rng(seed).permutation(len(t))
        k, h = until([grid[i] for i in order], is_layout(t.iloc[order], best))
        rand_n.append(k or len(t))
        rand_h.append(h)
    saved = float(rows.gpu_hours_saved.fillna(0).sum()) if "gpu_hours_saved" in rows else 0.0
    return {
        "cell": name,
        "held out": held_out(name),
        "grid": len(t),
        "trials": n,
        f"within {CLOSE:.0%}": close,
        "GPU-h": gpu_h,
        "grid GPU-h": sum(grid),
        "random trials": statistics.mean(rand_n),
        "random GPU-h": statistics.mean(rand_h),
        "stopped early": int((rows.status == "stopped_early").sum()),
        "GPU-h saved": saved,
    }


def quirk(tmp: Path, budget: int | None = None) -> tuple[int | None, str]:
    """Trials until the true best ran in a replay whose one knob value runs QUIRK times slower than predicted
    (None: not within `budget` trials; no budget: every candidate may run)."""
    spec: dict[str, Any] = {
        "name": "quirk",
        "model": "llama-13b",
        "seq_len": 2048,
        "global_batch_size": 2048,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
        "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "micro_batch_size": [1, 2, 4], "sharding": ["none", "zero1"]},
        "memory": {"headroom": 0.0},
        "results_dir": str(tmp / "quirk_results"),
    }
    plan = make_plan(parse_sweep(yaml.safe_dump(spec)))
    rows = np.flatnonzero(plan.status == "candidate")  # (uncertain layouts run out of memory here)
    step = plan.throughput.total[rows]
    slow_pp = int(plan.cols["pp"][rows[np.argmin(step)]])
    true = step * np.where(plan.cols["pp"][rows] == slow_pp, QUIRK, 1.0)
    best = int(rows[np.argmin(true)])
    table = pd.DataFrame({k: plan.cols[k][rows] for k in ("tp", "pp", "micro_batch_size", "sharding")})
    table["status"], table["step_time_mean_s"] = "ok", true
    over = np.flatnonzero(plan.status == "uncertain")
    oom = pd.DataFrame({k: plan.cols[k][over] for k in ("tp", "pp", "micro_batch_size", "sharding")})
    table = pd.concat([table, oom.assign(status="oom")], ignore_index=True)
    spec |= {
        "launcher": {"kind": "replay", "table": str(tmp / "quirk.csv")},
        "search": {"max_trials": budget or len(rows), "parallel": 1, "seed": 0},
    }
    ran = replay(tmp, "quirk", spec, table)
    hit = (
        (ran.tp == plan.cols["tp"][best])
        & (ran.pp == plan.cols["pp"][best])
        & (ran.micro_batch_size == plan.cols["micro_batch_size"][best])
        & (ran.sharding == plan.cols["sharding"][best])
    )
    idx = np.flatnonzero(hit.to_numpy())
    return (int(idx[0]) + 1 if idx.size else None), f"pp={slow_pp} runs {QUIRK:g}x slower than predicted"


def foundry(recipe: str, every: int = 1) -> Counter:
    """Plan status of every `every`-th published MPT layout, each as a one-layout sweep (as benchmarks of
    throughput build it)."""
    d = pd.read_csv(DATA / "llm-foundry" / "runs.csv").iloc[::every]
    c: Counter = Counter()
    for i, r in d.iterrows():
        space = {
            "tp": [1],
            "pp": [1],
            "micro_batch_size": [int(r.micro_batch_size)],
            "sharding": ["fsdp"],
            "attention": ["flash2"],
            "float8": ["fp8" in str(r.precision)],
            "activation_checkpointing": ["full" if str(r.activation_checkpointing).startswith("full") else "none"],
            # submit_benchmarks.py sets norm_type=low_precision_layernorm (the data README, "How the runs
            # were made"): llm-foundry's LPLayerNorm runs torch's fused layer_norm on the bf16 input with
            # autocast off (llmfoundry/models/layers/norm.py @ 5e85bd62d), so it keeps no fp32 copy of it:
            # what the fused LayerNorm keeps under FSDP (`memory.norm_bytes`)
            "rmsnorm": ["fused"],
        }
        # the MPT yamls (@ 5e85bd62d, the README's) set no model.loss_fn: ComposerMPTCausalLM's default,
        # fused_crossentropy, flash-attn's fused kernel (llmfoundry/models/mpt/modeling_mpt.py @ 5e85bd62d)
        spec = mpt_spec(r, f"mpt{i}", {"recipe": recipe, "loss_kernel": "fused"}, space)
        c[str(make_plan(parse_sweep(yaml.safe_dump(spec))).status[0])] += 1
    return c


def quick_cells(cells: list[tuple[str, pd.DataFrame]]) -> list[tuple[str, pd.DataFrame]]:
    """The cell with the smallest grid of each part (tuned, held out), in the cells' order."""
    keep = {min((c for c in cells if held_out(c[0]) == part), key=lambda c: len(c[1]))[0] for part in (False, True)}
    return [c for c in cells if c[0] in keep]


def main(quick: bool = False) -> int:
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        os.environ["XDG_CACHE_HOME"] = os.path.join(d, "cache")  # never the user's cache: learned profiles
        tmp = Path(d)
        out = []
        cells = ultrascale_cells()
        for name, g in quick_cells(cells) if quick else cells:
            out.append(run_cell(tmp, name, g))
            print(f"  {name}: best after {out[-1]['trials']} trials ({time.time() - t0:.0f} s)", flush=True)
        res = pd.DataFrame(out)
        q, quirk_what = quirk(tmp, QUICK_QUIRK_TRIALS if quick else None)
    with pd.option_context("display.width", 200, "display.max_rows", 100):
        print(res.round(2).to_string(index=False))
    lines = []
    for part, sub in (("tuned", res[~res["held out"]]), ("held out", res[res["held out"]])):
        n = sub.trials
        share = (sub["GPU-h"] / sub["grid GPU-h"]).median()
        near = sub[f"within {CLOSE:.0%}"]
        lines.append(
            f"ultrascale {part}: {len(sub)} cells; best within 5 trials in {int((n <= 5).sum())}/{len(sub)} "
            f"(a layout within {CLOSE:.0%} of it in {int((near <= 5).sum())}/{len(sub)}), "
            f"never in {int(n.isna().sum())}; median trials {n.median():.0f} (random order "
            f"{sub['random trials'].median():.0f}, grid {sub.grid.median():.0f}); median GPU-h to the best "
            f"{100 * share:.1f}% of the grid's (random {100 * (sub['random GPU-h'] / sub['grid GPU-h']).median():.1f}%); "
            f"{int(sub['stopped early'].sum())} trials stopped early, {sub['GPU-h saved'].sum():.1f} GPU-h saved"
        )
    print(zero_pair_spread())
    for recipe in ("megatron", "torchtitan"):
        c = foundry(recipe, QUICK_EVERY if quick else 1)
        print(
            f"llm-foundry ({recipe} recipe): {sum(c.values())} published layouts (all ran): "
            f"{c['candidate']} candidate, {c['uncertain']} uncertain, {c['pruned']} pruned"
        )
    print(*lines[:1], sep="\n")
    print(f"quirk replay ({quirk_what}): the true best ran after {q} trials (goal <= 5)")
    print(lines[1])
    n = res.trials
    print(
        f"all {len(res)} cells: best within 5 trials in {int((n <= 5).sum())}, never in {int(n.isna().sum())}; "
        f"median GPU-h to the best {100 * (res['GPU-h'] / res['grid GPU-h']).median():.1f}% of the grid's "
        f"(goal < 10%); quirk {q} trials ({time.time() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two cells, a short quirk replay, a tenth of llm-foundry")
    raise SystemExit(main(ap.parse_args().quick))
