"""The context-parallel and mixture-of-experts validity rules (cp, ep, etp), as `Rule`s over columns.

`sweeper.layouts.layout.RULES` lists them in its order, between the sequence-parallel rule and the pipeline
rules; the rejection a layout gets is the first rule it breaks in that list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.layouts.rule import Columns, Rule, at
from sweeper.statuses import PlanReason

if TYPE_CHECKING:
    # the sweep file's loader checks sweeps against these rules: no import of the spec at run time
    from sweeper.spec.sweep import Sweep


# trainers whose expert-parallel groups may take tensor-parallel ranks where etp < tp
def _expert_ranks(c: Columns, s: Sweep) -> np.ndarray:
    """Ranks of a pipeline stage the experts are split over: dp*cp, times tp where the trainer folds."""
    base = c["dp"] * c["cp"]
    return base * c["tp"] if s.trainer.folds_experts_over_tp else base


def _expert_tp(c: Columns, s: Sweep) -> np.ndarray:
    """The expert tensor-parallel degree those ranks also hold, where the trainer folds over tp (else 1)."""
    return c["etp"] if s.trainer.folds_experts_over_tp else np.ones_like(c["etp"])


CONTEXT_PARALLEL_RULES: tuple[Rule, ...] = (
    # Megatron-LM and torchtitan cut each sequence into 2*cp chunks, rank i holding chunks i and
    # 2*cp-1-i, so that every rank gets the same causal-attention work
    Rule(
        PlanReason.CP_SEQ_NOT_DIVISIBLE,
        "context parallel needs 2*cp to divide seq_len",
        lambda c, s: (c["cp"] > 1) & (s.seq_len % (2 * c["cp"]) != 0),
        lambda c, s, i: (
            f"cp = {at(c, 'cp', i)} needs 2*cp = {2 * at(c, 'cp', i)} to divide seq_len = {s.seq_len} "
            "(each rank holds two of 2*cp equal chunks)"
        ),
    ),
    Rule(
        PlanReason.CP_NOT_IN_WORKLOAD,
        "context parallel with an attention kernel or layout the workload's trainer does not run it with",
        lambda c, s: (c["cp"] > 1) & ~s.trainer.runs_cp(c),
        lambda c, s, i: s.trainer.cp_refusal(c, i),
    ),
)


EXPERT_RULES: tuple[Rule, ...] = (
    Rule(
        PlanReason.EP_WITHOUT_EXPERTS,
        "expert parallel on a model without experts",
        lambda c, s: (c["ep"] > 1) & (s.model.experts == 0),
        lambda c, s, i: f"ep = {at(c, 'ep', i)} needs a model with experts (model.experts); {s.model.name} is dense",
    ),
    Rule(
        PlanReason.EP_EXPERTS_NOT_DIVISIBLE,
        "ep does not divide the experts",
        lambda c, s: (s.model.experts > 0) & (s.model.experts % c["ep"] != 0),
        lambda c, s, i: f"ep = {at(c, 'ep', i)} does not divide experts = {s.model.experts}",
    ),
    # The expert-parallel group folds into the ranks of a pipeline stage outside the expert's own
    # tensor-parallel group, dp*cp*tp/etp of them (Megatron-LM's "MoE parallel folding":
    # parallel_state.py builds the expert grid etp x ep x edp x pp over the same world; torchtitan's
    # ParallelDims: "expert_parallel_degree must divide dp_shard * cp * tp"). With etp = tp: dp*cp.
    # The built-in trainer (expert_tp "one") keeps its ep groups inside dp*cp.
    Rule(
        PlanReason.EP_NOT_IN_DP_CP,
        "ep does not divide the data- and context-parallel ranks (times tp/etp where the trainer folds experts over tp)",
        lambda c, s: (c["ep"] > 1) & ((c["dp"] == 0) | (_expert_ranks(c, s) % (c["ep"] * _expert_tp(c, s)) != 0)),
        lambda c, s, i: (
            f"ep*etp = {at(c, 'ep', i)}*{at(c, 'etp', i)} does not divide dp*cp*tp = {at(c, 'dp', i)}*"
            f"{at(c, 'cp', i)}*{at(c, 'tp', i)} (the experts are split over a stage's data- and context-parallel "
            "ranks, and its tensor-parallel ranks where etp < tp)"
            if s.trainer.folds_experts_over_tp
            else f"ep = {at(c, 'ep', i)} does not divide dp*cp = {at(c, 'dp', i)}*{at(c, 'cp', i)} (the "
            f"{s.workload.kind} trainer splits the experts over data- and context-parallel ranks)"
        ),
    ),
    Rule(
        PlanReason.ETP_FFN_NOT_DIVISIBLE,
        "etp does not divide each expert's width",
        lambda c, s: (s.model.experts > 0) & (s.model.expert_ffn % c["etp"] != 0),
        lambda c, s, i: f"etp = {at(c, 'etp', i)} does not divide moe_ffn = {s.model.expert_ffn}",
    ),
    Rule(
        PlanReason.EXPERT_WORLD_NOT_DIVISIBLE,
        "etp*ep*pp does not divide the number of GPUs",
        lambda c, s: (s.model.experts > 0) & (s.cluster.world % (c["etp"] * c["ep"] * c["pp"]) != 0),
        lambda c, s, i: (
            f"etp*ep*pp = {at(c, 'etp', i)}*{at(c, 'ep', i)}*{at(c, 'pp', i)} does not divide world = "
            f"{s.cluster.world} GPUs (the experts' own mesh)"
        ),
    ),
    Rule(
        PlanReason.EXPERTS_NOT_IN_WORKLOAD,
        "an expert layout the workload's trainer does not run",
        lambda c, s: (s.model.experts > 0) & ~s.trainer.runs_experts(c),
        lambda c, s, i: s.trainer.experts_refusal(c, i),
    ),
    # Megatron-LM: "When using expert parallelism and tensor parallelism, sequence parallelism must be used"
    Rule(
        PlanReason.EP_NEEDS_SP,
        "expert and tensor parallel without sequence parallel, where the trainer needs it",
        lambda c, s: (c["ep"] > 1) & (c["tp"] > 1) & ~c["sequence_parallel"].astype(bool) & s.trainer.ep_tp_needs_sp,
        lambda c, s, i: (
            f"the {s.workload.kind} trainer runs ep = {at(c, 'ep', i)} with tp = {at(c, 'tp', i)} only "
            "with sequence_parallel"
        ),
    ),
)
