"""The model: a GPT whose shape is a planner ``ModelSpec``, written for one device.

Two architectures (planner/core/model.py says which pieces each has):
- ``gpt``  : LayerNorm, GELU MLP with biases, learned positions, dropout, tied embeddings (GPT-2).
- ``llama``: RMSNorm, SwiGLU MLP, RoPE, grouped-query attention, no biases, untied head (LLaMA).

``sum(p.numel() for p in GPT(spec).parameters()) == spec.params`` exactly (tests/trainer).

Parallelism is applied from outside (reference_trainer/parallel.py). Two choices here serve it:
- Layers live in a ``ModuleDict`` keyed by their global index, so a pipeline stage built with
  ``layer_ids=range(4, 8)`` has the same parameter names as the whole model (torchtitan does this).
- Q, K and V are one fused Linear whose output rows are grouped per KV head, Megatron-LM style:
  ``[q heads of group 0, k_0, v_0, q heads of group 1, k_1, v_1, ...]``. A contiguous split of the
  rows (``ColwiseParallel``) then hands each tensor-parallel rank whole groups.

Weights are initialised per parameter from a generator seeded by (seed, parameter name), so any
subset of layers, built on any rank, gets the same values as the whole model.

Shapes in comments: B batch, T sequence, C hidden, nh query heads, nkv KV heads, hd head dim,
V vocabulary, F ffn hidden; "local" counts are per tensor-parallel rank.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.core.model import ModelSpec

INIT_STD = 0.02  # GPT-2 (Radford et al. 2019) / nanoGPT
RMS_EPS = 1e-5  # LLaMA (Touvron et al. 2023)
ROPE_THETA = 10000.0  # RoFormer (Su et al. 2021)
ATTENTION_KINDS = ("flash", "standard")  # fused SDPA kernel (no T x T stored) or explicit softmax


def make_norm(spec: ModelSpec, width: int | None = None) -> nn.Module:
    width = width or spec.hidden
    return nn.LayerNorm(width) if spec.arch == "gpt" else nn.RMSNorm(width, eps=RMS_EPS)


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (T, hd/2), for rotary position embedding (Su et al. 2021, eq. 34)."""
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of x (B, T, n, hd) by position-dependent angles.
    ``positions`` (T,): the global positions of x's tokens (context parallel); None: 0..T-1."""
    t = x.shape[1]
    if positions is not None:
        cos, sin = cos[positions, None, :], sin[positions, None, :]  # (T, 1, hd/2)
    else:
        cos, sin = cos[:t, None, :], sin[:t, None, :]  # (T, 1, hd/2)
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class AttentionCore(nn.Module):
    """softmax(Q K^T / sqrt(hd)) V with a causal mask. No parameters: a separate module so that
    selective recomputation can checkpoint exactly this part (Korthikanti et al. 2022, Sec. 5)."""

    def __init__(self, kind: str, dropout: float):
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention={kind!r}: one of {', '.join(ATTENTION_KINDS)}")
        self.kind = kind
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t, _, hd = q.shape
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, n, T, hd)
        p = self.dropout if self.training else 0.0
        if self.kind == "flash":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=True)
        else:
            group = q.shape[1] // k.shape[1]  # query heads per KV head
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)  # (B, nh, T, T)
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            att = F.dropout(att.masked_fill(~mask, float("-inf")).softmax(dim=-1), p)
            y = att @ v  # (B, nh, T, hd)
        return y.transpose(1, 2).reshape(b, t, -1)  # (B, T, nh_local * hd)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float, attention: str):
        super().__init__()
        h, hd = spec.hidden, spec.head_dim  # head_dim: hidden/heads, or explicit (Qwen3: q wider than h)
        self.head_dim = hd
        self.q_per_kv = spec.heads // spec.kv_heads
        # grouped per KV head; biases: gpt's, or on q, k, v only (Qwen1.5/2's qkv_bias)
        self.wqkv = nn.Linear(h, spec.q_width + 2 * spec.kv_hidden, bias=spec.has_bias or spec.qkv_bias)
        self.core = AttentionCore(attention, dropout)
        self.wo = nn.Linear(spec.q_width, h, bias=spec.has_bias)
        # QK-norm before RoPE: over all of q and of k (OLMoE), or per head (Qwen3)
        self.qk_norm = spec.qk_norm
        if spec.qk_norm != "none":
            full = spec.qk_norm == "full"
            self.q_norm = make_norm(spec, spec.q_width if full else hd)
            self.k_norm = make_norm(spec, spec.kv_hidden if full else hd)
        self.drop = nn.Dropout(dropout)
        self.rope = not spec.learned_positions
        self.positions: torch.Tensor | None = None  # global token positions (context parallel: GPT.set_positions)
        if self.rope:
            # On the meta device, shapes only (GPT.init_weights fills them in; see _embedding).
            half = (hd + 1) // 2  # rope_tables: one angle per channel pair
            cos, sin = (torch.empty(spec.seq_len, half), torch.empty(spec.seq_len, half)) if _on_meta() \
                else rope_tables(spec.seq_len, hd)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, C)
        b, t, _ = x.shape
        g, hd = self.q_per_kv, self.head_dim
        # view(b, t, -1, ...): each tensor-parallel rank holds only its share of the groups.
        qkv = self.wqkv(x).view(b, t, -1, (g + 2) * hd)  # (B, T, nkv_local, (g+2)*hd)
        q, k, v = qkv.split([g * hd, hd, hd], dim=-1)
        q = q.reshape(b, t, -1, hd)  # (B, T, nh_local, hd)
        if self.qk_norm == "full":  # over every head's channels (tensor parallel refused with it)
            q, k = self.q_norm(q.flatten(2)).view_as(q), self.k_norm(k.flatten(2)).view_as(k)
        elif self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin, pos = self.rope_cos, self.rope_sin, self.positions
            q, k = apply_rope(q, cos, sin, pos), apply_rope(k, cos, sin, pos)
        y = self.core(q, k, v)  # (B, T, nh_local * hd)
        return self.drop(self.wo(y))  # (B, T, C)


