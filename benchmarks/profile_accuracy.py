"""The profiled step-time model against real trials of the built-in trainer on this machine.

1. `sweep profile` on this machine, for the benchmark's sweep (its shapes), written to OUT/profile.yaml.
2. Real trials of a grid of layouts through the code `sweep trial` and the local launcher run
   (`sweeper.launchers.ranks.launch_trial`: one process per device, gloo on CPU, NCCL on GPUs).
3. Per layout: the measured step time (median of the measured steps), the profiled model's
   prediction (no trial measured, no calibration), and the GPU-table model's (today's); then the
   median |error| and the Spearman rank correlation of both, on all layouts and on the held-out
   part apart (a fixed CRC32 of the layout puts a third of them aside: nothing was tuned on them).

CPU (default): a tiny LLaMA (4 layers, hidden 128, seq 128) over tp, pp, dp, micro-batch,
checkpointing and the attention kernel, on 2 and 4 processes (20 layouts; 12 with --quick).
Goal: profiled median error <= 15 %, Spearman >= 0.9. Also printed: the same against each
trial's fastest step (a busy host only adds time).

GPU (--device cuda, one GPU): a 1B LLaMA (16 layers, hidden 2048, 2k tokens, vocab 32000) over
micro-batch 1-8, checkpointing none/selective/full, the attention kernels (flash2, cudnn,
sdpa_efficient), rmsnorm fused, compile and float8 (where the card and torchao have it), 10-step
trials, stopping before `--budget-s` (default 330 s with the profile) would be overrun.

Across nodes (--nodes 2, root): the two-node cluster of network namespaces on this machine
(scripts/netns/start.sh) with its link shaped to --link-rate and --link-delay; `sweep profile --nodes
2` measures across it, then real trials of 2 nodes x 2 ranks over a small LLaMA whose gradients are
big beside its compute (4 layers, hidden 256, vocab 2048, 64-token sequences: 16 MB of fp32
gradients, so the link matters) put tp inside a node and dp, pp, zero1 and fsdp inside and across
the link (16 layouts). Printed besides: the measured best layout's rank in the profiled prediction.

Four nodes (--nodes 4 --profile-nodes 2, root): four namespaces in a star (node 0 forwards between
the others, so their traffic crosses two links), the profile measured on two of them (2 x 2 ranks,
as a user measures it with `sweep profile --nodes 2`), then real trials of 4 nodes x 1 rank, where
every collective and stage-to-stage send crosses a link: dp, pp 2 and 4, zero1, fsdp and
checkpointing (14 layouts).

Usage: python benchmarks/profile_accuracy.py [--device cpu|cuda] [--out DIR] [--budget-s S] [--quick]
       python benchmarks/profile_accuracy.py --nodes 2 --link-rate 1gbit [--link-delay 0us] [--out DIR]
       python benchmarks/profile_accuracy.py --nodes 4 --profile-nodes 2 --link-rate 1gbit [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sweeper.estimate.predict import predict
from sweeper.launchers.netns import LocalNodes
from sweeper.launchers.ranks import launch_trial
from sweeper.layouts.layout import Layout
from sweeper.results.trial import OK
from sweeper.run.profiler import run_profile
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep

CPU_MODEL = "{layers: 4, hidden: 128, heads: 4, kv_heads: 2, ffn: 352, vocab: 1024}"
GPU_MODEL = "{layers: 16, hidden: 2048, heads: 32, kv_heads: 8, ffn: 8192, vocab: 32000}"
HELD_OUT_SHARE = 3  # one layout in three, by CRC32 of its knobs, is held out

# (world, knobs) per layout; knobs not named take the sweep's first value
CPU_GRID: list[tuple[int, dict[str, Any]]] = [
    (2, {"micro_batch_size": 1}),
    (2, {"micro_batch_size": 2}),
    (2, {"micro_batch_size": 4}),
    (2, {"micro_batch_size": 2, "activation_checkpointing": "selective"}),
    (2, {"micro_batch_size": 2, "activation_checkpointing": "full"}),
    (2, {"tp": 2, "micro_batch_size": 1}),
    (2, {"tp": 2, "micro_batch_size": 2}),
    (2, {"tp": 2, "micro_batch_size": 4}),
    (2, {"tp": 2, "micro_batch_size": 2, "activation_checkpointing": "full"}),
    (2, {"tp": 2, "micro_batch_size": 4, "activation_checkpointing": "selective"}),
    (2, {"pp": 2, "micro_batch_size": 1}),
    (2, {"pp": 2, "micro_batch_size": 2}),
    (2, {"pp": 2, "micro_batch_size": 4}),
    (2, {"pp": 2, "micro_batch_size": 1, "activation_checkpointing": "full"}),
    (2, {"pp": 2, "micro_batch_size": 2, "activation_checkpointing": "selective"}),
    (2, {"micro_batch_size": 2, "attention": "eager"}),
    (4, {"micro_batch_size": 2}),
    (4, {"tp": 2, "micro_batch_size": 2}),
    (4, {"pp": 2, "micro_batch_size": 1}),
    (4, {"tp": 2, "pp": 2, "micro_batch_size": 2}),
]
CPU_QUICK = [0, 2, 4, 5, 7, 10, 12, 14, 15, 16, 17, 18]
# two nodes of two ranks: ranks are ordered tp inside dp inside pp, so dp=4 and tp=2 x dp=2 reduce
# gradients across the link, pp=2 x dp=2 reduces inside a node and sends activations across it
NET_MODEL = "{layers: 4, hidden: 256, heads: 4, kv_heads: 2, ffn: 704, vocab: 2048}"
NET_GRID: list[tuple[int, dict[str, Any]]] = [
    (4, {"micro_batch_size": 1}),
    (4, {"micro_batch_size": 2}),
    (4, {"micro_batch_size": 1, "sharding": "zero1"}),
    (4, {"micro_batch_size": 2, "sharding": "fsdp"}),
    (4, {"micro_batch_size": 1, "activation_checkpointing": "full"}),
    (4, {"tp": 2, "micro_batch_size": 1}),
    (4, {"tp": 2, "micro_batch_size": 2}),
    (4, {"tp": 2, "micro_batch_size": 2, "sharding": "zero1"}),
    (4, {"pp": 2, "micro_batch_size": 1}),
    (4, {"pp": 2, "micro_batch_size": 2}),
    (4, {"pp": 2, "micro_batch_size": 1, "sharding": "zero1"}),
    (4, {"pp": 2, "micro_batch_size": 2, "activation_checkpointing": "full"}),
    (4, {"tp": 2, "pp": 2, "micro_batch_size": 1}),
    (4, {"tp": 2, "pp": 2, "micro_batch_size": 2}),
    (4, {"pp": 4, "micro_batch_size": 1}),
    (4, {"pp": 4, "micro_batch_size": 2}),
]
# four nodes of one rank each (--nodes 4): every collective and every stage-to-stage send crosses a
# link, and between two nodes other than the hub it crosses two (the star: node 0 forwards); the
# profile is measured on two nodes of two ranks, as a user measures it (`sweep profile --nodes 2`)
FOUR_GRID: list[tuple[int, dict[str, Any]]] = [
    (4, {"micro_batch_size": 1}),
    (4, {"micro_batch_size": 2}),
    (4, {"micro_batch_size": 1, "sharding": "zero1"}),
    (4, {"micro_batch_size": 2, "sharding": "fsdp"}),
    (4, {"micro_batch_size": 1, "activation_checkpointing": "full"}),
    (4, {"pp": 2, "micro_batch_size": 1}),
    (4, {"pp": 2, "micro_batch_size": 2}),
    (4, {"pp": 2, "micro_batch_size": 1, "sharding": "zero1"}),
    (4, {"pp": 2, "micro_batch_size": 1, "sharding": "fsdp"}),
    (4, {"pp": 2, "micro_batch_size": 2, "activation_checkpointing": "full"}),
    (4, {"pp": 4, "micro_batch_size": 1}),
    (4, {"pp": 4, "micro_batch_size": 2}),
    (4, {"micro_batch_size": 1, "sharding": "fsdp"}),
    (4, {"pp": 2, "micro_batch_size": 2, "sharding": "zero1"}),
]


def net_sweep_text(name: str, nodes: int = 2) -> str:
    """The benchmark's sweep across nodes (the namespaces of this machine): 2 nodes x 2 CPU ranks, or
    4 nodes x 1 (the same four ranks, every one on its own node)."""
    return f"""
