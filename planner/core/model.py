"""What to train: the shape of a decoder-only transformer and its exact parameter count.

Two architectures, as the reference trainer builds them:
- ``gpt``  : LayerNorm, GELU MLP (ffn 4h by default), learned positions, biases, dropout,
             tied input/output embeddings (GPT-2 / GPT-3 / Megatron-LM 2021).
- ``llama``: RMSNorm, SwiGLU MLP, RoPE (no position table), no biases, no dropout,
             untied embeddings, grouped-query attention when kv_heads < heads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.errors import PlannerError, require
from planner.schema import FLAGS, MAX_PARAMS

ARCHS = ("gpt", "llama")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    name: str = "custom"
    arch: str = "llama"
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = None  # None: same as heads (multi-head attention)
    ffn_hidden: int | None = None  # None: 4h for gpt, LLaMA's 2/3*4h rounded up to 256 for llama
    vocab: int = 32000
    seq_len: int = 2048
    tied_embeddings: bool | None = None  # None: tied for gpt, untied for llama
    dropout: float | None = None  # None: 0.1 for gpt (GPT-2/3, Megatron-LM), 0 for llama

    def __post_init__(self) -> None:
        require(self.arch in ARCHS, "arch", self.arch, f"one of {', '.join(ARCHS)}")
        for field in ("layers", "hidden", "heads", "vocab", "seq_len"):
            value = getattr(self, field)
            require(isinstance(value, int) and value > 0, field, value, "a positive integer")
            if field != "layers":  # depth is bounded by the parameter count below (no loop runs over it)
                require(value <= FLAGS[field].hi, field, value, FLAGS[field].allowed())
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", default_ffn_hidden(self.arch, self.hidden))
        if self.tied_embeddings is None:
            object.__setattr__(self, "tied_embeddings", self.arch == "gpt")
        if self.dropout is None:
            object.__setattr__(self, "dropout", 0.1 if self.arch == "gpt" else 0.0)
        require(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "in [0, 1)")
        require(isinstance(self.kv_heads, int) and self.kv_heads > 0, "kv_heads", self.kv_heads, "a positive integer")
        require(isinstance(self.ffn_hidden, int) and self.ffn_hidden > 0, "ffn_hidden", self.ffn_hidden,
                "a positive integer")
        require(self.hidden % self.heads == 0, "heads", self.heads,
                f"must divide hidden={self.hidden} (head_dim = hidden / heads)")
        require(self.heads % self.kv_heads == 0, "kv_heads", self.kv_heads,
                f"must divide heads={self.heads} (grouped-query attention)")
        require(self.params <= MAX_PARAMS * 1.01, "params", self.params,  # 1%: a scaled shape overshoots
                f"at most {MAX_PARAMS:g} parameters (planner/schema.py; keeps int64 and float64 exact)")

    # --- derived shape -----------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.arch == "llama"

    @property
    def has_bias(self) -> bool:
        return self.arch == "gpt"

    @property
    def has_dropout(self) -> bool:
        """Dropout keeps 1-byte masks for backward and costs element-wise passes."""
        return self.dropout > 0

    @property
    def learned_positions(self) -> bool:
        return self.arch == "gpt"

    # --- parameter counts (exact: equal to the reference trainer's sum(p.numel())) --------
    @property
    def norm_params(self) -> int:
        """One norm: LayerNorm has weight and bias, RMSNorm a weight only."""
        return 2 * self.hidden if self.arch == "gpt" else self.hidden

    @property
    def attention_params(self) -> int:
        h, hkv = self.hidden, self.kv_hidden
        weights = h * (h + 2 * hkv) + h * h  # fused QKV, output projection
        bias = (h + 2 * hkv) + h if self.has_bias else 0
        return weights + bias

    @property
    def mlp_params(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        if self.gated_mlp:  # SwiGLU: gate and up (h x f each), down (f x h)
            return 3 * h * f
        return 2 * h * f + ((f + h) if self.has_bias else 0)

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        """Token embedding plus the learned position table (gpt)."""
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.learned_positions else 0)

    @property
    def head_params(self) -> int:
        """The output projection to the vocabulary: zero when tied to the token embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.norm_params + self.head_params

    @property
    def matmul_params_per_token(self) -> int:
        """Weights that every token multiplies: all layer matmuls plus the output head
        (the head multiplies even when tied). Forward FLOPs per token = 2x this plus attention."""
        per_layer = self.layer_params - 2 * self.norm_params
        if self.has_bias:
            per_layer -= (self.hidden + 2 * self.kv_hidden) + self.hidden + self.ffn_hidden + self.hidden
        return self.layers * per_layer + self.vocab * self.hidden

    def replace(self, **changes: object) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        kv = f", kv_heads {self.kv_heads}" if self.kv_heads != self.heads else ""
        from planner.units import fmt_params

        return (f"{self.name} ({self.arch}, {fmt_params(self.params)} params: {self.layers} layers, "
                f"hidden {self.hidden}, {self.heads} heads{kv}, ffn {self.ffn_hidden}, "
                f"vocab {self.vocab}, seq {self.seq_len})")


def default_ffn_hidden(arch: str, hidden: int) -> int:
    if arch == "gpt":
        return 4 * hidden
    # LLaMA (Touvron et al. 2023, model.py): int(2 * 4h / 3) rounded up to a multiple of 256.
    f = int(2 * 4 * hidden / 3)
    return 256 * ((f + 255) // 256)


def spec_from_dict(name: str, data: dict) -> ModelSpec:
    allowed = {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}
    unknown = sorted(set(data) - allowed - {"source"})
    if unknown:
        raise PlannerError(f"preset {name}", unknown[0], f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return ModelSpec(name=name, **{k: v for k, v in data.items() if k in allowed})
