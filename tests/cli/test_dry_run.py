"""`sweep run --dry-run` as a user runs it: output, plan files, exit codes, and no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import conftest
from tests.conftest import ROOT, SPACES

PLAN_COLUMNS = [
    "tp",
    "pp",
    "dp",
    "micro_batch_size",
    "grad_accum",
    "sequence_parallel",
    "activation_checkpointing",
    "attention",
    "rmsnorm",
    "status",
    "reason",
    "mem_total_gib",
    "mem_weights_gib",
    "mem_grads_gib",
    "mem_optimizer_gib",
    "mem_activations_gib",
    "mem_logits_gib",
    "mem_overhead_gib",
    "pred_mfu",
    "mem_buffers_gib",
    "mem_allocator_gib",
    "mem_allocated_gib",
    "mem_reserved_gib",
]


def sweep_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return conftest.sweep_cli(*args, cwd=cwd, timeout=120)


def test_dry_run_prints_table_and_summary():
    r = sweep_cli("run", str(SPACES / "llama13b_2k.yaml"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "candidate layouts" in r.stdout
    assert "layouts in the cross product: 2048" in r.stdout
    assert "GiB/GPU" in r.stdout
    data = json.loads(sweep_cli("run", str(SPACES / "llama13b_2k.yaml"), "--dry-run", "--json").stdout)
    # every status with its count on a line of its own, uncertain included: the lines add up to the cross product
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert set(data["counts"]) == {"candidate", "uncertain", "pruned", "invalid"}
    assert sum(data["counts"].values()) == data["layouts"] == 2048
    for status, n in data["counts"].items():
        assert lines[status].split()[1] == str(n), lines[status]
    assert "predicted memory over 95% of 80 GiB" in lines["pruned"]
    # the invalid ones per reason, each naming the value and the limit, adding up to the invalid count
    reasons = [line.split(maxsplit=1) for line in r.stdout.splitlines() if line.startswith(" " * 14)]
    assert sum(int(n) for n, _ in reasons) == data["counts"]["invalid"]
    assert [int(n) for n, _ in reasons] == [512, 192]
    assert reasons[0][1].startswith(
        "an attention kernel the workload's trainer does not have: flash1 (builtin trainer has: cudnn, eager, "
        "flash2, fused_softmax, sdpa_efficient, sdpa_math; flash1 needs the flash-attn 1.x package"
    )


def test_dry_run_gives_the_budget_and_the_estimated_cost():
    r = sweep_cli("run", str(SPACES / "llama13b_2k.yaml"), "--dry-run")
    est = json.loads(sweep_cli("run", str(SPACES / "llama13b_2k.yaml"), "--dry-run", "--json").stdout)["estimate"]
    assert (est["budget"], est["trials"], est["runnable"], est["parallel"], est["gpus_per_trial"]) == (
        40,
        40,
        991,
        4,
        64,
    )
    assert (
        "search: 40 trials of 991 runnable layouts (search.max_trials 40), 4 at a time (search.parallel), 64 GPUs each"
        in r.stdout
    )
    line = next(ln for ln in r.stdout.splitlines() if "GPU-hours" in ln)
    assert line.startswith(
        f"estimated cost: {est['gpu_hours']:,.0f} GPU-hours, {est['wall_hours']:.1f} h wall (an estimate:"
    )
    assert (
        "2 min of start-up (assumed for a job on a cluster" in line
        and "+ 10 steps at the plan's predicted step time" in line
        and "no queue wait" in line
    )


def zero_candidates(tmp_path: Path, batch: int) -> Path:
    """tiny_cpu with a global batch of `batch` and micro-batches of 2, its results under tmp_path."""
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name="zero", global_batch_size=batch, results_dir=str(tmp_path / "results"))
    spec["space"]["micro_batch_size"] = [2]
    spec["search"] = {"max_trials": 1, "parallel": 1}
    spec["trial"] = {"steps": 2, "warmup_steps": 1, "timeout_min": 5, "precision": "fp32"}
    path = tmp_path / "zero.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


ZERO = (
    "error: zero: no candidate layout is left after the plan; the reason that removed the most (6 of 8 layouts): "
    "micro_batch_size*dp does not divide the global batch: micro_batch_size*dp = 2*1 does not divide "
    "global_batch_size = 3"
)


def test_zero_candidates_exit_2_with_the_reason_that_removed_the_most(tmp_path):
    spec = zero_candidates(tmp_path, batch=3)
    dry = sweep_cli("run", str(spec), "--dry-run")
    assert dry.returncode == 2, dry.stdout
    assert dry.stderr.strip().splitlines()[-1] == ZERO
    assert "  candidate  0" in dry.stdout and "  invalid    8" in dry.stdout  # the summary still says why
    as_json = sweep_cli("run", str(spec), "--dry-run", "--json")
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["counts"] == {"invalid": 8}


def test_a_run_that_plans_nothing_leaves_nothing_behind(tmp_path):
    spec = zero_candidates(tmp_path, batch=3)
    r = sweep_cli("run", str(spec))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == ZERO
    assert not (tmp_path / "results").exists()  # no folder, lock, sweep.yaml or study
    # the corrected file then runs, without --fresh
    spec.write_text(spec.read_text().replace("global_batch_size: 3", "global_batch_size: 4"))
    ok = sweep_cli("run", str(spec))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert len(pd.read_parquet(tmp_path / "results" / "zero" / "trials")) == 1


def test_a_gpu_alias_is_named_in_the_dry_run(tmp_path):
    spec = tmp_path / "h100.yaml"
    spec.write_text((SPACES / "llama13b_2k.yaml").read_text().replace("gpu: a100-80gb", "gpu: h100"))
    r = sweep_cli("run", str(spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "8×8 h100-sxm (cluster.gpu h100 is an alias of h100-sxm)" in r.stdout
    spec.write_text((SPACES / "llama13b_2k.yaml").read_text().replace("gpu: a100-80gb", "gpu: h1000"))
    bad = sweep_cli("run", str(spec), "--dry-run")
    assert bad.returncode == 2 and "known: a100-40gb, a100-80gb, h100-sxm" in bad.stderr
    assert "aliases: a100 -> a100-80gb, a100-80g -> a100-80gb, a100-40g -> a100-40gb, h100 -> h100-sxm" in bad.stderr


def test_float8_mfu_says_it_is_against_the_bf16_peak(tmp_path):
    text = (SPACES / "llama13b_2k.yaml").read_text().replace("gpu: a100-80gb", "gpu: h100-sxm")
    spec = tmp_path / "f8.yaml"
    spec.write_text(text.replace("  rmsnorm: [eager, fused]", "  float8: [false, true]"))
    note = (
        "pred MFU of a float8 layout is against the card's dense bf16 peak, as torchtitan counts it, not its fp8 peak"
    )
    for args in (["run", str(spec), "--dry-run"], ["best", str(spec), "--plan"]):
        r = sweep_cli(*args)
        assert r.returncode == 0 and note in r.stdout, r.stdout[-3000:]
    spec.write_text(text)  # no float8 layout: no note
    assert "float8" not in sweep_cli("run", str(spec), "--dry-run").stdout


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_the_plan_file_takes_the_users_mode(tmp_path, umask, mode):
    import os

    old = os.umask(umask)
    try:
        r = sweep_cli("run", "tiny_cpu", "--dry-run", "--out", str(tmp_path / "plan.csv"), cwd=tmp_path)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.csv").stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_out_writes_every_layout(tmp_path, ext):
    out = tmp_path / f"plan.{ext}"
    r = sweep_cli("run", "llama13b_2k.yaml", "--dry-run", "--out", str(out), cwd=tmp_path)  # bare name
    assert r.returncode == 0, r.stderr
    plan = pd.read_parquet(out) if ext == "parquet" else pd.read_csv(out)
    assert len(plan) == 4 * 4 * 4 * 2 * 2 * 4 * 2  # the whole cross product
    assert set(PLAN_COLUMNS) <= set(plan.columns)
    # uncertain: over the card by less than the memory estimate's measured error, tried, not pruned
    assert set(plan.status) == {"candidate", "invalid", "pruned", "uncertain"}
    pruned = plan[plan.status == "pruned"]
    assert (pruned.mem_total_gib > 80 * 0.95).all()
    assert (plan[plan.status == "candidate"].mem_total_gib <= 80 * 0.95).all()
    assert (plan[plan.status != "candidate"].reason.str.len() > 0).all()
    parts = plan[[c for c in plan.columns if c.startswith("mem_") and c not in ("mem_total_gib",)]]
    parts = parts.drop(columns=["mem_share", "mem_allocated_gib", "mem_reserved_gib"], errors="ignore")
    assert ((parts.sum(axis=1) - plan.mem_total_gib).abs() < 1e-2)[plan.status != "invalid"].all()
    # reserved = allocated + the allocator's gap; the card must hold reserved + the overhead
    est = plan[plan.status != "invalid"]  # invalid layouts are not estimated (NaN)
    assert ((est.mem_reserved_gib - est.mem_allocated_gib - est.mem_allocator_gib).abs() < 1e-3).all()
    assert ((est.mem_reserved_gib + est.mem_overhead_gib - est.mem_total_gib).abs() < 1e-3).all()
    assert plan[plan.status == "invalid"].mem_total_gib.isna().all()
    assert not list(tmp_path.glob(".*tmp"))


def test_json_summary():
    r = sweep_cli("run", str(SPACES / "tiny_cpu.yaml"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["layouts"] == 16 and data["counts"] == {"candidate": 12, "invalid": 4}
    assert data["reasons"] == {"world_not_divisible": 4}
    assert {c["tp"] * c["pp"] * c["dp"] for c in data["candidates"]} == {2}


def test_unknown_knob_exits_2_and_names_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((SPACES / "llama13b_2k.yaml").read_text().replace("space:\n", "space:\n  warp_drive: [1, 2]\n"))
    r = sweep_cli("run", str(bad), "--dry-run", "--out", str(tmp_path / "plan.csv"))
    assert r.returncode == 2
    assert "warp_drive" in r.stderr and "allowed" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "plan.csv").exists()  # nothing half-written


@pytest.mark.parametrize(
    "args,words",
    [
        (["run", "no_such_sweep", "--dry-run"], ["no such sweep file", "tiny_cpu"]),
        (["run", "tiny_cpu", "--dry-run", "--out", "plan.txt"], ["--out", ".parquet or .csv"]),
        (["run", "tiny_cpu", "--dry-run", "--out", "/no/such/dir/plan.csv"], ["does not exist"]),
    ],
)
def test_user_errors_exit_2(args, words, tmp_path):
    r = sweep_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    for w in words:
        assert w in r.stderr


def test_dry_run_imports_no_torch_or_submitit():
    code = (
        "import sys\n"
        "from sweeper.cli import main\n"
        f"sys.argv = ['sweep', 'run', {str(SPACES / 'llama13b_2k.yaml')!r}, '--dry-run']\n"
        "code = 0\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = [m for m in ('torch', 'submitit', 'optuna') if m in sys.modules]\n"
        "print('EXIT', code, 'HEAVY', heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "EXIT 0 HEAVY []" in r.stdout, r.stdout[-500:] + r.stderr[-2000:]


def test_pure_core_imports_no_torch():
    code = (
        "import sys\n"
        "import sweeper.spec, sweeper.layouts.layout, sweeper.estimate.memory, sweeper.estimate.flops, sweeper.plan.plan\n"
        "print([m for m in ('torch', 'submitit', 'optuna', 'pandas') if m in sys.modules])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_short_help_and_version(tmp_path):
    import sweeper

    for args in (["-h"], ["run", "-h"], ["best", "-h"]):
        r = sweep_cli(*args, cwd=tmp_path)
        assert r.returncode == 0 and "Usage:" in r.stdout and "--help" in r.stdout, (args, r.stderr[-500:])
    r = sweep_cli("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"sweep {sweeper.__version__}"
