"""NVIDIA's tuned Megatron-Core layouts with expert or context parallelism (nvidia-perf rows with
ep > 1 or cp > 1) against the step-time model; `throughput_accuracy.py` prints them as the sources
`nvidia-perf moe` and `nvidia-perf cp`, apart from the dense rows.

What the tables do not state is assumed as Megatron-Bridge's perf recipes set it:
- the model: presets qwen3-30b-a3b and qwen3-235b-a22b; GPT-OSS 120B written out from
  openai/gpt-oss-120b config.json (36 blocks, hidden 2880, 64 query heads and 8 kv heads of 64,
  128 experts of width 2880, top-4, vocabulary 201088; its sliding window of 128 tokens on every
  other block, attention sinks and biases are not modelled: full causal attention is priced);
  the dense CP rows' Llama shapes are in the table. DeepSeek-V3 and Kimi K2 use multi-head
  latent attention and Nemotron 3 is a hybrid of Mamba-2 and attention blocks: no model field
  describes them; DeepSeek-V4 Flash's shape is not read here (all left out, counted);
- expert tensor parallelism 1 (`expert_tensor_parallel_size=1` in Megatron-Bridge's
  scripts/performance/configs/qwen/qwen3_workload_base_configs.py and gpt_oss_workload_base_configs.py),
  sequence parallelism with tp > 1, TE fused norms, the distributed optimizer, cuDNN attention, no
  recompute. Not priced (no knob says so): those recipes' `moe_a2a_overlap=True` on H100 for
  Qwen3-235B (the all-to-all hidden behind another micro-batch's compute), the HybridEP flex
  dispatcher (one copy of a token per remote node, not one per expert; Qwen3-30B on H100 and most
  Blackwell recipes from 2026), CUDA graphs (partial, and from 26.06 the whole iteration in most
  recipes, which removes the MoE blocks' host cost `perfmoe.MOE_BLOCK_OVERHEAD_S`: those rows come
  out slow; printed apart by release), and
  `moe_router_force_load_balancing=True`, which every NVIDIA MoE perf recipe sets (the measured runs
  route evenly; the model keeps a trained router's `perfmoe.EXPERT_IMBALANCE`);
- precision: FP8 (per-tensor) and MXFP8 both as the `float8` knob (Blackwell runs MXFP8 GEMMs at
  the FP8 rate; the figures are printed with and without the MXFP8 rows), NVFP4 left out;
  token-dropping runs left out (the model prices dropless routing, no knob caps an expert);
- the long-sequence tables (NeMo, FP8) state no micro-batch (1 assumed) and give model TFLOP/s, not
  tokens/s: step = our FLOPs per token x tokens per step / (TFLOP/s x GPUs), as small-matched does.

Measured step = global batch x sequence / (tokens/s/GPU x GPUs). The rows are split FIT /
HELD-OUT by the same CRC32 rule as the other sources. One model constant was fitted on the FIT
rows of `nvidia-perf moe` only: `perfmoe.MOE_BLOCK_OVERHEAD_S` (its comment says how); the other
MoE and CP constants (sweeper.estimate.moe, sweeper.estimate.comm) come from their cited sources. The MoE rows
are also printed per model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from throughput_accuracy import DATA, NV_GPU, VOCAB, Group, columns, error_line, nvidia_spec, parse, refused, shape

from sweeper.errors import SpecError
from sweeper.estimate.flops import model_flops_per_token
from sweeper.estimate.predict import predict
from sweeper.layouts.layout import Layout

MOE_SOURCE, CP_SOURCE = "nvidia-perf moe", "nvidia-perf cp"
# openai/gpt-oss-120b config.json (num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, head_dim, intermediate_size, num_local_experts, num_experts_per_tok, vocab_size)
GPT_OSS_120B: dict[str, Any] = {
    "layers": 36,
    "hidden": 2880,
    "heads": 64,
    "kv_heads": 8,
    "head_dim": 64,
    "ffn": 2880,
    "vocab": 201088,
    "experts": 128,
    "experts_per_token": 4,
    "moe_ffn": 2880,
}
MODELS: dict[str, str | dict[str, Any]] = {
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": GPT_OSS_120B,
}
NOT_EXPRESSIBLE = {
    "DeepSeekV3": "multi-head latent attention (MLA) has no model field",
    "DeepSeekV4": "shape not stated in the table, no published config read",
    "Kimi": "multi-head latent attention (MLA, DeepSeek-V3's) has no model field",
    "Nemotron": "hybrid Mamba-2 / attention blocks have no model field",
}
MEGATRON = {"kind": "megatron", "command": "torchrun pretrain_gpt.py {flags}"}


def moe_or_cp(r: Any) -> bool:
    """A row this module owns (throughput_accuracy.nvidia leaves it out)."""
    return (not pd.isna(r.ep) and r.ep > 1) or (not pd.isna(r.cp) and r.cp > 1)


def float8(precision: str) -> bool | None:
    """True for FP8 and MXFP8, False for BF16, None for what no knob says (NVFP4)."""
    p = precision.upper()
    if p.startswith("BF16"):
        return False
    if p.startswith(("FP8", "MXFP8")):
        return True
    return None


def _why_not(r: Any) -> str | None:
    moe = not pd.isna(r.ep) and r.ep > 1
    name = str(r.model)
    for family, why in NOT_EXPRESSIBLE.items():
        if name.startswith(family):
            return why
    if "tokendrop" in name:
        return "token dropping (a capacity factor) has no knob; the model prices dropless routing"
    if moe and name not in MODELS:
        return "MoE model shape not known"
    if not moe and pd.isna(r.layers):
        return "model shape not stated"
    if pd.isna(r.tp):
        return "layout not stated"
    if pd.isna(r.tokens_per_s_per_gpu) and pd.isna(r.model_tflops_per_gpu):
        return "throughput not stated"
    if float8(str(r.precision)) is None:
        return f"precision {r.precision} has no knob"
    if r.gpu_type not in NV_GPU:
        return f"gpu {r.gpu_type} not in the table"
    return None


def nvidia_moe_cp(skipped: list[tuple[str, str, str]]) -> Iterator[Group]:
    d = pd.read_csv(os.path.join(DATA, "nvidia-perf", "runs.csv"))
    for i, r in d.iterrows():
        if not moe_or_cp(r):
            continue
        moe = not pd.isna(r.ep) and r.ep > 1
        source = MOE_SOURCE if moe else CP_SOURCE
        rid = f"nv{i} {r.model} {r.gpu_type} {r.gpus}g {r.release}"
        why = _why_not(r)
        if why:
            skipped.append((source, rid, why))
            continue
        gpus, tp, pp, cp = int(r.gpus), int(r.tp), int(r.pp), int(r.cp)
        ep = int(r.ep) if moe else 1
        vp = int(r.virtual_stages) if not pd.isna(r.virtual_stages) and r.virtual_stages > 1 else 1
        mbs = 1 if pd.isna(r.micro_batch_size) else int(r.micro_batch_size)
        if moe:
            model = MODELS[str(r.model)]
        else:
            family = "LLAMA3" if "3" in str(r.model).split("_")[0].split("-")[0] else "LLAMA2"
            model = shape(r) | {"vocab": VOCAB[family]}
        space: dict[str, Any] = {"tp": [tp], "attention": ["cudnn"], "cp": [cp]}
        if moe:
            space |= {"ep": [ep], "etp": [1]}
        try:
            sweep = parse(nvidia_spec(r, "acc", model, space) | {"workload": MEGATRON})
        except SpecError as e:
            skipped.append((source, rid, str(e).splitlines()[-1]))
            continue
        lay = Layout(
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            etp=1,
            micro_batch_size=mbs,
            sequence_parallel=tp > 1,
            attention="cudnn",
            rmsnorm="fused",
            sharding="zero1",
            pp_schedule="interleaved" if (pp > 1 and vp > 1) else "1f1b",
            virtual_stages=vp if (pp > 1 and vp > 1) else 1,
            float8=bool(float8(str(r.precision))),
        )
        cols = columns([lay], sweep)
        tokens = r.global_batch_size * r.seq_len
        if pd.isna(r.tokens_per_s_per_gpu):
            step = model_flops_per_token(sweep.model, sweep.seq_len) * tokens / (r.model_tflops_per_gpu * 1e12 * gpus)
        else:
            step = tokens / (r.tokens_per_s_per_gpu * gpus)
        label = f"tp{tp} pp{pp} vp{vp} cp{cp} ep{ep} mbs{mbs} {str(r.precision).split(' ')[0]}"
        yield Group(source, rid, sweep, cols, np.asarray([float(step)]), [label], refused(cols, sweep))


def release(g: Group) -> tuple[int, int]:
    """The NVIDIA release of a row (its id's last word, e.g. 26.04.01) as (year, month)."""
    year, month = str(g.sweep_id).split()[-1].split(".")[:2]
    return int(year), int(month)


def is_mx(g: Group) -> bool:
    return "MX" in g.labels[0].upper()


def report(skipped: list[tuple[str, str, str]]) -> list[Group]:
    """Print each source's |step-time error| (uncalibrated; FIT and HELD-OUT apart) and return its groups."""
    groups = list(nvidia_moe_cp(skipped))
    for g in groups:
        g.pred = g.pred_trainer = predict(g.cols, g.sweep)
    for source in (MOE_SOURCE, CP_SOURCE):
        mine = [g for g in groups if g.source == source]
        for part, keep in (
            ("all", lambda g: True),
            ("fit", lambda g: not g.held_out),
            ("held-out", lambda g: g.held_out),
            ("all, no MXFP8", lambda g: not is_mx(g)),
        ):
            sel = [g for g in mine if keep(g)]
            err = np.concatenate([g.pred.total / g.measured_s - 1 for g in sel if g.pred]) if sel else np.zeros(0)
            print(error_line(f"{source} {part}", err))
    moe = [g for g in groups if g.source == MOE_SOURCE]
    for name in MODELS:
        for part, keep in (("fit", False), ("held-out", True)):
            sel = [g for g in moe if str(g.sweep_id).split(" ", 1)[1].startswith(name) and g.held_out == keep]
            err = np.concatenate([g.pred.total / g.measured_s - 1 for g in sel if g.pred]) if sel else np.zeros(0)
            print(error_line(f"{MOE_SOURCE} {name} {part}", err))
    # from release 26.06 on, most of NVIDIA's MoE recipes capture the whole iteration in a CUDA graph
    # (Megatron-Bridge PR 4173: GPT-OSS 120B; PR 4211: Qwen3 MXFP8 on GB200/GB300), which removes the
    # MoE blocks' host cost the model prices
    for part, graphed in (("releases before 26.06", False), ("releases 26.06 on", True)):
        for half, keep in (("fit", False), ("held-out", True)):
            sel = [g for g in moe if (release(g) >= (26, 6)) == graphed and g.held_out == keep]
            err = np.concatenate([g.pred.total / g.measured_s - 1 for g in sel if g.pred]) if sel else np.zeros(0)
            print(error_line(f"{MOE_SOURCE} {part}, {half}", err))
    refusals = sum(len(g.invalid) for g in groups)
    print(f"  ({refusals} of these {len(groups)} rows refused by our validity rules, predicted anyway: see below)")
    return groups