class MLP(nn.Module):
    """The dense MLP of width ``width`` (default ffn_hidden; an MoE's shared experts use theirs)."""

    def __init__(self, spec: ModelSpec, dropout: float, width: int | None = None):
        super().__init__()
        h, f, bias = spec.hidden, width or spec.ffn_hidden, spec.has_bias
        self.gated = spec.gated_mlp
        if self.gated:  # SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))
            self.gate = nn.Linear(h, f, bias=False)  # (C -> F)
            self.up = nn.Linear(h, f, bias=False)  # (C -> F)
            self.down = nn.Linear(f, h, bias=False)  # (F -> C)
        else:
            self.fc1, self.fc2 = nn.Linear(h, f, bias=bias), nn.Linear(f, h, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, C)
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))  # inner (B, T, F_local)
        return self.drop(self.fc2(F.gelu(self.fc1(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x)). Layer ``index`` of an
    MoE model from ``dense_layers`` on has an MoE MLP (reference_trainer/moe.py) holding expert-
    parallel rank ``ep_rank``'s share of the routed experts."""

    def __init__(self, spec: ModelSpec, dropout: float, attention: str, index: int = 0, ep_rank: int = 0,
                 ep: int = 1):
        super().__init__()
        self.attn_norm, self.attn = make_norm(spec), Attention(spec, dropout, attention)
        self.mlp_norm = make_norm(spec)
        if spec.experts and index >= spec.dense_layers:
            from reference_trainer.moe import MoE

            self.mlp = MoE(spec, dropout, MLP, ep_rank, ep)
        else:
            self.mlp = MLP(spec, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor. None can exist before torch.distributed.tensor is imported (by
    tensor parallel, FSDP2 or a checkpoint), so a run that uses none of them does not pay that
    import (about 0.4 s a process on a CPU)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def _on_meta() -> bool:
    """Whether modules are being built on the meta device (shapes only). There the model skips
    computing initial values: some meta kernels (normal_, arange) are Python references that
    import torch._dynamo on first use, about 1 s a process on a CPU, and ``GPT.init_weights``
    fills every weight and buffer in afterwards."""
    return torch.get_default_device().type == "meta"


def _embedding(rows: int, width: int) -> nn.Embedding:
    """An ``nn.Embedding``, without its default normal_ init on the meta device (``_on_meta``)."""
    if _on_meta():
        return nn.Embedding(rows, width, _weight=torch.empty(rows, width))
    return nn.Embedding(rows, width)


class Embeddings(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float):
        super().__init__()
        self.tok = _embedding(spec.vocab, spec.hidden)  # (V, C)
        self.pos = _embedding(spec.seq_len, spec.hidden) if spec.learned_positions else None  # (T, C)
        self.drop = nn.Dropout(dropout) if dropout > 0 else None
        self.positions: torch.Tensor | None = None  # global token positions (context parallel: GPT.set_positions)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx (B, T) int64 -> (B, T, C)
        x = self.tok(idx)
        if self.pos is not None:
            pos = self.positions if self.positions is not None else torch.arange(idx.shape[1], device=idx.device)
            x = x + self.pos(pos)
        return self.drop(x) if self.drop is not None else x


class GPT(nn.Module):
    """The whole model, or one pipeline stage of it: ``layer_ids`` picks the layers, ``first``
    adds the embeddings, ``last`` the final norm and output head. Input: token ids (B, T) when
    ``first``, else hidden states (B, T, C). Output: logits (B, T, V) when ``last``, else (B, T, C).

    With tied embeddings the head reuses the token embedding's parameter; a last stage that does
    not hold the embedding keeps a copy (``head_is_tied_copy``) whose gradient the trainer sums
    with the first stage's, so the two stay equal (Megatron-LM's embedding group).
    """

    def __init__(self, spec: ModelSpec, *, layer_ids: Iterable[int] | None = None, first: bool = True,
                 last: bool = True, attention: str = "flash", ep_rank: int = 0, ep: int = 1):
        super().__init__()
        self.spec, self.ep_rank = spec, ep_rank
        dropout = spec.dropout
        ids = range(spec.layers) if layer_ids is None else layer_ids
        self.embed = Embeddings(spec, dropout) if first else None
        self.layers = nn.ModuleDict({str(i): Block(spec, dropout, attention, i, ep_rank, ep) for i in ids})
        self.norm = make_norm(spec) if last else None
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False) if last else None  # (V, C) weight
        self.head_is_tied_copy = bool(last and spec.tied_embeddings and not first)
        if first and last and spec.tied_embeddings:
            self.head.weight = self.embed.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)  # (B, T) -> (B, T, C)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is not None:
            x = self.head(self.norm(x))  # (B, T, V)
        return x

    def set_positions(self, positions: torch.Tensor | None) -> None:
        """The global positions (T_local,) of the tokens this rank sees, for RoPE and the learned
        position table: context parallel hands each rank two chunks of the sequence."""
        for module in self.modules():
            if isinstance(module, (Attention, Embeddings)):
                module.positions = positions

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) weights; residual projections scaled by 1/sqrt(2 * layers) (GPT-2);
        zero biases; unit norm weights. Each tensor from its own generator keyed by its name
        (wrappers' prefixes removed), drawn whole on the host and then cut to this rank's shard
        when the parameter is a DTensor: a model initialised on the meta device, parallelised
        and then materialised holds the same values as one initialised eagerly, for any layout.
        Also refills the RoPE buffers (``to_empty`` leaves them uninitialised)."""
        residual_std = INIT_STD / math.sqrt(2 * self.spec.layers)
        for name, p in self.named_parameters():
            name = name.replace(WRAPPER_PREFIX, "")
            key = "embed.tok.weight" if name == "head.weight" and self.spec.tied_embeddings else name
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{key}".encode()))
            leaf = name.rsplit(".", 2)
            if leaf[-2] == "experts":  # stacked (El, ...): this ep rank's slice of all experts' draw
                _init_experts(p, leaf[-1], self.spec.experts, self.ep_rank, gen, residual_std)
            elif "norm" in leaf[-2]:
                p.fill_(1.0 if leaf[-1] == "weight" else 0.0)
            elif leaf[-1] == "bias":
                p.zero_()
            else:
                std = residual_std if leaf[-2] in ("wo", "fc2", "down") else INIT_STD
                _assign(p, torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=gen))
        for module in self.modules():
            if isinstance(module, Attention) and module.rope:
                cos, sin = rope_tables(self.spec.seq_len, module.head_dim)
                module.rope_cos.copy_(cos)
                module.rope_sin.copy_(sin)


WRAPPER_PREFIX = "_checkpoint_wrapped_module."  # torch's checkpoint_wrapper


def _init_experts(p: torch.Tensor, leaf: str, experts: int, ep_rank: int, gen: torch.Generator,
                  residual_std: float) -> None:
    """Routed experts' stacked weights (El, ...): all ``experts`` drawn, as one process holding them
    all would, then expert-parallel rank ``ep_rank``'s consecutive El of them kept."""
    if leaf.endswith("bias"):
        p.zero_()
        return
    local = p.shape[0]
    std = residual_std if leaf in ("down", "fc2") else INIT_STD
    full = torch.empty((experts, *p.shape[1:]), dtype=torch.float32).normal_(0.0, std, generator=gen)
    _assign(p, full[ep_rank * local:(ep_rank + 1) * local])


def _assign(p: torch.Tensor, full: torch.Tensor) -> None:
    """Write the whole tensor ``full`` (host, fp32) into ``p``: a plain tensor takes it all; a
    DTensor (tensor parallel, FSDP2) takes this rank's shard of it, cut locally without
    communication (``src_data_rank=None``: every rank holds the same ``full``)."""
    if is_dtensor(p):
        from torch.distributed.tensor import distribute_tensor

        shard = distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
        p.to_local().copy_(shard.to_local())
    else:
        p.copy_(full)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32. logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
