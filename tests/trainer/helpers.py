"""Helpers of the trainer tests: a tiny sweep, launching worker functions, the single-process reference."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from sweeper.launchers.ranks import launch
from sweeper.spec import Sweep, parse_sweep
from sweeper.trainer import kernels
from sweeper.trainer.model import Transformer, build_model, loss_fn, materialize, norm_kernel
from sweeper.trainer.train import make_optimizer, synthetic_batch

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


# Variants of the tiny model (ModelShape fields replaced), by name
MODELS: dict[str, dict[str, Any]] = {
    "llama": {},
    # GPT-2/3 style: multi-head attention, ffn 4h, GELU, LayerNorm with biases, learned positions
    "gpt": dict(kv_heads=4, ffn=256, mlp="gelu", norm="layernorm", position="learned"),
    # Qwen3-style head_dim: 4 heads of 32 (q_dim 128) on hidden 64
    "head_dim": dict(head_dim=32),
    # layer counts no pipeline of 2 (or 2x2 virtual) stages divides
    "layers5": dict(layers=5),
    "layers7": dict(layers=7),
    "gpt_layers5": dict(layers=5, kv_heads=4, ffn=256, mlp="gelu", norm="layernorm", position="learned"),
    # a dense block, then 3 mixture-of-experts blocks: 4 experts of 32, top-2, one shared expert
    "moe": dict(experts=4, experts_per_token=2, moe_ffn=32, shared_experts=1, dense_layers=1),
}


def tiny_sweep(
    world: int, *, tied: bool = False, precision: str = "fp32", seq_len: int = 32, extra: str = "", model: str = "llama"
) -> Sweep:
    """The tiny LLaMA of the issue (4 layers, dim 64, 4 heads, 2 kv heads, ffn 176, vocab 256) on `world` CPU ranks,
    or one of its `MODELS` variants."""
    sweep = _tiny_sweep(world, tied=tied, precision=precision, seq_len=seq_len, extra=extra)
    if not MODELS[model]:
        return sweep
    shape = dataclasses.replace(sweep.model, **MODELS[model], name=f"tiny-{model}")
    return dataclasses.replace(sweep, model=shape)


def _tiny_sweep(world: int, *, tied: bool, precision: str, seq_len: int, extra: str) -> Sweep:
    return parse_sweep(f"""
name: tiny_test
model: {{layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 176, vocab: 256, tied_embeddings: {str(tied).lower()}}}
seq_len: {seq_len}
global_batch_size: 8
cluster: {{nodes: 1, gpus_per_node: {world}, gpu: cpu}}
trial: {{steps: 10, warmup_steps: 1, timeout_min: 5, precision: {precision}, lr: 0.003, seed: 0}}
{extra}
""")


def run_workers(
    target: str, *, nprocs: int, workdir: Path, timeout_s: float = 300, env: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    """Run `tests.trainer.workers:<target>` on `nprocs` processes; fail the test with the logs if a rank failed."""
    task = {"kind": "call", "target": f"tests.trainer.workers:{target}", "kwargs": kwargs}
    done = launch(
        task, nprocs=nprocs, timeout_s=timeout_s, workdir=workdir, extra_env={"PYTHONPATH": str(ROOT), **(env or {})}
    )
    if done.timed_out or any(done.returncodes):
        logs = "\n".join(f"--- rank {r} (rc {rc})\n{done.log_tail(r, 40)}" for r, rc in enumerate(done.returncodes))
        pytest.fail(f"{target} on {nprocs} ranks: rc={done.returncodes} timed_out={done.timed_out}\n{logs}")
    return done


def plain_model(sweep: Sweep, *, attention: str = "flash2", rmsnorm: str = "eager") -> Transformer:
    """The whole model in one process, materialised with the layout-independent init."""
    s = sweep.model
    attend = kernels.attention_kernel(
        attention,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        seq_len=sweep.seq_len,
        dtype=torch.float32,
        device=CPU,
    )
    model = build_model(s, sweep.seq_len, attend=attend, norm_fn=norm_kernel(s, rmsnorm))
    materialize(model, s, seed=sweep.trial.seed, device=CPU)
    return model


@cache
def reference(
    tied: bool = False, attention: str = "flash2", rmsnorm: str = "eager", steps: int = 10, model: str = "llama"
) -> dict[str, Any]:
    """The single-process run every layout must reproduce: the whole global batch in one micro-batch."""
    sweep = tiny_sweep(1, tied=tied, model=model)
    model = plain_model(sweep, attention=attention, rmsnorm=rmsnorm)
    opt = make_optimizer(list(model.parameters()), lr=sweep.trial.lr, device=CPU)
    x, y = synthetic_batch(sweep.model, batch=sweep.global_batch_size, seq_len=sweep.seq_len, seed=sweep.trial.seed)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
    return {"losses": losses, "grads": grads, "params": {k: p.detach().clone() for k, p in model.named_parameters()}}


def merged(out_dir: Path, case_id: str) -> dict[str, Any]:
    """A case's saved state, the pipeline stages' files merged into one model."""
    files = sorted(out_dir.glob(f"{case_id}_rank*.pt"))
    assert files, f"no output for case {case_id}"
    out: dict[str, Any] = {"grads": {}, "params": {}}
    for f in files:
        part = torch.load(f)
        out["losses"] = part["losses"]
        out["grads"].update(part["grads"])
        out["params"].update(part["params"])
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), f"parameters differ: {sorted(set(a) ^ set(b))}"
    return max((a[k] - b[k]).abs().max().item() for k in a)
