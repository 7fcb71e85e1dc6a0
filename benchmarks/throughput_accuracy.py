"""The step-time model against step times measured by others, one row per public measurement.

Reads ../shared/data/ (each folder's README names every source and says what is inferred):

- `ultrascale`: the Ultra-Scale Playbook sweep (nanotron, 1-64 nodes of 8xH100); each (model,
  nodes) cell is one sweep, written as `../shared/checks/_ultrascale.py` writes it (SP at tp > 1,
  flash2, no checkpointing; tp above a node or more stages than layers left out, counted) with
  `workload.kind: nanotron`, the trainer that measured it: its rules, memory recipe and step-time
  traits (`sweeper.trainers.nanotron`). The same rows predicted with the
  built-in trainer's traits (what `../shared/checks/throughput` measures, its sweep files having
  no workload) are printed beside them. Ranked by tokens/s/GPU (the data's MFU counts tied
  embeddings twice at pp > 1);
- `nvidia-perf`: NVIDIA's tuned Megatron-Core layouts (dense Llama rows with a stated layout);
- `llm-foundry`: MosaicML's MPT FSDP tables (A100 40/80 GB, H100);
- `small-matched`: torchtitan's vanilla-TP rows and Megatron-Bridge's Llama 3 70B SFT rows.

Measured step time = global batch x sequence / (tokens/s/GPU x GPUs) (TFLOP/s rows: our FLOPs per
token over the measured TFLOP/s). Predicted: `perfmodel.predict(...).total`, uncalibrated, with the sweep's trainer's traits.

Hold-out: every row belongs to the FIT part or the HELD-OUT part by a CRC32 of its sweep's id
(ultrascale: the whole (model, nodes) cell; other sources: the row), fixed for ever. The model's
hand-set constants were chosen looking at the FIT part only; the calibration scales fitted here
use each source's FIT rows only; the HELD-OUT figures are printed apart, per source.

Calibrated: `sweeper.search.residual.calibrate`, the robust fit (soft L1 in log space) the search applies
to measured step times (sweeper/search/learn.py), not `perfmodel.calibrate`'s least squares, which the
search no longer uses: on ultrascale a few runs 20-89x slower than modelled (the pipeline stall,
throughput_stall.py) set the least-squares scales (compute x2.09) and the calibrated held-out
error came out worse than the uncalibrated one (65.8 % against 35.1 %).

Then the ultrascale sweep's pipeline stall (throughput_stall.py): the share of runs that stall per
node count from the data, its fit on the FIT cells, and the goals on the rows that did not stall.

Usage: python benchmarks/throughput_accuracy.py [--rows]   (--rows: one line per row)
"""

from __future__ import annotations

import math
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import yaml
from throughput_stall import report as stall_report

from sweeper.errors import SpecError
from sweeper.estimate.flops import model_flops_per_token
from sweeper.estimate.predict import predict
from sweeper.estimate.step_time import Calibration, StepTime
from sweeper.layouts.layout import RULES, Layout, with_derived
from sweeper.search.residual import calibrate
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep
from sweeper.trainers import TRAINERS

# the trainer that measured the ultrascale sweep (its rules and step-time traits come with it)
NANOTRON_WORKLOAD = {"kind": "nanotron", "command": "torchrun run_train.py --config-file config.yaml"}
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
SOURCES = ("ultrascale", "nvidia-perf", "llm-foundry", "small-matched")


@dataclass
class Group:
    """Rows of one sweep (one model on one cluster): measured and predicted step times."""

    source: str
    sweep_id: str
    sweep: Sweep
    cols: dict[str, np.ndarray]
    measured_s: np.ndarray
    labels: list[str]
    invalid: list[str] = field(default_factory=list)  # rule messages for measured rows our rules refuse
    invalid_builtin: list[str] = field(default_factory=list)  # the same under the built-in trainer's rules
    pred: StepTime | None = None  # with the sweep's trainer's traits (nanotron for ultrascale)
    pred_builtin: StepTime | None = None  # with the built-in trainer's traits

    @property
    def held_out(self) -> bool:
        return zlib.crc32(self.sweep_id.encode()) % 2 == 1


