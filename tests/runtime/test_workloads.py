"""External workloads: command templates, log parsing in Megatron's and torchtitan's formats, failures,
and a sweep whose trials run a Megatron stand-in end to end through the local launcher."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.estimate.flops import model_flops_per_token, utilization
from sweeper.layouts.layout import Layout
from sweeper.runtime.workloads import classify_failure, render_command, run_external
from sweeper.spec.loader import parse_sweep
from sweeper.trainers.megatron import parse_megatron
from sweeper.trainers.torchtitan import parse_torchtitan
from tests.conftest import SPACES, sweep_cli

STANDINS = Path(__file__).parents[1] / "standins"

MEGATRON_LINES = """\
 [2025-04-13 23:41:12] iteration        1/      10 | consumed samples:           16 | elapsed time per iteration (ms): 3147.6 | throughput per GPU (TFLOP/s/GPU): 99.1 | learning rate: 3.000000E-04 | global batch size:    16 | lm loss: 1.043000E+01 | loss scale: 1.0 | grad norm: 3.100 | number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 1 iterations) memory (MB) | allocated: 20480.5 | max allocated: 40960.25 | reserved: 45056.0 | max reserved: 46080.0
 [2025-04-13 23:41:13] iteration        2/      10 | consumed samples:           32 | elapsed time per iteration (ms): 1147.6 | throughput per GPU (TFLOP/s/GPU): 123.4 | learning rate: 3.000000E-04 | global batch size:    16 | lm loss: 1.021000E+01 | loss scale: 1.0 | grad norm: 2.900 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""

TITAN_LINES = """\
[rank0]:[titan] 2025-10-30 14:32:58,897 - root - INFO - step:  1  loss:  8.1661  grad_norm:  3.6855  memory:  2.47GiB(3.12%)  tps: 3,502  tflops: 1.90  mfu: 0.19%
[rank0]:[titan] 2025-10-30 14:32:58,990 - root - INFO - step:  2  loss:  6.1098  grad_norm:  4.6416  memory:  2.49GiB(3.14%)  tps: 177,138  tflops: 96.17  mfu: 9.72%
"""


def test_parse_megatron():
    p = parse_megatron(MEGATRON_LINES)
    assert p.step_times_s == pytest.approx([3.1476, 1.1476])
    assert p.losses == [10.43, 10.21]
    assert p.reported_tflops == [99.1, 123.4]
    assert p.peak_mem_gib == pytest.approx(40960.25 / 1024) and p.peak_mem_reserved_gib == pytest.approx(45.0)


def test_parse_torchtitan():
    p = parse_torchtitan(TITAN_LINES, tokens_per_step_per_device=177_138.0)
    assert p.step_times_s == pytest.approx([177_138 / 3_502, 1.0])
    assert p.losses == [8.1661, 6.1098] and p.peak_mem_reserved_gib == 2.49


@pytest.mark.parametrize(
    "log,status,word",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom", "out of memory"),
        ("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2025-01-01 DUE TO TIME LIMIT ***", "timeout", "time limit"),
        (
            "[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL(...)",
            "timeout",
            "collective",
        ),
        ("n1:1234:1300 [0] NCCL WARN Net : Connection closed by remote peer", "failed", "NCCL"),
        ("Segmentation fault", "failed", "too few steps"),
    ],
)
def test_failures_are_classified_from_the_log(log, status, word):
    got, reason = classify_failure(log)
    assert got == status and word in reason


def sweep_with(workload: dict, tmp_path: Path, **trial):
    spec = yaml.safe_load((SPACES / "llama13b_2k.yaml").read_text())
    spec.update(workload=workload, results_dir=str(tmp_path / "results"), launcher="local")
    spec["trial"].update(trial)
    return parse_sweep(yaml.safe_dump(spec))


