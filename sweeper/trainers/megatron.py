"""Megatron-LM: its memory recipe (mixed precision, distributed optimizer, Megatron FSDP), its
flags and environment (`sweeper.trainers.export`), and its training log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.estimate.memory import compute_bytes
from sweeper.spec.memory_options import MegatronMemory, MemoryOptions, StateBytes
from sweeper.trainers.base import EnvNeeds, ParsedLog, TableRecipe, Trainer
from sweeper.trainers.export import MEGATRON_ATTENTION, megatron_args, megatron_env, to_megatron

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep


class MegatronRecipe(TableRecipe):
    """megatron (--bf16): 2-byte parameters, main gradients 4 (fp32 accumulation, the default
    with --bf16) or 2 (--grad-reduce-in-bf16), fp32 master weights 4 and Adam moments 8;
    --use-distributed-optimizer shards master and moments (6 + 12/dp bytes); sharding fsdp is
    Megatron FSDP (optim_grads_params): everything sharded. Under fp32 compute there is no
    separate master copy: parameters are the fp32 weights (README has the sources)."""

    name = "megatron"
    options = MegatronMemory
    # Megatron-LM logs typically show reserved 5-15 % above max allocated
    reserved_factor = 1.10

    def table(self, sweep: Sweep, sharding: str) -> StateBytes:
        m = sweep.memory
        assert isinstance(m, MegatronMemory)
        e = compute_bytes(sweep)
        params, master = (2.0, 4.0) if e < 4 else (4.0, 0.0)
        grads = 2.0 if (m.grad_accum_dtype == "bf16" and e < 4) else 4.0  # default fp32 main grads
        distributed = sharding != "none" if m.distributed_optimizer is None else m.distributed_optimizer
        sharded = ["master", "optimizer"] if distributed else []
        if sharding == "fsdp":
            sharded = ["params", "grads", "master", "optimizer"]
        return StateBytes.model_validate(
            {"params": params, "grads": grads, "master": master, "optimizer": 8.0, "sharded": sharded}
        )

    def loss_bytes(self, cols: Columns, sweep: Sweep) -> tuple[np.ndarray | float, np.ndarray | float]:
        # vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py) casts the
        # logits to fp32 and works in place on that copy, which it keeps: at the peak only the
        # e-byte logits coexist with the kept fp32 softmax, and its gradient reuses it in place
        return 4.0, float(compute_bytes(sweep))

    def summary(self, options: MemoryOptions) -> list[str]:
        assert isinstance(options, MegatronMemory)
        do = {None: "as sharding says", True: "always", False: "never"}[options.distributed_optimizer]
        return [f"distributed optimizer {do}", f"grads {options.grad_accum_dtype or 'fp32'}"]


# megatron/training/training.py, training_log() (Megatron-LM core_r0.12 / main, 2025):
#  " [2025-04-13 23:41:12] iteration       10/    1000 | consumed samples: ... | elapsed time per
#   iteration (ms): 1147.6 | throughput per GPU (TFLOP/s/GPU): 123.4 | learning rate: ... |
#   global batch size:    16 | lm loss: 1.043E+01 | loss scale: 1.0 | grad norm: 3.1 | ..."
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_MEGATRON_LOSS = re.compile(r"lm loss:\s*([-+\d.Ee]+)")
# megatron/training/utils.py, report_memory():
#  "[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 1234.5 | reserved: ... | max reserved: ..."
_MEGATRON_MEM = re.compile(
    r"\(after \d+ iterations\) memory \(MB\).*?max allocated:\s*([\d.]+).*?max reserved:\s*([\d.]+)"
)


def parse_megatron(text: str) -> ParsedLog:
    """Per-iteration times (run with --log-interval 1), losses, TFLOP/s and the peak memory report."""
    out = ParsedLog()
    for line in text.splitlines():
        m = _MEGATRON_ITER.search(line)
        if not m:
            mem = _MEGATRON_MEM.search(line)
            if mem:
                alloc, reserved = float(mem.group(1)) / 1024, float(mem.group(2)) / 1024
                out.peak_mem_gib = max(out.peak_mem_gib or 0.0, alloc)
                out.peak_mem_reserved_gib = max(out.peak_mem_reserved_gib or 0.0, reserved)
            continue
        out.step_times_s.append(float(m.group(2)) / 1000)
        if (loss := _MEGATRON_LOSS.search(line)) is not None:
            out.losses.append(float(loss.group(1)))
        if (tf := _MEGATRON_TFLOPS.search(line)) is not None:
            out.reported_tflops.append(float(tf.group(1)))
    return out


class Megatron(Trainer):
    """Megatron-LM's pretrain_gpt.py; every attention value maps to an --attention-backend."""

    kind = "megatron"
    recipe = MegatronRecipe()
    # forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py)
    # warms up min(pp - rank - 1, m) forwards: fewer micro-batches than stages run, bubble paid
    runs_short_1f1b = True
    exports = {"megatron": to_megatron}
    # Transformer Engine's DotProductAttention runs context parallelism in its flash and fused
    # (cuDNN) backends only, not in the unfused one (--attention-backend, see export.MEGATRON_ATTENTION)
    cp_attention = frozenset(k for k, backend in MEGATRON_ATTENTION.items() if backend != "unfused")
    expert_tp = "any"  # --expert-tensor-parallel-size is free of --tensor-model-parallel-size
    ep_tp_needs_sp = True  # validate_args: expert and tensor parallelism need --sequence-parallel

    def flags(self, rec: Mapping[str, Any], steps: int) -> list[str]:
        args, _ = megatron_args(rec)
        return [*args, "--train-iters", str(steps), "--log-interval", "1"]

    def env(self, rec: Mapping[str, Any]) -> EnvNeeds:
        # validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS per layout (see `export.megatron_env`)
        return megatron_env(rec)

    def parse_log(self, text: str, sweep: Sweep) -> ParsedLog:
        return parse_megatron(text)
