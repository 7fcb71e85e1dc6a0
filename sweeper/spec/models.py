"""Transformer shapes: presets (LLaMA 1/2/3.x, Qwen3, Mistral, GPT-3, and the mixture-of-experts
Mixtral, Qwen3-MoE and GPT-OSS) and the parameter counts derived from a shape.

Two block families: LLaMA-style (RMSNorm weight only, RoPE, SwiGLU, no biases) and GPT-style
(LayerNorm weight and bias, learned positions, GELU MLP of two matrices, and, as in GPT-2/3 and
Megatron-LM's default `--add-bias-linear`, a bias on every linear layer of a GELU block).
GPT-OSS is LLaMA-style with biases on the attention projections, the experts and the router
(`attention_bias`, `mlp_bias`) and one learned attention sink per head (`attention_sinks`).

Not modelled, for GPT-OSS: the 128-token sliding window of every other layer (those layers
are counted as full causal attention, so their attention FLOPs and, with a kernel that keeps
the scores, their score memory are overestimated at long sequences); the sinks' effect on the
softmax (they are counted as parameters only); the clamped SwiGLU (same tensors as SwiGLU).
DeepSeek-V3 and Kimi K2 are not presets: their multi-head latent attention (low-rank
compressed queries and keys/values with a decoupled RoPE part) has projections and cached
tensors no field here describes, and counting it as grouped-query attention would be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: LLaMA-style by default (RMSNorm, RoPE, grouped-query attention,
    SwiGLU MLP); `mlp`, `norm` and `position` describe GPT-style blocks (GELU, LayerNorm, learned)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool = False
    name: str = "custom"
    head_dim: int = 0  # 0: hidden // heads; Qwen3 and Gemma set it explicitly
    mlp: str = "swiglu"  # swiglu | gelu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    position: str = "rope"  # rope | learned
    qk_norm: bool = False  # Qwen3: an RMSNorm over head_dim on the queries and on the keys
    # learned positions: rows of the position table (GPT-3: n_ctx = 2048); a sweep whose
    # seq_len is longer grows it to seq_len (see spec.build_sweep), as Megatron-LM requires
    # --max-position-embeddings >= --seq-length
    max_positions: int = 0
    # Mixture of experts (0 experts: a dense model). Past the `dense_layers` leading blocks, each
    # block's MLP is `experts` MLPs of width `moe_ffn` (0: ffn) of which a router picks
    # `experts_per_token` per token, plus `shared_experts` of the same width that see every token.
    experts: int = 0
    experts_per_token: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    router: str = "softmax"  # softmax (Mixtral, Qwen3) | sigmoid (DeepSeek-V3): the gate's scores
    # GPT-OSS (openai/gpt-oss-* config.json "attention_bias": true; transformers' GptOssMLP and
    # GptOssTopKRouter): biases on q, k, v and o; on every expert's gate/up and down projections
    # and on the router; one learned sink logit per head and block
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_sinks: bool = False
    # Qwen2 (transformers' Qwen2Attention): biases on q, k and v, none on o
    qkv_bias: bool = False

    # the fields only a mixture of experts sets: left out of a dense model's identity (sweeper.results.identity)
    MOE_FIELDS = ("experts", "experts_per_token", "moe_ffn", "shared_experts", "dense_layers", "router")
    # fields added after identities were first written: left out of an identity while unset
    LATE_FIELDS = ("attention_bias", "mlp_bias", "attention_sinks", "qkv_bias")

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def q_dim(self) -> int:
        """Width of the Q projection (and of wo's input): heads * head_dim; hidden unless head_dim is set."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def biases(self) -> bool:
        """GELU (GPT-style) blocks carry a bias on every linear layer; SwiGLU (LLaMA-style) none."""
        return self.mlp == "gelu"

    @property
    def attention_params(self) -> int:
        """wq is hidden x q_dim, wo q_dim x hidden; wk and wv are hidden x kv_dim; biases for GPT
        blocks and where `attention_bias` is set (on q, k, v only where `qkv_bias` is); a sink logit
        per head where `attention_sinks` is."""
        w = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        bias = self.q_dim + 2 * self.kv_dim + self.hidden if (self.biases or self.attention_bias) else 0
        bias = bias or (self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0)
        return w + bias + (self.heads if self.attention_sinks else 0)

    def _mlp_params(self, width: int) -> int:
        # SwiGLU: w1 and w3 (hidden -> width) and w2 (width -> hidden), biases (2*width + hidden)
        # where mlp_bias is set; GELU: two matrices and their biases
        if self.mlp == "gelu":
            return 2 * self.hidden * width + width + self.hidden
        return 3 * self.hidden * width + (2 * width + self.hidden if self.mlp_bias else 0)

    @property
    def mlp_params(self) -> int:
        """SwiGLU: w1 and w3 (hidden -> ffn) and w2 (ffn -> hidden); GELU: two matrices and their biases."""
        return self._mlp_params(self.ffn)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_ffn(self) -> int:
        """Width of one expert's MLP: moe_ffn, or ffn when not given."""
        return self.moe_ffn or self.ffn

    @property
    def moe_layers(self) -> int:
        """Blocks whose MLP is a mixture of experts (none in a dense model)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """One expert: an MLP of the block's kind at the experts' width."""
        return self._mlp_params(self.expert_ffn)

    @property
    def router_params(self) -> int:
        """The router's gate: hidden x experts (and a bias per expert where mlp_bias is set)."""
        return self.hidden * self.experts + (self.experts if self.mlp_bias else 0)

    @property
    def moe_layer_params(self) -> int:
        """One mixture-of-experts block: attention, router, every expert (shared ones included), norms."""
        experts = (self.experts + self.shared_experts) * self.expert_params
        return self.attention_params + self.router_params + experts + self.layer_norm_params

    @property
    def moe_layer_active_params(self) -> int:
        """The parameters of one mixture-of-experts block a token passes through: the top-k and shared experts."""
        experts = (self.experts_per_token + self.shared_experts) * self.expert_params
        return self.attention_params + self.router_params + experts + self.layer_norm_params

    @property
    def norm_params(self) -> int:
        """One norm over hidden: RMSNorm a weight, LayerNorm a weight and a bias."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    @property
    def layer_norm_params(self) -> int:
        """A block's norms (replicated under tensor parallelism): two, plus Qwen3's q/k norms."""
        return 2 * self.norm_params + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def layer_params(self) -> int:
        """One block: attention, MLP and its norms."""
        return self.attention_params + self.mlp_params + self.layer_norm_params

    @property
    def position_params(self) -> int:
        """The learned position table (max_positions x hidden); RoPE has no parameters."""
        return self.max_positions * self.hidden if self.position == "learned" else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection; zero extra parameters when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def _outside_blocks(self) -> int:
        return self.embedding_params + self.head_params + self.position_params + self.norm_params  # final norm

    @property
    def num_params(self) -> int:
        """All parameters, embeddings, output head and every expert included (the total a model card states)."""
        dense = self.layers - self.moe_layers
        return dense * self.layer_params + self.moe_layers * self.moe_layer_params + self._outside_blocks

    @property
    def active_params(self) -> int:
        """The parameters one token passes through: every expert not picked left out (the N of the
        PaLM MFU formula; Megatron-LM and the MoE papers count MFU over these). num_params when dense."""
        dense = self.layers - self.moe_layers
        return dense * self.layer_params + self.moe_layers * self.moe_layer_active_params + self._outside_blocks


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> ModelShape:
    return ModelShape(layers, hidden, heads, kv_heads, ffn, vocab, tied_embeddings=False, name=name)


def _qwen3(name: str, layers: int, hidden: int, heads: int, ffn: int, tied: bool) -> ModelShape:
    # every Qwen3 dense model: 8 kv heads, head_dim 128, vocab 151936, q/k RMSNorm
    return ModelShape(
        layers, hidden, heads, 8, ffn, 151936, tied_embeddings=tied, name=name, head_dim=128, qk_norm=True
    )


def _qwen3_moe(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, moe_ffn: int) -> ModelShape:
    return ModelShape(
        layers,
        hidden,
        heads,
        kv_heads,
        ffn,
        151936,
        name=name,
        head_dim=128,
        qk_norm=True,
        experts=128,
        experts_per_token=8,
        moe_ffn=moe_ffn,
    )


def _gpt_oss(name: str, layers: int, experts: int) -> ModelShape:
    # openai/gpt-oss-20b and -120b config.json: hidden_size 2880, intermediate_size 2880 (each
    # expert's width), head_dim 64, 64 attention heads, 8 key/value heads, vocab_size 201088,
    # experts_per_token 4, tie_word_embeddings false, attention_bias true; 24 or 36 layers of
    # num_local_experts 32 or 128, every block sparse
    return ModelShape(
        layers,
        2880,
        64,
        8,
        2880,
        201088,
        name=name,
        head_dim=64,
        experts=experts,
        experts_per_token=4,
        moe_ffn=2880,
        attention_bias=True,
        mlp_bias=True,
        attention_sinks=True,
    )


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelShape:
    # Brown et al. 2020, Table 2.1: d_ff = 4 d_model, d_head = 128 except 2.7B (80), n_ctx 2048,
    # 13B's d_model 5140 with 40 heads of 128 (so head_dim is explicit there),
    # GPT-2's BPE vocabulary of 50257, output head tied to the token embedding
    return ModelShape(
        layers,
        hidden,
        heads,
        heads,
        4 * hidden,
        50257,
        tied_embeddings=True,
        name=name,
        head_dim=0 if hidden % heads == 0 else 128,
        mlp="gelu",
        norm="layernorm",
        position="learned",
        max_positions=2048,
    )


# Shapes from the published configs (params.json / config.json of each release; GPT-3 from
# the paper's Table 2.1). Published totals they reproduce: tests/spec/test_models.py.
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        _llama("llama-7b", 32, 4096, 32, 32, 11008, 32000),
        _llama("llama-13b", 40, 5120, 40, 40, 13824, 32000),
        _llama("llama-30b", 60, 6656, 52, 52, 17920, 32000),
        _llama("llama-65b", 80, 8192, 64, 64, 22016, 32000),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
        # meta-llama/Llama-3.1-{8B,70B,405B}/config.json: the Llama 3 shapes (rope scaling only differs)
        _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256),
        _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256),
        # meta-llama/Llama-3.2-{1B,3B}/config.json: tie_word_embeddings true
        ModelShape(16, 2048, 32, 8, 8192, 128256, tied_embeddings=True, name="llama3.2-1b"),
        ModelShape(28, 3072, 24, 8, 8192, 128256, tied_embeddings=True, name="llama3.2-3b"),
        # meta-llama/Llama-3.3-70B-Instruct/config.json
        _llama("llama3.3-70b", 80, 8192, 64, 8, 28672, 128256),
        # mistralai/Mistral-7B-v0.1/config.json
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
        # Qwen/Qwen3-*/config.json (dense models)
        _qwen3("qwen3-0.6b", 28, 1024, 16, 3072, True),
        _qwen3("qwen3-1.7b", 28, 2048, 16, 6144, True),
        _qwen3("qwen3-4b", 36, 2560, 32, 9728, True),
        _qwen3("qwen3-8b", 36, 4096, 32, 12288, False),
        _qwen3("qwen3-14b", 40, 5120, 40, 17408, False),
        _qwen3("qwen3-32b", 64, 5120, 64, 25600, False),
        # 1.3B: Table 2.1 gives 24 heads of 128, which cannot span d_model 2048; the 16 heads of
        # 128 that Megatron-LM's and NeMo's GPT-3 1.3B configs use do
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        _gpt3("gpt3-13b", 40, 5140, 40),
        _gpt3("gpt3-175b", 96, 12288, 96),
        # mistralai/Mixtral-8x7B-v0.1/config.json: 8 experts of 14336, top-2, every block
        ModelShape(32, 4096, 32, 8, 14336, 32000, name="mixtral-8x7b", experts=8, experts_per_token=2, moe_ffn=14336),
        # Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json: 128 experts, top-8, no shared
        # expert, every block sparse (decoder_sparse_step 1, mlp_only_layers []), softmax router
        _qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 768),
        _qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 1536),
        _gpt_oss("gpt-oss-20b", 24, 32),
        _gpt_oss("gpt-oss-120b", 36, 128),
    ]
}
