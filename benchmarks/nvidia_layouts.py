"""Would the plan keep NVIDIA's published layouts? Each nvidia-perf row the sweep file can express,
as a one-layout sweep, through `make_plan`: called a candidate (fits), uncertain, or pruned.

`../shared/data/nvidia-perf/runs.csv` (its README names the sources: NeMo's and Megatron-Bridge's
performance summaries) lists 344 layouts that ran and one stated OOM. Every `ok` row fit on its
card, so a memory model that prunes one is wrong, unless the run used a recompute or offload
setting the table does not state. The tables state no recompute setting: each row is planned
with `activation_checkpointing` none, selective, ffn and full (the values a sweep would search)
and reported under the lightest one the plan keeps; a row kept under none only with recompute is
counted as fit, with the setting it needs in the table.

How a row becomes a sweep (Megatron-LM, `memory.recipe: megatron`): its model (the preset for
Qwen3-30B-A3B, Qwen3-235B-A22B, GPT-OSS-120B and GPT-3 175B, the stated shape for Llama), seq_len,
global batch, GPU count and card; tp, pp, virtual stages (interleaved), cp, ep, micro-batch; etp = 1
for a mixture of experts (the tables do not state it; Megatron-Bridge's recipe helpers default it
to 1, e.g. recipes/qwen/qwen3_moe.py `_qwen3_moe_common`); sequence parallel with tp > 1;
TE's fused attention (`cudnn`) and norms; the distributed optimizer (`zero1`), or Megatron FSDP
where the FSDP column is set. The precision is no memory term (float8 keeps the bf16 tensors:
see benchmarks/memory_accuracy.py), so MXFP8 and NVFP4 rows are planned as float8 and counted in
their own column. Token-dropping runs ("(tokendrop)") are planned as dropless (an upper bound).

Usage: python benchmarks/nvidia_layouts.py [-v] [--quick]   (-v: one line per expressible row)

--quick plans every QUICK_EVERY-th ok row of the table only (the same rows at every run), through the
same calls, tables and counts: the counts are of those rows.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any

import pandas as pd
import yaml
from throughput_accuracy import DATA, NV_GPU, VOCAB, nvidia_spec  # benchmarks/ is on sys.path

from sweeper.errors import SpecError
from sweeper.plan.plan import make_plan
from sweeper.spec.hardware import GIB
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep

# nvidia-perf model names that are presets here (Llama rows carry their shape in the table)
PRESET = {
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
    "GPT3-175B": "gpt3-175b",
}
# why the other models cannot be written as a sweep's model
NOT_A_SHAPE = {
    "DeepSeek": "multi-head latent attention (MLA) and multi-token prediction: no model fields for them",
    "Kimi": "multi-head latent attention (MLA): no model fields for it",
    "Nemotron_3": "hybrid Mamba/attention blocks: no model fields for them",
    "Nemotron-": "Nemotron 4 shapes (squared-ReLU MLP) are not stated in the table",
    "GPT3-": "GPT-3 5B/20B: NeMo's shapes are not stated in the table (no preset)",
}
CHECKPOINTING = ("none", "selective", "ffn", "full")
QUICK_EVERY = 10  # --quick: every 10th ok row


def model_of(r: Any) -> str | dict[str, Any] | None:
    """The sweep's `model` for a row (a preset name or the stated shape), or None."""
    name = str(r.model).replace(" (tokendrop)", "")
    if name in PRESET:
        return PRESET[name]
    if not pd.isna(r.layers):
        family = "LLAMA3" if "3" in name.split("_")[0].split("-")[0] else "LLAMA2"
        shape = {k: int(getattr(r, k)) for k in ("layers", "hidden", "heads", "kv_heads", "ffn")}
        return shape | {"vocab": VOCAB[family]}
    return None


def not_expressible(r: Any) -> str | None:
    """Why a row cannot be written as a sweep, or None."""
    if model_of(r) is None:
        name = str(r.model)
        return next((why for key, why in NOT_A_SHAPE.items() if name.startswith(key)), f"model {name}: no shape")
    if pd.isna(r.tp) or pd.isna(r.micro_batch_size):
        return "layout not stated (the long-sequence tables' 'without CP' rows)"
    if "LoRA" in str(r.task):
        return "LoRA: frozen base weights and adapters, which the memory recipes do not hold"
    if r.gpu_type not in NV_GPU:
        return f"gpu {r.gpu_type} not in the table"
    vp = 1 if pd.isna(r.virtual_stages) else int(r.virtual_stages)
    if not pd.isna(r.layers) and int(r.pp) * vp > int(r.layers):
        # Llama 3.1 405B: 126 blocks over pp 16 x vp 8 = 128 model chunks, as Megatron-Bridge's
        # recipe runs it with account_for_embedding_in_pipeline_split and
        # account_for_loss_in_pipeline_split (the embedding and the loss each take a chunk's place)
        return "more model chunks than blocks: the embedding and the loss counted as pipeline layers (no knob)"
    return None


