"""The searchable knobs of a layout, each defined once: type, allowed values, default, label and help.

Everything else that names the knobs (`Layout`'s fields, `SpaceSpec`, `TrialResult`, the results
schema, every table's column labels and fixed columns, the knobs of one-line layouts, the values
that mean "no effect") is generated from `KNOBS`, or pinned to it by `tests/common/test_knobs.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# layouts as columns: one array per knob (and per derived column: dp, grad_accum, ...), a row per layout
Columns = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Knob:
    """One dimension of the search space."""

    name: str
    kind: type  # int, bool or str
    default: Any
    help: str
    choices: tuple[str, ...] = ()  # for str knobs: the allowed values, in a stable order
    label: str = ""  # short column label in tables ("mbs"); the name when empty
    # The value this knob behaves as where it has no effect (sequence parallel at tp=1, ...);
    # None for a knob that always takes effect. Layouts that differ only there run identically.
    no_effect: Any = None
    # Named sets of choices other modules ask about, e.g. attention kernels that keep the s x s scores.
    properties: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Tables show this knob even when it does not vary (the others appear when they vary).
    always_shown: bool = False
    # One-line summaries of a layout name it (the live display of `sweep run`, `sweep status`).
    in_summary: bool = False
    # Left out of a sweep's identity while the space holds only its default: knobs added after
    # results folders existed, so that those folders keep their identity (sweeper.results.identity).
    identity_if_searched: bool = False
    # Where the space does not list this knob, each layout takes the value of the named knob
    # (etp follows tp, as Megatron-LM's --expert-tensor-parallel-size defaults to the tp size).
    follows: str = ""
    # One-line summaries name it where a layout departs from its neutral value (`neutral`): cp, ep
    # and etp, which most layouts leave at 1 (etp at tp), so that a dense run's lines stay short.
    in_summary_when_set: bool = False

    @property
    def short(self) -> str:
        return self.label or self.name

    def neutral(self, values: Mapping[str, Any]) -> Any:
        """The value that says nothing in a layout of `values`: the followed knob's value, else the default."""
        return values.get(self.follows) if self.follows else self.default

    def with_property(self, prop: str) -> tuple[str, ...]:
        """The choices that have `prop`, in the knob's order (KeyError for an unknown property)."""
        members = self.properties[prop]
        return tuple(c for c in self.choices if c in members)


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        Knob("tp", int, 1, "tensor-parallel degree (within a node)", always_shown=True, in_summary=True),
        Knob("pp", int, 1, "pipeline-parallel degree (number of pipeline stages)", always_shown=True, in_summary=True),
        Knob(
            "micro_batch_size",
            int,
            1,
            "sequences per micro-batch on one data-parallel rank",
            label="mbs",
            always_shown=True,
            in_summary=True,
        ),
        Knob(
            "sequence_parallel",
            bool,
            False,
            "shard norms and residuals along the sequence (needs tp > 1)",
            label="sp",
            no_effect=False,
            in_summary=True,
        ),
        Knob(
            "activation_checkpointing",
            str,
            "none",
            "recompute in backward: none, selective (cheap ops only), ffn (the MLP only), full (every block)",
            ("none", "selective", "ffn", "full"),
            label="ckpt",
            in_summary=True,
        ),
        Knob(
            "attention",
            str,
            "flash2",
            "attention kernel; eager, fused_softmax and sdpa_math materialise the s x s scores",
            ("eager", "fused_softmax", "sdpa_math", "flash1", "flash2", "sdpa_efficient", "cudnn"),
            label="attn",
            properties={"keeps_scores": frozenset({"eager", "fused_softmax", "sdpa_math"})},
            in_summary=True,
        ),
        Knob(
            "rmsnorm", str, "eager", "RMSNorm kernel: eager (plain ops) or fused", ("eager", "fused"), in_summary=True
        ),
        Knob(
            "sharding",
            str,
            "none",
            "data-parallel sharding: none (DDP), zero1 (optimizer states), fsdp (FSDP2, everything)",
            ("none", "zero1", "fsdp"),
            no_effect="none",
        ),
        Knob(
            "pp_schedule",
            str,
            "1f1b",
            "pipeline schedule: 1f1b, gpipe, interleaved (1F1B with virtual stages)",
            ("1f1b", "gpipe", "interleaved"),
            label="schedule",
            no_effect="1f1b",
        ),
        Knob(
            "virtual_stages",
            int,
            1,
            "model chunks per pipeline rank for the interleaved schedule",
            label="v",
            no_effect=1,
        ),
        Knob("compile", bool, False, "torch.compile each transformer block"),
        Knob("float8", bool, False, "float8 matmuls (torchao; GPUs with fp8 only)"),
        Knob(
            "cp",
            int,
            1,
            "context-parallel degree: each sequence split over cp ranks in 2*cp load-balanced chunks",
            identity_if_searched=True,
            in_summary_when_set=True,
        ),
        Knob(
            "ep",
            int,
            1,
            "expert-parallel degree: the experts split over ep ranks inside dp*cp (MoE models only)",
            identity_if_searched=True,
            in_summary_when_set=True,
        ),
        Knob(
            "etp",
            int,
            0,
            "tensor-parallel degree inside each expert (MoE models only); default: tp, as Megatron-LM",
            identity_if_searched=True,
            follows="tp",
            in_summary_when_set=True,
        ),
    ]
}