name: {name}
model: {NET_MODEL}
seq_len: 64
global_batch_size: 8
cluster: {{nodes: {nodes}, gpus_per_node: {4 // nodes}, gpu: cpu}}
space:
  tp: {"[1, 2]" if nodes < 4 else "[1]"}
  pp: [1, 2, 4]
  micro_batch_size: [1, 2]
  activation_checkpointing: [none, full]
  attention: [flash2]
  sharding: [none, zero1, fsdp]
trial: {{steps: 12, warmup_steps: 2, timeout_min: 10, precision: fp32}}
launcher: local
"""


# the knobs the H200 runs varied; compile and float8 last (the slowest to start)
GPU_GRID: list[tuple[int, dict[str, Any]]] = [
    (1, {"micro_batch_size": 1}),
    (1, {"micro_batch_size": 4}),
    (1, {"micro_batch_size": 8, "activation_checkpointing": "selective"}),
    (1, {"micro_batch_size": 4, "attention": "cudnn"}),
    (1, {"micro_batch_size": 8}),
    (1, {"micro_batch_size": 8, "activation_checkpointing": "full"}),
    (1, {"micro_batch_size": 2}),
    (1, {"micro_batch_size": 4, "attention": "sdpa_efficient"}),
    (1, {"micro_batch_size": 4, "rmsnorm": "fused"}),
    (1, {"micro_batch_size": 4, "compile": True}),
    (1, {"micro_batch_size": 4, "compile": True, "float8": True}),
    (1, {"micro_batch_size": 8, "activation_checkpointing": "selective", "compile": True}),
    (1, {"micro_batch_size": 2, "activation_checkpointing": "full", "attention": "cudnn"}),
]


def sweep_text(device: str, world: int, name: str, gpu: str = "h200") -> str:
    """The benchmark's sweep file on `gpu` (a GPU table key; the CPU's on a CPU): every knob value
    the grid uses is in its space."""
    cpu = device == "cpu"
    return f"""
name: {name}
model: {CPU_MODEL if cpu else GPU_MODEL}
seq_len: {128 if cpu else 2048}
global_batch_size: 8
cluster: {{nodes: 1, gpus_per_node: {world}, gpu: {"cpu" if cpu else gpu}}}
space:
  tp: {"[1, 2]" if cpu else "[1]"}
  pp: {"[1, 2]" if cpu else "[1]"}
  micro_batch_size: [1, 2, 4, 8]
  activation_checkpointing: [none, selective, full]
  attention: {"[flash2, eager]" if cpu else "[flash2, cudnn, sdpa_efficient]"}
  rmsnorm: [eager, fused]
  sharding: {"[none, zero1]" if cpu else "[none]"}
  compile: {"[false]" if cpu else "[false, true]"}
  float8: {"[false]" if cpu else "[false, true]"}
trial: {{steps: {6 if cpu else 10}, warmup_steps: {2 if cpu else 3}, timeout_min: 10, precision: {"fp32" if cpu else "bf16"}}}
launcher: local
"""


def load(text: str, path: Path, *, profiles: bool) -> Sweep:
    path.write_text(text)
    return parse_sweep(text, source=str(path), profiles=profiles)


@dataclass
class Row:
    """One layout: its knobs, held out or not, what the trial measured, both predictions."""

    world: int
    knobs: dict[str, Any]
    held_out: bool
    status: str = "not run"
    measured_s: float = float("nan")
    fastest_s: float = float("nan")
    profiled_s: float = float("nan")
    table_s: float = float("nan")
    note: str = ""

    @property
    def label(self) -> str:
        return f"w{self.world} " + " ".join(f"{k}={v}" for k, v in self.knobs.items())


def held_out(world: int, knobs: dict[str, Any]) -> bool:
    key = f"{world}:" + ",".join(f"{k}={knobs[k]}" for k in sorted(knobs))
    return zlib.crc32(key.encode()) % HELD_OUT_SHARE == 0


def layout_of(sweep: Sweep, knobs: dict[str, Any]) -> Layout:
    values = {k: v[0] for k, v in sweep.space.items()} | knobs
    return Layout.from_mapping(values)


def predicted_s(sweep: Sweep, layout: Layout) -> float:
    return float(predict(layout.columns(sweep), sweep).total[0])


def run_trial(
    sweep: Sweep, layout: Layout, workdir: Path, *, timeout_s: float, nodes: LocalNodes | None = None
) -> tuple[str, float, float, str]:
    """(status, median and fastest step seconds, error) of one real trial on local processes (in the
    namespaces of `nodes`, node k's ranks in namespace k)."""
    result = launch_trial(sweep, layout, workdir=workdir, timeout_s=timeout_s, nodes=nodes)
    if result.status != OK or not result.step_times_s:
        return str(result.status), float("nan"), float("nan"), (result.error or "")[:160]
    return OK, statistics.median(result.step_times_s), min(result.step_times_s), ""


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3:
        return float("nan")
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def summary(rows: list[Row], which: str, *, against: str = "measured_s") -> str:
    ok = [r for r in rows if r.status == OK]
    if not ok:
        return f"{which}: no layout measured"
    measured = np.array([getattr(r, against) for r in ok])
    parts = []
    for name, attr in (("table model (today)", "table_s"), ("profiled model", "profiled_s")):
        pred = np.array([getattr(r, attr) for r in ok])
        err = np.median(np.abs(pred / measured - 1.0))
        parts.append(f"{name}: median |error| {100 * err:.1f}%, spearman {spearman(pred, measured):.2f}")
    return f"{which} ({len(ok)} layouts): " + "; ".join(parts)


def best_rank(rows: list[Row]) -> str:
    """`measured best at predicted rank K`: where the fastest measured layout stands in the profiled
    model's order (1: the model names it first)."""
    ok = [r for r in rows if r.status == OK and not np.isnan(r.profiled_s)]
    if not ok:
        return "measured best: no layout measured"
    best = min(ok, key=lambda r: r.measured_s)
    rank = 1 + sum(r.profiled_s < best.profiled_s for r in ok)
    top = min(ok, key=lambda r: r.profiled_s)
    return (
        f"measured best at predicted rank {rank}: {best.label} ({best.measured_s:.3f} s); "
        f"predicted best {top.label} measured {top.measured_s:.3f} s ({top.measured_s / best.measured_s - 1:+.1%})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument(
        "--nodes", type=int, choices=(1, 2, 4), default=1, help="2 or 4: across a local cluster of that many nodes"
    )
    ap.add_argument(
        "--profile-nodes",
        type=int,
        choices=(2, 4),
        default=None,
        help="with --nodes 4: the nodes the profile is measured on (default: --nodes; 2 as a user measures it)",
    )
    ap.add_argument("--link-rate", default="1gbit", help="with --nodes 2 or 4: the links' rate (tc: 300mbit, 1gbit)")
    ap.add_argument("--link-delay", default="0us", help="with --nodes 2 or 4: the links' one-way delay (0us, 200us)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the profile, the sweep files and the CSV")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting trials past this many seconds")
    ap.add_argument("--quick", action="store_true", help="a shorter grid and a quick profile")
    args = ap.parse_args()
    if args.profile_nodes is not None and args.profile_nodes > args.nodes:
        ap.error(f"--profile-nodes {args.profile_nodes}: at most --nodes ({args.nodes})")
    if args.nodes > 1:
        return main_nodes(args)
    start = time.monotonic()
    cuda = args.device == "cuda"
    gpu = "h200"
    if cuda:
        import torch

        from sweeper.runtime.profile_run import gpu_key
        from sweeper.spec.hardware import lookup_gpu

        if not torch.cuda.is_available():
            print("--device cuda: torch.cuda.is_available() is False on this machine", file=sys.stderr)
            return 2
        # the card this runs on, if the GPU table knows it (else the sweep says h200 and the profile is refused)
        key = gpu_key(torch.device("cuda", 0))[0]
        gpu = key if lookup_gpu(key) is not None else gpu
    budget = args.budget_s if args.budget_s is not None else (330.0 if cuda else 1e9)
    out = args.out or Path(tempfile.mkdtemp(prefix="profile-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    grid = GPU_GRID if cuda else [CPU_GRID[i] for i in CPU_QUICK] if args.quick else CPU_GRID
    worlds = sorted({w for w, _ in grid})
    first = worlds[0]

    def progress(what: str) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {what}", file=sys.stderr, flush=True)

    base = load(sweep_text(args.device, first, "profile_accuracy", gpu), out / f"sweep_w{first}.yaml", profiles=False)
    measured = run_profile(base, out=out / "profile.yaml", quick=args.quick, progress=progress, want_cuda=cuda)
    for what, why in measured.skipped.items():
        progress(f"profile left out {what}: {why}")
    progress(f"profile written to {measured.path}")
    sweeps = {}
    for w in worlds:
        text = sweep_text(args.device, w, f"profile_accuracy_w{w}", gpu)
        table = load(text, out / f"sweep_w{w}.yaml", profiles=False)
        priced = text.replace("gpu: ", f"profile: {measured.path}, gpu: ")
        sweeps[w] = (table, load(priced, out / f"sweep_w{w}_profiled.yaml", profiles=True))
    rows = [Row(w, knobs, held_out(w, knobs)) for w, knobs in grid]
    last_trial_s = 0.0
    for i, row in enumerate(rows):
        table, profiled = sweeps[row.world]
        layout = layout_of(table, row.knobs)
        rejection = layout.rejection(table)
        if rejection is not None:
            row.status, row.note = "invalid", rejection.message[:160]
            continue
        row.table_s, row.profiled_s = predicted_s(table, layout), predicted_s(profiled, layout)
        elapsed = time.monotonic() - start
        slower = 2.0 if row.knobs.get("compile") else 1.0  # compiling the block adds about a trial's start-up
        if elapsed + 1.2 * slower * last_trial_s > budget:
            row.note = f"skipped: the budget of {budget:.0f} s would be overrun"
            continue
        progress(f"trial {i + 1}/{len(rows)}: {row.label}")
        t0 = time.monotonic()
        limit = min(table.trial.timeout_min * 60, max(budget - elapsed, 60.0))  # a hung trial cannot eat the budget
        row.status, row.measured_s, row.fastest_s, row.note = run_trial(
            table, layout, out / "trials" / f"t{i:02d}", timeout_s=limit
        )
        last_trial_s = time.monotonic() - t0
    print_rows(rows, out)
    print(f"\nprofile: {measured.path}; table: {out / 'profile_accuracy.csv'}; {time.monotonic() - start:.0f} s")
    # a busy host only adds time: each trial's fastest step is its least disturbed one
    print(summary(rows, "all layouts, against each trial's fastest step", against="fastest_s"))
    print(summary([r for r in rows if not r.held_out], "fit part"))
    print(summary([r for r in rows if r.held_out], "held-out part"))
    print(summary(rows, "all layouts"))
    return 0


def print_rows(rows: list[Row], out: Path) -> None:
    """The table of layouts (and the CSV beside it), then each layout's note."""
    frame = pd.DataFrame(
        [
            {
                "layout": r.label,
                "held_out": r.held_out,
                "status": r.status,
                "measured_s": r.measured_s,
                "fastest_s": r.fastest_s,
                "profiled_s": r.profiled_s,
                "table_s": r.table_s,
                "profiled_err": r.profiled_s / r.measured_s - 1.0,
                "table_err": r.table_s / r.measured_s - 1.0,
                "note": r.note,
            }
            for r in rows
        ]
    )
    frame.to_csv(out / "profile_accuracy.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_colwidth", 70, "display.max_rows", 100):
        print(frame.drop(columns=["note"]).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for r in rows:
        if r.note:
            print(f"  {r.label}: {r.status}: {r.note}")


def main_nodes(args: argparse.Namespace) -> int:
    """--nodes 2 or 4: the profile measured across the shaped links of --profile-nodes nodes (2 x 2
    ranks), then the grid's trials across all of them (2 x 2 ranks, or 4 x 1)."""
    import os

    from sweeper.errors import SweepError
    from sweeper.launchers import netns

    if os.geteuid() != 0:
        print(f"--nodes {args.nodes}: needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    try:
        netns.check_link(args.link_rate, args.link_delay)
    except SweepError as e:
        print(e, file=sys.stderr)
        return 2
    start = time.monotonic()
    out = args.out or Path(tempfile.mkdtemp(prefix="profile-accuracy-nodes-"))
    out.mkdir(parents=True, exist_ok=True)
    grid = FOUR_GRID if args.nodes == 4 else NET_GRID
    profile_nodes = args.profile_nodes or args.nodes

    def progress(what: str) -> None:
        print(f"[{time.monotonic() - start:6.1f} s] {what}", file=sys.stderr, flush=True)

    with netns.shaped_link(args.link_rate, args.link_delay, nodes=args.nodes) as nodes:
        link = netns.link_description(nodes)
        progress(f"{args.nodes} nodes ({', '.join(nodes.namespaces)}), link {link}")
        # the profile's sweep is two (or four) nodes of two ranks: a user profiles their own node shape
        shape = load(net_sweep_text("profile_accuracy_nodes"), out / "sweep_profile.yaml", profiles=False)
        measured = run_profile(
            shape, out=out / "profile.yaml", quick=args.quick, progress=progress, nodes=profile_nodes
        )
        for what, why in measured.skipped.items():
            progress(f"profile left out {what}: {why}")
        progress(f"profile measured on {profile_nodes} nodes, written to {measured.path}")
        text = net_sweep_text("profile_accuracy_nodes", args.nodes)
        table = load(text, out / "sweep.yaml", profiles=False)
        profiled = load(text.replace("gpu: ", f"profile: {measured.path}, gpu: "), out / "sweep_p.yaml", profiles=True)
        rows = [Row(w, knobs, held_out(w, knobs)) for w, knobs in grid]
        for i, row in enumerate(rows):
            layout = layout_of(table, row.knobs)
            rejection = layout.rejection(table)
            if rejection is not None:
                row.status, row.note = "invalid", rejection.message[:160]
                continue
            row.table_s, row.profiled_s = predicted_s(table, layout), predicted_s(profiled, layout)
            progress(f"trial {i + 1}/{len(rows)}: {row.label}")
            row.status, row.measured_s, row.fastest_s, row.note = run_trial(
                table, layout, out / "trials" / f"t{i:02d}", timeout_s=table.trial.timeout_min * 60, nodes=nodes
            )
    print_rows(rows, out)
    print(
        f"\n{args.nodes} nodes x {4 // args.nodes} ranks, link {link} (asked: {args.link_rate}, delay {args.link_delay}); "
        f"profile measured on {profile_nodes} nodes x 2 ranks: {measured.path}; {time.monotonic() - start:.0f} s"
    )
    print(summary(rows, "all layouts, against each trial's fastest step", against="fastest_s"))
    print(summary([r for r in rows if not r.held_out], "fit part"))
    print(summary([r for r in rows if r.held_out], "held-out part"))
    print(summary(rows, "all layouts"))
    print(best_rank(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