def sweep_of(r: Any, checkpointing: str) -> Sweep:
    tp, pp, cp = int(r.tp), int(r.pp), int(r.cp)
    ep = 1 if pd.isna(r.ep) else int(r.ep)
    vp = int(r.virtual_stages) if not pd.isna(r.virtual_stages) and r.virtual_stages > 1 else 1
    fsdp = not pd.isna(r.fsdp_column) and float(r.fsdp_column) > 0
    model = model_of(r)
    moe = isinstance(model, str) and model not in ("gpt3-175b",)
    space: dict[str, list[Any]] = {
        "tp": [tp],
        "pp": [pp],
        "cp": [cp],
        "micro_batch_size": [int(r.micro_batch_size)],
        "sequence_parallel": [tp > 1],
        "attention": ["cudnn"],
        "rmsnorm": ["fused"],
        "sharding": ["fsdp" if fsdp else "zero1"],
        "pp_schedule": ["interleaved" if (pp > 1 and vp > 1) else "1f1b"],
        "virtual_stages": [vp if (pp > 1 and vp > 1) else 1],
        "activation_checkpointing": [checkpointing],
        "float8": [not str(r.precision).upper().startswith("BF16")],
    }
    if moe:
        space |= {"ep": [ep], "etp": [1]}
    spec = nvidia_spec(r, "nvidia", model, space) | {
        "workload": {"kind": "megatron", "command": "torchrun pretrain_gpt.py {flags}"}
    }
    return parse_sweep(yaml.safe_dump(spec))


def call(r: Any) -> tuple[str, str, float, str]:
    """(verdict, checkpointing, GiB per GPU, why): the lightest checkpointing the plan calls a
    candidate, else the one nearest the card (uncertain or pruned); verdict candidate / uncertain /
    pruned / invalid."""
    tried: list[tuple[str, str, float, str]] = []
    for mode in CHECKPOINTING:
        try:
            plan = make_plan(sweep_of(r, mode))
        except SpecError as e:
            return "invalid", mode, float("nan"), str(e).splitlines()[-1]
        status, reason = str(plan.status[0]), str(plan.reason[0])
        if status not in ("candidate", "uncertain", "pruned"):
            return "invalid", mode, float("nan"), reason
        if status == "candidate":
            return status, mode, float(plan.memory.total[0]) / GIB, reason
        tried.append((status, mode, float(plan.memory.total[0]) / GIB, reason))
    return min(tried, key=lambda t: (t[0] != "uncertain", t[2]))


def main(verbose: bool = False, quick: bool = False) -> int:
    d = pd.read_csv(os.path.join(DATA, "nvidia-perf", "runs.csv"))
    d = d[d.status == "ok"]
    if quick:
        d = d.iloc[::QUICK_EVERY]
    reasons: Counter[str] = Counter()
    rows: list[dict[str, Any]] = []
    for i, r in d.iterrows():
        why = not_expressible(r)
        if why:
            reasons[why] += 1
            continue
        verdict, mode, gib, reason = call(r)
        mx = any(k in str(r.precision).upper() for k in ("MX", "NVFP4"))
        rows.append(
            {"row": i, "model": str(r.model), "gpu": r.gpu_type, "gpus": int(r.gpus), "verdict": verdict}
            | {"checkpointing": mode, "gib": gib, "reason": reason, "mx": mx, "cp": int(r.cp) > 1}
            | {"ep": not pd.isna(r.ep) and int(r.ep) > 1, "release": r.release}
        )
    t = pd.DataFrame(rows)
    if verbose:
        for x in t.itertuples():
            print(
                f"nv{x.row:<4} {x.release:<9} {x.model[:28]:<28} {x.gpu[:14]:<14} {x.gpus:>5} "
                f"{x.verdict:<10} {x.checkpointing:<9} {x.gib:6.1f} GiB  {x.reason[:70]}"
            )
    print(f"nvidia-perf: {len(d)} ok rows, {len(t)} expressible as a sweep, {sum(reasons.values())} not\n")
    fit = t.verdict.isin(["candidate", "uncertain"])
    print(f"{'rows':<34} {'n':>4} {'fits':>5} {'uncert':>7} {'pruned':>7} {'invalid':>8}   needs recompute")
    groups = {
        "all expressible": t.index == t.index,
        "  dense": ~t.ep,
        "  mixture of experts (ep > 1)": t.ep,
        "  context parallel (cp > 1)": t.cp,
        "  precision bf16 / per-tensor fp8": ~t.mx,
        "  precision MXFP8 / NVFP4 (as fp8)": t.mx,
    }
    for name, sel in groups.items():
        g = t[sel]
        v = Counter(g.verdict)
        needs = Counter(g[fit[sel] & (g.checkpointing != "none")].checkpointing)
        print(
            f"{name:<34} {len(g):>4} {v['candidate']:>5} {v['uncertain']:>7} {v['pruned']:>7} {v['invalid']:>8}   "
            + ", ".join(f"{k} {n}" for k, n in sorted(needs.items()))
        )
    bad = t[~fit]
    if len(bad):
        print(
            "\nnot called fit (nv164, Llama 3 70B at tp1 pp1 on 64 GB300 with FSDP 0, is the one row of that"
            "\nlayout whose FSDP column is not 64: unsharded, 70.6 B parameters need more than 6 bytes each):"
        )
        for x in bad.itertuples():
            print(f"  nv{x.row} {x.release} {x.model} {x.gpu} {x.gpus} GPUs: {x.verdict} ({x.reason[:110]})")
    print("\nnot expressible:")
    for why, n in reasons.most_common():
        print(f"  {n:>4}  {why}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", action="store_true", help="one line per expressible row")
    ap.add_argument("--quick", action="store_true", help=f"every {QUICK_EVERY}th ok row only")
    args = ap.parse_args()
    sys.exit(main(args.v, args.quick))
