"""The memory estimate against peaks measured by others, one row per public measurement.

Reads `benchmarks/data/memory_measurements.csv` (collected from Megatron-LM's CI golden values,
torchtitan's benchmark pages and docs, torchao's READMEs and DeepSpeed's tutorials; the file's
README names every source). For each row: the sweep the row describes (model, sequence, batch,
GPUs, memory recipe), its layout, and the estimate of what the source measured:

- `measured_allocated_gib` (torch's max allocated; Megatron-LM's CI logs it on the last
  pipeline stage, so that stage is estimated) against the allocated estimate;
- else `measured_reserved_gib` (torch's max reserved; torchtitan's memory line) against the
  reserved estimate;
- `outcome` (fits | oom) against the plan's verdict: a candidate fits, a pruned layout does not.

Prints one line per row, then per source: rows with a number, median and p90 |error|, and
how many fits/OOM verdicts agree. The mixture-of-experts and context-parallel rows are sources of
their own (megatron-ci-moe, megatron-ci-cp, torchtitan-cp), so their errors print apart; no
constant of the MoE or cp terms (sweeper.estimate.memory.MOE_CAPACITY, RING_KV_BUFFERS) was set on them. Usage: python benchmarks/memory_accuracy.py [CSV]
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sweeper.errors import SpecError
from sweeper.estimate.memfit import MEMORY_SHARED_SHARE
from sweeper.estimate.memory import estimate
from sweeper.layouts.layout import Layout
from sweeper.spec.hardware import GIB, lookup_gpu
from sweeper.spec.loader import parse_sweep
from sweeper.spec.models import PRESETS
from sweeper.spec.sweep import Sweep

DATA = Path(__file__).parent / "data" / "memory_measurements.csv"
SHAPE = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
MOE_SHAPE = ("experts", "experts_per_token", "moe_ffn")


def degree(row: dict[str, str], knob: str) -> int:
    """cp, ep or etp of a row (1, or 0 for etp: follows tp, where the source leaves it unset)."""
    return _int(row.get(knob, "")) or (0 if knob == "etp" else 1)


def _int(v: str) -> int | None:
    return int(float(v)) if v.strip() else None


def _float(v: str) -> float | None:
    return float(v) if v.strip() else None


def _bool(v: str) -> bool | None:
    return {"true": True, "false": False}.get(v.strip().lower())


def model_of(row: dict[str, str]) -> str | dict[str, Any]:
    """The preset named by the row, else the shape its columns give."""
    if row["model"] and row["model"].lower() in PRESETS:
        return row["model"].lower()
    m: dict[str, Any] = {k: int(row[k]) for k in SHAPE if row[k]}
    if row["head_dim"] and int(row["head_dim"]) * int(row["heads"]) != int(row["hidden"]):
        m["head_dim"] = int(row["head_dim"])
    for k in ("mlp", "norm", "position"):
        if row[k]:
            m[k] = row[k]
    if _bool(row["tied_embeddings"]) is not None:
        m["tied_embeddings"] = _bool(row["tied_embeddings"])
    for k in MOE_SHAPE:
        if row.get(k, "").strip():
            m[k] = int(row[k])
    return m


# torchtitan commits that ran with `training.compile` but an eager loss: its loss was compiled
# with the model from e10cb94 (2024-10-22) to e8977b0 (2024-12-18, "turning off compile on loss
# function") and again from d1f62be (2025-02-20, `build_cross_entropy_loss`) on. The 2024
# benchmark page ran 9dec370 (2024-12-26); the docs pages 613bfd0 (2024-04) and 0809984 (2024-08)
# predate it. Later rows (torchtitan 0.0.2 of March 2025 with torchao 890e0ac8 of 2025-02-28,
# 2c8b594, 6fc499f, e7c0cae) compile it.
EAGER_LOSS_COMMITS = ("9dec370", "613bfd0", "0809984")


def compiled_loss(row: dict[str, str]) -> bool | None:
    """False where the row's torchtitan did not compile its loss, else None (the recipe's default)."""
    text = row["source_ref"] + " " + row["notes"]
    if "llama3_h100_202412" in text or any(c in text for c in EAGER_LOSS_COMMITS):
        return False
    return None


# (torchtitan commit, model) whose train config sets norm_type = "fused_rmsnorm"; every other
# torchtitan config the rows name sets "rmsnorm" (llama_70b.toml at 613bfd0, llama2/llama3 tomls
# at 0809984, 877991a and 9dec370) or has no norm_type (2025 commits: compile fuses it)
FUSED_NORM_CONFIGS = (("613bfd0", "llama2-13b"),)


def fused_norm_config(row: dict[str, str]) -> bool:
    return any(c in row["source_ref"] and row["model"].lower() == m for c, m in FUSED_NORM_CONFIGS)


def memory_of(row: dict[str, str]) -> dict[str, Any]:
    recipe = row["recipe"] or "builtin"
    out: dict[str, Any] = {"recipe": recipe}
    if recipe == "torchtitan" and compiled_loss(row) is not None:
        out["compiled_loss"] = compiled_loss(row)
    if recipe == "megatron" and _bool(row["distributed_optimizer"]) is not None:
        out["distributed_optimizer"] = _bool(row["distributed_optimizer"])
    if recipe == "deepspeed" and row["zero_stage"]:
        out["zero_stage"] = int(row["zero_stage"])
    if recipe in ("megatron", "deepspeed") and row["grad_accum_dtype"]:
        out["grad_accum_dtype"] = row["grad_accum_dtype"]
    return out


def layout_of(row: dict[str, str]) -> Layout:
    vpp = _int(row["vpp"]) or 1
    pp = int(row["pp"])
    # Megatron-LM runs TransformerEngine's fused LayerNorm/RMSNorm, and torch.compile fuses
    # torchtitan's norm (the CSV has no compile column: fid-data's notes say "compile=true");
    # otherwise torchtitan and DeepSpeed's GPT-2 examples run the framework's plain norm
    compiled = "compile=true" in row["notes"] or "torch.compile" in row["source_ref"]
    # float8 (torchao Float8Linear, tensorwise/rowwise, and the mxfp8 converter) changes no saved
    # tensor: matmul_with_hp_or_float8_args saves the bf16 input and weight and casts again in
    # backward (torchao/float8/float8_linear.py @9519beb); the knob is set for the layout's sake
    low_precision = "float8=true" in row["notes"] or "float8=mxfp8" in row["notes"]
    # torchtitan's own train config may pick its Triton fused RMSNorm (`norm_type =
    # "fused_rmsnorm"`, which keeps the input and rstd): llama_13b.toml at 613bfd0 does
    fused = row["recipe"] == "megatron" or compiled or fused_norm_config(row)
    return Layout(
        tp=int(row["tp"]),
        pp=pp,
        micro_batch_size=int(row["micro_batch_size"]),
        sequence_parallel=bool(_bool(row["sequence_parallel"])) and int(row["tp"]) > 1,
        activation_checkpointing=row["activation_checkpointing"] or "none",
        attention=row["attention"] or "flash2",
        rmsnorm="fused" if fused else "eager",
        sharding=row["sharding"] or "none",
        compile=compiled,
        float8=low_precision,
        pp_schedule="interleaved" if (pp > 1 and vpp > 1) else "1f1b",
        virtual_stages=vpp if (pp > 1 and vpp > 1) else 1,
        cp=degree(row, "cp"),
        ep=degree(row, "ep"),
        etp=degree(row, "etp"),
    )


def sweep_of(row: dict[str, str], layout: Layout) -> Sweep:
    world = int(row["tp"]) * int(row["pp"]) * int(row["dp"]) * degree(row, "cp")
    per_node = _int(row["gpus_per_node"]) or min(8, world)
    per_node = per_node if world % per_node == 0 else world
    gpu: str | dict[str, Any] = row["gpu"]
    if lookup_gpu(row["gpu"]) is None or (
        row["gpu_memory_gib"] and abs(lookup_gpu(row["gpu"]).memory_gib - float(row["gpu_memory_gib"])) > 0.5  # type: ignore[union-attr]
    ):
        gpu = {"name": row["gpu"], "memory_gib": float(row["gpu_memory_gib"]), "peak_tflops": 1000.0}
        if layout.float8:  # an H100 (96 GB) here: fp8 matmuls at twice the bf16 peak
            gpu["fp8_tflops"] = 2000.0
    gbs = _int(row["global_batch_size"]) or int(row["micro_batch_size"]) * int(row["dp"])
    knobs = {k: [v] for k, v in layout.as_dict().items()}
    if not row.get("experts", "").strip():
        del knobs["etp"]  # a dense model's sweep file cannot name it
    spec = {
        "name": "accuracy",
        "model": model_of(row),
        "seq_len": int(row["seq_len"]),
        "global_batch_size": gbs,
        "cluster": {"nodes": world // per_node, "gpus_per_node": per_node, "gpu": gpu},
        "space": knobs,
        "memory": memory_of(row),
    }
    # context parallel and experts are checked against the trainer that ran them (its rules and its
    # cp exchange: Megatron-LM's ring, torchtitan's all-gather)
    commands = {"megatron": "torchrun pretrain_gpt.py {flags}", "torchtitan": "torchrun -m torchtitan.train {flags}"}
    if row["trainer"] in commands and (layout.cp > 1 or row.get("experts", "").strip()):
        spec["workload"] = {"kind": row["trainer"], "command": commands[row["trainer"]]}
    return parse_sweep(yaml.safe_dump(spec))


def evaluate(row: dict[str, str]) -> dict[str, Any]:
    """Estimate, measurement, error and verdicts for one row (or why it was skipped)."""
    layout = layout_of(row)
    try:
        sweep = sweep_of(row, layout)
    except SpecError as e:
        return {"skipped": str(e).split(": ", 1)[-1]}
    cols = layout.columns(sweep)
    why = layout.rejection(sweep)
    if why is not None:
        return {"skipped": f"the layout is invalid here: {why.message}"}
    allocated = _float(row["measured_allocated_gib"])
    reserved = _float(row["measured_reserved_gib"])
    last_stage = "last pipeline stage" in row["notes"]
    est = estimate(cols, sweep, rank=-1 if (allocated is not None and last_stage) else None)
    full = estimate(cols, sweep)  # the verdict is the plan's: the most loaded stage
    out: dict[str, Any] = {"sweep": sweep, "layout": layout, "fits_pred": bool(full.fits[0])}
    if allocated is not None:
        out |= {"kind": "alloc", "measured": allocated, "estimated": float(est.allocated[0]) / GIB}
    elif reserved is not None:
        out |= {"kind": "resv", "measured": reserved, "estimated": float(est.reserved[0]) / GIB}
    if out.get("measured"):
        out["error"] = out["estimated"] / out["measured"] - 1
    out["fits_true"] = {"fits": True, "oom": False}.get(row["outcome"])
    return out


def describe(layout: Layout) -> str:
    d = layout
    s = f"tp{d.tp} pp{d.pp}{'v' + str(d.virtual_stages) if d.virtual_stages > 1 else ''} mbs{d.micro_batch_size}"
    s += "".join(f" {k}{getattr(d, k)}" for k in ("cp", "ep") if getattr(d, k) > 1)
    return s + f" {d.activation_checkpointing} {d.sharding}{' sp' if d.sequence_parallel else ''}"


def p90(values: list[float]) -> float:
    return float(np.percentile(values, 90)) if values else float("nan")


# What differs between runs of one layout that the layout cannot say (read from the sources)
RUN_DIFFERENCES = {
    "b200": "torchtitan 6fc499f runs cuDNN attention on compute capability 10 (models/attention.py), "
    "which its op-SAC _save_list lacked until b39377f (2025-12): attention recomputed, not kept",
    "mi300x": "ROCm build (torch 2.9.0.dev20250811+rocm6.4), torchtitan 2c8b594",
    "h100-sxm": "torchtitan 0.0.2 with torch 2.7.0a0 (2025-03); H100 variant not stated",
}


def inconsistent(by_source: dict[str, list[dict[str, Any]]], spread: float = 0.10) -> None:
    """Name the groups of rows that share every input of the estimate (model, sequence, GPU count,
    layout, recipe) but ran on different cards and whose measured peaks differ by more than
    `spread`: no estimate can be within 5 % of all of them, and the table's errors there measure
    the runs' software, not the layout. (Rows of one card that share an estimate differ in what
    the columns cannot say, such as Megatron's explicit uneven split: not flagged.)"""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for source, rs in by_source.items():
        for r in rs:
            if "error" in r:
                groups.setdefault((source, r["kind"], round(r["estimated"], 2)), []).append(r)
    for (source, _kind, est), rs in groups.items():
        lo, hi = min(r["measured"] for r in rs), max(r["measured"] for r in rs)
        gpus = sorted({r["sweep"].cluster.gpu.name for r in rs})
        if hi / lo - 1 <= spread or len(gpus) < 2:
            continue
        by_gpu = ", ".join(
            f"{g} {min(r['measured'] for r in rs if r['sweep'].cluster.gpu.name == g):.1f}-"
            f"{max(r['measured'] for r in rs if r['sweep'].cluster.gpu.name == g):.1f}"
            for g in gpus
        )
        print(
            f"\ninconsistent data: {len(rs)} {source} rows share one layout (estimate {est:.2f} GiB) "
            f"but measured {lo:.2f}-{hi:.2f} GiB ({100 * (hi / lo - 1):.0f} % apart): {by_gpu}"
        )
        for g in gpus:
            if g in RUN_DIFFERENCES:
                print(f"  {g}: {RUN_DIFFERENCES[g]}")


