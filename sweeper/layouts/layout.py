"""Layouts: one frozen value per parallel configuration, and the validity rules of DESIGN.md.

Each rule is written once over columns of numpy arrays, so the same code checks one `Layout`
(as one-row columns) and a whole cross product of a million layouts (see `sweeper.plan.plan`).
`RULES` is the one list of them, in the order a rejection is chosen; the rule type is
`sweeper.layouts.rule.Rule`, and the context- and expert-parallel rules are written in `sweeper.layouts.moe`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.knobs import KNOBS
from sweeper.layouts.moe import CONTEXT_PARALLEL_RULES, EXPERT_RULES
from sweeper.layouts.rule import Columns, Rule, at, scalar
from sweeper.statuses import PlanReason

if TYPE_CHECKING:
    # the sweep file's loader checks sweeps against these rules: no import of the spec at run time
    from sweeper.spec.sweep import Sweep


@dataclass(frozen=True)
class Layout:
    """The value of every knob for one trial. Derived values need the sweep (world, batch)."""

    tp: int = KNOBS["tp"].default
    pp: int = KNOBS["pp"].default
    micro_batch_size: int = KNOBS["micro_batch_size"].default
    sequence_parallel: bool = KNOBS["sequence_parallel"].default
    activation_checkpointing: str = KNOBS["activation_checkpointing"].default
    attention: str = KNOBS["attention"].default
    rmsnorm: str = KNOBS["rmsnorm"].default
    sharding: str = KNOBS["sharding"].default
    pp_schedule: str = KNOBS["pp_schedule"].default
    virtual_stages: int = KNOBS["virtual_stages"].default
    compile: bool = KNOBS["compile"].default
    float8: bool = KNOBS["float8"].default
    cp: int = KNOBS["cp"].default
    ep: int = KNOBS["ep"].default
    etp: int = KNOBS["etp"].default

    def __post_init__(self) -> None:
        # a knob that follows another (etp follows tp) holds that knob's value when left at its default
        for name, value in following({k: np.asarray(getattr(self, k)) for k in KNOBS}).items():
            object.__setattr__(self, name, np.asarray(value).item())

    def dp(self, world: int) -> int:
        """Data-parallel degree: what is left of the world after tensor, context and pipeline
        parallelism (0: does not divide)."""
        return int(data_parallel(np.asarray(self.tp), np.asarray(self.pp), world, np.asarray(self.cp)))

    def grad_accum(self, world: int, global_batch_size: int) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (the pipeline's micro-batches)."""
        return int(micro_batches(np.asarray(self.micro_batch_size), np.asarray(self.dp(world)), global_batch_size))

    def stages_per_rank(self) -> int:
        """Pipeline model chunks held by one pipeline rank (virtual stages only when interleaved)."""
        return int(chunks_per_rank(np.asarray(self.pp_schedule), np.asarray(self.pp), np.asarray(self.virtual_stages)))

    def resolve(self, sweep: Sweep) -> ResolvedLayout:
        """This layout with its derived sizes in `sweep` (world, global batch)."""
        cols = self.columns(sweep)
        return ResolvedLayout(
            self,
            dp=int(cols["dp"][0]),
            grad_accum=int(cols["grad_accum"][0]),
            chunks=int(cols["chunks"][0]),
            sequence_parallel=bool(cols["effective_sp"][0]),
            world=sweep.cluster.world,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def columns(self, sweep: Sweep) -> dict[str, np.ndarray]:
        """This layout as one-row columns, derived values included."""
        cols = {k: np.asarray([v]) for k, v in self.as_dict().items()}
        return with_derived(cols, sweep)

    def rejection(self, sweep: Sweep) -> Rejection | None:
        """The first validity rule this layout breaks, or None when it is valid."""
        cols = self.columns(sweep)
        for rule in RULES:
            if bool(rule.broken(cols, sweep)[0]):
                return Rejection(rule.code, rule.explain(cols, sweep, 0))
        return None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Layout:
        """A layout from knob values; unknown names raise KeyError naming them."""
        unknown = set(values) - set(KNOBS)
        if unknown:
            raise KeyError(f"unknown knobs {sorted(unknown)}; knobs: {', '.join(KNOBS)}")
        return cls(**{k: scalar(v) for k, v in values.items()})


LAYOUT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Layout))


