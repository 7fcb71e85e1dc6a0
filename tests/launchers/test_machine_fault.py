"""The machine's fault is not the layout's: a GPU sweep on a machine the local launcher cannot run
it on is refused before any trial (one line, exit 2, no results folder), and a trial of any
launcher that found no usable GPU is retried once, then stops the sweep without a row."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from sweeper.launchers.local import check_local_device
from sweeper.results.trial import NO_ACCELERATOR
from sweeper.spec.loader import parse_sweep
from tests.conftest import SPACES, sweep_cli


def _tiny(tmp_path: Path, **changes) -> dict:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(results_dir=str(tmp_path / "results"), **changes)
    return spec


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_a_gpu_sweep_on_a_machine_without_cuda_is_refused_before_any_trial(tmp_path: Path) -> None:
    spec = _tiny(tmp_path, name="gpuless")
    spec["cluster"] = {"nodes": 1, "gpus_per_node": 1, "gpu": "h100-sxm"}
    spec["space"] = {k: v for k, v in spec["space"].items() if k not in ("tp", "pp")}
    spec["launcher"] = "local"
    path = tmp_path / "gpuless.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(Exception, match=r"cluster.gpu: h100-sxm needs CUDA, and this machine cannot run it"):
        check_local_device(parse_sweep(path.read_text()))
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "cluster.gpu: h100-sxm needs CUDA" in last and "CPU-only build" in last
    assert not (tmp_path / "results" / "gpuless").exists()  # nothing written, no layout burned
    dry = sweep_cli("run", str(path), "--dry-run", cwd=tmp_path, timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]  # planning any cluster stays possible


def test_another_trainers_command_is_not_judged_by_this_interpreters_torch(tmp_path: Path) -> None:
    # a megatron command brings its own environment: this process's CPU-only torch says nothing of it
    spec = _tiny(tmp_path, name="ext")
    spec["cluster"] = {"nodes": 1, "gpus_per_node": 1, "gpu": "h100-sxm"}
    spec["space"] = {k: v for k, v in spec["space"].items() if k not in ("tp", "pp")}
    spec["workload"] = {"kind": "megatron", "command": "python pretrain_gpt.py {flags}"}
    sweep = parse_sweep(yaml.safe_dump(spec))
    check_local_device(sweep)  # no error: the command's own machine check is its own
    spec["workload"] = {"kind": "builtin"}
    with pytest.raises(Exception, match=r"cluster.gpu: h100-sxm needs CUDA"):
        check_local_device(parse_sweep(yaml.safe_dump(spec)))


def test_a_trial_that_found_no_gpu_is_retried_then_stops_the_sweep_without_a_row(tmp_path: Path) -> None:
    # a replay answers every trial with the error of a node without a usable GPU (any launcher's trial can)
    table = tmp_path / "t.csv"
    error = f"{NO_ACCELERATOR}: the sweep's GPU is cpu, but this node has none"
    pd.DataFrame(
        [{"tp": 1, "pp": 1, "micro_batch_size": m, "status": "failed", "error": error, "mfu": None} for m in (1, 2, 4)]
    ).to_csv(table, index=False)
    spec = _tiny(tmp_path, name="nogpu")
    spec["launcher"] = {"kind": "replay", "table": str(table)}
    spec["search"] = {"max_trials": 3, "parallel": 1, "seed": 0}
    path = tmp_path / "nogpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "this machine cannot run the sweep" in r.stderr and "its layout stays untried" in r.stderr
    trials = tmp_path / "results" / "nogpu" / "trials"
    assert not trials.exists() or not list(trials.glob("*.parquet"))  # no row against any layout
