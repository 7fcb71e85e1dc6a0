"""`sweep run --dry-run` as a user runs it: output, plan files, exit codes, and no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

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
    return subprocess.run(
        [sys.executable, "-c", "from sweeper.cli import main; main()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prints_table_and_summary():
    r = sweep_cli("run", str(SPACES / "llama13b_2k.yaml"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "candidate layouts" in r.stdout
    assert "layouts in the cross product" in r.stdout and "2048" in r.stdout
    assert "pruned: predicted memory" in r.stdout
    assert "GiB/GPU" in r.stdout


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
        "from sweeper.cli import app\n"
        "code = 0\n"
        "try:\n"
        f"    app(['run', {str(SPACES / 'llama13b_2k.yaml')!r}, '--dry-run'])\n"
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
        "import sweeper.spec, sweeper.layout, sweeper.memory, sweeper.flops, sweeper.plan\n"
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
