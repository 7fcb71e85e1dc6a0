"""The built-in trainer (`sweeper.runtime`, torch): its memory recipe is the reference the others depart from."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from sweeper.estimate.memory import compute_bytes
from sweeper.knobs import KNOBS
from sweeper.packages import flash_attn_major
from sweeper.spec.memory_options import BuiltinMemory, MemoryOptions
from sweeper.spec.traits import TimeTraits
from sweeper.trainers.base import Arrays, ParsedLog, Recipe, Trainer, unit_params

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep

# Mixed-precision AdamW as the trainer runs it (fp32 master weights, bf16 compute copies):
# weights 4 + 2, gradients 4, Adam moments 4 + 4 = 18 bytes per parameter unsharded.
MASTER_BYTES = 4
GRAD_BYTES = 4
ADAM_BYTES = 8


def builtin_state_bytes(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The built-in trainer's (and torchtitan's) model states for `params` parameters on a rank.

    none (DDP): 4 master + 2 compute copy, 4 grad, 8 Adam per parameter. zero1 (DDP with a
    ZeRO-1 optimizer): Adam states / dp. fsdp (FSDP2): master, grads and Adam / dp, plus the
    unsharded 16-bit parameters of two blocks (the one computing and the one prefetched) and
    one block's unsharded gradient (e bytes) with its fp32 reduce-scatter buffer; with pp > 1
    the stage keeps its parameters unsharded across micro-batches (no re-gather per micro-batch)
    and its whole unsharded fp32 gradient until the last micro-batch (gradients are reduced
    once, after the schedule).
    """
    e = compute_bytes(sweep)
    dp = np.maximum(cols["dp"], 1).astype(float)
    sharding = cols["sharding"]
    copy = e if e < 4 else 0  # the 16-bit compute copy; none when computing in fp32
    fsdp = sharding == "fsdp"
    unit = unit_params(cols, sweep)
    gathered = np.where(cols["pp"] > 1, params * e, 2 * unit * e)
    weights = np.where(fsdp, MASTER_BYTES * params / dp + gathered, (MASTER_BYTES + copy) * params)
    unsharded_grads = np.where(cols["pp"] > 1, GRAD_BYTES * params, unit * (e + 4))
    grads = np.where(fsdp, GRAD_BYTES * params / dp + unsharded_grads, GRAD_BYTES * params)
    optimizer = np.where(sharding == "none", ADAM_BYTES * params, ADAM_BYTES * params / dp)
    return weights, grads, optimizer


class BuiltinRecipe(Recipe):
    """DDP, DDP with a ZeRO-1 optimizer, or FSDP2, as `sweeper.runtime` runs them."""

    name = "builtin"
    options: ClassVar[type[MemoryOptions]] = BuiltinMemory
    # the built-in trainer leaves PYTORCH_CUDA_ALLOC_CONF alone: a small gap over allocated
    reserved_factor = 1.05

    def states(self, cols: Columns, sweep: Sweep, params: np.ndarray) -> Arrays:
        return (*builtin_state_bytes(cols, sweep, params), np.zeros(np.shape(params)))


