"""The sweep's own cost per trial: 50 trials that do nothing, through the real orchestrator.

Two launchers: in-process (answers at once: what Optuna, the results files and the loop cost)
and the local launcher running a no-op process per trial (adds process start and polling).
The trial result is a synthetic MFU (a fixed function of the layout), marked as such: the
point is the cost around trials, not the trials.

    python benchmarks/orchestrator_overhead.py [--quick]

--quick runs 8 trials per row instead of 50 (the same four rows and last line; the medians are
noisier and TPE's first trials, which sample at random, weigh more).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from sweeper.launchers.base import Handle, JobOutcome, Launcher, TrialJob
from sweeper.launchers.local import LocalLauncher
from sweeper.results.trial import TrialResult
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.search.search import LayoutSearch
from sweeper.spec.loader import load_sweep

TRIALS = 50


def synthetic_result(job: TrialJob) -> dict:
    lay = job.layout
    mfu = 0.3 + 0.02 * lay.tp - 0.03 * lay.pp + 0.01 * lay.micro_batch_size  # synthetic, not measured
    return {"status": "ok", "mfu": mfu, **lay.as_dict()}


class InstantLauncher(Launcher):
    kind = "instant"

    def submit(self, job: TrialJob) -> Handle:
        return Handle(f"instant-{job.number}", job)

    def poll(self, handle: Handle) -> JobOutcome:
        return JobOutcome(TrialResult.from_dict(synthetic_result(handle.job)), handle.job_id)

    def cancel(self, handle: Handle) -> None:
        pass

    def reattach(self, job_id: str, job: TrialJob) -> Handle | None:
        return None


class NoopProcessLauncher(LocalLauncher):
    """The local launcher's real Popen/poll/collect path, running a process that only prints a result."""

    def submit(self, job: TrialJob) -> Handle:
        import subprocess

        job.workdir.mkdir(parents=True, exist_ok=True)
        with open(job.workdir / "result.json", "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", f"print({json.dumps(json.dumps(synthetic_result(job)))})"],
                stdout=out,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        return Handle(f"local-{proc.pid}", job, proc, {"started": time.time(), "pid": proc.pid})


class TimedAsk:
    """Wraps LayoutSearch.choose (what the sweep loop asks for each next layout) to time the sampler."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._orig = LayoutSearch.choose

    def __enter__(self) -> TimedAsk:
        orig, times = self._orig, self.times

        def choose(search: LayoutSearch, **kw: object):  # noqa: ANN202
            t0 = time.perf_counter()
            out = orig(search, **kw)
            times.append(time.perf_counter() - t0)
            return out

        LayoutSearch.choose = choose  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        LayoutSearch.choose = self._orig  # type: ignore[method-assign]


def one(label: str, launcher: Launcher, sampler: str, parallel: int, tmp: Path, trials: int = TRIALS) -> tuple:
    spec = yaml.safe_load(Path("search_spaces/llama13b_2k.yaml").read_text())
    spec.update(name=f"bench_{label}", results_dir=str(tmp / label), launcher="local")
    spec["search"] = {"max_trials": trials, "parallel": parallel, "sampler": sampler, "seed": 0}
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    t0 = time.perf_counter()
    with TimedAsk() as timer:
        run = prepare(sweep, launcher)
        run_loop(run, poll_s=0.01)
    wall = time.perf_counter() - t0
    assert len(run.rows) == trials, len(run.rows)
    assert timer.times, "the sweep loop never called LayoutSearch.choose: time what it calls now"
    return label, sampler, parallel, wall / trials, statistics.median(timer.times), max(timer.times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 trials per row instead of 50")
    n = 8 if ap.parse_args().quick else TRIALS
    with tempfile.TemporaryDirectory() as d:
        os.environ["XDG_CACHE_HOME"] = os.path.join(d, "cache")  # never the user's cache: learned profiles
        tmp = Path(d)
        rows = [
            one("instant-grid", InstantLauncher(), "grid", 1, tmp, n),
            one("instant-tpe", InstantLauncher(), "tpe", 1, tmp, n),
            one("instant-tpe-par4", InstantLauncher(), "tpe", 4, tmp, n),
            one("process-tpe", NoopProcessLauncher(), "tpe", 4, tmp, n),
        ]
    print(f"{'launcher':18s} {'sampler':7s} {'parallel':>8s} {'s/trial':>8s} {'ask median s':>13s} {'ask max s':>10s}")
    for label, sampler, par, per, med, mx in rows:
        print(f"{label:18s} {sampler:7s} {par:8d} {per:8.3f} {med:13.4f} {mx:10.4f}")
    print(f"orchestration: {rows[1][3]:.3f} s per trial in-process (TPE), {rows[3][3]:.3f} s with a process per trial")


if __name__ == "__main__":
    main()
