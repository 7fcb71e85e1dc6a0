"""Transformer shapes: the LLaMA family presets and the parameter counts derived from a shape."""

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
    def attention_params(self) -> int:
        """wq is hidden x q_dim, wo q_dim x hidden; wk and wv are hidden x kv_dim (no biases)."""
        return 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim

    @property
    def mlp_params(self) -> int:
        """SwiGLU: w1 and w3 (hidden -> ffn) and w2 (ffn -> hidden)."""
        return 3 * self.hidden * self.ffn

    @property
    def layer_params(self) -> int:
        """One block: attention, MLP and its two RMSNorm weights."""
        return self.attention_params + self.mlp_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection; zero extra parameters when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """All parameters, embeddings and output head included (the N of the PaLM MFU formula)."""
        return (
            self.layers * self.layer_params
            + self.embedding_params
            + self.head_params
            + self.hidden  # final norm
        )


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> ModelShape:
    return ModelShape(layers, hidden, heads, kv_heads, ffn, vocab, tied_embeddings=False, name=name)


# Shapes from the published configs (params.json / config.json of each release).
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
    ]
}
