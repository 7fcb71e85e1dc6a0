"""The context-parallel, expert-parallel and mixture-of-experts parts of the exports (`sweeper.trainers.export`).

Pure functions of a layout record (`export.layout_record`): a mixture of experts adds its model
fields to the record (`moe_fields`), and each trainer's export reads them here. Names and the rules
each trainer enforces are from the releases `sweeper.trainers.export` targets:

- Megatron-LM c1e938b: megatron/training/arguments.py (`--num-experts`, `--moe-layer-freq`,
  validate_args) and the flags generated from megatron/core/model_parallel_config.py and
  transformer/transformer_config.py (`--context-parallel-size`, `--expert-model-parallel-size`,
  `--expert-tensor-parallel-size`, `--moe-router-topk`, `--moe-ffn-hidden-size`, ...).
- torchtitan 0.2.2: `Parallelism.context_parallel_degree`, `expert_parallel_degree`,
  `expert_tensor_parallel_degree` (config/job_config.py); ParallelDims' sparse mesh
  (pp, dp_replicate, efsdp, ep, etp) with efsdp = dp_shard*cp*tp / (ep*etp), and etp = 1 or tp.
- torchtitan 0.3.0: no expert_tensor_parallel_degree; the sparse mesh is (pp, dp_replicate,
  efsdp, ep) with efsdp = dp_shard*cp*tp / ep ("EP borrows ranks from FSDP and TP"), so the routed
  experts are not tensor-parallel under ep > 1 and follow tp without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

# Our presets that torchtitan ships, as (0.2.x model name, 0.2.x flavor, 0.3.x module, 0.3.x config
# function or "" where 0.3 has none): models/qwen3 and models/gpt_oss of each release
TORCHTITAN_MOE_MODELS: dict[str, tuple[str, str, str, str]] = {
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3", "qwen3_30b_a3b"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B", "qwen3", ""),
    "gpt-oss-20b": ("gpt_oss", "20b", "gpt_oss", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "120b", "gpt_oss", "gpt_oss_120b"),
}


def moe_fields(sweep: Sweep) -> dict[str, Any]:
    """A mixture of experts' model fields and its total and active parameters; {} for a dense model
    (whose records stay as they were)."""
    m = sweep.model
    if not m.is_moe:
        return {}
    return {
        "model": m.name,
        "experts": m.experts,
        "experts_per_token": m.experts_per_token,
        "moe_ffn": m.expert_ffn,
        "shared_experts": m.shared_experts,
        "dense_layers": m.dense_layers,
        "router": m.router,
        "params": m.num_params,
        "active_params": m.active_params,
    }


def is_moe(rec: Mapping[str, Any]) -> bool:
    return bool(rec.get("experts"))


# ---- Megatron-LM -------------------------------------------------------------------------
def megatron_cp_moe_args(rec: Mapping[str, Any]) -> list[str]:
    """Context-parallel, expert-parallel and MoE model flags; none for a dense layout without cp."""
    args: list[str] = []
    if rec["cp"] > 1:
        # load-balanced ring attention over the cp ranks (--cp-comm-type p2p, the default); Transformer
        # Engine runs it in its flash and fused backends, which the plan requires for cp > 1
        args += ["--context-parallel-size", str(rec["cp"])]
    if not is_moe(rec):
        return args
    f = rec["moe_ffn"]
    args += [
        "--expert-model-parallel-size",
        str(rec["ep"]),
        # its default is --tensor-model-parallel-size; written always, as the plan resolved it
        "--expert-tensor-parallel-size",
        str(rec["etp"]),
        "--num-experts",
        str(rec["experts"]),
        "--moe-router-topk",
        str(rec["experts_per_token"]),
        "--moe-ffn-hidden-size",
        str(f),
    ]
    if rec["shared_experts"]:
        # Megatron-LM's shared experts are one MLP of this width: n shared experts of width f are one of n*f
        args += ["--moe-shared-expert-intermediate-size", str(rec["shared_experts"] * f)]
    if rec["dense_layers"]:
        # 0 = a dense MLP, 1 = experts, one entry per layer (moe_freq_type evaluates the list expression)
        args += ["--moe-layer-freq", f"([0]*{rec['dense_layers']}+[1]*{rec['layers'] - rec['dense_layers']})"]
    if rec["router"] == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
    elif rec["experts_per_token"] == 1:
        # TransformerConfig: "Please use --moe-router-pre-softmax when topk is 1" (a softmax over one score)
        args.append("--moe-router-pre-softmax")
    # the all-to-all dispatcher (the default allgather one gathers every token on every ep rank) and
    # grouped GEMMs over the local experts: what NVIDIA's MoE recipes run and the time model assumes
    args += ["--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
    return args


def megatron_recompute_modules(rec: Mapping[str, Any]) -> list[str]:
    """`--recompute-modules` of activation_checkpointing=ffn: the dense MLP, and the MoE layer where there is one."""
    if not is_moe(rec):
        return ["mlp"]
    return (["mlp"] if rec["dense_layers"] else []) + ["moe"]


# ---- torchtitan --------------------------------------------------------------------------
def torchtitan_cp_ep(
    rec: Mapping[str, Any], replicate: int, shard: int, with_etp: bool
) -> tuple[dict[str, Any], int, int, list[str]]:
    """cp/ep/etp parallelism fields, the data-parallel (replicate, shard) degrees they need, and notes.

    torchtitan's expert mesh takes the ep*etp ranks out of dp_shard*cp*tp (dp_replicate stays outside),
    so under ep > 1 the shard degree grows to the smallest divisor of dp for which ep*etp divides
    dp_shard*cp*tp: data parallelism written as HSDP rather than DDP. `with_etp`: 0.2.x has
    expert_tensor_parallel_degree, 0.3.x none (its experts run etp = 1 under ep > 1, tp without).
    """
    par: dict[str, Any] = {}
    notes: list[str] = []
    cp, tp, ep, etp, dp = rec["cp"], rec["tp"], rec["ep"], rec["etp"], rec["dp"]
    if cp > 1:
        par["context_parallel_degree"] = cp
        if rec["sharding"] != "fsdp":
            notes.append(
                f"cp={cp}: torchtitan shards the weights over the cp ranks too (FSDP over dp_shard*cp), "
                f"whatever sharding={rec['sharding']} says"
            )
    if not is_moe(rec):
        return par, replicate, shard, notes
    par["expert_parallel_degree"] = ep
    expert_tp = etp if with_etp else 1
    if with_etp:
        par["expert_tensor_parallel_degree"] = etp
    else:
        runs = 1 if ep > 1 else tp
        if etp != runs:
            notes.append(
                f"etp={etp}: torchtitan 0.3 has no expert tensor parallel degree; its experts run "
                f"etp = {runs} with ep = {ep} and tp = {tp}"
            )
    if ep > 1 and (shard * cp * tp) % (ep * expert_tp):
        shard = next(d for d in range(1, dp + 1) if dp % d == 0 and (d * cp * tp) % (ep * expert_tp) == 0)
        replicate = dp // shard
        notes.append(
            f"ep={ep}: torchtitan takes the expert-parallel ranks out of dp_shard*cp*tp; written as "
            f"data_parallel_shard_degree = {shard}, data_parallel_replicate_degree = {replicate} (HSDP)"
        )
    return par, replicate, shard, notes


def torchtitan_model(rec: Mapping[str, Any], version_02: bool) -> tuple[dict[str, str], list[str]]:
    """The model torchtitan trains: {name, flavor} (0.2.x) or {module, config} (0.3.x), or a note
    saying what to set where torchtitan ships no such model."""
    if not is_moe(rec):
        return {}, []
    name, flavor, module, config = TORCHTITAN_MOE_MODELS.get(rec["model"], ("", "", "", ""))
    if version_02 and name:
        # train.py (0.2.2): "Pipeline Parallel is enabled but {name} does not support pipelining"
        pp = [f"pp={rec['pp']}: torchtitan 0.2 has no pipelining for {name}; 0.3 has (--format torchtitan-cli)"]
        return {"name": name, "flavor": flavor}, pp if rec["pp"] > 1 else []
    if not version_02 and config:
        return {"module": module, "config": config}, []
    return {}, [
        f"model {rec['model']}: torchtitan ships no such "
        + ("flavor" if version_02 else "config function")
        + f"; describe its {rec['experts']} experts (top-{rec['experts_per_token']}, width {rec['moe_ffn']}) "
        + ("in a model flavor of your own ([model] name and flavor)" if version_02 else "in a --config function")
    ]
