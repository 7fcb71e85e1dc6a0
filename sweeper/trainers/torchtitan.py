"""torchtitan: the built-in trainer's states with its own checkpointing policy, loss and
allocator settings; its flags (`sweeper.trainers.export`, 0.3.x overrides) and its metrics log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sweeper.estimate.memory import compute_bytes, per_token_terms
from sweeper.spec.memory_options import TorchtitanMemory
from sweeper.spec.traits import TimeTraits
from sweeper.trainers.base import ParsedLog, Trainer
from sweeper.trainers.builtin import BuiltinRecipe
from sweeper.trainers.export import to_torchtitan, to_torchtitan_cli, torchtitan_cli_args

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep


def torchtitan_loss_bytes(cols: Columns, sweep: Sweep, e: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) bytes per logit of torchtitan's loss, `cross_entropy(pred.float(), labels)`
    (torchtitan/components/loss.py), with the e-byte `pred` dropped before backward (train.py:
    `del pred`). Peaks counted tensor by tensor from the code that runs:

    - eager, no tensor parallel: forward pred + its fp32 copy + the fp32 log-softmax (e + 8);
      backward nll_loss_backward's dense fp32 gradient (zeros, then scattered) and
      log_softmax_backward's fp32 output beside the kept log-softmax: 12 bytes.
    - eager under loss parallel (tp > 1: torchtitan's default, `disable_loss_parallel` false;
      logits stay vocab-sharded): torch/distributed/tensor/parallel/loss.py runs log-softmax as
      `shifted = x - max; sum(exp(shifted)); shifted - logsumexp` (pred, x, shifted, exp: e + 12)
      and its backward as `(zeros_like(x) scattered + exp(x)) * grad` beside the kept x: 16 bytes.
    - compiled (torchtitan compiles the loss with the model since d1f62be, Feb 2025:
      `build_cross_entropy_loss`; it did from e10cb94, Oct 2024, until e8977b0, Dec 2024, and
      not in between: `memory.compiled_loss: false` says so): Inductor fuses the
      cast, log-softmax and its backward, so the graph keeps the e-byte pred (and per-token
      statistics) and writes one e-byte gradient: e + e. Only without tensor parallel: whether
      the DTensor loss-parallel handlers fuse under compile is not established, so tp > 1 keeps
      the eager count (an over-estimate at worst).
    """
    tp = cols["tp"] > 1
    compiled_loss = getattr(sweep.memory, "compiled_loss", None)
    compiled = cols["compile"].astype(bool) & ~tp & (compiled_loss is not False)
    kept = np.where(compiled, float(e), 4.0)
    peak = np.select([compiled, tp], [2.0 * e, 16.0], default=12.0)
    return kept, peak - kept


class TorchtitanRecipe(BuiltinRecipe):
    """The built-in trainer's model states (FSDP2, DDP); activations, loss and allocator its own."""

    name = "torchtitan"
    options = TorchtitanMemory
    # run_train.sh sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which keeps the gap small
    reserved_factor = 1.03

    def activations(
        self, cols: Columns, sweep: Sweep, kept: np.ndarray, transient: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """torchtitan's `selective`: its op-level policy (torchtitan/models/llama3/infra/parallelize.py,
        `_apply_ac_to_transformer_block`, "Saves output of all compute ops, except every second mm")
        keeps the 1st, 3rd, 5th and 7th matmul of a SwiGLU block (wq, wv, w1, w2) and recomputes
        wk, wo and w3: e*(kv/t + h + ffn/t) bytes per token fewer kept, materialised again one
        block at a time in backward. Eager (no `compile`), that recomputation runs every op of the
        block the policy did not save (torch.utils.checkpoint's selective mode replays the block's
        forward in backward), so the block's whole unsaved activation exists at once, as under full
        checkpointing: the transient is the block's none-mode activation less what stays kept.
        Compiled, Inductor fuses the replayed elementwise ops (norms, SiLU, RoPE) and only the
        recomputed matmul outputs are materialised.
        """
        m = sweep.model
        if m.mlp != "swiglu":
            return kept, transient
        e = compute_bytes(sweep)
        t = cols["tp"].astype(float)
        tokens = sweep.seq_len * cols["micro_batch_size"]
        recomputed = e * (m.kv_dim / t + m.hidden + m.ffn / t) * tokens
        selective = cols["activation_checkpointing"] == "selective"
        p = per_token_terms(cols, sweep)
        kept_tt = kept - recomputed
        replay = np.where(
            cols["compile"].astype(bool), transient + recomputed, (p["attention"] + p["mlp"]) * tokens - kept_tt
        )
        return np.where(selective, kept_tt, kept), np.where(selective, replay, transient)

    def loss_bytes(self, cols: Columns, sweep: Sweep) -> tuple[np.ndarray | float, np.ndarray | float]:
        return torchtitan_loss_bytes(cols, sweep, compute_bytes(sweep))


# torchtitan/components/metrics.py, MetricsProcessor.log() (torchtitan main, 2025):
#  "step:  2  loss:  6.1098  grad_norm:  4.6416  memory:  2.49GiB(3.14%)  tps: 177,138  tflops: 96.17  mfu: 9.72%"
_TITAN_STEP = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([-+\d.Ee]+)(?:\s+grad_norm:\s*[-+\d.Ee]+)?\s+memory:\s*([\d.]+)GiB\([\d.]+%\)"
    r"\s+tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)"
)