@dataclass(frozen=True)
class ResolvedLayout:
    """A layout and the sizes it derives in one sweep, computed once (as torchtitan's `ParallelDims` does).

    The same derivation, over columns, is `with_derived`: the plan's million layouts and this one
    value read the same functions.
    """

    layout: Layout
    dp: int  # data-parallel degree (0 when tp*pp does not divide the world)
    grad_accum: int  # micro-batches per step on each data-parallel rank
    chunks: int  # model chunks per pipeline rank (virtual stages when interleaved, else 1)
    sequence_parallel: bool  # in effect: asked for, and tp > 1
    world: int

    def as_fields(self) -> dict[str, Any]:
        """The knobs and the derived sizes, as result fields."""
        return {**self.layout.as_dict(), "dp": self.dp, "grad_accum": self.grad_accum, "num_devices": self.world}


@dataclass(frozen=True)
class Rejection:
    code: PlanReason
    message: str


def data_parallel(tp: np.ndarray, pp: np.ndarray, world: int, cp: np.ndarray | int = 1) -> np.ndarray:
    """dp = world / (tp*cp*pp), as Megatron-LM derives it; 0 where tp*cp*pp does not divide the
    world (a rule flags those)."""
    model_par = tp * cp * pp
    return np.where(world % model_par == 0, world // np.maximum(model_par, 1), 0)


def expert_data_parallel(etp: np.ndarray, ep: np.ndarray, pp: np.ndarray, world: int) -> np.ndarray:
    """Expert data parallel = world / (etp*ep*pp): the ranks an expert's gradients are reduced
    over (Megatron-LM's expert mesh); 0 where etp*ep*pp does not divide the world."""
    return data_parallel(etp, pp, world, ep)


def following(cols: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The knobs that follow another (`Knob.follows`), resolved: the followed knob's value where
    left at their default."""
    return {
        k: np.where(cols[k] == knob.default, cols[knob.follows], cols[k])
        for k, knob in KNOBS.items()
        if knob.follows and k in cols
    }


def micro_batches(micro_batch_size: np.ndarray, dp: np.ndarray, global_batch_size: int) -> np.ndarray:
    """grad_accum = global_batch_size / (micro_batch_size*dp), by integer division (a rule flags the rest)."""
    per_step = micro_batch_size * dp
    return np.where(per_step > 0, global_batch_size // np.maximum(per_step, 1), 0)


def chunks_per_rank(pp_schedule: np.ndarray, pp: np.ndarray, virtual_stages: np.ndarray) -> np.ndarray:
    # interleaving only exists with pp > 1; otherwise one chunk per rank
    return np.where((pp_schedule == "interleaved") & (pp > 1), virtual_stages, 1)


def gpipe_order(schedule: np.ndarray, pp: np.ndarray, grad_accum: np.ndarray, sweep: Sweep) -> np.ndarray:
    """Where the pipeline runs all forwards before all backwards: GPipe, and a 1F1B with fewer
    micro-batches than stages where the trainer runs that as GPipe (`Trainer.short_1f1b_as_gpipe`)."""
    short = (schedule == "1f1b") & (pp > 1) & (grad_accum < pp) & sweep.trainer.short_1f1b_as_gpipe
    return (schedule == "gpipe") | short


def with_derived(cols: dict[str, np.ndarray], sweep: Sweep) -> dict[str, np.ndarray]:
    """Add the derived columns: dp, grad_accum, chunks (per pipeline rank), effective_sp (SP in
    effect), edp (expert data parallel), gpipe_order (the pipeline runs GPipe's order); knobs that
    follow another (etp) are resolved."""
    cols = {**cols, **following(cols)}
    dp = data_parallel(cols["tp"], cols["pp"], sweep.cluster.world, cols["cp"])
    grad_accum = micro_batches(cols["micro_batch_size"], dp, sweep.global_batch_size)
    return {
        **cols,
        "dp": dp,
        "edp": expert_data_parallel(cols["etp"], cols["ep"], cols["pp"], sweep.cluster.world),
        "grad_accum": grad_accum,
        "chunks": chunks_per_rank(cols["pp_schedule"], cols["pp"], cols["virtual_stages"]),
        "effective_sp": cols["sequence_parallel"].astype(bool) & (cols["tp"] > 1),
        "gpipe_order": gpipe_order(cols["pp_schedule"], cols["pp"], grad_accum, sweep),
    }


def _product(c: Columns, i: int, knobs: tuple[str, ...]) -> str:
    """`tp*cp*pp = 2*2*4`, leaving out the factors at 1 that are not always shown (cp of a dense run)."""
    shown = [k for k in knobs if KNOBS[k].always_shown or at(c, k, i) != 1]
    return f"{'*'.join(shown)} = {'*'.join(str(at(c, k, i)) for k in shown)}"


def _microbatch_rounds_ok(cols: Columns) -> np.ndarray:
    # torch's ScheduleInterleaved1F1B splits the micro-batches into rounds of about pp each
    m, pp = cols["grad_accum"], cols["pp"]
    rounds = np.maximum(1, m // np.maximum(pp, 1))
    return m % rounds == 0


def _short_1f1b_refused(c: Columns, s: Sweep) -> np.ndarray:
    short = (c["pp"] > 1) & (c["grad_accum"] < c["pp"])
    interleaved = c["pp_schedule"] == "interleaved"
    # how few micro-batches a plain 1F1B may run is the trainer's (Trainer.fewest_1f1b_microbatches);
    # interleaved schedules (Megatron-LM's and torch's) need at least pp everywhere; GPipe runs any number
    plain = (c["pp_schedule"] == "1f1b") & (c["grad_accum"] < s.trainer.fewest_1f1b_microbatches(c["pp"]))
    return short & (interleaved | plain)


def _fewest(c: Columns, s: Sweep, i: int) -> str:
    pp = at(c, "pp", i)
    need = pp if at(c, "pp_schedule", i) == "interleaved" else scalar(s.trainer.fewest_1f1b_microbatches(c["pp"])[i])
    return "one per stage" if need == pp else str(need)


def _knob_not_in_trainer(c: Columns, s: Sweep) -> np.ndarray:
    out = np.zeros(len(c["tp"]), dtype=bool)
    for knob, values in s.trainer.lacks.items():
        out |= np.isin(c[knob], list(values))
    return out


def _knob_not_in_trainer_why(c: Columns, s: Sweep, i: int) -> str:
    lacking = [
        f"{knob} = {scalar(c[knob][i])}: {why}"
        for knob, values in s.trainer.lacks.items()
        for value, why in values.items()
        if scalar(c[knob][i]) == value
    ]
    return f"the {s.workload.kind} trainer cannot run " + "; ".join(lacking)


def _kernel_why(c: Columns, s: Sweep, i: int) -> str:
    kernel, kind = at(c, "attention", i), s.workload.kind
    missing = s.trainer.attention_missing()
    if kernel in missing:  # the trainer has it, this installation lacks its package
        return f"attention = {kernel} {missing[kernel]} (the {kind} trainer runs it with that package only)"
    have = ", ".join(sorted(s.trainer.attention_here()))
    return f"attention = {kernel}: the {kind} trainer has no such kernel (it has: {have})"


def _kernel_detail(c: Columns, s: Sweep, i: int) -> str:
    kernel = at(c, "attention", i)
    why = s.trainer.attention_missing().get(kernel)
    have = f"{s.workload.kind} trainer has: {', '.join(sorted(s.trainer.attention_here()))}"
    return f"{kernel} ({have}{f'; {kernel} {why}' if why else ''})"


RULES: tuple[Rule, ...] = (
    Rule(
        PlanReason.WORLD_NOT_DIVISIBLE,
        "tp*cp*pp does not divide the number of GPUs",
        lambda c, s: s.cluster.world % (c["tp"] * c["cp"] * c["pp"]) != 0,
        lambda c, s, i: f"{_product(c, i, ('tp', 'cp', 'pp'))} does not divide world = {s.cluster.world} GPUs",
    ),
    Rule(
        PlanReason.TP_EXCEEDS_NODE,
        "tp larger than the GPUs of one node",
        lambda c, s: c["tp"] > s.cluster.gpus_per_node,
        lambda c, s, i: f"tp = {at(c, 'tp', i)} exceeds gpus_per_node = {s.cluster.gpus_per_node}",
    ),
    Rule(
        PlanReason.HEADS_NOT_DIVISIBLE,
        "tp does not divide the attention heads",
        lambda c, s: s.model.heads % c["tp"] != 0,
        lambda c, s, i: f"tp = {at(c, 'tp', i)} does not divide heads = {s.model.heads}",
    ),
    Rule(
        PlanReason.KV_HEADS_NOT_DIVISIBLE,
        "tp does not divide the key/value heads",
        lambda c, s: s.model.kv_heads % c["tp"] != 0,
        lambda c, s, i: f"tp = {at(c, 'tp', i)} does not divide kv_heads = {s.model.kv_heads}",
    ),
    Rule(
        PlanReason.FFN_NOT_DIVISIBLE,
        "tp does not divide the MLP width",
        lambda c, s: s.model.ffn % c["tp"] != 0,
        lambda c, s, i: f"tp = {at(c, 'tp', i)} does not divide ffn = {s.model.ffn}",
    ),
    # pp need not divide the layers: stages get ceil/floor layer counts (sweeper.layouts.stages), as
    # Megatron-LM and torchtitan run them; each stage needs at least one layer
    Rule(
        PlanReason.PP_EXCEEDS_LAYERS,
        "more pipeline stages than layers",
        lambda c, s: c["pp"] > s.model.layers,
        lambda c, s, i: f"pp = {at(c, 'pp', i)} exceeds layers = {s.model.layers} (each stage needs a layer)",
    ),
    Rule(
        PlanReason.BATCH_NOT_DIVISIBLE,
        "micro_batch_size*dp does not divide the global batch",
        lambda c, s: (c["dp"] == 0) | (s.global_batch_size % np.maximum(c["micro_batch_size"] * c["dp"], 1) != 0),
        lambda c, s, i: (
            f"micro_batch_size*dp = {at(c, 'micro_batch_size', i)}*{at(c, 'dp', i)} does not divide "
            f"global_batch_size = {s.global_batch_size}"
        ),
    ),
    Rule(
        PlanReason.SEQ_NOT_DIVISIBLE,
        "sequence parallel needs tp to divide each cp rank's part of seq_len",
        lambda c, s: c["sequence_parallel"].astype(bool) & (s.seq_len % (c["tp"] * c["cp"]) != 0),
        lambda c, s, i: (
            f"sequence_parallel with tp = {at(c, 'tp', i)} needs it to divide seq_len/cp = {s.seq_len}/{at(c, 'cp', i)}"
        ),
    ),
    # the context-parallel and expert rules live in sweeper.layouts.moe; their place here is their order
    *CONTEXT_PARALLEL_RULES,
    *EXPERT_RULES,
    Rule(
        PlanReason.TOO_FEW_MICROBATCHES,
        "1F1B with fewer micro-batches than stages, where the trainer refuses it",
        lambda c, s: _short_1f1b_refused(c, s),
        lambda c, s, i: (
            f"grad_accum = {at(c, 'grad_accum', i)} micro-batches is fewer than pp = {at(c, 'pp', i)} stages: "
            f"the {s.workload.kind} trainer's {at(c, 'pp_schedule', i)} schedule needs at least {_fewest(c, s, i)}"
        ),
    ),
    Rule(
        PlanReason.INTERLEAVED_VIRTUAL_STAGES,
        "interleaved schedule needs virtual_stages >= 2",
        lambda c, s: (c["pp"] > 1) & (c["pp_schedule"] == "interleaved") & (c["virtual_stages"] < 2),
        lambda c, s, i: f"pp_schedule = interleaved needs virtual_stages >= 2, got {at(c, 'virtual_stages', i)}",
    ),
    Rule(
        PlanReason.INTERLEAVED_LAYERS,
        "pp*virtual_stages exceeds the layers",
        lambda c, s: (c["chunks"] > 1) & (c["pp"] * c["chunks"] > s.model.layers),
        lambda c, s, i: (
            f"interleaved: pp*virtual_stages = {at(c, 'pp', i)}*{at(c, 'virtual_stages', i)} "
            f"exceeds layers = {s.model.layers} (each model chunk needs a layer)"
        ),
    ),
    Rule(
        PlanReason.INTERLEAVED_MICROBATCHES,
        "interleaved 1F1B needs micro-batches in whole rounds",
        lambda c, s: (c["chunks"] > 1) & ~_microbatch_rounds_ok(c),
        lambda c, s, i: (
            f"interleaved: grad_accum = {at(c, 'grad_accum', i)} is not a multiple of its "
            f"{max(1, at(c, 'grad_accum', i) // at(c, 'pp', i))} rounds of pp = {at(c, 'pp', i)}"
        ),
    ),
    Rule(
        PlanReason.KERNEL_NOT_IN_WORKLOAD,
        "an attention kernel the workload's trainer does not have",
        lambda c, s: ~np.isin(c["attention"], sorted(s.trainer.attention_here())),
        _kernel_why,
        _kernel_detail,
    ),
    Rule(
        PlanReason.KNOB_NOT_IN_TRAINER,
        "a knob value the workload's trainer has no way to run",
        _knob_not_in_trainer,
        _knob_not_in_trainer_why,
    ),
    Rule(
        PlanReason.COMBINATION_NOT_IN_TRAINER,
        "knob values the workload's trainer refuses together",
        lambda c, s: s.trainer.refuses(c, s),
        lambda c, s, i: s.trainer.refusal(c, s, i),
    ),
    Rule(
        PlanReason.FLOAT8_UNSUPPORTED,
        "float8 on a GPU without fp8",
        lambda c, s: c["float8"].astype(bool) & (not s.cluster.gpu.supports_fp8),
        lambda c, s, i: f"float8 needs fp8 matmuls; {s.cluster.gpu.name} has none",
    ),
)


# The rules one value of tp or pp breaks on its own, whatever the other knobs hold: a searched value
# that breaks one can never be used, and the sweep file is refused (see `unusable`).
DECIDED_ALONE: dict[str, tuple[PlanReason, ...]] = {
    "tp": (
        PlanReason.WORLD_NOT_DIVISIBLE,
        PlanReason.TP_EXCEEDS_NODE,
        PlanReason.HEADS_NOT_DIVISIBLE,
        PlanReason.KV_HEADS_NOT_DIVISIBLE,
    ),
    "pp": (PlanReason.WORLD_NOT_DIVISIBLE,),
    "cp": (PlanReason.WORLD_NOT_DIVISIBLE, PlanReason.CP_SEQ_NOT_DIVISIBLE),
    "ep": (PlanReason.EP_WITHOUT_EXPERTS, PlanReason.EP_EXPERTS_NOT_DIVISIBLE),
    "etp": (PlanReason.ETP_FFN_NOT_DIVISIBLE,),
}


def unusable(knob: str, value: Any, sweep: Sweep) -> list[str]:
    """Why no layout of `sweep` can use `knob=value` (the rules it breaks alone); empty when some can."""
    cols = Layout.from_mapping({knob: value}).columns(sweep)
    return [
        r.explain(cols, sweep, 0) for r in RULES if r.code in DECIDED_ALONE[knob] and bool(r.broken(cols, sweep)[0])
    ]


RULE_SUMMARIES: dict[str, str] = {r.code.value: r.summary for r in RULES} | {
    PlanReason.DUPLICATE.value: "same as another layout (a knob that has no effect here)",
    PlanReason.MEMORY.value: "predicted peak memory exceeds the card",
}


def ineffective(cols: Columns) -> dict[str, np.ndarray]:
    """Where each collapsible knob is a no-op: layouts differing only there run identically.

    sequence parallel at tp=1, a pipeline schedule at pp=1, virtual stages outside the
    interleaved schedule, data-parallel sharding at dp=1.
    """
    return {
        "sequence_parallel": cols["tp"] <= 1,
        "pp_schedule": cols["pp"] <= 1,
        "virtual_stages": cols["chunks"] <= 1,
        "sharding": cols["dp"] <= 1,
    }
