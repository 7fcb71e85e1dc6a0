"""What the trial runner costs over plain PyTorch: the trainer at tp = pp = dp = 1 against a hand-written loop.

Both train the same model (a small LLaMA, fp32 on CPU, bf16 on a GPU) on the same batch with
the same AdamW, each in a fresh process with the same threads, and time every step the same
way (synchronise, wall time at the end of each step, drop the first). The rounds alternate the
two so that drift of the machine hits both. Prints a table (the protocol's mean per round), the
ratio of the median step times over all rounds (robust to the odd slow step of a busy machine;
target <= 1.05) and the time from process start to the first step of the trainer.

    python benchmarks/trial_overhead.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweeper.layout import Layout
from sweeper.spec import Sweep, parse_sweep

STEPS = 10
SPEC = """
name: trial_overhead
model: {layers: 4, hidden: 256, heads: 8, kv_heads: 4, ffn: 688, vocab: 4096}
seq_len: 256
global_batch_size: 8
cluster: {nodes: 1, gpus_per_node: 1, gpu: %(gpu)s}
trial: {steps: %(steps)d, warmup_steps: 1, timeout_min: 10, precision: %(precision)s, lr: 0.0003}
"""


def bench_sweep() -> Sweep:
    """The benchmark's sweep: fp32 on CPU; bf16 (and the real peak) when a CUDA GPU is here."""
    gpu, precision = "cpu", "fp32"
    if (
        subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"]).returncode
        == 0
    ):
        gpu, precision = "h100-sxm", "bf16"
    return parse_sweep(SPEC % {"gpu": gpu, "steps": STEPS, "precision": precision})


LAYOUT = Layout(micro_batch_size=8)  # the whole batch in one micro-batch, as the plain loop does


def plain_loop(sweep: Sweep) -> dict[str, float | list[float]]:
    """The hand-written baseline (runs in its own process): model, AdamW, batch, forward, backward, step."""
    import torch

    from sweeper.trainer import kernels
    from sweeper.trainer.env import process_start_unix
    from sweeper.trainer.model import Transformer, init_weights, loss_fn
    from sweeper.trainer.train import ADAMW, synthetic_batch

    started = process_start_unix()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    s = sweep.model
    attend = kernels.attention_kernel(
        LAYOUT.attention,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        seq_len=sweep.seq_len,
        dtype=torch.bfloat16 if sweep.trial.precision == "bf16" else torch.float32,
        device=device,
    )
    with device:
        model = Transformer(s, sweep.seq_len, attend=attend, norm_fn=kernels.rmsnorm_kernel(LAYOUT.rmsnorm))
    init_weights(model, s, seed=sweep.trial.seed, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=sweep.trial.lr, fused=True, **ADAMW)
    x, y = (
        t.to(device)
        for t in synthetic_batch(s, batch=sweep.global_batch_size, seq_len=sweep.seq_len, seed=sweep.trial.seed)
    )
    bf16 = sweep.trial.precision == "bf16"
    times = []
    first = time.time()
    last = time.perf_counter()
    for _ in range(sweep.trial.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return {"step_times_s": times, "startup_s": first - started if started else float("nan")}


def run_plain(sweep: Sweep) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))}
    out = subprocess.run([sys.executable, __file__, "--plain"], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run_trainer(sweep: Sweep) -> dict:
    from sweeper.launchers.ranks import launch_trial

    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        r = launch_trial(sweep, LAYOUT, workdir=Path(tmp))
    if r.status != "ok":
        raise SystemExit(f"the trainer's trial ended {r.status}: {r.error}")
    return {"step_times_s": r.step_times_s, "startup_s": r.startup_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # the baseline's own process
    args = parser.parse_args()
    sweep = bench_sweep()
    if args.plain:
        print(json.dumps(plain_loop(sweep)))
        return
    runs: dict[str, list[dict]] = {"trainer": [], "plain": []}
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds} ...", file=sys.stderr)
        runs["trainer"].append(run_trainer(sweep))
        runs["plain"].append(run_plain(sweep))
    means = {k: [statistics.fmean(r["step_times_s"][1:]) for r in v] for k, v in runs.items()}
    medians = {k: statistics.median(t for r in v for t in r["step_times_s"][1:]) for k, v in runs.items()}
    m = sweep.model
    print(
        f"model: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), seq {sweep.seq_len}, "
        f"batch {sweep.global_batch_size}, {sweep.trial.precision} on {sweep.cluster.gpu.name}; "
        f"{STEPS} steps, first dropped, {args.rounds} alternating rounds"
    )
    print(f"{'':24}{'median step (s)':>16}{'mean step per round (s)':>44}{'tokens/s':>12}")
    tokens = sweep.global_batch_size * sweep.seq_len
    for name, label in (("trainer", "trainer (tp=pp=dp=1)"), ("plain", "plain PyTorch loop")):
        rounds = " ".join(f"{x:.4f}" for x in means[name])
        print(f"{label:24}{medians[name]:>16.4f}{rounds:>44}{tokens / medians[name]:>12,.0f}")
    ratio = medians["trainer"] / medians["plain"]
    startup = statistics.median(r["startup_s"] for r in runs["trainer"])
    plain_startup = statistics.median(r["startup_s"] for r in runs["plain"])
    print(f"step time ratio trainer / plain: {ratio:.3f} (median steps; target <= 1.05)")
    print(f"process start to first step: trainer {startup:.2f} s (plain loop {plain_startup:.2f} s)")


if __name__ == "__main__":
    main()