class Builtin(Trainer):
    """The built-in PyTorch trainer: one process per GPU, started by the launcher."""

    kind = "builtin"
    recipe = BuiltinRecipe()
    # every kernel; flash1 only where the flash-attn 1.x package is installed (`attention_missing`)
    attention: ClassVar[frozenset[str]] = frozenset(KNOBS["attention"].choices)
    runs_command = False
    # torch's Schedule1F1B refuses fewer micro-batches than stages; there the built-in trainer runs
    # ScheduleGPipe (sweeper.runtime.parallel.build_pipeline). With m < pp a 1F1B's first stage warms
    # up all m forwards before its first backward anyway: the same bubble and the same peak on stage
    # 0; later stages hold m micro-batches instead of fewer
    runs_short_1f1b = True
    short_1f1b_as_gpipe = True
    # sweeper.runtime.context: each rank gathers the cp group's keys and values and runs SDPA
    # pinned to the knob's backend, each local chunk over its prefix with a lower-right causal
    # bias (torch.nn.attention.bias.causal_lower_right). The flash and efficient kernels take
    # that bias natively (CUDA), math materialises it (as does the CPU flash kernel); torch has no
    # cuDNN path for it (it would fall back to a materialised mask, untested with cuDNN): no cudnn
    cp_attention = frozenset({"flash2", "sdpa_efficient", "sdpa_math"})
    routers = frozenset({"softmax"})  # sweeper.runtime.moe's router is a softmax over the gate
    expert_tp = "one"  # sweeper.runtime.moe keeps each expert whole on one rank
    # cp gathers the group's keys and values before the attention kernel (torchtitan's default
    # context_parallel_rotate_method "allgather"; the built-in trainer's CPU path likewise)
    time: ClassVar[TimeTraits] = TimeTraits(cp_ring=False, torch_dp_wrappers=True, zero1_broadcasts=True)

    def attention_missing(self) -> dict[str, str]:
        """flash1 runs on the flash-attn 1.x package (sweeper.runtime.kernels), which clusters
        rarely have (flash-attn 2 replaced it): without it here the plan refuses flash1, as the
        kernel probe of a trial and of `sweep selftest` would (the same `flash_attn_major`)."""
        major = flash_attn_major()
        if major == 1:
            return {}
        have = "not installed" if major is None else f"{major}.x"
        return {"flash1": f"needs the flash-attn 1.x package, and flash-attn here is {have}"}

    def runs_cp(self, cols: Columns) -> np.ndarray:
        """cp > 1 runs with tp (and SP), pp (1F1B, interleaved, a tied head) and dp, each checked
        against one process (tests/runtime); not under torch.compile (the all-gather's autograd
        function and the per-chunk SDPA calls under a fullgraph compile are not tested)."""
        return super().runs_cp(cols) & ~cols["compile"].astype(bool)

    def cp_refusal(self, cols: Columns, i: int) -> str:
        if not super().runs_cp(cols)[i]:
            return super().cp_refusal(cols, i)
        return f"the {self.kind} trainer runs cp > 1 only with compile off"

    def runs_experts(self, cols: Columns) -> np.ndarray:
        """A mixture of experts runs with tp = 1 (the tensor-parallel plan has no MoE block),
        without torch.compile (the router's data-dependent split under a fullgraph compile is
        not tested), without float8 (the grouped experts are no nn.Linear), and ep > 1 without
        FSDP (which would shard and average the ep-sharded experts over ranks holding other
        experts). With pp, cp and dp it is checked against one process (tests/runtime)."""
        blocked = _moe_blocker(cols) != ""
        fsdp_ep = (cols["ep"] > 1) & (cols["sharding"] == "fsdp")
        return super().runs_experts(cols) & ~blocked & ~fsdp_ep & ~cols["float8"].astype(bool)

    def experts_refusal(self, cols: Columns, i: int) -> str:
        # tp first: at tp > 1 no etp value helps, and a message about etp would send the user there
        why = _moe_blocker(cols)[i]
        if why:
            return f"the {self.kind} trainer runs a mixture of experts only with {why}"
        if not super().runs_experts(cols)[i]:
            return super().experts_refusal(cols, i)
        if cols["float8"][i]:
            return f"the {self.kind} trainer runs no float8 mixture of experts (its grouped experts are no nn.Linear)"
        return f"the {self.kind} trainer runs ep > 1 with sharding none or zero1 only, not fsdp"

    def parse_log(self, text: str, sweep: Sweep) -> ParsedLog:
        raise TypeError("the built-in trainer reports its steps itself; it has no log to parse")


def _moe_blocker(cols: Columns) -> np.ndarray:
    """Per row, what the built-in trainer needs for a mixture of experts and the row lacks
    ("" where it has it): tp = 1, pp = 1, compile off."""

    def why(tp: int, compiled: bool) -> str:
        if tp > 1:
            return f"tp = 1, not tp = {tp} (it has no tensor-parallel MoE block; no etp value changes that)"
        return "compile off" if compiled else ""

    rows = zip(cols["tp"].tolist(), cols["compile"].astype(bool).tolist(), strict=True)
    return np.array([why(*row) for row in rows], dtype=object)
