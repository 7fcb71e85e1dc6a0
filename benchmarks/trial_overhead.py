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

`--startup` measures instead what starting a trial costs in CPU seconds (user + system, so a busy
machine slows it less than it slows wall time): the ranks of one tiny trial (the demo sweep's model,
2 ranks of data parallelism, 2 steps, through the local launcher's `launch_trial`), the same trial as
a sweep's later trials run it (its ranks forked from the zygote `sweep run` keeps warm; their CPU read
machine-wide from /proc/stat, so a quiet machine's figure), a whole
`sweep run --dry-run` of the demo sweep, and `sweep best` and `sweep status` of the demo sweep
replayed to its end (12 trials, every candidate answered at its predicted step time with 10 steps:
what the commands that read a finished sweep cost, the most frequent processes of the test suite). `--before REF` runs the same measurements, in the same
alternating rounds, on the code of git revision REF (a temporary worktree) and prints the change.

    python benchmarks/trial_overhead.py [--rounds 4] [--explain] [--quick]
    python benchmarks/trial_overhead.py --startup [--before REF] [--rounds 3] [--quick]

`--quick`: one round (unless --rounds says otherwise) and, without --startup, QUICK_STEPS steps a run
instead of STEPS (the first still dropped): the same processes and table, noisier medians.
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
from sweeper.process import SERVER_VAR
from sweeper.spec.hardware import GPUS, gpu_matches
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep

STEPS = 10
QUICK_STEPS = 3  # --quick: two measured steps a run
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

    from sweeper.process import process_start_unix
    from sweeper.runtime import kernels
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

    from sweeper.process import process_start_unix
    from sweeper.runtime.env import (
        DistEnv,
        build_mesh,
        init_distributed,
        pick_device,
        prepare_process_environment,
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


def run_variant(name: str, gpu: str, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))}
    cmd = [sys.executable, __file__, "--variant", name, "--gpu", gpu, "--steps", str(steps)]
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


def startup_probe() -> dict[str, float]:
    """One tiny trial's ranks, in CPU seconds (run in a process of its own, on the code its
    PYTHONPATH names): the ranks are this process's children, reaped by the launcher, so the
    children's usage after the launch is theirs alone."""
    import resource

    import yaml

    from sweeper.launchers.ranks import launch_trial

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "search_spaces" / "tiny_cpu.yaml").read_text())
    spec["trial"].update(steps=2, warmup_steps=1)
    sweep = parse_sweep(yaml.safe_dump(spec))
    with tempfile.TemporaryDirectory(prefix="trial-startup-") as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
        r = launch_trial(sweep, Layout(), workdir=Path(tmp) / "cold")
        if r.status != "ok":
            raise SystemExit(f"the tiny trial ended {r.status}: {r.error}")
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = {"ranks_cpu_s": used.ru_utime + used.ru_stime, "startup_s": r.startup_s}
        return result | warm_trial(sweep, Path(tmp))


def warm_trial(sweep: Sweep, tmp: Path) -> dict[str, float]:
    """The same trial as a sweep's trials after its first run it: its ranks forked from the zygote `sweep run`
    keeps warm (launchers/forking.py), which a first trial started; NaN on code without one. Its ranks are not
    this process's children (the server's zygote reaps them), so their CPU is the machine's, read from
    /proc/stat around the launch: a quiet machine's figure."""
    from sweeper.launchers.ranks import launch_trial

    try:
        from sweeper.launchers.forking import warm_zygote
    except ImportError:
        return {"warm_cpu_s": float("nan"), "warm_startup_s": float("nan")}
    with warm_zygote(tmp) as env:
        launch_trial(sweep, Layout(), workdir=tmp / "first", extra_env=env)  # the server's imports: not measured
        before = _machine_cpu_s()
        r = launch_trial(sweep, Layout(), workdir=tmp / "warm", extra_env=env)
        cpu = _machine_cpu_s() - before
    if r.status != "ok":
        raise SystemExit(f"the tiny trial from a warm zygote ended {r.status}: {r.error}")
    return {"warm_cpu_s": cpu, "warm_startup_s": r.startup_s}


