"""Kill `sweep run` with SIGKILL at seeded random moments, restart it, and check nothing was lost.

Runs the demo sweep (search_spaces/tiny_cpu.yaml with fewer steps, in a temp folder) once
uninterrupted, then again with N kill/restart cycles at random moments, then again with N kills
each at the moment a trial process starts (the window between starting a trial and recording
it), and compares: the set of layouts that finished, rows lost, duplicate rows, duplicate
launches (a trial started twice: its folder's log shows two starts, or two trial processes of
the sweep ran at once), partial files visible to readers, and the extra wall time.

    python benchmarks/kill_resume.py [--cycles 5] [--seed 0] [--steps 3] [--trials 6] [--quick]

--quick: one kill of each kind on a sweep of one trial of two steps (--cycles 1 --trials 1 --steps 2;
each flag given still overrides): the same real `sweep run` processes, kills and checks.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_KNOBS = ["tp", "pp", "micro_batch_size", "activation_checkpointing", "attention"]


def demo_spec(folder: Path, name: str, *, steps: int, trials: int) -> Path:
    """tiny_cpu with `steps` steps, a grid search (the same trials in the same order, killed or not)."""
    spec = yaml.safe_load((ROOT / "search_spaces" / "tiny_cpu.yaml").read_text())
    spec.update(name=name, results_dir=str(folder / "results"))
    spec["trial"].update(steps=steps, warmup_steps=1)
    spec["search"] = {"max_trials": trials, "parallel": 1, "seed": 0, "sampler": "grid"}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cmd(spec: Path) -> list[str]:
    return [sys.executable, "-m", "sweeper.cli", "run", str(spec)]


def _env() -> dict[str, str]:
    """This environment with this checkout first on the import path, added only where it is not already
    first: a fork server the caller keeps (`SWEEP_ZYGOTE_SERVER`) takes only launches whose environment
    is its own, and a path named twice would send every `sweep run` here to start its own zygote."""
    path = os.environ.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != str(ROOT):
        path = os.pathsep.join(p for p in (str(ROOT), path) if p)
    return {**os.environ, "PYTHONPATH": path}


def run_to_end(spec: Path) -> None:
    r = subprocess.run(_cmd(spec), cwd=spec.parent, capture_output=True, text=True, env=_env(), timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"sweep run {spec} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def run_with_kills(spec: Path, *, cycles: int, seed: int, max_delay_s: float) -> list[float]:
    """`cycles` runs each SIGKILLed after a seeded random delay, then one run to the end."""
    rng = random.Random(seed)
    delays = []
    for _ in range(cycles):
        delay = rng.uniform(0.3, max_delay_s)
        proc = subprocess.Popen(
            _cmd(spec), cwd=spec.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env()
        )
        try:
            proc.wait(timeout=delay)  # it may finish the whole sweep before its kill
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        delays.append(delay)
    run_to_end(spec)
    return delays


def trial_processes(results: Path) -> set[int]:
    """Live `sweep trial` processes of the sweep whose results are under `results` (not ranks,
    nor a rank between fork and exec, which still looks like its parent)."""
    jobs = str(results.resolve() / "jobs") + "/"  # `sweep trial --workdir <results>/jobs/trial-.../ranks`
    found: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            if b"sweeper.cli" not in cmd or b"trial" not in cmd or b"--workdir" not in cmd:
                continue
            if not cmd[cmd.index(b"--workdir") + 1].decode(errors="replace").startswith(jobs):
                continue
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            found[int(d.name)] = int(stat[1])
    return {pid for pid, ppid in found.items() if ppid not in found}


def run_with_start_kills(spec: Path, results: Path, *, cycles: int, parallel: int = 1) -> tuple[int, int]:
    """`cycles` runs each SIGKILLed the moment a new trial process of the sweep appears, then one
    run to the end. Returns (kills that hit a trial start, most trial processes seen at once beyond
    `parallel`), watching the whole time."""
    hits, over = 0, 0
    seen: set[int] = set()
    for _ in range(cycles):
        proc = subprocess.Popen(
            _cmd(spec), cwd=spec.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env()
        )
        while proc.poll() is None:
            now = trial_processes(results)
            over = max(over, len(now) - parallel)
            if now - seen:
                proc.send_signal(signal.SIGKILL)
                hits += 1
            seen |= now
            time.sleep(0.002)
        proc.wait()
    final = subprocess.Popen(
        _cmd(spec), cwd=spec.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env()
    )
    while final.poll() is None:
        over = max(over, len(trial_processes(results)) - parallel)
        time.sleep(0.05)
    if final.returncode != 0:
        raise SystemExit(f"sweep run {spec} failed ({final.returncode}):\n{final.stderr.read()[-3000:]}")
    return hits, over


def duplicate_launches(results: Path, name: str) -> int:
    """Trial folders started more than once: each `sweep trial` start writes one `trial NAME:` line
    to its folder's log (appended, never truncated)."""
    extra = 0
    for log in (results / "jobs").glob("trial-*/log.txt"):
        starts = sum(line.startswith(f"trial {name}:") for line in log.read_text(errors="replace").splitlines())
        extra += max(0, starts - 1)
    return extra


