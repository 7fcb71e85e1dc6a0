"""Each benchmark under benchmarks/ run as a user runs it (`python benchmarks/X.py --quick ...` from the
repository's root), exit 0 and its summary line read back with its numbers checked: a move or rename
in sweeper/ that breaks a benchmark fails here, not months later in someone's run.

The quick modes run the benchmark's own code on fewer cases (each script's docstring says what it
cuts). profile_accuracy.py is the exception: even its `--quick` measures a profile and 12 real trials
(minutes of CPU), so its argument parsing runs here and its table code runs on recorded rows.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from tests.conftest import ROOT, cli_env, missing_reference

DATA = ROOT.parent / "shared" / "data"  # the published measurements the replaying benchmarks read
NUM = r"([-\d.]+)"  # a number as the benchmarks print it
INT = r"(\d+)"


def run_benchmark(tmp_path: Path, script: str, *args: str, timeout: int = 600, **env_extra: str) -> str:
    """stdout of `python benchmarks/SCRIPT ARGS` from the repository's root (this checkout first on the
    import path, an empty profile cache, `env_extra` set); fails with its output's tail unless it exits 0."""
    env = cli_env(XDG_CACHE_HOME=str(tmp_path / "cache"), **env_extra)
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{script} {' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def line(out: str, pattern: str) -> tuple[str, ...]:
    """The groups of the first line matching `pattern` (from the line's start)."""
    m = re.search("^" + pattern, out, re.MULTILINE)
    assert m, f"no line matching {pattern!r} in:\n{out[-3000:]}"
    return m.groups()


def needs_data(*parts: str) -> None:
    path = DATA.joinpath(*parts)
    if not path.exists():
        missing_reference(path, "the published measurements this benchmark replays")


def test_memory_accuracy(tmp_path: Path) -> None:
    """A few seconds whole: it runs in its one mode."""
    out = run_benchmark(tmp_path, "memory_accuracy.py")
    peaks, med, p90, right, verdicts, skipped = line(
        out,
        rf"all sources: {INT} measured peaks, median \|error\| {NUM}% \(goal <= 5%\), p90 {NUM}% "
        rf"\(goal <= 15%\); fits/OOM right {INT}/{INT}; {INT} rows skipped",
    )
    assert int(peaks) > 0 and 0 <= float(med) <= float(p90)
    assert 0 < int(right) <= int(verdicts) and int(skipped) >= 0
    # the share the search's memory learning takes as measured is the one measured here
    from sweeper.estimate.memfit import MEMORY_SHARED_SHARE

    (share,) = line(out, rf"shared error: {INT} settings .* within one: {INT} % of its variance shared")[1:]
    assert abs(int(share) / 100 - MEMORY_SHARED_SHARE) <= 0.05


def test_plan_bench_quick(tmp_path: Path) -> None:
    out = run_benchmark(tmp_path, "plan_bench.py", "--quick")
    n, secs, rate = line(out, r"largest space: ([\d,]+) layouts planned in ([\d.]+) s of CPU \(([\d,]+) layouts/s\)")
    assert int(n.replace(",", "")) == 4 * 4 * 4 * 2 * 2 * 4 * 2  # the smallest space's knobs, multiplied
    assert float(secs) >= 0 and int(rate.replace(",", "")) > 0
    assert "llama3-405b" not in out  # the quick mode left the large spaces out


@pytest.mark.slow
def test_orchestrator_overhead_quick(tmp_path: Path) -> None:
    out = run_benchmark(tmp_path, "orchestrator_overhead.py", "--quick")
    for label in ("instant-grid", "instant-tpe", "instant-tpe-par4", "process-tpe"):
        per, med, mx = line(out, rf"{label}\s+\w+\s+\d+\s+{NUM}\s+{NUM}\s+{NUM}$")
        assert float(per) > 0 and 0 <= float(med) <= float(mx)
    inproc, process = line(
        out, rf"orchestration: {NUM} s per trial in-process \(TPE\), {NUM} s with a process per trial"
    )
    assert float(inproc) > 0 and float(process) > 0


def test_nvidia_layouts_quick(tmp_path: Path) -> None:
    needs_data("nvidia-perf", "runs.csv")
    out = run_benchmark(tmp_path, "nvidia_layouts.py", "--quick")
    ok, expressible, not_expressible = map(
        int, line(out, rf"nvidia-perf: {INT} ok rows, {INT} expressible as a sweep, {INT} not")
    )
    table = pd.read_csv(DATA / "nvidia-perf" / "runs.csv")
    assert ok == math.ceil((table.status == "ok").sum() / 10)  # every 10th ok row
    assert ok == expressible + not_expressible and expressible > 0
    n, fits, uncertain, pruned, invalid = map(
        int, line(out, rf"all expressible\s+{INT}\s+{INT}\s+{INT}\s+{INT}\s+{INT}")
    )
    assert n == expressible == fits + uncertain + pruned + invalid


@pytest.mark.slow
def test_nodes_cost_quick(tmp_path: Path) -> None:
    needs_data("ultrascale", "runs.csv")
    out = run_benchmark(tmp_path, "nodes_cost.py", "--quick")
    t_right, t_n, c_right, c_n, trials, every, share = map(
        int,
        line(
            out,
            rf"nodes_cost: --by time names the truly fastest node count in {INT}/{INT} models, --by cost the "
            rf"truly cheapest in {INT}/{INT}; {INT} trials against {INT} for every layout at every size \({INT}%\)",
        ),
    )
    assert t_n == c_n == 1 and t_right <= t_n and c_right <= c_n  # the 1B model only
    assert 0 < trials < every and share == round(100 * trials / every)


@pytest.mark.slow
def test_sizes_tables_quick(tmp_path: Path) -> None:
    table_code = ROOT.parent / "shared" / "checks" / "_sizes_table.py"
    if not table_code.exists():
        missing_reference(table_code, "the measured-sizes check's table code this benchmark replays")
    out = run_benchmark(tmp_path, "sizes_tables.py", "--quick")
    held, n, in_limits, n_limits, doubt, n_doubt, time_gap, cost_gap, trials = line(
        out,
        rf"sizes_tables: the check's bar holds on {INT}/{INT} tables \({INT}/{INT} against the cheapest within "
        rf"max_days\); the best by cost is a layout the plan holds in doubt on {INT}/{INT}; mean gap by time {NUM} %, "
        rf"by cost {NUM} %; {INT} trials",
    )
    assert float(time_gap) >= 0 and float(cost_gap) >= -0.05  # the truth's best is the best (-0.0: rounding)
    # the check's default table, on which its bar must hold (a replay: the same trials every run); an 8B
    # model meets max_days at every size, so both truths are one
    assert int(n) == int(n_limits) == int(n_doubt) == 1 and int(held) == int(in_limits) == 1 and int(doubt) <= 1
    assert 4 <= int(trials) <= 24  # the check's budget: 24 trials, at least one size's confirmations
    table = out.splitlines()
    assert table[0].split()[:4] == ["seed", "eff", "time", "time"] and table[1].split()[:2] == ["0", "0.04"]


SEARCH_LINES = {
    "tables": rf"default within 10% of the grid's trials on {INT}/{INT} tables; within 1% of the best MFU in 5 trials on {INT}/{INT}",
    "geomean": rf"geometric mean of trials to best, default / grid size {NUM}, default / random {NUM}",
    "memory": rf"memory off the estimate: the true best ran in {INT}/{INT} simulated sweeps \({INT} recipes x over/under x "
    rf"{INT} seeds x {INT} tables\); where the plan had pruned the true best, it still ran in {INT}/{INT}",
}


def check_memory_line(out: str) -> None:
    ran, runs, recipes, seeds, tables, pruned_ran, pruned = map(int, line(out, SEARCH_LINES["memory"]))
    assert (recipes, seeds, tables) == (2, 1, 1)  # the quick mode's cases
    assert runs == recipes * 2 * seeds * tables and ran <= runs and pruned_ran <= pruned <= runs


def check_public(out: str) -> None:
    """search_public.py's lines: the two quick cells, the quirk replay, the llm-foundry counts."""
    cells, within, never, share, quirk = line(
        out,
        rf"all {INT} cells: best within 5 trials in {INT}, never in {INT}; median GPU-h to the best {NUM}% of the "
        rf"grid's \(goal < 10%\); quirk (\d+|None) trials",
    )
    assert int(cells) == 2 and int(within) + int(never) <= 2 and 0 < float(share) <= 100
    for part in ("tuned", "held out"):
        n, hit, of = map(int, line(out, rf"ultrascale {part}: {INT} cells; best within 5 trials in {INT}/{INT}"))
        assert n == of == 1 and hit <= of  # one cell of each part
    for recipe in ("megatron", "torchtitan"):
        n, cand, unc, pruned = map(
            int,
            line(
                out,
                rf"llm-foundry \({recipe} recipe\): {INT} published layouts \(all ran\): {INT} candidate, {INT} uncertain, {INT} pruned",
            ),
        )
        assert n > 0 and cand + unc + pruned <= n
    q = line(
        out, r"quirk replay \(pp=\d+ runs [\d.]+x slower than predicted\): the true best ran after (\d+|None) trials"
    )[0]
    assert q == quirk and (q == "None" or 1 <= int(q) <= 8)  # within the quick replay's 8 trials


@pytest.mark.slow
def test_search_bench_quick(tmp_path: Path) -> None:
    out = run_benchmark(tmp_path, "search_bench.py", "--quick")
    on, tables, within, of = map(int, line(out, SEARCH_LINES["tables"]))
    assert tables == of == 1 and on <= tables and within <= of  # one table in the quick mode
    grid, rand = map(float, line(out, SEARCH_LINES["geomean"]))
    assert 0 < grid <= 1 and rand > 0
    check_memory_line(out)


def test_search_bench_memory_only_quick(tmp_path: Path) -> None:
    out = run_benchmark(tmp_path, "search_bench.py", "--quick", "--memory-only")
    check_memory_line(out)
    assert "geometric mean" not in out  # the strategies' table did not run


@pytest.mark.slow
def test_search_public_quick(tmp_path: Path) -> None:
    """Run as search_bench.py --public (how the docs name it); search_public.py's own arguments parse."""
    needs_data("ultrascale", "runs.csv")
    check_public(run_benchmark(tmp_path, "search_bench.py", "--public", "--quick"))
    assert "--quick" in run_benchmark(tmp_path, "search_public.py", "--help")


@pytest.mark.slow
def test_search_transfer_quick(tmp_path: Path) -> None:
    out = run_benchmark(tmp_path, "search_transfer.py", "--quick")
    for truth in ("model", "simulated"):
        fewer, n, equal, more, without, with_ = line(
            out,
            rf"learned profile \({truth} truth\): the second sweep ran its best in fewer trials with it in {INT}/{INT} "
            rf"pairs, as many in {INT}, more in {INT}; mean trials to the best {NUM} without, {NUM} with",
        )
        assert int(n) == 1 and int(fewer) + int(equal) + int(more) == 1  # one pair, one quirk
        assert float(without) >= 1 and float(with_) >= 1


@pytest.mark.slow
def test_search_transfer_recorded_quick(tmp_path: Path) -> None:
    needs_data("ultrascale", "runs.csv")
    out = run_benchmark(tmp_path, "search_transfer.py", "--recorded", "--quick")
    got = line(
        out,
        rf"recorded transfer: fewer in {INT}/{INT}, equal in {INT}/{INT}, more in {INT}/{INT}; mean {NUM} -> {NUM} "
        rf"trials to the best; within 1 %: fewer in {INT}/{INT}, equal in {INT}/{INT}, more in {INT}/{INT}, mean {NUM} -> {NUM}",
    )
    counts = [int(x) for x in got[:6] + got[8:14]]
    assert counts[1::2] == [1] * 6  # one cell at one seed
    assert sum(counts[0:6:2]) == 1 and sum(counts[6:12:2]) == 1
    assert all(float(x) >= 1 for x in (*got[6:8], *got[14:16]))


@pytest.mark.slow
def test_throughput_accuracy(tmp_path: Path) -> None:
    """Its one mode: throughput_moe.py and throughput_stall.py print inside it (they have no `__main__`)."""
    needs_data("ultrascale", "runs.csv")
    out = run_benchmark(tmp_path, "throughput_accuracy.py")
    cells, rho, worst_rho, best, worst_best, first, of = line(
        out,
        rf"ultrascale all {INT} cells, nanotron trainer: spearman median {NUM} \(goal >= 0.8\), worst {NUM} "
        rf"\(goal >= 0.6\); predicted best reaches {NUM} of the best, worst {NUM} \(goal >= 0.9 everywhere\); "
        rf"best ranked first in {INT}/{INT}",
    )
    assert int(cells) == int(of) > 0 and int(first) <= int(of)
    assert -1 <= float(worst_rho) <= float(rho) <= 1 and 0 < float(worst_best) <= float(best) <= 1
    assert line(out, r"nvidia-perf moe all\s+(\d+)")[0] != "0"  # throughput_moe.py's source printed
    line(out, r"median \|step-time error\| uncalibrated \(goal <= 15% each\): ultrascale [\d.]+%")


@pytest.mark.slow
@pytest.mark.parametrize("startup", [False, True], ids=["step-time", "startup"])
def test_trial_overhead_quick(tmp_path: Path, startup: bool) -> None:
    """One torch thread per process (the script and the launcher keep OMP_NUM_THREADS when it is set):
    on a busy machine more threads only spin, and this checks that it runs, not how fast."""
    flags = ["--quick", *(["--startup"] if startup else [])]
    out = run_benchmark(tmp_path, "trial_overhead.py", *flags, OMP_NUM_THREADS="1")
    if startup:
        got = line(
            out,
            rf"start-up: ranks CPU {NUM} s a trial, {NUM} s from a warm zygote \(machine-wide\), dry run CPU {NUM} s, "
            rf"best CPU {NUM} s, status CPU {NUM} s",
        )
        assert all(float(s) > 0 for s in got)
        return
    assert float(line(out, rf"step time ratio trainer / plain: {NUM} \(median steps; target <= 1.05\)")[0]) > 0
    trainer, plain = map(float, line(out, rf"process start to first step: trainer {NUM} s \(plain loop {NUM} s\)"))
    assert trainer > 0 and plain > 0
    assert "3 steps, first dropped, 1 alternating rounds" in out


@pytest.mark.slow
def test_kill_resume_quick(tmp_path: Path) -> None:
    """Real `sweep run` processes killed and restarted (no SLURM): it exits 0 only if nothing was lost."""
    out = run_benchmark(tmp_path, "kill_resume.py", "--quick")
    assert line(out, rf"trials finished: {INT} and {INT} of {INT}") == ("1", "1", "1")
    assert line(out, rf"rows lost: {INT}") == ("0",) and line(out, rf"duplicate rows: {INT}") == ("0",)
    assert line(out, rf"duplicate launches: {INT}") == ("0",)


def load_profile_accuracy(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/profile_accuracy.py as a module (registered for this test only: its dataclasses look
    their module up while being made)."""
    spec = importlib.util.spec_from_file_location("profile_accuracy", ROOT / "benchmarks" / "profile_accuracy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_profile_accuracy_arguments_and_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not its trials: even `--quick` measures a profile and runs 12 real trials (minutes of CPU;
    ../shared/checks/profile runs it whole). Its arguments parse (`--help` imports everything it
    uses) and its table and summary lines come out right on recorded rows."""
    out = run_benchmark(tmp_path, "profile_accuracy.py", "--help")
    assert "--quick" in out and "--nodes" in out
    pa = load_profile_accuracy(monkeypatch)
    rows = [
        pa.Row(2, {"micro_batch_size": 1}, False, "ok", 0.10, 0.09, 0.11, 0.20),
        pa.Row(2, {"micro_batch_size": 4}, True, "ok", 0.20, 0.19, 0.19, 0.30),
        pa.Row(4, {"tp": 2}, False, "ok", 0.40, 0.35, 0.40, 0.30),
        pa.Row(4, {"pp": 2}, False, "oom", note="out of memory"),
    ]
    pa.print_rows(rows, tmp_path)
    table = pd.read_csv(tmp_path / "profile_accuracy.csv")
    assert list(table.status) == ["ok", "ok", "ok", "oom"]
    assert table.profiled_err.iloc[0] == pytest.approx(0.1)
    table_err, table_rho, prof_err, prof_rho = map(
        float,
        line(
            pa.summary(rows, "all layouts"),
            rf"all layouts \(3 layouts\): table model \(today\): median \|error\| {NUM}%, spearman {NUM}; "
            rf"profiled model: median \|error\| {NUM}%, spearman {NUM}",
        ),
    )
    assert (table_err, prof_err) == (50.0, 5.0)  # table 1.0, 0.5, 0.25: median 0.5; profiled 0.1, 0.05, 0
    assert prof_rho == 1.0 and table_rho == 0.87  # the table ties the two slower layouts
    assert pa.summary(rows[3:], "held-out part") == "held-out part: no layout measured"
    assert pa.best_rank(rows).startswith("measured best at predicted rank 1: w2 micro_batch_size=1 (0.100 s)")