def parse_torchtitan(text: str, *, tokens_per_step_per_device: float) -> ParsedLog:
    """torchtitan logs tokens/s per device (tps): step time = tokens per step per device / tps.

    Its memory figure is max reserved; it is kept as the reserved peak.
    """
    out = ParsedLog()
    for m in _TITAN_STEP.finditer(text):
        tps = float(m.group(4).replace(",", ""))
        if tps <= 0:
            continue
        out.step_times_s.append(tokens_per_step_per_device / tps)
        out.losses.append(float(m.group(2)))
        out.reported_tflops.append(float(m.group(5).replace(",", "")))
        out.peak_mem_reserved_gib = max(out.peak_mem_reserved_gib or 0.0, float(m.group(3)))
    return out


def parse_torchtitan_of(text: str, sweep: Sweep) -> ParsedLog:
    """`parse_torchtitan` with the sweep's tokens per step per device."""
    return parse_torchtitan(
        text, tokens_per_step_per_device=sweep.global_batch_size * sweep.seq_len / sweep.cluster.world
    )


class Torchtitan(Trainer):
    """torchtitan 0.3.x (`torchrun ... -m torchtitan.train ... {flags}`); it picks its attention kernel itself."""

    kind = "torchtitan"
    recipe = TorchtitanRecipe()
    exports = {"torchtitan": to_torchtitan, "torchtitan-cli": to_torchtitan_cli}
    # torch's context_parallel shards SDPA (flash, memory-efficient, cuDNN); the math backend too
    cp_attention = frozenset({"flash2", "sdpa_efficient", "cudnn", "sdpa_math"})
    # 0.3 has no expert tensor-parallel degree: its expert mesh (pp, dp_replicate, efsdp, ep) takes the
    # ep ranks out of dp_shard*cp*tp, so under ep > 1 each expert is whole on its rank (etp = 1), and
    # without ep the experts are sharded as the dense MLP is, over tp (distributed/parallel_dims.py)
    expert_tp = "one_under_ep"
    # cp gathers the group's keys and values before the attention kernel (torchtitan's default
    # context_parallel_rotate_method "allgather"; the built-in trainer's CPU path likewise)
    time: ClassVar[TimeTraits] = TimeTraits(cp_ring=False)

    def flags(self, rec: Mapping[str, Any], steps: int) -> list[str]:
        args, _ = torchtitan_cli_args(rec)
        return ["--training.steps", str(steps), "--metrics.log_freq", "1", *args]

    def order_argv(self, argv: list[str], flags: list[str]) -> list[str]:
        # tyro hands every word after a subcommand to that subcommand: words of the template that
        # follow {flags} would be refused, so torchtitan's activation-checkpoint:MODE goes last
        sub = [w for w in flags if w.startswith("activation-checkpoint:")]
        return [w for w in argv if w not in sub] + sub

    def parse_log(self, text: str, sweep: Sweep) -> ParsedLog:
        return parse_torchtitan_of(text, sweep)
