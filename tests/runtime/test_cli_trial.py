"""`sweep trial` as a user runs it: one layout of the demo sweep, as a table or as JSON; user errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SPACES


def sweep_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from sweeper.cli import main; main()", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["tp=3"], "invalid layout (world_not_divisible): tp*pp = 3*1 does not divide world = 2"),
        (
            ["attention=flash3"],
            "attention takes one of eager, fused_softmax, sdpa_math, flash1, flash2, sdpa_efficient, cudnn",
        ),
        (["warp_drive=1"], "unknown knob 'warp_drive'; knobs: tp, pp,"),
        (["tp"], "expected KNOB=VALUE"),
        (["compile=maybe"], "compile takes true or false"),
        (["pp=0"], "pp takes a positive integer"),
        (["pp=2", "pp_schedule=interleaved", "virtual_stages=2", "micro_batch_size=8"], "too_few_microbatches"),
    ],
)
def test_user_errors_name_the_knob_and_exit_2(sets: list[str], message: str) -> None:
    r = sweep_cli("trial", str(SPACES / "tiny_cpu.yaml"), *[a for s in sets for a in ("--set", s)], timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in " ".join(r.stderr.split())
    assert r.stdout == ""


@pytest.mark.slow
def test_json_result_of_a_pipeline_layout() -> None:
    r = sweep_cli("trial", str(SPACES / "tiny_cpu.yaml"), "--set", "tp=1", "--set", "pp=2", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)  # stdout is the JSON object and nothing else
    assert result["status"] == "ok", result["error"]
    assert len(result["step_times_s"]) == 10 and len(result["losses"]) == 10
    assert 0 < result["mfu"] < 1 and result["hfu"] >= result["mfu"]
    assert (result["tp"], result["pp"], result["dp"], result["grad_accum"]) == (1, 2, 1, 8)
    assert result["micro_batch_size"] == 1 and result["activation_checkpointing"] == "none"  # first of each list
    assert result["peak_mem_gib"] > 0 and result["peak_mem_reserved_gib"] is None
    assert "tp=1 pp=2 dp=1" in r.stderr  # progress goes to stderr


@pytest.mark.slow
def test_table_result_of_a_tensor_parallel_layout(tmp_path: Path) -> None:
    r = sweep_cli("trial", "tiny_cpu.yaml", "--set", "tp=2", "--set", "micro_batch_size=2")
    assert r.returncode == 0, r.stderr
    assert "status" in r.stdout and "ok" in r.stdout and "MFU" in r.stdout


def test_trial_imports_no_other_command() -> None:
    # `sweep trial` runs once per local trial of a sweep: the planner, search and report it does not use
    # stay unimported (about 0.3 s of CPU a trial), and `sweep --help` still lists every command
    code = (
        "import sys\n"
        "from sweeper.cli import main\n"
        "sys.argv = ['sweep', *sys.argv[1:]]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('LOADED', sorted(m for m in ('sweeper.cli.best', 'sweeper.cli.run', 'sweeper.plan.sizes') if m in sys.modules))\n"
    )
    trial = subprocess.run([sys.executable, "-c", code, "trial", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert "--workdir" in trial.stdout and trial.stdout.splitlines()[-1] == "LOADED []", trial.stdout + trial.stderr
    every = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd=ROOT)
    for command in ("run", "best", "status", "trial", "report", "compare", "selftest", "profile"):
        assert f" {command} " in every.stdout, every.stdout
    assert every.stdout.splitlines()[-1].startswith("LOADED ['sweeper.cli.best'"), every.stdout
