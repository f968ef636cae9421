"""What to train: the shape of a decoder-only transformer and its exact parameter count.

Two architectures, as the reference trainer builds them:
- ``gpt``  : LayerNorm, GELU MLP (ffn 4h by default), learned positions, biases, dropout,
             tied input/output embeddings (GPT-2 / GPT-3 / Megatron-LM 2021).
- ``llama``: RMSNorm, SwiGLU MLP, RoPE (no position table), no biases, no dropout,
             untied embeddings, grouped-query attention when kv_heads < heads.

Either can be a mixture of experts (``experts`` > 0; Shazeer et al. 2017, Fedus et al. 2022
Switch, Jiang et al. 2024 Mixtral, DeepSeek-AI 2024 V2/V3): after ``dense_layers`` leading
layers with the dense MLP, each layer's MLP is a router (Linear(hidden, experts), no bias), ``experts``
routed MLPs of width ``expert_ffn`` of which each token uses ``top_k``, and optionally one
always-on shared MLP of width ``shared_experts * expert_ffn`` (DeepSeekMoE's shared experts,
fused as DeepSeek's code builds them).
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
    # Mixture of experts (experts == 0: dense).
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0  # routed experts each token goes to
    expert_ffn: int | None = None  # one routed expert's MLP width (None: ffn_hidden)
    shared_experts: int = 0  # always-on experts, one fused MLP of width shared_experts * expert_ffn
    dense_layers: int = 0  # leading layers with the dense MLP (width ffn_hidden)
    capacity_factor: float = 0.0  # tokens per expert capped at this x the mean (0: dropless)

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
        self._check_moe()
        require(self.params <= MAX_PARAMS * 1.01, "params", self.params,  # 1%: a scaled shape overshoots
                f"at most {MAX_PARAMS:g} parameters (planner/schema.py; keeps int64 and float64 exact)")

    def _check_moe(self) -> None:
        for field in ("experts", "top_k", "shared_experts", "dense_layers"):
            value = getattr(self, field)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, field, value,
                    "a whole number >= 0")
        cf = self.capacity_factor
        require(isinstance(cf, (int, float)) and not isinstance(cf, bool) and (cf == 0 or 0 < cf <= 64),
                "capacity_factor", cf, "0 (dropless) or a factor in (0, 64]")
        if self.experts == 0:
            for field in ("top_k", "shared_experts", "dense_layers", "capacity_factor"):
                require(not getattr(self, field), field, getattr(self, field), "0 for a dense model (experts = 0)")
            require(self.expert_ffn is None, "expert_ffn", self.expert_ffn, "unset for a dense model (experts = 0)")
            return
        require(self.experts >= 2 and self.experts <= 65536, "experts", self.experts,
                "0 (dense) or from 2 to 65,536 routed experts")
        require(1 <= self.top_k <= self.experts, "top_k", self.top_k, f"from 1 to experts={self.experts}")
        require(self.dense_layers < self.layers, "dense_layers", self.dense_layers,
                f"fewer than layers={self.layers} (at least one MoE layer)")
        if self.expert_ffn is None:
            object.__setattr__(self, "expert_ffn", self.ffn_hidden)
        require(isinstance(self.expert_ffn, int) and self.expert_ffn > 0, "expert_ffn", self.expert_ffn,
                "a positive integer")

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

    def _mlp(self, width: int) -> int:
        """One MLP of ``width``: SwiGLU's gate, up and down (no biases); GELU's fc1, fc2 (+ biases)."""
        h = self.hidden
        if self.gated_mlp:
            return 3 * h * width
        return 2 * h * width + ((width + h) if self.has_bias else 0)

    def _mlp_matmul(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @property
    def mlp_params(self) -> int:
        """The dense MLP (every layer of a dense model; the leading dense layers of an MoE)."""
        return self._mlp(self.ffn_hidden)

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    @property
    def expert_params(self) -> int:
        """One routed expert's MLP."""
        return self._mlp(self.expert_ffn) if self.moe else 0

    @property
    def moe_mlp_params(self) -> int:
        """An MoE layer's MLP block: router, shared MLP and every routed expert."""
        shared = self._mlp(self.shared_experts * self.expert_ffn) if self.shared_experts else 0
        return self.hidden * self.experts + shared + self.experts * self.expert_params

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        return self.attention_params + self.moe_mlp_params + 2 * self.norm_params if self.moe else 0

    @property
    def layers_params(self) -> int:
        """All transformer layers together."""
        return (self.layers - self.moe_layers) * self.dense_layer_params + self.moe_layers * self.moe_layer_params

    @property
    def layer_params(self) -> float:
        """Parameters of one layer: exact for a dense model, the mean over layers for an MoE
        (its leading dense layers are smaller); a pipeline stage of n layers holds n times this."""
        if not self.moe:
            return self.dense_layer_params
        return self.layers_params / self.layers

    @property
    def layer_expert_params(self) -> float:
        """Routed-expert weights per layer (mean over layers): what expert parallel shards."""
        return self.moe_layers * self.experts * self.expert_params / self.layers

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
        return self.layers_params + self.embedding_params + self.norm_params + self.head_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all of a dense model; an MoE's without the routed experts
        it does not go to (top_k of experts per MoE layer)."""
        return self.params - self.moe_layers * (self.experts - self.top_k) * self.expert_params

    @property
    def attention_matmul_params(self) -> int:
        """The attention block's weight-matrix entries (no biases): fused QKV and output projection."""
        h, hkv = self.hidden, self.kv_hidden
        return h * (h + 2 * hkv) + h * h

    @property
    def dense_layer_matmul_params(self) -> int:
        return self.attention_matmul_params + self._mlp_matmul(self.ffn_hidden)

    @property
    def moe_layer_matmul_params(self) -> int:
        """Weights one token multiplies in an MoE layer: attention, router, shared MLP, top_k experts."""
        if not self.moe:
            return 0
        return (self.attention_matmul_params + self.hidden * self.experts
                + self._mlp_matmul(self.shared_experts * self.expert_ffn) + self.top_k * self._mlp_matmul(self.expert_ffn))

    @property
    def matmul_params_per_token(self) -> int:
        """Weights that every token multiplies: all layer matmuls plus the output head
        (the head multiplies even when tied); for an MoE, its active experts only.
        Forward FLOPs per token = 2x this plus attention."""
        return ((self.layers - self.moe_layers) * self.dense_layer_matmul_params
                + self.moe_layers * self.moe_layer_matmul_params + self.vocab * self.hidden)

    def replace(self, **changes: object) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        kv = f", kv_heads {self.kv_heads}" if self.kv_heads != self.heads else ""
        from planner.units import fmt_params

        moe = ""
        if self.moe:
            shared = f" + {self.shared_experts} shared" if self.shared_experts else ""
            dense = f", {self.dense_layers} dense layers first" if self.dense_layers else ""
            moe = (f", {fmt_params(self.active_params)} active; MoE {self.experts} experts{shared}, top-{self.top_k}, "
                   f"expert ffn {self.expert_ffn}{dense}")
        return (f"{self.name} ({self.arch}, {fmt_params(self.params)} params{moe}: {self.layers} layers, "
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
