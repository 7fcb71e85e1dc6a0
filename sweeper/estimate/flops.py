"""FLOPs per token (PaLM, appendix B), with and without recomputation, and MFU / HFU from throughput."""

from __future__ import annotations

from sweeper.spec.models import ModelShape


def model_flops_per_token(model: ModelShape, seq_len: int) -> float:
    """6N + 12*L*H*Q*T: matmuls with the weights (fwd 2N, bwd 4N) plus attention scores and values.

    N counts every parameter, embeddings and output head included (as DESIGN.md specifies); in a
    mixture of experts only the parameters a token passes through (its top-k and the shared
    experts, `ModelShape.active_params`), as Megatron-LM and the MoE papers count MFU;
    H*Q is the width of the queries, heads x head_dim (the hidden size unless head_dim is set,
    as in Qwen3), even under grouped-query attention (the queries set the work).
    """
    return 6.0 * model.active_params + 12.0 * model.layers * model.q_dim * seq_len


def recompute_flops_per_token(model: ModelShape, seq_len: int, activation_checkpointing: str) -> float:
    """Extra forward FLOPs spent recomputing in backward, per token, for a checkpointing mode.

    full: every block's forward again (2 per weight, 4*H*Q*T for attention); ffn: the MLP's
    forward again; selective: our policy keeps every matmul and attention output, so only
    cheap elementwise ops are recomputed (counted as zero, like PaLM ignores them); none: zero.
    """
    dense = model.layers - model.moe_layers
    if activation_checkpointing == "full":
        blocks = dense * model.layer_params + model.moe_layers * model.moe_layer_active_params
        return 2.0 * blocks + 4.0 * model.layers * model.q_dim * seq_len
    if activation_checkpointing == "ffn":
        experts = model.experts_per_token + model.shared_experts
        return 2.0 * (dense * model.mlp_params + model.moe_layers * experts * model.expert_params)
    return 0.0


def hardware_flops_per_token(model: ModelShape, seq_len: int, activation_checkpointing: str) -> float:
    """FLOPs the hardware actually executes per token: model FLOPs plus recomputation."""
    return model_flops_per_token(model, seq_len) + recompute_flops_per_token(model, seq_len, activation_checkpointing)


def utilization(tokens_per_s: float, flops_per_token: float, *, num_devices: int, peak_flops: float) -> float:
    """Achieved share of the devices' peak: tokens/s * FLOPs/token / (devices * peak FLOP/s)."""
    return tokens_per_s * flops_per_token / (num_devices * peak_flops)


def tflops_per_device(tokens_per_s: float, flops_per_token: float, *, num_devices: int) -> float:
    """Model TFLOP/s achieved per device."""
    return tokens_per_s * flops_per_token / num_devices / 1e12