def parse(spec: dict[str, Any]) -> Sweep:
    return parse_sweep(yaml.safe_dump(spec))


def columns(layouts: list[Layout], sweep: Sweep) -> dict[str, np.ndarray]:
    raw = {k: np.asarray([getattr(lay, k) for lay in layouts]) for k in layouts[0].as_dict()}
    return with_derived(raw, sweep)


def refused(cols: dict[str, np.ndarray], sweep: Sweep) -> list[str]:
    """Our validity rules' messages for rows that ran (a refused measured row is a finding)."""
    out = []
    for rule in RULES:
        for i in np.flatnonzero(rule.broken(cols, sweep)):
            out.append(rule.explain(cols, sweep, int(i)))
    return out


# ---- ultrascale -------------------------------------------------------------------------------
def ultrascale(skipped: list[tuple[str, str, str]]) -> Iterator[Group]:
    d = pd.read_csv(os.path.join(DATA, "ultrascale", "runs.csv"))
    d["sharding"] = d.zero_stage.map({0: "none", 1: "zero1"})
    key = ["model", "nodes", "tp", "pp", "micro_batch_size", "sharding"]
    d = (
        d[d.status == "ok"]
        .groupby(key, as_index=False)
        .agg(
            tps=("tokens_per_s_per_gpu", "mean"),
            **{
                c: (c, "first")
                for c in (
                    "layers",
                    "hidden",
                    "heads",
                    "ffn",
                    "vocab",
                    "tied_embeddings",
                    "gpus",
                    "global_batch_size",
                    "seq_len",
                )
            },
        )
    )
    scaling = pd.read_csv(os.path.join(DATA, "ultrascale", "tp_sp_scaling.csv"))
    why_not = "tp_sp_scaling.csv: dp, pp, nodes and the micro-batch are not stated"
    skipped.extend([("ultrascale", f"3B tp{t}", why_not) for t in scaling.tp])
    for (model, nodes), g in d.groupby(["model", "nodes"]):
        cell = f"{model.split('-')[-1]}/{nodes}n"
        bad = (g.tp > 8) | (g.pp > g.layers)
        why = "tp above a node (8) or more stages than layers (as the check)"
        skipped.extend([("ultrascale", cell, why)] * int(bad.sum()))
        g = g[~bad]
        if g.empty:
            continue
        f = g.iloc[0]
        spec = {
            "name": "acc",
            "seq_len": int(f.seq_len),
            "global_batch_size": int(f.global_batch_size),
            "model": {
                "layers": int(f.layers),
                "hidden": int(f.hidden),
                "heads": int(f.heads),
                "kv_heads": int(f.heads),
                "ffn": int(f.ffn),
                "vocab": int(f.vocab),
                "tied_embeddings": bool(f.tied_embeddings),
            },
            "cluster": {"nodes": int(nodes), "gpus_per_node": 8, "gpu": "h100-sxm"},
            "space": {"tp": [1], "sequence_parallel": [True], "attention": ["flash2"]},
        }
        # nanotron's sweep takes its trainer's memory recipe; the built-in one's as the check writes it
        sweep = parse(spec | {"workload": NANOTRON_WORKLOAD})
        builtin = parse(spec | {"memory": {"recipe": "megatron"}})
        lays = [
            Layout(
                tp=int(r.tp),
                pp=int(r.pp),
                micro_batch_size=int(r.micro_batch_size),
                sharding=r.sharding,
                sequence_parallel=bool(r.tp > 1),
                attention="flash2",
            )
            for r in g.itertuples()
        ]
        measured = (g.global_batch_size * g.seq_len / (g.tps * g.gpus)).to_numpy(float)
        cols = columns(lays, sweep)
        labels = [f"tp{r.tp} pp{r.pp} mbs{r.micro_batch_size} {r.sharding}" for r in g.itertuples()]
        yield Group("ultrascale", cell, sweep, cols, measured, labels, refused(cols, sweep), refused(cols, builtin))


