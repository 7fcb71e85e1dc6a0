"""What the trial runner costs over plain PyTorch: the trainer at tp = pp = dp = 1 against a hand-written loop.

Both train the same model (a small LLaMA, fp32 on CPU, bf16 on a GPU) on the same batch with
the same AdamW, each in a fresh process with the same threads, and time every step the same
way (synchronise, wall time at the end of each step, drop the first). The rounds alternate the
two so that drift of the machine hits both. Prints a table (the protocol's mean per round), the
ratio of the median step times over all rounds (robust to the odd slow step of a busy machine;
target <= 1.05) and the time from process start to the first step of the trainer. The model
line names the device the runs used (the driver's name) and the GPU-table entry whose peak MFU
divides by.

`--explain` adds the steps between the two, each in its own process and in the same rounds, to
find where the trainer's extra time per step goes: the plain loop with the trial's outcome
watcher polling a real rendezvous store (sweeper.runtime.outcome.Watcher, as run_trial starts
it), and the trainer's own step loop (build_trainer + run_steps) in a one-rank process group
without the launcher around it.

    python benchmarks/trial_overhead.py [--rounds 4] [--explain]
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

from sweeper.layouts.layout import Layout
from sweeper.spec.hardware import GPUS, gpu_matches
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep

STEPS = 10
SPEC = """
name: trial_overhead
model: {layers: 4, hidden: 256, heads: 8, kv_heads: 4, ffn: 688, vocab: 4096}
seq_len: 256
global_batch_size: 8
cluster: {nodes: 1, gpus_per_node: 1, gpu: %(gpu)s}
trial: {steps: %(steps)d, warmup_steps: 1, timeout_min: 10, precision: %(precision)s, lr: 0.0003}
"""


def detected_device() -> str:
    """The driver's name of CUDA device 0 ("NVIDIA H200"), or "cpu" (asked in a child process, so
    this one never initialises CUDA before the runs)."""
    probe = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def table_gpu(detected: str) -> str:
    """The GPU table's entry for the detected device (its peak is MFU's denominator); h100-sxm,
    said so, for a card the table lacks."""
    if detected == "cpu":
        return "cpu"
    for name, gpu in GPUS.items():
        if name != "cpu" and gpu_matches(gpu, detected):
            return name
    print(f"{detected} is not in the GPU table: priced as h100-sxm", file=sys.stderr)
    return "h100-sxm"


LAYOUT = Layout(micro_batch_size=8)  # the whole batch in one micro-batch, as the plain loop does


def plain_loop(sweep: Sweep, *, watcher: bool = False) -> dict[str, float | list[float]]:
    """The hand-written baseline (runs in its own process): model, AdamW, batch, forward, backward, step.

    `watcher`: with the trial's outcome watcher polling a rendezvous store beside the loop, as
    every rank of a trial has it (a thread that wakes every 0.25 s and asks the store).
    """
    import torch

    from sweeper.runtime import kernels
    from sweeper.runtime.env import process_start_unix
    from sweeper.runtime.model import Transformer, init_weights, loss_fn
    from sweeper.runtime.train import ADAMW, synthetic_batch

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
    if watcher:
        _start_watcher()
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


def _start_watcher() -> None:
    """The outcome watcher of run_trial on a real one-rank store, polling until the process ends."""
    import torch.distributed as dist

    from sweeper.process import free_port
    from sweeper.runtime.outcome import Watcher

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, wait_for_workers=False)
    Watcher(store, rank=0, on_stuck=lambda failure: None).start()


def trainer_loop(sweep: Sweep) -> dict[str, float | list[float]]:
    """The trainer's own step loop (build_trainer + run_steps) on a one-rank process group, with no
    launcher, outcome watcher or result files around it (runs in its own process)."""
    import torch

    from sweeper.runtime.env import (
        DistEnv,
        build_mesh,
        init_distributed,
        pick_device,
        prepare_process_environment,
        process_start_unix,
        set_matmul_precision,
    )
    from sweeper.runtime.runner import run_steps
    from sweeper.runtime.train import build_trainer

    started = process_start_unix()
    prepare_process_environment()
    env = DistEnv.from_environ()
    device = pick_device(env, want_cuda=torch.cuda.is_available())
    init_distributed(env, device, timeout_s=120)
    set_matmul_precision(sweep.trial.precision)
    trainer = build_trainer(
        sweep.model,
        LAYOUT,
        mesh=build_mesh(device, pp=1, dp=1, tp=1),
        device=device,
        seq_len=sweep.seq_len,
        global_batch_size=sweep.global_batch_size,
        precision=sweep.trial.precision,
        seed=sweep.trial.seed,
        lr=sweep.trial.lr,
    )
    times, _, first = run_steps(trainer, steps=sweep.trial.steps, rank=0, faults=[])
    return {"step_times_s": times, "startup_s": first - started if started else float("nan")}


# the variants run in a process of their own: `--variant NAME` prints its step times as JSON
VARIANTS = {
    "plain": plain_loop,
    "plain+watcher": lambda sweep: plain_loop(sweep, watcher=True),
    "trainer loop": trainer_loop,
}
LABELS = {
    "trainer": "trainer (tp=pp=dp=1)",
    "trainer loop": "  its step loop alone",
    "plain+watcher": "  plain + outcome watcher",
    "plain": "plain PyTorch loop",
}


def run_variant(name: str, gpu: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))}
    cmd = [sys.executable, __file__, "--variant", name, "--gpu", gpu]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_trainer(sweep: Sweep) -> dict:
    from sweeper.launchers.ranks import launch_trial

    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # never the user's cache: learned profiles
        r = launch_trial(sweep, LAYOUT, workdir=Path(tmp))
    if r.status != "ok":
        raise SystemExit(f"the trainer's trial ended {r.status}: {r.error}")
    return {"step_times_s": r.step_times_s, "startup_s": r.startup_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--explain", action="store_true", help="also time the steps between trainer and plain loop")
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a variant's own process
    parser.add_argument("--gpu", help=argparse.SUPPRESS)  # the table entry, passed to a variant's process
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(VARIANTS[args.variant](parse_sweep(SPEC % _fields(args.gpu)))))
        return
    detected = detected_device()
    gpu = table_gpu(detected)
    sweep = parse_sweep(SPEC % _fields(gpu))
    names = ["trainer", *(["trainer loop", "plain+watcher"] if args.explain else []), "plain"]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds} ...", file=sys.stderr)
        for name in names:
            if name == "trainer":
                runs[name].append(run_trainer(sweep))
            else:
                runs[name].append(run_variant(name, gpu))
    means = {k: [statistics.fmean(r["step_times_s"][1:]) for r in v] for k, v in runs.items()}
    medians = {k: statistics.median(t for r in v for t in r["step_times_s"][1:]) for k, v in runs.items()}
    m = sweep.model
    print(
        f"model: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), seq {sweep.seq_len}, "
        f"batch {sweep.global_batch_size}, {sweep.trial.precision} on {detected} (GPU table: {gpu}); "
        f"{STEPS} steps, first dropped, {args.rounds} alternating rounds"
    )
    print(f"{'':28}{'median step (s)':>16}{'vs plain (ms)':>15}{'mean step per round (s)':>40}{'tokens/s':>12}")
    tokens = sweep.global_batch_size * sweep.seq_len
    for name in names:
        rounds = " ".join(f"{x:.4f}" for x in means[name])
        extra_ms = (medians[name] - medians["plain"]) * 1e3
        print(f"{LABELS[name]:28}{medians[name]:>16.4f}{extra_ms:>+15.2f}{rounds:>40}{tokens / medians[name]:>12,.0f}")
    ratio = medians["trainer"] / medians["plain"]
    startup = statistics.median(r["startup_s"] for r in runs["trainer"])
    plain_startup = statistics.median(r["startup_s"] for r in runs["plain"])
    print(f"step time ratio trainer / plain: {ratio:.3f} (median steps; target <= 1.05)")
    print(f"process start to first step: trainer {startup:.2f} s (plain loop {plain_startup:.2f} s)")


def _fields(gpu: str) -> dict[str, object]:
    return {"gpu": gpu, "steps": STEPS, "precision": "fp32" if gpu == "cpu" else "bf16"}


if __name__ == "__main__":
    main()