def shared_share(by_source: dict[str, list[dict[str, Any]]]) -> None:
    """How much of the estimate's error the layouts of one setting share (one source's model on one
    card, as one sweep's layouts are): of the variance of log(estimate / measured), the part between
    settings; `sweeper.estimate.memfit.MEMORY_SHARED_SHARE` is taken from it."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for source, rs in by_source.items():
        for r in rs:
            if "error" in r:
                key = (source, r["sweep"].model.name or "", r["sweep"].cluster.gpu.name)
                groups.setdefault(key, []).append(float(np.log1p(r["error"])))
    every = np.concatenate([np.asarray(v) for v in groups.values()])
    within = sum(float(((np.asarray(v) - np.mean(v)) ** 2).sum()) for v in groups.values())
    within /= max(every.size - len(groups), 1)
    print(
        f"shared error: {len(groups)} settings (source, model, card); log error sd {every.std():.3f} over all, "
        f"{np.sqrt(within):.3f} within one: {100 * (1 - within / every.var()):.0f} % of its variance shared "
        f"(memfit.MEMORY_SHARED_SHARE {MEMORY_SHARED_SHARE})"
    )


def main(path: Path = DATA) -> int:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    by_source: dict[str, list[dict[str, Any]]] = {}
    print(
        f"{'source':<22} {'model':<14} {'layout':<34} {'what':<5} {'measured':>9} {'estimate':>9} {'error':>7}  verdict"
    )
    for row in rows:
        r = evaluate(row)
        r["source"] = row["source"]
        by_source.setdefault(row["source"], []).append(r)
        model = row["model"] or f"{row['layers']}x{row['hidden']}"
        if "skipped" in r:
            print(f"{row['source']:<22} {model:<14} skipped: {r['skipped']}")
            continue
        measured = f"{r['measured']:9.2f}" if "measured" in r else f"{'-':>9}"
        est = f"{r['estimated']:9.2f}" if "estimated" in r else f"{'-':>9}"
        err = f"{100 * r['error']:+6.1f}%" if "error" in r else f"{'-':>7}"
        truth = {True: "fits", False: "oom", None: "?"}[r["fits_true"]]
        pred = "fits" if r["fits_pred"] else "oom"
        mark = "" if r["fits_true"] is None else (" ok" if r["fits_true"] == r["fits_pred"] else " WRONG")
        print(
            f"{row['source']:<22} {model:<14} {describe(r['layout']):<34} {r.get('kind', '-'):<5} "
            f"{measured} {est} {err}  {truth}/{pred}{mark}"
        )

    print(f"\n{'source':<22} {'rows':>5} {'numbers':>8} {'median|err|':>12} {'p90|err|':>9} {'fits/OOM right':>15}")
    all_err: list[float] = []
    right = total = 0
    for source, rs in by_source.items():
        errs = [abs(r["error"]) for r in rs if "error" in r]
        verdicts = [r["fits_true"] == r["fits_pred"] for r in rs if "skipped" not in r and r["fits_true"] is not None]
        all_err += errs
        right, total = right + sum(verdicts), total + len(verdicts)
        med = f"{100 * statistics.median(errs):.1f}%" if errs else "-"
        p = f"{100 * p90(errs):.1f}%" if errs else "-"
        print(f"{source:<22} {len(rs):>5} {len(errs):>8} {med:>12} {p:>9} {f'{sum(verdicts)}/{len(verdicts)}':>15}")
    inconsistent(by_source)
    shared_share(by_source)
    skipped = sum("skipped" in r for rs in by_source.values() for r in rs)
    print(
        f"\nall sources: {len(all_err)} measured peaks, median |error| {100 * statistics.median(all_err):.1f}% "
        f"(goal <= 5%), p90 {100 * p90(all_err):.1f}% (goal <= 15%); fits/OOM right {right}/{total}; "
        f"{skipped} rows skipped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA))