# ---- nvidia-perf ------------------------------------------------------------------------------
NV_GPU = {
    "H100 SXM 80GB": ("h100-sxm", 8),
    "B200": ("b200", 8),
    "B300": ("b300", 8),
    "GB200 (NVL72)": ("gb200", 4),
    "GB300 (NVL72)": ("gb300", 4),
}
# vocabularies from the models' cards (the tables leave vocab empty): Llama 3 128256, Llama 2 32000
VOCAB = {"LLAMA3": 128256, "LLAMA2": 32000}


def nvidia_spec(r: Any, name: str, model: str | dict[str, Any], space: dict[str, Any]) -> dict[str, Any]:
    """One nvidia-perf row as a sweep file (no workload): its GPU and nodes (`NV_GPU`), batch,
    sequence, Megatron-LM's memory recipe; nvidia_layouts.py and throughput_moe.py build on it."""
    gpu, per_node = NV_GPU[r.gpu_type]
    gpus = int(r.gpus)
    return {
        "name": name,
        "seq_len": int(r.seq_len),
        "global_batch_size": int(r.global_batch_size),
        "model": model,
        "cluster": {"nodes": max(gpus // per_node, 1), "gpus_per_node": min(per_node, gpus), "gpu": gpu},
        "space": space,
        "memory": {"recipe": "megatron"},
    }


def fp8(precision: str) -> bool | None:
    """True for per-tensor FP8 (current/delayed scaling), False for BF16, None for what no knob says."""
    p = precision.upper()
    if p.startswith("BF16"):
        return False
    if p.startswith("FP8") and "MX" not in p:
        return True
    return None


def nvidia(skipped: list[tuple[str, str, str]]) -> Iterator[Group]:
    d = pd.read_csv(os.path.join(DATA, "nvidia-perf", "runs.csv"))
    for i, r in d.iterrows():
        if r.ep > 1 or r.cp > 1:  # expert / context parallel: benchmarks/throughput_moe.py prices them
            continue
        rid = f"nv{i} {r.model} {r.gpu_type} {r.gpus}g {r.release}"
        why = None
        if pd.isna(r.layers):
            why = "model shape not stated (MoE, GPT-3 or Nemotron rows)"
        elif pd.isna(r.tp) or pd.isna(r.tokens_per_s_per_gpu):
            why = "layout or throughput not stated"
        elif "LoRA" in r.task:
            why = "LoRA: frozen base weights, a step the model does not price"
        elif fp8(str(r.precision)) is None:
            why = f"precision {r.precision} (block-scaled MX/NV formats) has no knob"
        elif r.gpu_type not in NV_GPU:
            why = f"gpu {r.gpu_type} not in the table"
        if why:
            skipped.append(("nvidia-perf", rid, why))
            continue
        gpus, tp, pp = int(r.gpus), int(r.tp), int(r.pp)
        vp = int(r.virtual_stages) if not pd.isna(r.virtual_stages) and r.virtual_stages > 1 else 1
        fsdp = not pd.isna(r.fsdp_column) and float(r.fsdp_column) > 0
        family = "LLAMA3" if "3" in str(r.model).split("_")[0].split("-")[0] else "LLAMA2"
        try:
            sweep = parse(
                nvidia_spec(r, "acc", shape(r) | {"vocab": VOCAB[family]}, {"tp": [1], "attention": ["cudnn"]})
            )
        except SpecError as e:
            skipped.append(("nvidia-perf", rid, str(e).splitlines()[-1]))
            continue
        # Megatron-Core perf recipes: TE fused norms, SP with TP, the distributed optimizer; the
        # recompute setting is not in the tables (none assumed)
        lay = Layout(
            tp=tp,
            pp=pp,
            micro_batch_size=int(r.micro_batch_size),
            sequence_parallel=tp > 1,
            attention="cudnn",
            rmsnorm="fused",
            sharding="fsdp" if fsdp else "zero1",
            pp_schedule="interleaved" if (pp > 1 and vp > 1) else "1f1b",
            virtual_stages=vp if (pp > 1 and vp > 1) else 1,
            float8=bool(fp8(str(r.precision))),
        )
        cols = columns([lay], sweep)
        step = r.global_batch_size * r.seq_len / (r.tokens_per_s_per_gpu * gpus)
        yield Group(
            "nvidia-perf",
            rid,
            sweep,
            cols,
            np.asarray([step]),
            [f"tp{tp} pp{pp} vp{vp} {r.precision}"],
            refused(cols, sweep),
        )


# ---- llm-foundry ------------------------------------------------------------------------------
FOUNDRY_GPU = {"h100_80gb": "h100-sxm", "a100_80gb": "a100-80gb", "a100_40gb": "a100-40gb"}


def shape(r: Any) -> dict[str, int]:
    """The transformer shape every public row states (a data row with these columns)."""
    return {k: int(getattr(r, k)) for k in ("layers", "hidden", "heads", "kv_heads", "ffn")}


def mpt_spec(r: Any, name: str, memory: dict[str, Any], space: dict[str, Any]) -> dict[str, Any]:
    """One llm-foundry row (an MPT run) as a sweep file; search_public.py builds its plans from it too."""
    gpus = int(r.gpus)
    return {
        "name": name,
        "seq_len": int(r.seq_len),
        "global_batch_size": int(r.global_batch_size),
        # MPT: GELU MLP (4h), LayerNorm, tied embeddings, ALiBi (no position table)
        "model": shape(r) | {"vocab": int(r.vocab), "tied_embeddings": True, "mlp": "gelu", "norm": "layernorm"},
        "cluster": {"nodes": max(gpus // 8, 1), "gpus_per_node": min(8, gpus), "gpu": FOUNDRY_GPU[r.gpu_type]},
        "space": space,
        "memory": memory,
    }


def foundry(skipped: list[tuple[str, str, str]]) -> Iterator[Group]:
    d = pd.read_csv(os.path.join(DATA, "llm-foundry", "runs.csv"))
    for i, r in d.iterrows():
        rid = f"mpt{i} {r.model} {r.gpu_type} {r.gpus}g seq{r.seq_len}"
        gpus = int(r.gpus)
        try:
            sweep = parse(mpt_spec(r, "acc", {"recipe": "torchtitan"}, {"tp": [1]}))
        except SpecError as e:
            skipped.append(("llm-foundry", rid, str(e).splitlines()[-1]))
            continue
        lay = Layout(
            micro_batch_size=int(r.micro_batch_size),
            sharding="fsdp",
            attention="flash2",
            activation_checkpointing="full" if str(r.activation_checkpointing).startswith("full") else "none",
            float8="fp8" in str(r.precision),
        )
        cols = columns([lay], sweep)
        step = r.global_batch_size * r.seq_len / (r.tokens_per_s_per_gpu * gpus)
        yield Group(
            "llm-foundry",
            rid,
            sweep,
            cols,
            np.asarray([step]),
            [f"mbs{r.micro_batch_size} {lay.activation_checkpointing} {r.precision}"],
            refused(cols, sweep),
        )


# ---- small-matched ----------------------------------------------------------------------------
def small(skipped: list[tuple[str, str, str]]) -> Iterator[Group]:
    d = pd.read_csv(os.path.join(DATA, "small-matched", "runs.csv"))
    mb: list[tuple[Layout, float, str]] = []
    for i, r in d.iterrows():
        rid = f"sm{i} {r.group} {r.variant}"
        if "moonlight" in r.group or "nemotron" in r.group:
            skipped.append(("small-matched", rid, "MoE model, shape not stated"))
        elif "async" in str(r.variant):
            skipped.append(("small-matched", rid, "async TP is not a knob"))
        elif "oom" in str(r.status):
            skipped.append(("small-matched", rid, "ran out of memory: no throughput"))
        elif "rowwise" in str(r.precision):
            # the float8 knob is torchao's default tensorwise scaling (what the built-in trainer and the
            # torchtitan export run); the file calls its vanilla-TP rowwise baseline low, pytorch/torchtitan#1207
            skipped.append(("small-matched", rid, "float8 rowwise scaling has no knob (float8 is tensorwise)"))
        elif r.group.startswith("torchtitan"):
            # Grand Teton's H100 96 GB HBM2e at 500 W (the data README), priced as the 700 W H100 SXM: the
            # GPU table has no power-capped part (its clocks at 500 W are not published with the data)
            tp, dp = int(r.tp), int(r.dp)
            # seq_len 8192: the llama3 tomls' default at 820504e (not stated by the benchmark page)
            sweep = parse(
                {
                    "name": "acc",
                    "seq_len": 8192,
                    "global_batch_size": int(r.local_batch_size) * dp,
                    "model": {
                        "layers": int(r.layers),
                        "hidden": int(r.hidden),
                        "heads": int(r.heads),
                        "kv_heads": int(r.kv_heads),
                        "ffn": int(r.ffn),
                        "vocab": 128256,
                    },
                    "cluster": {"nodes": int(r.gpus) // 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
                    "space": {"tp": [1]},
                    "memory": {"recipe": "torchtitan"},
                }
            )
            lay = Layout(
                tp=tp,
                micro_batch_size=int(r.local_batch_size),
                sequence_parallel=True,
                sharding="fsdp",
                activation_checkpointing="full" if r.activation_checkpointing == "full" else "selective",
                compile=True,
                rmsnorm="fused",
                attention="flash2",
                float8=str(r.precision).startswith("float8"),
            )
            cols = columns([lay], sweep)
            step = sweep.global_batch_size * 8192 / (float(r.throughput_value) * int(r.gpus))
            yield Group("small-matched", rid, sweep, cols, np.asarray([step]), [f"{r.precision}"], refused(cols, sweep))
        else:
            ckpt = {"selective: mlp": "ffn"}.get(str(r.activation_checkpointing), "selective")
            if "mlp + core_attn" in str(r.activation_checkpointing):
                skipped.append(("small-matched", rid, "recompute of mlp + core_attn has no knob"))
                continue
            vp = int(r.virtual_stages)
            lay = Layout(
                tp=int(r.tp),
                pp=int(r.pp),
                micro_batch_size=1,
                sequence_parallel=True,
                attention="cudnn",
                rmsnorm="fused",
                sharding="zero1",
                pp_schedule="interleaved",
                virtual_stages=vp,
                float8=True,
                activation_checkpointing=ckpt,
            )
            mb.append((lay, float(str(r.throughput_value).strip("~")), rid))
    if mb:
        sweep = parse(
            {
                "name": "acc",
                "seq_len": 4096,
                "global_batch_size": 32,
                "model": {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "vocab": 128256},
                "cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm"},
                "space": {"tp": [1], "attention": ["cudnn"]},
                "memory": {"recipe": "megatron"},
            }
        )
        cols = columns([m[0] for m in mb], sweep)
        flops = model_flops_per_token(sweep.model, 4096) * 32 * 4096
        step = np.asarray([flops / (t * 1e12 * 32) for _, t, _ in mb])
        yield Group(
            "small-matched",
            "mbridge-llama3-70b-sft-32xH100",
            sweep,
            cols,
            step,
            [m[2] for m in mb],
            refused(cols, sweep),
        )


# ---- figures ----------------------------------------------------------------------------------
def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def pct(v: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(v), q)) if len(v) else math.nan


def error_line(name: str, err: np.ndarray) -> str:
    if not len(err):
        return f"{name:<30} {0:>5} {'-':>9}"
    a = np.abs(err)
    return (
        f"{name:<30} {len(err):>5} {100 * np.median(a):>8.1f}% {100 * pct(a, 90):>8.1f}% {100 * np.median(err):>+8.1f}%"
    )


def main() -> int:
    show_rows = "--rows" in sys.argv
    skipped: list[tuple[str, str, str]] = []
    groups: list[Group] = []
    for make in (ultrascale, nvidia, foundry, small):
        for g in make(skipped):
            g.pred = predict(g.cols, g.sweep)  # the sweep's trainer's traits
            builtin = TRAINERS["builtin"]
            g.pred_builtin = g.pred if g.sweep.trainer is builtin else predict(g.cols, g.sweep, traits=builtin.time)
            groups.append(g)

    # calibration scales fitted per source on its FIT part (robustly, as the search does within one sweep)
    fitted: dict[str, Calibration] = {}
    for source in SOURCES:
        fit = [g for g in groups if g.source == source and not g.held_out and g.pred is not None]
        if fit:
            comp = np.concatenate([g.pred.compute for g in fit if g.pred])
            comm = np.concatenate([g.pred.comm for g in fit if g.pred])
            meas = np.concatenate([g.measured_s for g in fit])
            blank = StepTime(comp, comm, Calibration(), np.zeros_like(comp))
            fitted[source] = calibrate(blank, list(range(len(meas))), list(meas))

    print(
        f"{'source / part':<30} {'rows':>5} {'med|err|':>9} {'p90|err|':>9} {'signed':>9}   (step time, uncalibrated)"
    )
    lines: dict[str, tuple[float, float]] = {}
    for source in SOURCES:
        for part, sel in (("all", None), ("fit", False), ("held-out", True)):
            gs = [g for g in groups if g.source == source and (sel is None or g.held_out == sel)]
            err = np.concatenate([g.pred.total / g.measured_s - 1 for g in gs if g.pred]) if gs else np.zeros(0)
            print(error_line(f"{source} {part}", err))
            if part == "all" and len(err):
                lines[source] = (100 * float(np.median(np.abs(err))), 100 * pct(np.abs(err), 90))
            if part == "held-out" and len(err):
                t = np.concatenate(
                    [
                        g.pred.compute * fitted[source].compute_scale + g.pred.comm * fitted[source].comm_scale
                        for g in gs
                        if g.pred
                    ]
                )
                cal = t / np.concatenate([g.measured_s for g in gs]) - 1
                print(error_line(f"{source} held-out, calibrated", cal))
    print(
        "calibration fitted on each source's fit part: "
        + ", ".join(f"{s} compute x{k.compute_scale:.2f} comm x{k.comm_scale:.2f}" for s, k in fitted.items())
    )

    # NVIDIA's expert- and context-parallel rows, their own sources (imported here: it imports this module)
    from throughput_moe import report as moe_cp_report

    refusal_groups = moe_cp_report(skipped)

    us_groups = [g for g in groups if g.source == "ultrascale" and g.pred_builtin is not None]
    for part, sel in (("fit", False), ("held-out", True)):
        err = np.concatenate([g.pred_builtin.total / g.measured_s - 1 for g in us_groups if g.held_out == sel])
        print(error_line(f"ultrascale {part}, built-in's traits", err))

    print(
        f"\n{'sweep':<34} {'part':<9} {'rows':>5} {'spearman':>9} {'pred-best/best':>15} {'rank of best':>13}"
        "   | with the built-in trainer's traits"
    )
    cells: list[dict[str, Any]] = []
    for g in groups:
        if len(g.measured_s) < 3 or g.pred is None or g.pred_builtin is None:
            continue
        tps = 1 / g.measured_s
        c = {"source": g.source, "sweep": g.sweep_id, "held_out": g.held_out, "rows": len(tps)}
        for tag, pred in (("", g.pred), ("b_", g.pred_builtin)):
            pred_tps = 1 / pred.total
            order = np.argsort(-pred_tps, kind="stable")
            c[tag + "rank"] = int(np.flatnonzero(order == int(np.argmax(tps)))[0]) + 1
            c[tag + "rho"] = spearman(pred_tps, tps)
            c[tag + "best"] = float(tps[order[0]] / tps.max())
        cells.append(c)
        part = "held-out" if g.held_out else "fit"
        print(
            f"{g.source + ' ' + g.sweep_id:<34} {part:<9} {c['rows']:>5} {c['rho']:>9.2f} {c['best']:>15.3f} "
            f"{c['rank']:>13}   | {c['b_rho']:>5.2f} {c['b_best']:>6.3f} {c['b_rank']:>4}"
        )
    if show_rows:
        for g in groups:
            for i, lab in enumerate(g.labels):
                assert g.pred is not None
                print(
                    f"{g.source:<14} {g.sweep_id:<40} {lab:<34} measured {g.measured_s[i]:8.3f} s "
                    f"model {g.pred.total[i]:8.3f} s ({100 * (g.pred.total[i] / g.measured_s[i] - 1):+.0f}%)"
                )

    print(f"\nnot expressed: {len(skipped)} rows")
    reasons = pd.Series([f"{s}: {why}" for s, _, why in skipped]).value_counts()
    for why, n in reasons.items():
        print(f"  {n:>4}  {why}")
    refusals = [(g.source, m) for g in groups + refusal_groups for m in g.invalid]
    print(f"measured rows our validity rules refuse for the trainer that ran them (predicted anyway): {len(refusals)}")
    for why, n in pd.Series([f"{s}: {m}" for s, m in refusals]).value_counts().head(8).items():
        print(f"  {n:>4}  {why}")
    builtin_refusals = pd.Series([m for g in groups for m in g.invalid_builtin]).value_counts()
    print(f"ultrascale rows the built-in trainer's rules would refuse: {int(builtin_refusals.sum())}")
    for why, n in builtin_refusals.head(4).items():
        print(f"  {n:>4}  {why}")

    nanotron = [g for g in groups if g.source == "ultrascale"]
    stall_report(nanotron, nanotron[0].sweep.trainer.time)

    us = pd.DataFrame([c for c in cells if c["source"] == "ultrascale"])
    print("")
    for part, sel in (("fit", False), ("held-out", True)):
        p = us[us.held_out == sel]
        for tag, name in (("", "nanotron trainer"), ("b_", "built-in trainer's traits")):
            print(
                f"ultrascale {part} cells ({len(p)}), {name}: spearman median {p[tag + 'rho'].median():.2f}, "
                f"worst {p[tag + 'rho'].min():.2f}; predicted best {p[tag + 'best'].median():.3f} of the best "
                f"(worst {p[tag + 'best'].min():.3f})"
            )
    builtin_err = np.concatenate([g.pred_builtin.total / g.measured_s - 1 for g in us_groups])
    print(
        f"ultrascale all {len(us)} cells with the built-in trainer's traits (as ../shared/checks/throughput): "
        f"spearman median {us.b_rho.median():.2f}, worst {us.b_rho.min():.2f}; predicted best "
        f"{us.b_best.median():.3f} of the best, worst {us.b_best.min():.3f}; "
        f"median |step-time error| {100 * np.median(np.abs(builtin_err)):.1f}%"
    )
    errs = ", ".join(f"{s} {m:.1f}% (p90 {q:.1f}%)" for s, (m, q) in lines.items())
    print(f"median |step-time error| uncalibrated (goal <= 15% each): {errs}")
    print(
        f"ultrascale all {len(us)} cells, nanotron trainer: spearman median {us.rho.median():.2f} (goal >= 0.8), worst {us.rho.min():.2f} "
        f"(goal >= 0.6); predicted best reaches {us.best.median():.3f} of the best, worst {us.best.min():.3f} "
        f"(goal >= 0.9 everywhere); best ranked first in {int((us['rank'] == 1).sum())}/{len(us)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
