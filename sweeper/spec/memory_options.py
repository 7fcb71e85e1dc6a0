"""`memory:` of the sweep file: the options every memory recipe takes, and each recipe's own.

Declared here, below the trainers, because the sweep file's `memory` is their union (told apart by
`recipe`); the recipes that read them (how each trainer holds memory) are in `sweeper.trainers`,
each naming its options class (`Recipe.options`). Pure pydantic.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    # as the rest of the sweep file: a typo or a "64" for 64 must not change a sweep quietly
    # allow_inf_nan=False: .nan and .inf are refused as such ("a finite number"), not by a bound
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# A cross-entropy kernel the trainer runs in place of its recipe's loss (`memory.loss_kernel`).
# fused: one kernel over the e-byte logits, as flash-attn's `CrossEntropyLoss`
# (flash_attn/ops/triton/cross_entropy.py since v2.4: it saves the logits it was given and an fp32
# log-sum-exp per token, and backward writes `torch.empty_like(logits)`), the loss llm-foundry's
# MPT trains with unless told otherwise (`loss_fn` default `fused_crossentropy`, modeling_mpt.py)
LossKernel = Literal["fused"]


class MemoryOptions(_Strict):
    """`memory:` of the sweep file: the fields every recipe takes. A recipe's subclass narrows
    `recipe` to its name and adds its own options; the sweep file's `memory` is the union of
    them, told apart by `recipe` (default: the recipe of `workload.kind`'s trainer)."""

    # options added after results folders were recorded: the sweep's identity leaves them out
    # while unset, so those folders keep theirs (as `ModelShape.LATE_FIELDS`)
    LATE_FIELDS: ClassVar[tuple[str, ...]] = ("loss_kernel",)

    recipe: str
    headroom: float = Field(default=0.05, ge=0, lt=1, description="share of the card kept free")
    overhead_gib: float | None = Field(
        default=None, ge=0, le=1000, description="fixed per-process overhead; default by device type"
    )
    reserved_factor: float | None = Field(
        default=None, ge=1, le=3, description="reserved / allocated of the caching allocator; default by recipe"
    )
    probe_margin: float = Field(
        default=0.05, ge=0, le=1, description="a pruned layout within this share of the card may get one probe trial"
    )
    loss_kernel: LossKernel | None = Field(
        default=None,
        description="the trainer's cross-entropy kernel where not the recipe's: fused (flash-attn's, llm-foundry's MPT)",
    )


STATE_PARTS = ("params", "grads", "master", "optimizer")


class StateBytes(_Strict):
    """Bytes per parameter of each model state, and which of them are sharded over data parallel
    (when the layout's sharding is not none): a table recipe's answer, and `memory.bytes`."""

    params: float = Field(ge=0, le=64, description="the parameters the forward reads (2: bf16)")
    grads: float = Field(ge=0, le=64, description="the gradients kept between backward and the step")
    master: float = Field(default=0, ge=0, le=64, description="fp32 master weights held by the optimizer")
    optimizer: float = Field(ge=0, le=64, description="optimizer states (AdamW: 8 in fp32)")
    sharded: list[Literal["params", "grads", "master", "optimizer"]] = Field(
        default_factory=list, description="states divided over data parallel"
    )


class BuiltinMemory(MemoryOptions):
    recipe: Literal["builtin"] = "builtin"


class MegatronMemory(MemoryOptions):
    recipe: Literal["megatron"] = "megatron"
    distributed_optimizer: bool | None = Field(
        default=None,
        description="megatron: --use-distributed-optimizer always (true), never (false), or as sharding says",
    )
    grad_accum_dtype: Literal["fp32", "bf16"] | None = Field(
        default=None,
        description="megatron/deepspeed: dtype of the accumulated gradients (megatron fp32, deepspeed bf16)",
    )


class TorchtitanMemory(MemoryOptions):
    recipe: Literal["torchtitan"] = "torchtitan"
    compiled_loss: bool | None = Field(
        default=None,
        description="torchtitan: whether compile also compiles the loss (torchtitan since Feb 2025); default true",
    )


# ---- memory ---------------------------------------------------------------------------------
class NanotronMemory(MemoryOptions):
    recipe: Literal["nanotron"] = "nanotron"


class DeepSpeedMemory(MemoryOptions):
    recipe: Literal["deepspeed"] = "deepspeed"
    grad_accum_dtype: Literal["fp32", "bf16"] | None = Field(
        default=None,
        description="megatron/deepspeed: dtype of the accumulated gradients (megatron fp32, deepspeed bf16)",
    )
    zero_stage: int | None = Field(
        default=None, ge=0, le=3, description="deepspeed: ZeRO stage; default as sharding says"
    )


class ExplicitMemory(MemoryOptions):
    recipe: Literal["explicit"] = "explicit"
    bytes: StateBytes | None = Field(default=None, description="explicit recipe: bytes per parameter")

    @model_validator(mode="after")
    def _bytes_given(self) -> ExplicitMemory:
        if self.bytes is None:
            raise ValueError(
                "memory.bytes is required for recipe explicit: {params, grads, master, optimizer, sharded}"
            )
        return self


# every recipe's options, in the trainers' registry order (`sweeper.trainers.RECIPES`, which checks it)
OPTION_TYPES: tuple[type[MemoryOptions], ...] = (
    BuiltinMemory,
    MegatronMemory,
    TorchtitanMemory,
    NanotronMemory,
    DeepSpeedMemory,
    ExplicitMemory,
)