@dataclass
class Check:
    finished: int
    expected: int
    lost: int
    duplicates: int
    partial_files: list[str]
    statuses: dict[str, int]
    duplicate_launches: int = 0


def check(results: Path, reference: pd.DataFrame) -> Check:
    """Compare a sweep's rows with the uninterrupted reference: by layout, since numbers may differ."""
    trials = results / "trials"
    df = pd.read_parquet(trials)
    key = lambda frame: [tuple(r) for r in frame[LAYOUT_KNOBS].astype(str).itertuples(index=False)]  # noqa: E731
    got, want = key(df), set(key(reference))
    visible = [p.name for p in trials.iterdir() if not p.name.startswith(".") and not p.name.endswith(".parquet")]
    return Check(
        finished=len(df),
        expected=len(reference),
        lost=len(want - set(got)),
        duplicates=(len(got) - len(set(got))) + int(df.trial_number.duplicated().sum()),
        partial_files=visible,
        statuses=df.status.value_counts().to_dict(),
        duplicate_launches=duplicate_launches(results, results.name),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=None, help="kill/restart cycles (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--steps", type=int, default=None, help="training steps per trial (default 3)")
    ap.add_argument("--trials", type=int, default=None, help="trials in the sweep (default 6)")
    ap.add_argument("--quick", action="store_true", help="one cycle, one trial of two steps")
    args = ap.parse_args()
    for name, full, quick in (("cycles", 5, 1), ("steps", 3, 2), ("trials", 6, 1)):  # steps > warmup_steps (1)
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    with tempfile.TemporaryDirectory(prefix="sweep-kill-resume-") as tmp:
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")  # never the user's cache: learned profiles
        folder = Path(tmp)
        t0 = time.perf_counter()
        run_to_end(demo_spec(folder, "uninterrupted", steps=args.steps, trials=args.trials))
        clean_s = time.perf_counter() - t0
        reference = pd.read_parquet(folder / "results" / "uninterrupted" / "trials")
        per_trial = clean_s / max(1, len(reference))
        t0 = time.perf_counter()
        delays = run_with_kills(
            demo_spec(folder, "killed", steps=args.steps, trials=args.trials),
            cycles=args.cycles,
            seed=args.seed,
            max_delay_s=2.5 * per_trial,
        )
        killed_s = time.perf_counter() - t0
        c = check(folder / "results" / "killed", reference)
        t0 = time.perf_counter()
        hits, concurrent = run_with_start_kills(
            demo_spec(folder, "startkill", steps=args.steps, trials=args.trials),
            folder / "results" / "startkill",
            cycles=args.cycles,
        )
        start_s = time.perf_counter() - t0
        s = check(folder / "results" / "startkill", reference)
    print(f"{'run':<22} {'wall s':>8} {'rows':>5}  statuses")
    print(f"{'uninterrupted':<22} {clean_s:>8.1f} {len(reference):>5}  {reference.status.value_counts().to_dict()}")
    print(f"{f'{args.cycles} random kills':<22} {killed_s:>8.1f} {c.finished:>5}  {c.statuses}")
    print(f"{f'{hits} kills at trial start':<22} {start_s:>8.1f} {s.finished:>5}  {s.statuses}")
    print(f"kill moments (s after start): {', '.join(f'{d:.1f}' for d in delays)} (seed {args.seed})")
    print(f"partial files visible to readers: {len(c.partial_files) + len(s.partial_files)}")
    print(f"trials finished: {c.finished} and {s.finished} of {c.expected}")
    print(
        f"extra time for restarts: {killed_s - clean_s:+.1f} s ({100 * (killed_s / clean_s - 1):+.0f} %) random, "
        f"{start_s - clean_s:+.1f} s ({100 * (start_s / clean_s - 1):+.0f} %) at trial start"
    )
    print(f"rows lost: {c.lost + s.lost}")
    print(f"duplicate rows: {c.duplicates + s.duplicates}")
    launches = c.duplicate_launches + s.duplicate_launches + concurrent
    print(
        f"duplicate launches: {launches} (a folder started twice: {c.duplicate_launches + s.duplicate_launches}; "
        f"trial processes at once beyond parallel=1: {concurrent})"
    )
    ok = (
        c.lost == s.lost == 0
        and c.duplicates == s.duplicates == 0
        and launches == 0
        and not c.partial_files
        and not s.partial_files
        and c.finished == s.finished == c.expected
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