# Column labels of every table: the knobs' short labels, and the derived values beside them.
LABELS: dict[str, str] = {k: knob.short for k, knob in KNOBS.items()}

# The knobs every table shows, and those a one-line summary of a layout names, in the table's order.
ALWAYS_SHOWN: tuple[str, ...] = tuple(k for k, knob in KNOBS.items() if knob.always_shown)
SUMMARY_KNOBS: tuple[str, ...] = tuple(k for k, knob in KNOBS.items() if knob.in_summary)
# The knobs a one-line summary names only where they depart from their neutral value.
SUMMARY_WHEN_SET: tuple[str, ...] = tuple(k for k, knob in KNOBS.items() if knob.in_summary_when_set)

# Knobs that have no effect in some layouts, and the value they then behave as.
NO_EFFECT_VALUE: dict[str, Any] = {k: knob.no_effect for k, knob in KNOBS.items() if knob.no_effect is not None}


def set_knobs(values: Mapping[str, Any]) -> list[str]:
    """The knobs of SUMMARY_WHEN_SET that `values` sets away from their neutral value (cp=2, etp=1 at tp=2)."""
    return [k for k in SUMMARY_WHEN_SET if _known(values.get(k)) and values[k] != KNOBS[k].neutral(values)]


def shown_in_tables(name: str, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a table over `rows` shows this knob: it takes more than one value, and, for a knob
    that follows another (etp), departs from it somewhere (etp = tp everywhere says nothing new)."""
    known = [r for r in rows if _known(r.get(name))]
    if len({r[name] for r in known}) < 2:
        return False
    follows = KNOBS[name].follows if name in KNOBS else ""
    return not follows or any(_known(r.get(follows)) and r[name] != r[follows] for r in known)


def _known(v: Any) -> bool:
    """Not missing: None, or NaN where a results column predates the knob."""
    return v is not None and v == v


def label(name: str) -> str:
    """The short table label of a knob or column (the name itself for anything not a knob)."""
    return LABELS.get(name, name)


def layout_line(values: Mapping[str, Any], fmt: Callable[[Any], str] = str) -> str:
    """A layout in one line: tp, pp, dp, mbs, grad_accum, then every other knob as `label=value`."""
    base = [
        f"tp={values['tp']}",
        f"pp={values['pp']}",
        f"dp={values['dp']}",
        f"mbs={values['micro_batch_size']}",
        f"grad_accum={values['grad_accum']}",
    ]
    return " ".join(base + [f"{label(k)}={fmt(values[k])}" for k in KNOBS if k not in ALWAYS_SHOWN])
