"""First contact with a GPU cluster, as far as a CPU machine can show it: device picking under
SLURM's GPU binding styles, a GPU sweep that lands on a machine without CUDA, the versions in
every row, SLURM submission settings, and `sweep selftest` reporting what a CPU lacks."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from sweeper.launchers.slurm import clean_submit_environment, cpus_per_task_for
from sweeper.results.rows import COLUMNS
from sweeper.results.trial import NO_ACCELERATOR, TrialResult, stops_sweep
from sweeper.runtime import kernels
from sweeper.runtime.env import PeakMemory, cuda_unusable_reason, device_index
from sweeper.runtime.outcome import classify
from sweeper.runtime.parallel import SAC_SAVE_OPS
from sweeper.spec.hardware import GPUS, gpu_matches
from tests.conftest import SPACES, cli_env, sweep_cli


class FakeTaskView:
    """What one SLURM task would see of a node's GPUs, faked on a CPU machine (no GPU here):
    its CUDA_VISIBLE_DEVICES under a binding style, and the job's SLURM_GPUS_ON_NODE."""

    def __init__(self, gpus_on_node: int, tasks: int, binding: str) -> None:
        self.gpus_on_node, self.tasks, self.binding = gpus_on_node, tasks, binding

    def visible(self, local_rank: int) -> list[int]:
        if self.binding == "none":  # every task sees every GPU of the job on the node
            return list(range(self.gpus_on_node))
        if self.binding == "gpus-per-task":  # --gpus-per-task=1: its own GPU only
            return [local_rank]
        if self.binding == "gpu-bind-socket":  # --gpu-bind=closest on 2 sockets: its socket's half
            half = self.gpus_on_node // 2
            return list(range(half)) if local_rank < self.tasks // 2 else list(range(half, self.gpus_on_node))
        raise ValueError(self.binding)

    def physical_gpu(self, local_rank: int) -> int:
        """The physical GPU the rank drives: the picked index within what the task sees."""
        seen = self.visible(local_rank)
        return seen[device_index(local_rank, self.tasks, len(seen), self.gpus_on_node)]


@pytest.mark.parametrize("binding", ["none", "gpus-per-task", "gpu-bind-socket"])
def test_each_rank_gets_its_own_gpu_under_every_binding_style(binding: str) -> None:
    view = FakeTaskView(gpus_on_node=8, tasks=8, binding=binding)
    assert sorted(view.physical_gpu(r) for r in range(8)) == list(range(8))


def test_more_ranks_than_gpus_on_the_node_is_refused() -> None:
    with pytest.raises(RuntimeError, match="8 ranks on this node but only 4 GPUs"):
        device_index(5, 8, 4, node_gpus=4)  # no binding: two ranks would share a GPU
    with pytest.raises(RuntimeError, match="8 ranks on this node but only 4 GPUs"):
        device_index(5, 8, 4)  # outside SLURM: what the task sees is the node
    with pytest.raises(RuntimeError, match="does not divide"):
        device_index(1, 8, 3, node_gpus=8)
    assert device_index(3, 4, 8) == 3  # torchrun with fewer ranks than GPUs


@pytest.mark.parametrize(
    ("table", "detected", "same"),
    [
        ("a100-80gb", "NVIDIA A100-SXM4-80GB", True),
        ("a100-80gb", "NVIDIA A100-SXM4-40GB", False),
        ("a100-40gb", "NVIDIA A100-PCIE-40GB", True),
        ("h100-sxm", "NVIDIA H100 80GB HBM3", True),
        ("h100-sxm", "NVIDIA H100 PCIe", False),
        ("h100-pcie", "NVIDIA H100 PCIe", True),
        ("h200", "NVIDIA H200", True),
        ("h100-sxm", "NVIDIA H200", False),
        ("mi300x", "AMD Instinct MI300X", True),
        ("l40s", "NVIDIA L40S", True),
    ],
)
def test_detected_gpu_names_match_the_table(table: str, detected: str, same: bool) -> None:
    # names as nvidia-smi / torch.cuda.get_device_name print them
    assert gpu_matches(GPUS[table], detected) is same


def test_a_cpu_build_of_torch_says_so() -> None:
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    reason = cuda_unusable_reason()
    assert reason is not None and "CPU-only build" in reason and torch.__version__ in reason


def test_rows_carry_versions_and_a_steady_peak() -> None:
    for name in ("cuda_version", "nccl_version", "gpu_name", "peak_mem_steady_gib", "torch_version"):
        assert name in COLUMNS and name in TrialResult.__dataclass_fields__
    assert stops_sweep({"status": "failed", "error": f"{NO_ACCELERATOR}: the sweep's GPU is h100-sxm, but ..."})
    assert not stops_sweep({"status": "failed", "error": "rank 0: RuntimeError: x"})
    assert not stops_sweep({"status": "oom", "error": NO_ACCELERATOR})