def test_command_template_fills_flags_and_values_without_a_shell(tmp_path):
    s = sweep_with(
        {
            "kind": "megatron",
            "command": "torchrun --nproc-per-node {nproc} --nnodes {nnodes} pretrain_gpt.py {flags} --name 'a b;{tp}'",
        },
        tmp_path,
    )
    argv = render_command(s.workload.command, s, Layout(tp=4, pp=2, sequence_parallel=True), "megatron")
    assert argv[:5] == ["torchrun", "--nproc-per-node", "8", "--nnodes", "8"]
    i = argv.index("--tensor-model-parallel-size")
    assert argv[i + 1] == "4" and argv[argv.index("--pipeline-model-parallel-size") + 1] == "2"
    assert "--sequence-parallel" in argv and argv[argv.index("--log-interval") + 1] == "1"
    assert argv[-2:] == ["--name", "a b;4"]  # one word, never a shell


def test_workload_needs_a_command():
    with pytest.raises(SpecError, match="workload.command is required"):
        parse_sweep(
            yaml.safe_dump(
                yaml.safe_load((SPACES / "llama13b_2k.yaml").read_text()) | {"workload": {"kind": "megatron"}}
            )
        )


def test_megatron_standin_measured_with_our_mfu(tmp_path):
    s = sweep_with(
        {"kind": "megatron", "command": f"{sys.executable} {STANDINS / 'megatron_pretrain.py'} {{flags}}"},
        tmp_path,
        steps=5,
    )
    lay = Layout(tp=2, pp=2)
    r = run_external(s, lay, workdir=tmp_path / "w")
    assert r.status == "ok", r.error
    assert len(r.step_times_s) == 5 and r.step_times_s[0] > r.step_times_s[1]
    tokens_per_s = s.global_batch_size * s.seq_len / r.step_time_mean_s
    expected = utilization(tokens_per_s, model_flops_per_token(s.model, s.seq_len), num_devices=64, peak_flops=312e12)
    assert r.mfu == pytest.approx(expected)  # our formula, not the log's TFLOP/s
    assert r.peak_mem_gib == pytest.approx(40.0, abs=0.01)


def test_megatron_standin_oom_and_timeout(tmp_path):
    s = sweep_with(
        {
            "kind": "megatron",
            "command": f"{sys.executable} {STANDINS / 'megatron_pretrain.py'} {{flags}}",
            "env": {"STANDIN_FAIL": "oom"},
        },
        tmp_path,
        steps=5,
    )
    r = run_external(s, Layout(tp=2), workdir=tmp_path / "w")
    assert r.status == "oom" and "CUDA out of memory" in r.error
    s = sweep_with({"kind": "command", "command": f"{sys.executable} -c 'import time; time.sleep(30)'"}, tmp_path)
    r = run_external(s, Layout(tp=2), workdir=tmp_path / "t", timeout_s=1.0)
    assert r.status == "timeout"


def test_torchtitan_standin(tmp_path):
    s = sweep_with(
        {"kind": "torchtitan", "command": f"{sys.executable} {STANDINS / 'torchtitan_train.py'} {{flags}}"},
        tmp_path,
        steps=4,
    )
    r = run_external(s, Layout(tp=2), workdir=tmp_path / "w")
    assert r.status == "ok", r.error
    # tps 25,000 per device after the first step: 2048 x 2048 tokens over 64 devices
    assert r.step_time_mean_s == pytest.approx(2048 * 2048 / 64 / 25_000)


@pytest.mark.slow
def test_megatron_sweep_end_to_end_through_the_local_launcher(tmp_path):
    spec = yaml.safe_load((SPACES / "llama13b_2k.yaml").read_text())
    spec.update(
        name="mega",
        results_dir=str(tmp_path / "results"),
        launcher="local",
        workload={"kind": "megatron", "command": f"{sys.executable} {STANDINS / 'megatron_pretrain.py'} {{flags}}"},
        space={"tp": [2, 4], "pp": [1, 2], "micro_batch_size": [1]},
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 1000, "peak_tflops": 312}},
        search={"max_trials": 4, "parallel": 2},
    )
    spec["trial"].update(steps=4)
    path = tmp_path / "mega.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    df = pd.read_parquet(tmp_path / "results" / "mega" / "trials")
    assert len(df) == 4 and (df.status == "ok").all(), df[["status", "error"]]
    assert (df.device == "megatron workload").all() and (df.step_times_s.map(len) == 4).all()
    # the stand-in is fastest at tp=2, pp=1: the sweep's best
    best = df.loc[df.mfu.idxmax()]
    assert (best.tp, best.pp) == (2, 1)