def _machine_cpu_s() -> float:
    """CPU seconds every process of the machine has used (user, nice, system, interrupts) since boot."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def replay_table(out: Path) -> Path:
    """The demo sweep's candidates, each at its predicted step time (10 steps, 1 % apart), as a replay table."""
    import numpy as np
    import pandas as pd
    import yaml

    from sweeper.knobs import KNOBS
    from sweeper.plan.plan import make_plan

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "search_spaces" / "tiny_cpu.yaml").read_text())
    plan = make_plan(parse_sweep(yaml.safe_dump(spec)))
    rows = []
    for r in np.flatnonzero(plan.candidate_mask):
        layout = plan.layout(int(r))
        step = float(plan.throughput.total[r])
        row = {k: getattr(layout, k) for k in KNOBS}
        rows.append(row | {"status": "ok", "step_times_s": [step * (1 + 0.01 * (i % 3)) for i in range(10)]})
    path = out / "table.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def measure_startup(tree: Path, table: Path) -> dict[str, float]:
    """The probe, a dry run, and `best` and `status` of a replayed sweep on the code in `tree`, each in a
    fresh interpreter (the replayed sweep runs once first, not measured)."""
    # a fork server its caller keeps warm (a test session's) is not the probe's: its first trial starts a
    # zygote of its own, as a sweep's first trial does
    env = {k: v for k, v in os.environ.items() if k != SERVER_VAR}
    env |= {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = subprocess.run(
        [sys.executable, __file__, "--startup-probe"], env=env, capture_output=True, text=True, check=False
    )
    if probe.returncode:
        raise SystemExit(f"the startup probe failed on {tree}: {probe.stderr.strip().splitlines()[-1:]}")
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory(prefix="dry-run-") as tmp:
        env["XDG_CACHE_HOME"] = tmp
        spec = tree / "search_spaces" / "tiny_cpu.yaml"
        # run from the temporary folder: `python -m` puts the working folder first on sys.path, ahead of
        # PYTHONPATH, so from this checkout every tree's dry run would import this checkout's package
        cmd = [sys.executable, "-m", "sweeper.cli", "run", str(spec), "--dry-run"]
        result["dry_run_cpu_s"] = _cpu_of(cmd, env, cwd=Path(tmp))
        replayed = Path(tmp) / "replayed.yaml"
        text = spec.read_text().replace("launcher: local", f"launcher: {{kind: replay, table: {table}}}")
        replayed.write_text(text + f"results_dir: {Path(tmp) / 'results'}\n")
        _cpu_of([sys.executable, "-m", "sweeper.cli", "run", str(replayed)], env, cwd=Path(tmp))
        for command in ("best", "status"):
            cmd = [sys.executable, "-m", "sweeper.cli", command, str(replayed)]
            result[f"{command}_cpu_s"] = _cpu_of(cmd, env, cwd=Path(tmp))
    return result


def _cpu_of(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """CPU seconds (user + system) of `cmd`, read from the kernel's record of the reaped child."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[2:])} exited {done.returncode}: {done.stdout.strip().splitlines()[-1:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def startup_main(rounds: int, before: str | None) -> None:
    """The `--startup` table: HEAD's tree, and REF's where asked, in alternating rounds."""
    root = Path(__file__).resolve().parents[1]
    trees = {"this tree": root}
    with tempfile.TemporaryDirectory(prefix="trial-overhead-ref-") as tmp:
        if before:
            old = Path(tmp) / "ref"
            subprocess.run(["git", "-C", str(root), "worktree", "add", "-q", "--detach", str(old), before], check=True)
            trees = {before: old, **trees}
        # both trees read compiled modules (the runs write none): no tree pays for the compiling
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "sweeper")], check=True)
        try:
            table = replay_table(Path(tmp))
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for i in range(rounds):
                print(f"round {i + 1}/{rounds} ...", file=sys.stderr)
                for name, tree in trees.items():
                    runs[name].append(measure_startup(tree, table))
        finally:
            if before:
                subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(old)], check=False)
    print(
        "tiny trial (2 ranks, dp=2, 2 steps) with a zygote of its own, then as a sweep's later trial (warm: its ranks "
        "forked from the zygote the sweep keeps warm; CPU machine-wide), `sweep run --dry-run` of the demo sweep, "
        f"and `sweep best` and `sweep status` of it replayed; median of {rounds} rounds"
    )
    keys = ("ranks_cpu_s", "startup_s", "warm_cpu_s", "warm_startup_s", "dry_run_cpu_s", "best_cpu_s", "status_cpu_s")
    heads = ("ranks CPU (s)", "start to first step (s)", "warm: CPU (s)", "warm: to first step (s)")
    heads += ("dry run CPU (s)", "best CPU (s)", "status CPU (s)")
    print(f"{'code':28}" + "".join(f"{h:>{len(h) + 2}}" for h in heads))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    for name, m in med.items():
        print(f"{name[:28]:28}" + "".join(f"{m[k]:>{len(h) + 2}.2f}" for k, h in zip(keys, heads)))
    now = med["this tree"]
    if before:
        was = med[before]
        change = {k: (now[k] / was[k], now[k] - was[k]) for k in keys}
        print(
            f"start-up against {before}: ranks CPU {change['ranks_cpu_s'][0]:.2f}x ({change['ranks_cpu_s'][1]:+.2f} s a "
            f"trial; {now['warm_cpu_s']:.2f} s from a warm zygote, machine-wide), dry run CPU {change['dry_run_cpu_s'][0]:.2f}x ({change['dry_run_cpu_s'][1]:+.2f} s), best CPU "
            f"{change['best_cpu_s'][0]:.2f}x ({change['best_cpu_s'][1]:+.2f} s), status CPU "
            f"{change['status_cpu_s'][0]:.2f}x ({change['status_cpu_s'][1]:+.2f} s)"
        )
    else:
        print(
            f"start-up: ranks CPU {now['ranks_cpu_s']:.2f} s a trial, {now['warm_cpu_s']:.2f} s from a warm zygote "
            f"(machine-wide), dry run CPU {now['dry_run_cpu_s']:.2f} s, "
            f"best CPU {now['best_cpu_s']:.2f} s, status CPU {now['status_cpu_s']:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 4, --quick 1)")
    parser.add_argument("--quick", action="store_true", help=f"one round, {QUICK_STEPS} steps a run")
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)  # passed to a variant's process
    parser.add_argument("--startup", action="store_true", help="CPU seconds of a tiny trial's ranks and of a dry run")
    parser.add_argument("--before", metavar="REF", help="with --startup: measure git revision REF's code too")
    parser.add_argument("--startup-probe", action="store_true", help=argparse.SUPPRESS)  # one probe's process
    parser.add_argument("--explain", action="store_true", help="also time the steps between trainer and plain loop")
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a variant's own process
    parser.add_argument("--gpu", help=argparse.SUPPRESS)  # the table entry, passed to a variant's process
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 4)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.startup_probe:
        print(json.dumps(startup_probe()))
        return
    if args.startup:
        startup_main(rounds, args.before)
        return
    if args.variant:
        print(json.dumps(VARIANTS[args.variant](parse_sweep(SPEC % _fields(args.gpu, steps)))))
        return
    detected = detected_device()
    gpu = table_gpu(detected)
    sweep = parse_sweep(SPEC % _fields(gpu, steps))
    names = ["trainer", *(["trainer loop", "plain+watcher"] if args.explain else []), "plain"]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(rounds):
        print(f"round {i + 1}/{rounds} ...", file=sys.stderr)
        for name in names:
            if name == "trainer":
                runs[name].append(run_trainer(sweep))
            else:
                runs[name].append(run_variant(name, gpu, steps))
    means = {k: [statistics.fmean(r["step_times_s"][1:]) for r in v] for k, v in runs.items()}
    medians = {k: statistics.median(t for r in v for t in r["step_times_s"][1:]) for k, v in runs.items()}
    m = sweep.model
    print(
        f"model: {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), seq {sweep.seq_len}, "
        f"batch {sweep.global_batch_size}, {sweep.trial.precision} on {detected} (GPU table: {gpu}); "
        f"{steps} steps, first dropped, {rounds} alternating rounds"
    )
    print(f"{'':28}{'median step (s)':>16}{'vs plain (ms)':>15}{'mean step per round (s)':>40}{'tokens/s':>12}")
    tokens = sweep.global_batch_size * sweep.seq_len
    for name in names:
        per_round = " ".join(f"{x:.4f}" for x in means[name])
        extra_ms = (medians[name] - medians["plain"]) * 1e3
        print(
            f"{LABELS[name]:28}{medians[name]:>16.4f}{extra_ms:>+15.2f}{per_round:>40}{tokens / medians[name]:>12,.0f}"
        )
    ratio = medians["trainer"] / medians["plain"]
    startup = statistics.median(r["startup_s"] for r in runs["trainer"])
    plain_startup = statistics.median(r["startup_s"] for r in runs["plain"])
    print(f"step time ratio trainer / plain: {ratio:.3f} (median steps; target <= 1.05)")
    print(f"process start to first step: trainer {startup:.2f} s (plain loop {plain_startup:.2f} s)")


def _fields(gpu: str, steps: int = STEPS) -> dict[str, object]:
    return {"gpu": gpu, "steps": steps, "precision": "fp32" if gpu == "cpu" else "bf16"}


if __name__ == "__main__":
    main()
