"""LoRA (Hu et al. 2021): freeze the model, train a rank-r update (alpha/r) * B @ A beside each
target matrix. Applied from outside the model, before tensor/data parallelism, like recompute.

Targets are named as in the planner (planner/core/finetune.py): q_proj, k_proj, v_proj (slices of the
fused QKV), o_proj, gate_proj, up_proj, down_proj (gpt: fc1 and fc2). Each adds r * (d_in + d_out)
parameters per layer, so the trainable count equals ``planner.core.finetune.trainable_params``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from planner.core.model import ModelSpec


class LoRADelta(nn.Module):
    """x -> (alpha/r) * B(A(x)); B starts at zero, so training starts from the frozen model."""

    def __init__(self, d_in: int, d_out: int, r: int, alpha: float):
        super().__init__()
        self.a = nn.Parameter(torch.empty(r, d_in))  # (r, d_in)
        self.b = nn.Parameter(torch.zeros(d_out, r))  # (d_out, r)
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.scale = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d_in) -> (..., d_out)
        return (x @ self.a.t()) @ self.b.t() * self.scale


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus its LoRA delta (o_proj, gate/up/down, fc1/fc2)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float):
        super().__init__()
        self.base = base
        self.delta = LoRADelta(base.in_features, base.out_features, r, alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.delta(x)


class LoRAQKV(nn.Module):
    """The fused QKV projection (rows grouped per KV head: g query heads, then K, then V) with
    LoRA deltas on any of its q, k and v slices, each added to its own columns."""

    def __init__(self, base: nn.Linear, q_per_kv: int, head_dim: int, kv_heads: int, targets: set[str], r: int,
                 alpha: float):
        super().__init__()
        self.base, self.g, self.hd, self.kv = base, q_per_kv, head_dim, kv_heads
        h = base.in_features
        widths = {"q_proj": q_per_kv * kv_heads * head_dim, "k_proj": kv_heads * head_dim,
                  "v_proj": kv_heads * head_dim}
        self.deltas = nn.ModuleDict({t: LoRADelta(h, widths[t], r, alpha) for t in ("q_proj", "k_proj", "v_proj")
                                     if t in targets})

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, h + 2*h_kv)
        out = self.base(x)
        b, t, _ = out.shape
        grouped = out.view(b, t, self.kv, (self.g + 2) * self.hd)  # (B, T, nkv, (g+2)*hd)
        parts = list(grouped.split([self.g * self.hd, self.hd, self.hd], dim=-1))
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            if name in self.deltas:
                parts[i] = parts[i] + self.deltas[name](x).view(b, t, self.kv, -1)
        return torch.cat(parts, dim=-1).view(b, t, -1)


def apply_lora(module: nn.Module, spec: ModelSpec, r: int, alpha: float, targets: tuple[str, ...]) -> nn.Module:
    """Freeze every parameter of ``module`` (a GPT stage), then add the adapters to its layers."""
    for p in module.parameters():
        p.requires_grad_(False)
    wanted = set(targets)
    for block in module.modules():
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if attn is None or mlp is None:
            continue
        if wanted & {"q_proj", "k_proj", "v_proj"}:
            attn.wqkv = LoRAQKV(attn.wqkv, attn.q_per_kv, attn.head_dim, spec.kv_heads, wanted, r, alpha)
        if "o_proj" in wanted:
            attn.wo = LoRALinear(attn.wo, r, alpha)
        names = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"} if spec.gated_mlp else \
            {"up_proj": "fc1", "down_proj": "fc2"}
        for target, attr in names.items():
            if target in wanted:
                setattr(mlp, attr, LoRALinear(getattr(mlp, attr), r, alpha))
    return module
