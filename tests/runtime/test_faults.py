"""A trial that fails ends with one status on every rank, quickly, and never hangs the others.

Faults are injected with SWEEP_FAULT=KIND:RANK:STEP into real multi-process trials.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sweeper.launchers.ranks import launch_trial
from sweeper.layouts.layout import Layout
from sweeper.results.trial import FAILED, KERNEL_UNAVAILABLE, OOM, TIMEOUT

from .helpers import run_workers, tiny_sweep

# Others must learn of a failure this fast: the watcher polls every 0.25 s and gives a
# rank blocked in a collective 1 s before ending it; gloo usually breaks the collective at once.
AGREE_WITHIN_S = 3.0


def _rank_views(workdir: Path, world: int) -> list[dict]:
    return [json.loads((workdir / "out" / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs", [{"tp": 2, "micro_batch_size": 4}, {"pp": 2, "micro_batch_size": 2}], ids=["tp2", "pp2"]
)
def test_oom_on_one_rank_ends_as_oom_on_every_rank(tmp_path: Path, knobs: dict) -> None:
    sweep = tiny_sweep(2)
    start = time.monotonic()
    result = launch_trial(sweep, Layout(**knobs), workdir=tmp_path, timeout_s=120, extra_env={"SWEEP_FAULT": "oom:1:2"})
    elapsed = time.monotonic() - start
    assert result.status == OOM, result.error
    assert "rank 1" in result.error and "out of memory" in result.error
    views = _rank_views(tmp_path, 2)
    assert [v["status"] for v in views] == [OOM, OOM]
    spread = max(v["at_unix"] for v in views) - min(v["at_unix"] for v in views)
    assert spread < AGREE_WITHIN_S, f"ranks agreed on the outcome {spread:.1f} s apart"
    assert result.mfu is None and result.tokens_per_s is None  # nothing measured: null, not 0
    assert elapsed < 60


@pytest.mark.slow
def test_rank_stuck_when_a_peer_fails_is_ended_by_the_watcher(tmp_path: Path) -> None:
    """Rank 1 blocks where gloo cannot wake it (as NCCL never would): the watcher ends it as oom."""
    result = launch_trial(
        tiny_sweep(2),
        Layout(pp=2, micro_batch_size=2),
        workdir=tmp_path,
        timeout_s=120,
        extra_env={"SWEEP_FAULT": "oom:0:2,hang:1:2"},
    )
    assert result.status == OOM
    views = _rank_views(tmp_path, 2)
    assert [v["status"] for v in views] == [OOM, OOM]
    assert views[1]["at_unix"] - views[0]["at_unix"] < AGREE_WITHIN_S


@pytest.mark.slow
def test_other_exception_is_failed_with_its_message(tmp_path: Path) -> None:
    result = launch_trial(
        tiny_sweep(2),
        Layout(sharding="fsdp", micro_batch_size=2),
        workdir=tmp_path,
        timeout_s=120,
        extra_env={"SWEEP_FAULT": "error:0:1"},
    )
    assert result.status == FAILED
    assert "rank 0: RuntimeError: injected by SWEEP_FAULT: failure at step 1" in result.error
    assert [v["status"] for v in _rank_views(tmp_path, 2)] == [FAILED, FAILED]


@pytest.mark.slow
def test_rank_dying_without_a_word_fails_the_trial_without_hanging(tmp_path: Path) -> None:
    start = time.monotonic()
    result = launch_trial(
        tiny_sweep(2),
        Layout(tp=2, micro_batch_size=4),
        workdir=tmp_path,
        timeout_s=120,
        extra_env={"SWEEP_FAULT": "exit:1:1"},
    )
    assert result.status == FAILED
    assert result.error
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_hung_trial_is_killed_at_its_wall_clock_limit(tmp_path: Path) -> None:
    start = time.monotonic()
    result = launch_trial(
        tiny_sweep(2),
        Layout(pp=2, micro_batch_size=2),
        workdir=tmp_path,
        timeout_s=8,
        extra_env={"SWEEP_FAULT": "hang:0:1"},
    )
    elapsed = time.monotonic() - start
    assert result.status == TIMEOUT
    assert "8 s" in result.error
    assert 8 <= elapsed < 16


@pytest.mark.slow
def test_every_kernel_missing_here_ends_kernel_unavailable_in_the_trainer(tmp_path: Path) -> None:
    """CPU has no memory-efficient, cuDNN or fp8 kernels; flash1 needs the flash-attn 1.x package."""
    layouts = [{"attention": a} for a in ("sdpa_efficient", "cudnn", "flash1")] + [{"float8": True}]
    done = run_workers("unavailable", nprocs=1, workdir=tmp_path, sweep=tiny_sweep(1), layouts=layouts)
    outcomes = [json.loads((done.out_dir / f"{i}_rank0.json").read_text()) for i in range(len(layouts))]
    assert [o["status"] for o in outcomes] == [KERNEL_UNAVAILABLE] * len(layouts), outcomes
    reasons = [o["error"] for o in outcomes]
    assert "cannot run on cpu" in reasons[0] and "cannot run on cpu" in reasons[1]
    assert "flash-attn 1.x" in reasons[2]
    assert "float8 needs a CUDA GPU" in reasons[3]


@pytest.mark.slow
def test_unavailable_kernel_ends_the_trial_kernel_unavailable_on_every_rank(tmp_path: Path) -> None:
    result = launch_trial(
        tiny_sweep(2), Layout(tp=2, attention="sdpa_efficient", micro_batch_size=4), workdir=tmp_path, timeout_s=120
    )
    assert result.status == KERNEL_UNAVAILABLE
    assert "attention=sdpa_efficient cannot run on cpu" in result.error
    assert [v["status"] for v in _rank_views(tmp_path, 2)] == [KERNEL_UNAVAILABLE] * 2