def test_steady_peak_starts_after_warm_up() -> None:
    peak = PeakMemory(torch.device("cpu"))
    peak.start()
    big = torch.ones(64 * 1024**2 // 4)  # 64 MiB, touched
    big.add_(1)
    del big
    peak.mark_warm()
    small = torch.ones(4 * 1024**2 // 4)
    small.add_(1)
    overall, steady = peak.peak_bytes()[0], peak.steady_bytes()
    assert overall >= 60 * 1024**2
    assert steady < overall - 40 * 1024**2


def test_fused_rmsnorm_gives_the_fused_kernel_one_dtype() -> None:
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    w = torch.rand(64)  # fp32 master weight, as under autocast
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns "Cannot dispatch to fused implementation"
        out = kernels.fused_rmsnorm(x, w, 1e-5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), kernels.eager_rmsnorm(x.float(), w, 1e-5), atol=2e-2, rtol=2e-2)


def test_probe_that_runs_out_of_memory_is_an_oom_not_a_missing_kernel() -> None:
    # the s x s scores of 300k tokens are 360 GB: the allocator refuses at once (nothing is touched)
    with pytest.raises(torch.OutOfMemoryError) as info:
        kernels.attention_kernel(
            "sdpa_math",
            batch=1,
            heads=1,
            kv_heads=1,
            head_dim=8,
            seq_len=300_000,
            dtype=torch.float32,
            device=torch.device("cpu"),
        )
    assert classify(info.value, rank=0).status == "oom"


def test_flash1_needs_flash_attn_1() -> None:
    if kernels.flash_attn_major() == 1:
        pytest.skip("flash-attn 1.x is installed")
    with pytest.raises(kernels.KernelUnavailable, match="flash-attn 1.x"):
        kernels.attention_kernel(
            "flash1",
            batch=1,
            heads=2,
            kv_heads=2,
            head_dim=8,
            seq_len=16,
            dtype=torch.float32,
            device=torch.device("cpu"),
        )


def test_selective_checkpointing_saves_what_torchtitan_saves() -> None:
    # torchtitan's _op_sac_save_list (torchtitan/models/llama3/infra/parallelize.py)
    aten = torch.ops.aten
    for op in (
        aten.mm.default,
        aten.max.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
    ):
        assert op in SAC_SAVE_OPS, op


def test_submission_hides_inherited_launch_variables() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "login1",
        "LOCAL_RANK": "3",
        "TORCHELASTIC_RUN_ID": "x",
        "CUDA_VISIBLE_DEVICES": "0",
        "SWEEP_ZYGOTE_SERVER": "/tmp/login-node-server.sock",  # the submitting process's fork server
        "PATH": "/bin",
        "SLURM_ACCOUNT": "a",
    }
    before = dict(env)
    with clean_submit_environment(env) as hidden:
        assert env == {"PATH": "/bin", "SLURM_ACCOUNT": "a"}
        assert hidden == sorted(set(before) - {"PATH", "SLURM_ACCOUNT"})
    assert env == before


def test_cpus_per_task_shares_the_node_among_its_gpus() -> None:
    assert cpus_per_task_for(128, 8) == 16  # a DGX-like node: 128 cores, 8 GPUs
    assert cpus_per_task_for(4, 8) == 1
    assert cpus_per_task_for(None, 8) is None


def _nogpu_spec(tmp_path: Path) -> Path:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name="nogpu", results_dir=str(tmp_path / "results"))
    spec["cluster"]["gpu"] = "a100-80gb"
    spec["trial"]["precision"] = "bf16"
    path = tmp_path / "nogpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_gpu_sweep_without_a_gpu_is_refused_before_any_trial(tmp_path: Path) -> None:
    r = sweep_cli("run", str(_nogpu_spec(tmp_path)), cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cluster.gpu: a100-80gb needs CUDA" in r.stderr and "CPU-only build" in r.stderr
    assert not (tmp_path / "results" / "nogpu").exists()  # no row: the machine's fault is no layout's


@pytest.mark.slow
def test_selftest_on_cpu_reports_what_a_cpu_lacks(tmp_path: Path) -> None:
    r = sweep_cli("selftest", cwd=tmp_path, timeout=900, env=cli_env(COLUMNS="200"))
    out = r.stdout + r.stderr
    assert "Traceback" not in out
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the CPU report does not apply")
    assert r.returncode == 1, out[-3000:]  # a GPU sweep relies on CUDA
    assert "CPU-only build" in out and "broken: CUDA" in out
    for row in ("attention=eager", "attention=sdpa_math", "rmsnorm=fused", "float8", "matmul fp32"):
        assert row in out, row
    for layout in ("TP on 2", "PP on 2", "FSDP on 2", "DDP on 2"):  # run for real over gloo
        line = next(ln for ln in out.splitlines() if layout in ln)
        assert "pass" in line and "tokens/s" in line and "estimate" in line, line


@pytest.mark.parametrize(("detected", "warned"), [("NVIDIA A100-SXM4-40GB", True), ("NVIDIA H100 80GB HBM3", False)])
def test_sweep_run_warns_when_the_gpu_found_is_not_the_sweep_files(tmp_path: Path, detected: str, warned: bool) -> None:
    # a replayed sweep whose rows were measured on `detected`; the sweep file says h100-sxm
    table = tmp_path / "rows.csv"
    pd.DataFrame([{"tp": t, "status": "ok", "mfu": 0.3 + 0.1 * t, "gpu_name": detected} for t in (1, 2)]).to_csv(
        table, index=False
    )
    spec = {
        "name": "gpuname",
        "model": "llama-7b",
        "seq_len": 2048,
        "global_batch_size": 512,
        "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {"tp": [1, 2]},
        "search": {"max_trials": 2, "parallel": 1},
        "launcher": {"kind": "replay", "table": str(table)},
        "results_dir": str(tmp_path / "results"),
    }
    path = tmp_path / "gpuname.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300, env=cli_env(COLUMNS="200"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("is not the sweep file's 'h100-sxm'" in r.stderr) is warned, r.stderr[-2000:]
    assert (pd.read_parquet(tmp_path / "results" / "gpuname" / "trials").gpu_name == detected).all()
