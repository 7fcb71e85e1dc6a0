"""Planner throughput: enumerate, validate, de-duplicate and memory-check large spaces.

Prints one row per space (layouts, candidates, CPU seconds, layouts per second). The goal of
the foundation issue: a space of 100,000+ layouts in well under a second of CPU.

    python benchmarks/plan_bench.py [--quick]

--quick plans the smallest space only (2,048 layouts), timed once instead of the best of three:
the same planner and the same table and last line, in a second instead of minutes.
"""

from __future__ import annotations

import argparse
import time

import yaml

from sweeper.plan.plan import make_plan
from sweeper.spec.loader import parse_sweep

EVERY_KNOB = {
    "tp": [1, 2, 4, 8],
    "pp": [1, 2, 4, 8, 16],
    "micro_batch_size": [1, 2, 4, 8],
    "sequence_parallel": [False, True],
    "activation_checkpointing": ["none", "selective", "ffn", "full"],
    "attention": ["eager", "fused_softmax", "sdpa_math", "flash1", "flash2", "sdpa_efficient", "cudnn"],
    "rmsnorm": ["eager", "fused"],
    "sharding": ["none", "zero1", "fsdp"],
    "pp_schedule": ["1f1b", "gpipe", "interleaved"],
    "virtual_stages": [1, 2, 4],
    "compile": [False, True],
    "float8": [False, True],
}


def space(**drop: int) -> dict:
    """Every knob, optionally truncating some lists (knob=n keeps the first n values)."""
    return {k: v[: drop.get(k, len(v))] for k, v in EVERY_KNOB.items()}


CASES = [
    (
        "llama-13b, 64 GPUs, paper knobs",
        "llama-13b",
        8,
        {
            "tp": [1, 2, 4, 8],
            "pp": [1, 2, 4, 8],
            "micro_batch_size": [1, 2, 4, 8],
            "sequence_parallel": [False, True],
            "activation_checkpointing": ["none", "full"],
            "attention": ["eager", "fused_softmax", "flash1", "flash2"],
            "rmsnorm": ["eager", "fused"],
        },
    ),
    ("llama3-70b, 4096 GPUs, ~120k layouts", "llama3-70b", 512, space(attention=4, virtual_stages=2, compile=1)),
    ("llama3-405b, 4096 GPUs, every knob", "llama3-405b", 512, space()),
]


def bench(label: str, model: str, nodes: int, knobs: dict, repeats: int = 3) -> tuple:
    text = yaml.safe_dump(
        {
            "name": "bench",
            "model": model,
            "seq_len": 8192,
            "global_batch_size": 2048,
            "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu": "h100-sxm"},
            "space": knobs,
        }
    )
    sweep = parse_sweep(text)
    make_plan(sweep)  # warm-up: first-call costs of numpy are start-up, not planning
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        plan = make_plan(sweep)
        best = min(best, time.process_time() - t0)
    counts = plan.counts()
    return label, len(plan), counts.get("candidate", 0), best, len(plan) / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the smallest space only, timed once")
    args = ap.parse_args()
    cases = CASES[:1] if args.quick else CASES
    rows = [bench(*case, repeats=1 if args.quick else 3) for case in cases]
    print(f"{'space':40s} {'layouts':>9s} {'candidates':>10s} {'CPU s':>7s} {'layouts/s':>11s}")
    for label, n, cand, secs, rate in rows:
        print(f"{label:40s} {n:9d} {cand:10d} {secs:7.3f} {rate:11,.0f}")
    label, n, _, secs, rate = rows[-1]
    print(f"largest space: {n:,} layouts planned in {secs:.2f} s of CPU ({rate:,.0f} layouts/s)")


if __name__ == "__main__":
    main()
