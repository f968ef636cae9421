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

Attention variants of the released MoE models, each off by default (the dense presets' counts
do not change): an explicit ``head_dim`` (Qwen3: q width 32 x 128 = 4096 on hidden 2048), q/k/v
biases (Qwen1.5/2; gpt-oss also the output projection's, a learned sink logit per head, and
biases on its experts), QK-norm over the full q and k widths (OLMoE) or per head (Qwen3), and
multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", Sec. 2.1): q through an
optional rank-``q_lora_rank`` bottleneck, K and V from a shared rank-``kv_lora_rank`` latent
plus one ``qk_rope_dim`` RoPE key for all heads; QK^T per head over qk_nope_dim + qk_rope_dim,
AV over v_head_dim. The low-rank RMSNorms (q_a_layernorm, kv_a_layernorm) are parameters.

Sliding-window attention (Mistral 7B v0.1, Phi-3, Gemma 2 and 3): ``window_layers`` of the layers
(all by default) let each token attend to the ``window`` tokens before it only; the attention
kernel skips the rest (FlashAttention's ``window_size``), so those layers' attention core costs
s*w - w*w/2 query-key pairs instead of s*s/2 (``attention_span``). Gemma 2 and 3 also normalise
each block's output before the residual add (``post_norms``: four RMSNorms per layer, not two).
Chunked attention (Llama 4, ``chunked``): the windowed layers split the sequence into aligned
chunks of ``window`` tokens and each token attends causally inside its own chunk, c*c/2 pairs per
chunk. Llama 4 Maverick also interleaves its MoE layers with dense ones (``moe_every``: 2).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import NamedTuple

from planner.errors import PlannerError, require
from planner.memo import by_identity, fast_init, kept_hash, kept_property
from planner.memo import replace as _replace
from planner.schema import FLAGS, MAX_PARAMS

ARCHS = ("gpt", "llama")
QK_NORMS = ("none", "full", "head")


@fast_init
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
    moe_every: int = 1  # after those, every moe_every-th layer is an MoE layer, the others dense (Llama 4 Maverick: 2)
    capacity_factor: float = 0.0  # tokens per expert capped at this x the mean (0: dropless)
    router_bias: bool = False  # a per-expert routing bias held as a weight (DeepSeek-V3 e_score_correction_bias)
    shared_expert_gate: bool = False  # sigmoid gate Linear(hidden, 1) on the shared MLP (Qwen1.5/2-MoE)
    # Group-limited routing (DeepSeek-V2/V3 n_group, topk_group): the experts form expert_groups equal
    # groups (one per node when expert parallel spans that many) and a token picks its top_k experts
    # inside its best groups_per_token groups. 1 and 1: no limit.
    expert_groups: int = 1
    groups_per_token: int = 1
    # Attention variants (defaults: multi-head / grouped-query attention with head_dim = hidden / heads).
    head_dim: int | None = None  # per-head q/k/v width (None: hidden / heads; MLA: qk_nope_dim + qk_rope_dim)
    qkv_bias: bool = False  # biases on the q, k and v projections only (Qwen1.5/2); gpt has all biases anyway
    out_bias: bool = False  # a bias on the attention output projection too (gpt-oss)
    attention_sinks: bool = False  # a learned sink logit per head in each layer's softmax (gpt-oss)
    expert_bias: bool = False  # biases on the router's logits and every routed expert's matrices (gpt-oss)
    qk_norm: str = "none"  # "full": one norm over all of q and of k (OLMoE); "head": per head (Qwen3)
    q_lora_rank: int = 0  # MLA: q through this rank with an RMSNorm (0: plain q projection)
    kv_lora_rank: int = 0  # MLA: the K/V latent width (0: not MLA)
    qk_rope_dim: int = 0  # MLA: RoPE part of each q/k head (the key's is one, shared by all heads)
    qk_nope_dim: int = 0  # MLA: non-RoPE part of each q/k head
    v_head_dim: int = 0  # MLA: per-head V width
    window: int = 0  # sliding-window attention: tokens each query sees in the windowed layers (0: none)
    window_layers: int | None = None  # layers with the window (None: all of them when window > 0)
    chunked: bool = False  # the window is a chunk: windowed layers attend inside aligned blocks of window tokens (Llama 4)
    post_norms: bool = False  # a norm after attention and after the MLP too (Gemma 2/3: 4 norms per layer)
    parallel_block: bool = False  # attention and the MLP read one norm's output, their outputs summed (Cohere's)
    # Linear attention (Gated DeltaNet: Qwen3-Next, Qwen3.5): linear_layers of the layers replace softmax
    # attention by a gated delta rule over linear_key_heads keys and linear_value_heads values of
    # linear_key_dim / linear_value_dim each, after a depthwise causal convolution of linear_conv taps.
    linear_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv: int = 0
    output_gate: bool = False  # softmax attention's output times a sigmoid gate from a second q-wide projection
    # The full-attention layers of a model with a sliding window on the others, with an attention shape
    # of their own (Gemma 4): per-head q/k/v width and K/V heads (0: the windowed layers'), and K used
    # as V (no v projection).
    global_head_dim: int = 0
    global_kv_heads: int = 0
    global_k_eq_v: bool = False
    # Gemma 4's MoE layer: the router's input scaled per channel and each routed weight per expert
    # (hidden + experts parameters), and norms of its own beside the layer's (the experts' input and
    # each of the two MLP outputs: 3).
    router_scale: bool = False
    moe_norms: int = 0
    # DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) on MLA: a lightning indexer of index_heads
    # heads of index_head_dim scores every earlier token for each query, which attends to its
    # index_topk best only (0: dense attention).
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # Multi-token prediction (DeepSeek-V3 Sec. 2.2; Megatron-Core --mtp-num-layers): modules trained
    # beside the model, each predicting one token further from the previous one's hidden states and
    # the next token's embedding: a transformer layer (the model's MoE layer, else its dense one), a
    # projection of the two normalised streams (2h -> h) and three norms, and a pass of the shared
    # output head; they sit on the last pipeline stage. 0: none (not counted in ``params``).
    mtp_layers: int = 0

    def __hash__(self) -> int:  # the dataclass's, kept: a model keys several caches in each estimate
        return kept_hash(self)

    def __post_init__(self) -> None:
        require(self.arch in ARCHS, "arch", self.arch, lambda: f"one of {', '.join(ARCHS)}")
        for field in ("layers", "hidden", "heads", "vocab", "seq_len"):
            value = getattr(self, field)
            require(isinstance(value, int) and value > 0, field, value, "a positive integer")
            if field != "layers":  # depth is bounded by the parameter count below (no loop runs over it)
                require(value <= FLAGS[field].hi, field, value, FLAGS[field].allowed)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", default_ffn_hidden(self.arch, self.hidden))
        if self.tied_embeddings is None:
            object.__setattr__(self, "tied_embeddings", self.arch == "gpt")
        if self.dropout is None:
            object.__setattr__(self, "dropout", 0.1 if self.arch == "gpt" else 0.0)
        require(isinstance(self.dropout, (int, float)) and not isinstance(self.dropout, bool)
                and 0.0 <= self.dropout < 1.0, "dropout", self.dropout, "a number in [0, 1)")
        require(isinstance(self.kv_heads, int) and self.kv_heads > 0, "kv_heads", self.kv_heads, "a positive integer")
        require(isinstance(self.ffn_hidden, int) and self.ffn_hidden > 0, "ffn_hidden", self.ffn_hidden,
                "a positive integer")
        # A plain model (every field past the basic shape at its default, each of the default's
        # type: no experts, MLA, window, biases...) passes the checks of those fields as it is:
        # only its attention's head width is checked and set (a model built each call, in a
        # sweep over shapes, skips some ninety checks that cannot fail).
        extra = _EXTRA(self)
        plain = (extra == _EXTRA_DEFAULTS and tuple(map(type, extra)) == _EXTRA_TYPES
                 and (self.window_layers is None or type(self.window_layers) is int and self.window_layers == 0))
        if plain:
            require(self.qk_norm in QK_NORMS, "qk_norm", self.qk_norm, lambda: f"one of {', '.join(QK_NORMS)}")
            self._head_dim()
            object.__setattr__(self, "window_layers", 0)
        else:
            self._check_attention()
        require(self.heads % self.kv_heads == 0, "kv_heads", self.kv_heads,
                lambda: f"must divide heads={self.heads} (grouped-query attention)")
        if not plain:
            self._check_moe()
            self._check_window()
            self._check_global()
            self._check_linear()
            self._check_sparse()
            require(isinstance(self.mtp_layers, int) and not isinstance(self.mtp_layers, bool)
                    and 0 <= self.mtp_layers <= FLAGS["mtp_layers"].hi, "mtp_layers", self.mtp_layers,
                    FLAGS["mtp_layers"].allowed)
        require(self.params <= MAX_PARAMS * 1.01, "params", self.params,  # 1%: a scaled shape overshoots
                lambda: f"at most {MAX_PARAMS:g} parameters (planner/schema.py; keeps int64 and float64 exact)")

    def _check_attention(self) -> None:
        for field in ("qkv_bias", "out_bias", "attention_sinks", "expert_bias", "router_bias", "shared_expert_gate"):
            require(isinstance(getattr(self, field), bool), field, getattr(self, field), "true or false")
        require(self.qk_norm in QK_NORMS, "qk_norm", self.qk_norm, lambda: f"one of {', '.join(QK_NORMS)}")
        mla = ("q_lora_rank", "kv_lora_rank", "qk_rope_dim", "qk_nope_dim", "v_head_dim")
        for field in mla:
            value = getattr(self, field)
            require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**16, field, value,
                    "a whole number from 0 to 65,536")
        if self.kv_lora_rank == 0:  # not MLA: the other MLA fields stay 0
            for field in mla:
                require(getattr(self, field) == 0, field, getattr(self, field),
                        "0 unless kv_lora_rank > 0 (multi-head latent attention)")
            self._head_dim()
            return
        for field in ("qk_nope_dim", "v_head_dim"):
            require(getattr(self, field) > 0, field, getattr(self, field), "a positive integer with MLA (kv_lora_rank > 0)")
        qk = self.qk_nope_dim + self.qk_rope_dim
        require(self.head_dim in (None, qk), "head_dim", self.head_dim,
                lambda: f"unset with MLA (it is qk_nope_dim + qk_rope_dim = {qk})")
        object.__setattr__(self, "head_dim", qk)
        require(self.kv_heads == self.heads, "kv_heads", self.kv_heads,
                lambda: f"equal to heads={self.heads} with MLA (every head has its own K and V from the latent)")
        require(self.arch == "llama", "arch", self.arch, "llama with MLA (RMSNorm, SwiGLU, RoPE, no biases)")
        require(not self.qkv_bias, "qkv_bias", self.qkv_bias, "false with MLA (its projections have no biases)")

    def _head_dim(self) -> None:
        """Without MLA: head_dim given, or hidden / heads."""
        if self.head_dim is None:
            require(self.hidden % self.heads == 0, "heads", self.heads,
                    lambda: f"must divide hidden={self.hidden} (head_dim = hidden / heads), or give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        require(isinstance(self.head_dim, int) and not isinstance(self.head_dim, bool)
                and 1 <= self.head_dim <= 2**14, "head_dim", self.head_dim, "a whole number from 1 to 16,384")

    def _check_window(self) -> None:
        require(isinstance(self.post_norms, bool), "post_norms", self.post_norms, "true or false")
        require(isinstance(self.parallel_block, bool), "parallel_block", self.parallel_block, "true or false")
        require(not (self.parallel_block and self.post_norms), "parallel_block", True,
                "false with post_norms (a parallel block has one norm before both halves)")
        w = self.window
        require(isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= FLAGS["seq_len"].hi, "window", w,
                lambda: f"0 (full attention) or a window of 1 to {FLAGS['seq_len'].hi:,} tokens")
        if self.window_layers is None:
            object.__setattr__(self, "window_layers", self.layers if w else 0)
        n = self.window_layers
        require(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= self.layers, "window_layers", n,
                lambda: f"a whole number from 0 to layers={self.layers}")
        require(w > 0 or n == 0, "window_layers", n, "0 without a window (window = 0)")
        require(isinstance(self.chunked, bool), "chunked", self.chunked, "true or false")
        require(w > 0 or not self.chunked, "chunked", self.chunked, "false without a window (window = 0)")

    def _check_global(self) -> None:
        for field in ("global_head_dim", "global_kv_heads"):
            value = getattr(self, field)
            require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**14, field, value,
                    "a whole number from 0 to 16,384 (0: the windowed layers' own)")
        require(isinstance(self.global_k_eq_v, bool), "global_k_eq_v", self.global_k_eq_v, "true or false")
        given = next((f for f in ("global_head_dim", "global_kv_heads", "global_k_eq_v") if getattr(self, f)), None)
        if given is None:
            return
        require(0 < self.window_layers < self.layers and not self.chunked, given, getattr(self, given),
                lambda: f"unset unless a sliding window covers some layers but not all (window_layers {self.window_layers} of "
                f"{self.layers}{', chunked' if self.chunked else ''}): it shapes the full-attention layers")
        require(self.arch == "llama" and not self.mla, given, getattr(self, given),
                "unset for arch gpt and with MLA (per-layer attention shapes of those are not modelled)")
        if self.global_kv_heads:
            require(self.heads % self.global_kv_heads == 0, "global_kv_heads", self.global_kv_heads,
                    lambda: f"must divide heads={self.heads} (grouped-query attention)")

    def _check_linear(self) -> None:
        require(isinstance(self.output_gate, bool), "output_gate", self.output_gate, "true or false")
        fields = ("linear_key_heads", "linear_value_heads", "linear_key_dim", "linear_value_dim", "linear_conv")
        n = self.linear_layers
        require(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < self.layers, "linear_layers", n,
                lambda: f"a whole number from 0 to layers - 1 = {self.layers - 1} (at least one softmax-attention layer)")
        if not n:
            for field in fields:
                require(getattr(self, field) == 0, field, getattr(self, field), "0 without linear layers (linear_layers = 0)")
            return
        for field in fields:
            value = getattr(self, field)
            top = 64 if field == "linear_conv" else 65536
            require(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= top, field, value,
                    f"a whole number from 1 to {top:,} with linear layers")
        require(self.linear_value_heads % self.linear_key_heads == 0, "linear_value_heads", self.linear_value_heads,
                lambda: f"a multiple of linear_key_heads={self.linear_key_heads} (each key head serves a group of value heads)")
        require(self.arch == "llama", "linear_layers", n, "0 for arch gpt")
        require(not self.window_layers, "window", self.window, "0 with linear layers (a window and linear attention "
                "together are not modelled)")
        require(not self.mla, "kv_lora_rank", self.kv_lora_rank, "0 with linear layers (MLA and linear attention "
                "together are not modelled)")

    def _check_sparse(self) -> None:
        fields = ("index_heads", "index_head_dim", "index_topk")
        for field in fields:
            value = getattr(self, field)
            require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**20, field, value,
                    "a whole number from 0 to 1,048,576 (0: dense attention)")
        given = [f for f in fields if getattr(self, f)]
        if not given:
            return
        missing = next((f for f in fields if not getattr(self, f)), None)
        require(missing is None, missing or "", 0, lambda: "a positive integer with the other sparse-attention fields "
                f"({', '.join(given)} set)")
        require(self.mla, "index_topk", self.index_topk, "0 without MLA (kv_lora_rank > 0): DeepSeek sparse attention "
                "selects keys of the latent attention")
        require(not self.window_layers and not self.linear_layers, "index_topk", self.index_topk,
                "0 with a window or linear layers (not modelled together)")

    def _check_moe(self) -> None:
        for field in ("experts", "top_k", "shared_experts", "dense_layers"):
            value = getattr(self, field)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, field, value,
                    "a whole number >= 0")
        require(isinstance(self.router_scale, bool), "router_scale", self.router_scale, "true or false")
        norms = self.moe_norms
        require(isinstance(norms, int) and not isinstance(norms, bool) and 0 <= norms <= 8, "moe_norms", norms,
                "a whole number from 0 to 8")
        every = self.moe_every
        require(isinstance(every, int) and not isinstance(every, bool) and every >= 1, "moe_every", every,
                "a whole number >= 1 (1: every layer after the dense ones is an MoE layer)")
        cf = self.capacity_factor
        require(isinstance(cf, (int, float)) and not isinstance(cf, bool) and (cf == 0 or 0 < cf <= 64),
                "capacity_factor", cf, "0 (dropless) or a factor in (0, 64]")
        for field in ("expert_groups", "groups_per_token"):
            value = getattr(self, field)
            require(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65536, field, value,
                    "a whole number from 1 to 65,536")
        if self.experts == 0:
            for field in ("top_k", "shared_experts", "dense_layers", "capacity_factor", "router_bias",
                          "shared_expert_gate", "expert_bias", "router_scale", "moe_norms"):
                require(not getattr(self, field), field, getattr(self, field), "0 for a dense model (experts = 0)")
            for field in ("expert_groups", "groups_per_token", "moe_every"):
                require(getattr(self, field) == 1, field, getattr(self, field), "1 for a dense model (experts = 0)")
            require(self.expert_ffn is None, "expert_ffn", self.expert_ffn, "unset for a dense model (experts = 0)")
            return
        require(self.experts >= 2 and self.experts <= 65536, "experts", self.experts,
                "0 (dense) or from 2 to 65,536 routed experts")
        require(1 <= self.top_k <= self.experts, "top_k", self.top_k, lambda: f"from 1 to experts={self.experts}")
        require(self.experts % self.expert_groups == 0, "expert_groups", self.expert_groups,
                lambda: f"a divisor of experts={self.experts} (equal groups)")
        require(self.groups_per_token <= self.expert_groups, "groups_per_token", self.groups_per_token,
                lambda: f"from 1 to expert_groups={self.expert_groups}")
        reachable = self.groups_per_token * self.experts // self.expert_groups
        require(self.top_k <= reachable, "groups_per_token", self.groups_per_token,
                lambda: f"enough groups for top_k={self.top_k} experts ({self.experts // self.expert_groups} per group)")
        require(self.dense_layers < self.layers, "dense_layers", self.dense_layers,
                lambda: f"fewer than layers={self.layers} (at least one MoE layer)")
        require(every <= self.layers - self.dense_layers, "moe_every", every,
                lambda: f"at most layers - dense_layers = {self.layers - self.dense_layers} (at least one MoE layer)")
        if self.expert_ffn is None:
            object.__setattr__(self, "expert_ffn", self.ffn_hidden)
        require(isinstance(self.expert_ffn, int) and self.expert_ffn > 0, "expert_ffn", self.expert_ffn,
                "a positive integer")
        require(self.shared_experts > 0 or not self.shared_expert_gate, "shared_expert_gate", self.shared_expert_gate,
                "false without shared experts (shared_experts = 0)")

    # --- derived shape -----------------------------------------------------------------
    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @property
    def attn_qk_dim(self) -> int:
        """Per-head width of q and k, the inner dimension of QK^T (MLA: qk_nope_dim + qk_rope_dim)."""
        return self.head_dim

    @kept_property
    def attn_v_dim(self) -> int:
        """Per-head width of v, the inner dimension of AV (MLA: v_head_dim)."""
        return self.v_head_dim if self.mla else self.head_dim

    # The attention widths below are one layer's; where the full-attention layers have a shape of
    # their own (``global_layers``), the mean over layers (a float), as every formula reading them
    # (activations, element-wise traffic, context parallel's exchange, the projections' GEMMs) is
    # linear in them.
    @kept_property
    def q_width(self) -> int | float:
        """Width of Q: heads * attn_qk_dim (= hidden for standard attention)."""
        return self.heads * self.attn_qk_dim if not self.global_layers else self._mean_width(0)

    @kept_property
    def attn_out_width(self) -> int | float:
        """Width of the attention output, the input of the output projection: heads * attn_v_dim."""
        return self.heads * self.attn_v_dim if not self.global_layers else self._mean_width(3)

    @kept_property
    def k_width(self) -> int | float:
        """Width of K as attention consumes it: kv_heads * attn_qk_dim (MLA: every head's, up-projected
        from the latent, as training and context parallel use it)."""
        return self.kv_heads * self.attn_qk_dim if not self.global_layers else self._mean_width(1)

    @kept_property
    def v_width(self) -> int | float:
        """Width of V as attention consumes it: kv_heads * attn_v_dim."""
        return self.kv_heads * self.attn_v_dim if not self.global_layers else self._mean_width(2)

    @kept_property
    def kv_hidden(self) -> int | float:
        """Width of K (and of V): kv_heads * head_dim. With MLA, K and V differ; this is their mean,
        so that 2 * kv_hidden is the K+V width (k_width + v_width) that activations and context
        parallel's K/V exchange carry."""
        if self.global_layers:
            return (self.k_width + self.v_width) / 2
        return (self.k_width + self.v_width) // 2

    @property
    def global_layers(self) -> int:
        """Full-attention layers with an attention shape of their own (a ``global_*`` field set: Gemma
        4's), the layers without the window; 0 otherwise (every layer one shape)."""
        if not (self.global_head_dim or self.global_kv_heads or self.global_k_eq_v):
            return 0
        return self.layers - self.window_layers

    def attention_widths(self, full: bool = False) -> tuple[int, int, int, int]:
        """(q, k, v, output) widths of one layer's attention as its kernel reads them: the windowed
        (or every) layer's, or with ``full`` a full-attention layer's under ``global_*`` (its head
        width, its K/V heads; K used as V still gives the kernel a V of K's width)."""
        qk, v, kv = self.attn_qk_dim, self.attn_v_dim, self.kv_heads
        if full and self.global_layers:
            qk = v = self.global_head_dim or self.head_dim
            kv = self.global_kv_heads or self.kv_heads
        return self.heads * qk, kv * qk, kv * v, self.heads * v

    def _mean_width(self, part: int) -> float:
        """The mean over layers of ``attention_widths``' ``part``: the windowed and the full layers'."""
        full = self.global_layers
        return ((self.layers - full) * self.attention_widths()[part]
                + full * self.attention_widths(True)[part]) / self.layers

    @kept_property
    def kv_cache_width(self) -> int:
        """Per token per layer, the K/V values an inference cache keeps: K and V (2 * kv_hidden);
        MLA caches the latent and the shared RoPE key only (kv_lora_rank + qk_rope_dim; DeepSeek-V2 Sec. 2.1.2)."""
        return self.kv_lora_rank + self.qk_rope_dim if self.mla else self.k_width + self.v_width

    @property
    def indexer_params(self) -> int:
        """DSA's lightning indexer in one layer: its query projection from the q latent (wq_b; from the
        hidden state without one), its key projection and LayerNorm (weight and bias), and the
        per-head weights' projection (0 without DSA)."""
        return _counts(self).indexer

    @property
    def indexer_matmul_params(self) -> int:
        """The projections' weights of ``indexer_params`` (its LayerNorm left out; 0 without DSA)."""
        return _counts(self).indexer_matmul

    @kept_property
    def attn_core_width(self) -> int | float:
        """heads * (attn_qk_dim + attn_v_dim): forward QK^T plus AV cost 2*s*this FLOPs per token per
        layer over the full square (4*s*h for standard attention with head_dim = hidden / heads). Under
        DSA the kernel runs MLA absorbed (Megatron-Core's AbsorbedMLASelfAttention, FlashMLA's sparse
        kernel): every head's q against the one latent key (kv_lora_rank + qk_rope_dim) and the
        latent as its value (kv_lora_rank), DeepSeek-V3.2's "MQA mode of MLA"."""
        if self.dsa:
            return self.heads * (2 * self.kv_lora_rank + self.qk_rope_dim)
        return self.q_width + self.attn_out_width

    @property
    def dsa(self) -> bool:
        """DeepSeek sparse attention: each query attends to ``index_topk`` keys its indexer picks."""
        return self.index_topk > 0

    @kept_property
    def attention_span(self) -> float:
        """The causal attention core's work, mean over layers, as a share of full causal attention's
        s*s/2 query-key pairs: 1 without a window; a windowed layer computes s*w - w*w/2 pairs
        (each query its w last keys, fewer in the first w), 2w/s - (w/s)^2 of the triangle; a
        chunked one (s // w whole chunks of w tokens and one of s % w) the chunks' own triangles,
        ((s // w) * w*w + (s % w)^2) / s^2 of it."""
        if self.linear_layers:  # the softmax layers' full triangle; a linear layer has none (no window with them)
            return self.softmax_share
        if self.dsa:  # query i attends to min(i, index_topk) keys: a window's count of pairs
            return self._window_share(self.index_topk)
        if not self.window_layers or self.window >= self.seq_len:
            return 1.0
        return 1.0 - self.window_layers * (1.0 - self._window_share()) / self.layers

    def _window_share(self, window: int | None = None) -> float:
        """A windowed layer's share of the causal triangle (``attention_span``); 1 with the window at
        least the sequence. ``window``: another window than the model's (unchunked)."""
        s, w = self.seq_len, self.window if window is None else window
        if w >= s:
            return 1.0
        r = w / s
        return ((s // w) * w * w + (s % w) ** 2) / (s * s) if self.chunked and window is None else (2.0 - r) * r

    @kept_property
    def attention_pair_width(self) -> float:
        """The causal attention core's work per layer, the mean over layers of each layer's share of the
        s*s/2 query-key pairs times its core width (heads x (qk + v widths)): attention_span x
        attn_core_width where every layer has one width; under ``global_*`` the windowed layers
        their window's share at their width, the full ones the whole triangle at theirs."""
        if not self.global_layers:
            return self.attention_span * self.attn_core_width
        q, _, _, out = self.attention_widths()
        full_q, _, _, full_out = self.attention_widths(True)
        return (self.window_layers * self._window_share() * (q + out)
                + self.global_layers * (full_q + full_out)) / self.layers

    @property
    def softmax_share(self) -> float:
        """The share of layers with softmax attention (the others linear attention)."""
        return (self.layers - self.linear_layers) / self.layers if self.linear_layers else 1.0

    @property
    def linear_projection_width(self) -> int:
        """A linear layer's input projection, output width: q and k (key heads x key_dim each), v and
        the gate z (value heads x value_dim each), beta and the decay's input a (one per value head)."""
        value = self.linear_value_heads * self.linear_value_dim
        return 2 * self.linear_key_heads * self.linear_key_dim + 2 * value + 2 * self.linear_value_heads

    @property
    def linear_core_flops(self) -> int:
        """Forward FLOPs per token of one linear layer's gated delta rule: per value head, the state's
        update and read-out, four products of the key x value state (decay and delta, the outer
        products, the output): 8 * value_heads * key_dim * value_dim (Megatron-LM's count, 6x its
        4*value_heads*dv^2 for forward and backward; independent of the sequence and the chunking)."""
        return 8 * self.linear_value_heads * self.linear_key_dim * self.linear_value_dim

    @property
    def layer_norms(self) -> int:
        """Norms in a layer's residual path: before attention and before the MLP, and with
        ``post_norms`` after each too (Gemma 2/3); one, before both, in a ``parallel_block``."""
        return 4 if self.post_norms else 1 if self.parallel_block else 2

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

    def _norm_weights(self, width: int) -> int:
        """A norm over ``width``: LayerNorm weight and bias (gpt), RMSNorm weight (llama)."""
        return (2 if self.arch == "gpt" else 1) * width

    @property
    def attention_params(self) -> int:
        """Weights, biases and the norms inside attention (QK-norm; MLA's low-rank RMSNorms), and
        the sink logits (gpt-oss)."""
        return _counts(self).attention

    def _mlp_matmul(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @property
    def mlp_params(self) -> int:
        """The dense MLP (every layer of a dense model; the leading dense layers of an MoE)."""
        return _counts(self).mlp

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers with the MoE MLP: after the leading dense ones, every ``moe_every``-th (the last of
        each run of ``moe_every``, as Llama 4 places them: layers 1, 3, 5, ... for 2)."""
        return _counts(self).moe_layers

    @property
    def expert_params(self) -> int:
        """One routed expert's MLP (with ``expert_bias``, a bias on each of its matrices' outputs)."""
        return _counts(self).expert

    @property
    def router_params(self) -> int:
        """An MoE layer's router Linear(hidden, experts), its per-expert bias if held as a weight
        (DeepSeek-V3's routing bias; gpt-oss's Linear bias, with ``expert_bias``), and the shared
        MLP's gate Linear(hidden, 1) (Qwen1.5/2-MoE)."""
        return _counts(self).router

    @property
    def moe_mlp_params(self) -> int:
        """An MoE layer's MLP block: router, shared MLP and every routed expert."""
        return _counts(self).moe_mlp

    @property
    def dense_layer_params(self) -> int:
        return _counts(self).dense_layer

    @property
    def moe_layer_params(self) -> int:
        return _counts(self).moe_layer

    @property
    def layers_params(self) -> int:
        """All transformer layers together."""
        return _counts(self).layers

    @kept_property
    def layer_params(self) -> float:
        """Parameters of one layer: exact for a dense model, the mean over layers for an MoE
        (its leading dense layers are smaller); a pipeline stage of n layers holds n times this."""
        if not self.moe and not self.linear_layers and not self.global_layers:
            return self.dense_layer_params
        return self.layers_params / self.layers

    @kept_property
    def layer_expert_params(self) -> float:
        """Routed-expert weights per layer (mean over layers): what expert parallel shards."""
        return self.moe_layers * self.experts * self.expert_params / self.layers

    @property
    def embedding_params(self) -> int:
        """Token embedding plus the learned position table (gpt)."""
        return _counts(self).embedding

    @property
    def head_params(self) -> int:
        """The output projection to the vocabulary: zero when tied to the token embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return _counts(self).total

    @property
    def mtp_layer_params(self) -> int:
        """One multi-token-prediction module's transformer layer: the model's MoE layer (DeepSeek-V3's
        is one), else its dense layer."""
        n = _counts(self)
        return n.moe_layer if self.moe else n.dense_layer

    @kept_property
    def mtp_params(self) -> int:
        """The multi-token-prediction modules (``mtp_layers``; not in ``params``): each its layer, the
        projection of the hidden state and the next token's embedding, both normalised, from 2h to h (no
        bias), and three norms (those two and the one before the output head). The embedding and the
        output head are the main model's, shared."""
        if not self.mtp_layers:
            return 0
        h = self.hidden
        return self.mtp_layers * (self.mtp_layer_params + 2 * h * h + 3 * self._norm_weights(h))

    @property
    def mtp_expert_params(self) -> int:
        """Of ``mtp_params``, the routed experts' weights (split over expert parallel as the layers' are)."""
        return self.mtp_layers * self.experts * self.expert_params if self.moe else 0

    @kept_property
    def mtp_matmul_params_per_token(self) -> int | float:
        """Weights a token multiplies in the multi-token-prediction modules: each one's layer (an MoE
        layer: top_k experts), its projection, and the output head again."""
        if not self.mtp_layers:
            return 0
        layer = self.moe_layer_matmul_params if self.moe else self.dense_layer_matmul_params
        return self.mtp_layers * (layer + 2 * self.hidden * self.hidden + self.vocab * self.hidden)

    @kept_property
    def active_params(self) -> int:
        """Parameters one token uses: all of a dense model; an MoE's without the routed experts
        it does not go to (top_k of experts per MoE layer)."""
        return self.params - self.moe_layers * (self.experts - self.top_k) * self.expert_params

    @property
    def linear_attention_params(self) -> int:
        """A linear layer's attention block (Gated DeltaNet): its projections, the depthwise convolution,
        dt_bias, A_log and the gated norm (0 without linear layers)."""
        return _counts(self).linear

    @property
    def linear_attention_matmul_params(self) -> int:
        """A linear layer's projections' weights: q, k and v (one in_proj), the output gate z, beta, the
        decay a, and the output projection."""
        return _counts(self).linear_matmul

    @property
    def attention_matmul_params(self) -> int | float:
        """The attention block's weight-matrix entries (no biases, no norms): q, k, v and output
        projections; MLA: q_a, q_b (or q), kv_a (latent + shared RoPE key), kv_b, output. Under
        ``global_*`` the mean over layers (the full-attention layers' their own)."""
        n = _counts(self)
        if not self.global_layers:
            return n.attention_matmul
        full = self.global_layers
        return ((self.layers - full) * n.attention_matmul + full * n.global_attention_matmul) / self.layers

    @kept_property
    def dense_layer_matmul_params(self) -> int | float:
        return self.attention_matmul_params + self._mlp_matmul(self.ffn_hidden)

    @kept_property
    def moe_layer_matmul_params(self) -> int | float:
        """Weights one token multiplies in an MoE layer: attention, router, shared MLP, top_k experts."""
        if not self.moe:
            return 0
        return (self.attention_matmul_params + self.hidden * (self.experts + self.shared_expert_gate)
                + self._mlp_matmul(self.shared_experts * self.expert_ffn) + self.top_k * self._mlp_matmul(self.expert_ffn))

    @kept_property
    def matmul_params_per_token(self) -> int | float:
        """Weights that every token multiplies: all layer matmuls plus the output head
        (the head multiplies even when tied); for an MoE, its active experts only.
        Forward FLOPs per token = 2x this plus attention."""
        linear = 0  # a linear layer multiplies its projections and its depthwise convolution's taps in place of attention's
        if self.linear_layers:
            n = _counts(self)
            linear = self.linear_layers * (n.attention_matmul - n.linear_matmul - n.linear_conv)
        indexer = self.layers * self.indexer_matmul_params  # DSA's indexer projections, every layer
        return ((self.layers - self.moe_layers) * self.dense_layer_matmul_params
                + self.moe_layers * self.moe_layer_matmul_params + self.vocab * self.hidden - linear + indexer)

    def replace(self, **changes: object) -> ModelSpec:
        """A copy with ``changes``; a head_dim that followed hidden / heads follows the new ones; a
        window on every layer stays on every layer (a window given to a model without one: on every
        layer), and without a window no layer has one."""
        derived = not self.mla and self.head_dim * self.heads == self.hidden
        if derived and ("hidden" in changes or "heads" in changes) and "head_dim" not in changes:
            changes = {**changes, "head_dim": None}
        if "window_layers" not in changes:  # a window on every layer (or none) stays so; no window, no layers
            every = self.window_layers == self.layers or ("window" in changes and not self.window_layers)
            if ("window" in changes and (every or not changes["window"])) or ("layers" in changes and every):
                changes = {**changes, "window_layers": None}
        if "window" in changes and not changes["window"] and "chunked" not in changes:
            changes = {**changes, "chunked": False}  # no window, no chunks
        return _replace(self, **changes)

    def describe(self) -> str:
        kv = f", kv_heads {self.kv_heads}" if self.kv_heads != self.heads else ""
        if self.mla:
            kv = (f", MLA kv_lora_rank {self.kv_lora_rank}" + (f" q_lora_rank {self.q_lora_rank}" if self.q_lora_rank
                                                                else ""))
        elif self.head_dim * self.heads != self.hidden:
            kv += f", head_dim {self.head_dim}"
        from planner.units import fmt_params

        moe = ""
        if self.moe:
            shared = f" + {self.shared_experts} shared" if self.shared_experts else ""
            dense = (f", {self.dense_layers} dense layer{'s' if self.dense_layers > 1 else ''} first"
                     if self.dense_layers else "")
            if self.moe_every > 1:
                dense += f", MoE in {self.moe_layers} of {self.layers - self.dense_layers} layers (every {self.moe_every})"
            groups = (f" in {self.groups_per_token} of {self.expert_groups} groups"
                      if self.groups_per_token < self.expert_groups else "")
            moe = (f", {fmt_params(self.active_params)} active; MoE {self.experts} experts{shared}, top-{self.top_k}"
                   f"{groups}, expert ffn {self.expert_ffn}{dense}")
        window = ""
        if self.window_layers:
            some = "" if self.window_layers == self.layers else f" in {self.window_layers} of {self.layers} layers"
            window = f", {'chunked attention' if self.chunked else 'sliding window'} {self.window}{some}"
        if self.linear_layers:
            window = (f", linear attention (Gated DeltaNet, {self.linear_key_heads} key / {self.linear_value_heads} "
                      f"value heads of {self.linear_key_dim} / {self.linear_value_dim}) in {self.linear_layers} of "
                      f"{self.layers} layers")
        if self.dsa:
            window += (f", DeepSeek sparse attention (indexer {self.index_heads} heads of {self.index_head_dim}, "
                       f"top-{self.index_topk} keys)")
        if self.global_layers:
            same = "K as V" if self.global_k_eq_v else ""
            shape = ", ".join(x for x in (f"head_dim {self.global_head_dim}" * bool(self.global_head_dim),
                                          f"kv_heads {self.global_kv_heads}" * bool(self.global_kv_heads), same) if x)
            window += f"; the {self.global_layers} full-attention layers {shape}"
        if self.output_gate:
            window += ", gated attention output"
        if self.parallel_block:
            window += ", attention and MLP in parallel"
        if self.mtp_layers:
            many = "s" if self.mtp_layers > 1 else ""
            window += (f"; {self.mtp_layers} multi-token-prediction module{many} on the last stage "
                       f"({fmt_params(self.mtp_params)} more)")
        # the dense MLP's width where some layer has one (every layer an MoE layer: the expert ffn says it)
        ffn = f", ffn {self.ffn_hidden}" if self.moe_layers < self.layers else ""
        return (f"{self.name} ({self.arch}, {fmt_params(self.params)} params{moe}: {self.layers} layers, "
                f"hidden {self.hidden}, {self.heads} heads{kv}{ffn}, "
                f"vocab {self.vocab}, seq {self.seq_len}{window})")


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


def _mlp(gated: bool, hidden: int, width: int) -> int:
    """One MLP of ``width``: SwiGLU's gate, up and down (no biases); GELU's fc1, fc2 (+ biases)."""
    return 3 * hidden * width if gated else 2 * hidden * width + width + hidden


class _Counts(NamedTuple):
    """A model's parameter counts by part (``_counts``). The dense and MoE layers are softmax-attention
    layers; a linear layer has the linear block in place of softmax attention's."""

    attention_matmul: int  # q, k, v and output matrices (MLA's low-rank pairs)
    attention: int  # with biases, QK-norms, sinks
    mlp: int  # the dense MLP
    moe_layers: int
    expert: int  # one routed expert
    router: int
    moe_mlp: int  # router, shared and routed experts
    dense_layer: int
    moe_layer: int
    layers: int  # all layers together
    embedding: int
    total: int
    linear: int  # a linear-attention (Gated DeltaNet) block
    linear_matmul: int  # its projections' weights
    linear_conv: int  # its depthwise convolution's taps
    global_attention: int  # a full-attention layer's attention block under ``global_*`` (0 without)
    global_attention_matmul: int  # its projections' weights
    indexer: int  # DSA's lightning indexer in one layer (0 without), inside ``attention``
    indexer_matmul: int  # its projections' weights (not in ``attention_matmul``: not split by TP)



# The fields past a model's basic shape (and its head width, norms and window's layer count, which
# every model's check reads): at their defaults, ModelSpec.__post_init__'s checks of them pass.
_BASIC = ("name", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "tied_embeddings",
          "dropout", "head_dim", "qk_norm", "window_layers")
_EXTRA_FIELDS = tuple(f for f in dataclasses.fields(ModelSpec) if f.name not in _BASIC)
_EXTRA = operator.attrgetter(*(f.name for f in _EXTRA_FIELDS))
_EXTRA_DEFAULTS = tuple(f.default for f in _EXTRA_FIELDS)
_EXTRA_TYPES = tuple(map(type, _EXTRA_DEFAULTS))

@by_identity  # once per model: every count below reads it (a ModelSpec is frozen)
def _counts(m: ModelSpec) -> _Counts:
    """A model's parameter counts, part by part, in one pass (each read once; ~2 us where a
    property per part, each kept, took ~9 us: '--params 33B' counts every dense preset)."""
    h, heads, kv_heads, qk, layers = m.hidden, m.heads, m.kv_heads, m.head_dim, m.layers
    gpt = m.arch == "gpt"
    mla = m.kv_lora_rank > 0
    v = m.v_head_dim if mla else qk
    q_width, k_width, v_width, out_width = heads * qk, kv_heads * qk, kv_heads * v, heads * v
    gate = q_width if m.output_gate else 0  # the output gate's projection: q's projection twice as wide
    # Attention: q, k, v and output matrices (MLA: q_a, q_b or q, kv_a with the shared RoPE key, kv_b, output)
    if mla:
        q = (h + q_width) * m.q_lora_rank if m.q_lora_rank else h * q_width
        matmul = (q + h * (m.kv_lora_rank + m.qk_rope_dim) + m.kv_lora_rank * heads * (m.qk_nope_dim + v)
                  + out_width * h)
    else:
        matmul = h * (q_width + gate + k_width + v_width) + out_width * h
    qkv = q_width + gate + k_width + v_width
    bias = qkv + h if gpt else (qkv if m.qkv_bias else 0) + h * m.out_bias
    bias += heads * m.attention_sinks  # one sink logit per head
    qk_norm = m.qk_norm
    norms = 0 if qk_norm == "none" else q_width + k_width if qk_norm == "full" else 2 * qk
    if mla:
        norms += m.q_lora_rank + m.kv_lora_rank  # q_a_layernorm, kv_a_layernorm
    norm = 2 * h if gpt else h  # LayerNorm: weight and bias; RMSNorm: weight
    indexer_matmul = indexer = 0
    if m.index_topk:  # DSA's lightning indexer: wq_b from the q latent, wk and its LayerNorm, weights_proj
        index_width = m.index_heads * m.index_head_dim
        indexer_matmul = (m.q_lora_rank or h) * index_width + h * (m.index_head_dim + m.index_heads)
        indexer = indexer_matmul + 2 * m.index_head_dim
    attention = matmul + bias + (2 * norms if gpt else norms) + indexer
    full_layers = m.global_layers
    if full_layers:  # the full-attention layers' own shape (Gemma 4; llama-style, no MLA)
        fq, fk, fv, fo = m.attention_widths(True)
        fv_proj = 0 if m.global_k_eq_v else fv  # K used as V: no v projection
        fgate = fq if m.output_gate else 0
        fqkv = fq + fgate + fk + fv_proj
        full_matmul = h * fqkv + fo * h
        full_norms = 0 if qk_norm == "none" else fq + fk if qk_norm == "full" else 2 * (m.global_head_dim or qk)
        full_attention = (full_matmul + (fqkv if m.qkv_bias else 0) + h * m.out_bias + heads * m.attention_sinks
                          + full_norms)
    else:
        full_matmul = full_attention = 0
    layer_norms = m.layer_norms * norm
    mlp = _mlp(not gpt, h, m.ffn_hidden)
    dense_layer = attention + mlp + layer_norms
    experts = m.experts
    if experts:
        moe_layers = (layers - m.dense_layers) // m.moe_every
        e_ffn, e_bias = m.expert_ffn, m.expert_bias
        expert = _mlp(not gpt, h, e_ffn) + ((1 if gpt else 2) * e_ffn + h) * e_bias
        router = (h + m.router_bias + e_bias) * experts + h * m.shared_expert_gate + (h + experts) * m.router_scale
        shared = _mlp(not gpt, h, m.shared_experts * e_ffn) if m.shared_experts else 0
        moe_mlp = router + shared + experts * expert
        moe_layer = attention + moe_mlp + layer_norms + m.moe_norms * norm
    else:
        moe_layers = expert = router = moe_mlp = moe_layer = 0
    linear_layers = m.linear_layers
    if linear_layers:  # Gated DeltaNet: projections of q, k, v, the output gate z, beta and the decay a; out
        key, value, value_heads = m.linear_key_heads * m.linear_key_dim, m.linear_value_heads * m.linear_value_dim, \
            m.linear_value_heads
        linear_matmul = h * m.linear_projection_width + value * h
        conv = (2 * key + value) * m.linear_conv  # the depthwise convolution over q, k and v
        # dt_bias and A_log per value head, the gated norm's weight
        linear = linear_matmul + conv + 2 * value_heads + m.linear_value_dim
    else:
        linear_matmul = linear = conv = 0
    # a linear layer's attention block in place of softmax attention's (the MLP and norms the same)
    all_layers = ((layers - moe_layers) * dense_layer + moe_layers * moe_layer - linear_layers * (attention - linear)
                  + full_layers * (full_attention - attention))
    embedding = m.vocab * h + (m.seq_len * h if gpt else 0)  # token embedding, learned positions (gpt)
    head = 0 if m.tied_embeddings else m.vocab * h
    return _Counts(matmul, attention, mlp, moe_layers, expert, router, moe_mlp, dense_layer, moe_layer, all_layers,
                   embedding, all_layers + embedding + norm + head, linear, linear_matmul, conv, full_attention,
                   full_matmul, indexer, indexer_matmul)
