"""Layouts: one frozen value per parallel configuration, and the validity rules of DESIGN.md.

Each rule is written once over columns of numpy arrays, so the same code checks one `Layout`
(as one-row columns) and a whole cross product of a million layouts (see `sweeper.plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.knobs import KNOBS
from sweeper.statuses import PlanReason

if TYPE_CHECKING:
    # the sweep file's loader checks sweeps against these rules: no import of the spec at run time
    from sweeper.spec.schema import Sweep

Columns = Mapping[str, np.ndarray]


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
        return cls(**{k: _python(v) for k, v in values.items()})


def _python(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


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


@dataclass(frozen=True)
class Rule:
    """A validity rule: `broken` marks the rows that violate it; `explain` says why for one row."""

    code: PlanReason
    summary: str
    broken: Callable[[Columns, Sweep], np.ndarray]
    explain: Callable[[Columns, Sweep, int], str]


# trainers whose expert-parallel groups may take tensor-parallel ranks where etp < tp
def _expert_ranks(c: Columns, s: Sweep) -> np.ndarray:
    """Ranks of a pipeline stage the experts are split over: dp*cp, times tp where the trainer folds."""
    base = c["dp"] * c["cp"]
    return base * c["tp"] if s.trainer.folds_experts_over_tp else base


def _expert_tp(c: Columns, s: Sweep) -> np.ndarray:
    """The expert tensor-parallel degree those ranks also hold, where the trainer folds over tp (else 1)."""
    return c["etp"] if s.trainer.folds_experts_over_tp else np.ones_like(c["etp"])


def _i(cols: Columns, name: str, i: int) -> Any:
    return _python(cols[name][i])


def _product(c: Columns, i: int, knobs: tuple[str, ...]) -> str:
    """`tp*cp*pp = 2*2*4`, leaving out the factors at 1 that are not always shown (cp of a dense run)."""
    shown = [k for k in knobs if KNOBS[k].always_shown or _i(c, k, i) != 1]
    return f"{'*'.join(shown)} = {'*'.join(str(_i(c, k, i)) for k in shown)}"


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
    pp = _i(c, "pp", i)
    need = pp if _i(c, "pp_schedule", i) == "interleaved" else _python(s.trainer.fewest_1f1b_microbatches(c["pp"])[i])
    return "one per stage" if need == pp else str(need)


def _knob_not_in_trainer(c: Columns, s: Sweep) -> np.ndarray:
    out = np.zeros(len(c["tp"]), dtype=bool)
    for knob, values in s.trainer.lacks.items():
        out |= np.isin(c[knob], list(values))
    return out


def _knob_not_in_trainer_why(c: Columns, s: Sweep, i: int) -> str:
    lacking = [
        f"{knob} = {_python(c[knob][i])}: {why}"
        for knob, values in s.trainer.lacks.items()
        for value, why in values.items()
        if _python(c[knob][i]) == value
    ]
    return f"the {s.workload.kind} trainer cannot run " + "; ".join(lacking)


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
        lambda c, s, i: f"tp = {_i(c, 'tp', i)} exceeds gpus_per_node = {s.cluster.gpus_per_node}",
    ),
    Rule(
        PlanReason.HEADS_NOT_DIVISIBLE,
        "tp does not divide the attention heads",
        lambda c, s: s.model.heads % c["tp"] != 0,
        lambda c, s, i: f"tp = {_i(c, 'tp', i)} does not divide heads = {s.model.heads}",
    ),
    Rule(
        PlanReason.KV_HEADS_NOT_DIVISIBLE,
        "tp does not divide the key/value heads",
        lambda c, s: s.model.kv_heads % c["tp"] != 0,
        lambda c, s, i: f"tp = {_i(c, 'tp', i)} does not divide kv_heads = {s.model.kv_heads}",
    ),
    Rule(
        PlanReason.FFN_NOT_DIVISIBLE,
        "tp does not divide the MLP width",
        lambda c, s: s.model.ffn % c["tp"] != 0,
        lambda c, s, i: f"tp = {_i(c, 'tp', i)} does not divide ffn = {s.model.ffn}",
    ),
    # pp need not divide the layers: stages get ceil/floor layer counts (sweeper.stages), as
    # Megatron-LM and torchtitan run them; each stage needs at least one layer
    Rule(
        PlanReason.PP_EXCEEDS_LAYERS,
        "more pipeline stages than layers",
        lambda c, s: c["pp"] > s.model.layers,
        lambda c, s, i: f"pp = {_i(c, 'pp', i)} exceeds layers = {s.model.layers} (each stage needs a layer)",
    ),
    Rule(
        PlanReason.BATCH_NOT_DIVISIBLE,
        "micro_batch_size*dp does not divide the global batch",
        lambda c, s: (c["dp"] == 0) | (s.global_batch_size % np.maximum(c["micro_batch_size"] * c["dp"], 1) != 0),
        lambda c, s, i: (
            f"micro_batch_size*dp = {_i(c, 'micro_batch_size', i)}*{_i(c, 'dp', i)} does not divide "
            f"global_batch_size = {s.global_batch_size}"
        ),
    ),
    Rule(
        PlanReason.SEQ_NOT_DIVISIBLE,
        "sequence parallel needs tp to divide each cp rank's part of seq_len",
        lambda c, s: c["sequence_parallel"].astype(bool) & (s.seq_len % (c["tp"] * c["cp"]) != 0),
        lambda c, s, i: (
            f"sequence_parallel with tp = {_i(c, 'tp', i)} needs it to divide seq_len/cp = {s.seq_len}/{_i(c, 'cp', i)}"
        ),
    ),
    # Megatron-LM and torchtitan cut each sequence into 2*cp chunks, rank i holding chunks i and
    # 2*cp-1-i, so that every rank gets the same causal-attention work
    Rule(
        PlanReason.CP_SEQ_NOT_DIVISIBLE,
        "context parallel needs 2*cp to divide seq_len",
        lambda c, s: (c["cp"] > 1) & (s.seq_len % (2 * c["cp"]) != 0),
        lambda c, s, i: (
            f"cp = {_i(c, 'cp', i)} needs 2*cp = {2 * _i(c, 'cp', i)} to divide seq_len = {s.seq_len} "
            "(each rank holds two of 2*cp equal chunks)"
        ),
    ),
    Rule(
        PlanReason.CP_NOT_IN_WORKLOAD,
        "context parallel with an attention kernel or layout the workload's trainer does not run it with",
        lambda c, s: (c["cp"] > 1) & ~s.trainer.runs_cp(c),
        lambda c, s, i: s.trainer.cp_refusal(c, i),
    ),
    Rule(
        PlanReason.EP_WITHOUT_EXPERTS,
        "expert parallel on a model without experts",
        lambda c, s: (c["ep"] > 1) & (s.model.experts == 0),
        lambda c, s, i: f"ep = {_i(c, 'ep', i)} needs a model with experts (model.experts); {s.model.name} is dense",
    ),
    Rule(
        PlanReason.EP_EXPERTS_NOT_DIVISIBLE,
        "ep does not divide the experts",
        lambda c, s: (s.model.experts > 0) & (s.model.experts % c["ep"] != 0),
        lambda c, s, i: f"ep = {_i(c, 'ep', i)} does not divide experts = {s.model.experts}",
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
            f"ep*etp = {_i(c, 'ep', i)}*{_i(c, 'etp', i)} does not divide dp*cp*tp = {_i(c, 'dp', i)}*"
            f"{_i(c, 'cp', i)}*{_i(c, 'tp', i)} (the experts are split over a stage's data- and context-parallel "
            "ranks, and its tensor-parallel ranks where etp < tp)"
            if s.trainer.folds_experts_over_tp
            else f"ep = {_i(c, 'ep', i)} does not divide dp*cp = {_i(c, 'dp', i)}*{_i(c, 'cp', i)} (the "
            f"{s.workload.kind} trainer splits the experts over data- and context-parallel ranks)"
        ),
    ),
    Rule(
        PlanReason.ETP_FFN_NOT_DIVISIBLE,
        "etp does not divide each expert's width",
        lambda c, s: (s.model.experts > 0) & (s.model.expert_ffn % c["etp"] != 0),
        lambda c, s, i: f"etp = {_i(c, 'etp', i)} does not divide moe_ffn = {s.model.expert_ffn}",
    ),
    Rule(
        PlanReason.EXPERT_WORLD_NOT_DIVISIBLE,
        "etp*ep*pp does not divide the number of GPUs",
        lambda c, s: (s.model.experts > 0) & (s.cluster.world % (c["etp"] * c["ep"] * c["pp"]) != 0),
        lambda c, s, i: (
            f"etp*ep*pp = {_i(c, 'etp', i)}*{_i(c, 'ep', i)}*{_i(c, 'pp', i)} does not divide world = "
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
            f"the {s.workload.kind} trainer runs ep = {_i(c, 'ep', i)} with tp = {_i(c, 'tp', i)} only "
            "with sequence_parallel"
        ),
    ),
    Rule(
        PlanReason.TOO_FEW_MICROBATCHES,
        "1F1B with fewer micro-batches than stages, where the trainer refuses it",
        lambda c, s: _short_1f1b_refused(c, s),
        lambda c, s, i: (
            f"grad_accum = {_i(c, 'grad_accum', i)} micro-batches is fewer than pp = {_i(c, 'pp', i)} stages: "
            f"the {s.workload.kind} trainer's {_i(c, 'pp_schedule', i)} schedule needs at least {_fewest(c, s, i)}"
        ),
    ),
    Rule(
        PlanReason.INTERLEAVED_VIRTUAL_STAGES,
        "interleaved schedule needs virtual_stages >= 2",
        lambda c, s: (c["pp"] > 1) & (c["pp_schedule"] == "interleaved") & (c["virtual_stages"] < 2),
        lambda c, s, i: f"pp_schedule = interleaved needs virtual_stages >= 2, got {_i(c, 'virtual_stages', i)}",
    ),
    Rule(
        PlanReason.INTERLEAVED_LAYERS,
        "pp*virtual_stages exceeds the layers",
        lambda c, s: (c["chunks"] > 1) & (c["pp"] * c["chunks"] > s.model.layers),
        lambda c, s, i: (
            f"interleaved: pp*virtual_stages = {_i(c, 'pp', i)}*{_i(c, 'virtual_stages', i)} "
            f"exceeds layers = {s.model.layers} (each model chunk needs a layer)"
        ),
    ),
    Rule(
        PlanReason.INTERLEAVED_MICROBATCHES,
        "interleaved 1F1B needs micro-batches in whole rounds",
        lambda c, s: (c["chunks"] > 1) & ~_microbatch_rounds_ok(c),
        lambda c, s, i: (
            f"interleaved: grad_accum = {_i(c, 'grad_accum', i)} is not a multiple of its "
            f"{max(1, _i(c, 'grad_accum', i) // _i(c, 'pp', i))} rounds of pp = {_i(c, 'pp', i)}"
        ),
    ),
    Rule(
        PlanReason.KERNEL_NOT_IN_WORKLOAD,
        "an attention kernel the workload's trainer does not have",
        lambda c, s: ~np.isin(c["attention"], sorted(s.trainer.attention)),
        lambda c, s, i: (
            f"the {s.workload.kind} trainer has no attention kernel "
            f"{' or '.join(sorted(set(KNOBS['attention'].choices) - s.trainer.attention))}"
        ),
    ),
    Rule(
        PlanReason.KNOB_NOT_IN_TRAINER,
        "a knob value the workload's trainer has no way to run",
        _knob_not_in_trainer,
        _knob_not_in_trainer_why,
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
