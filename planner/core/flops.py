"""FLOPs: the matmuls of one layer as GEMM shapes, and the model FLOPs behind MFU.

Forward FLOPs of a GEMM (m x k) @ (k x n) are 2*m*n*k; backward is twice forward (input and
weight gradients). Attention scores and values add 4*s*h FLOPs per token per layer forward
(Narayanan et al. 2021, Sec. 5.1 / eq. 3; PaLM, Chowdhery et al. 2022, App. B counts the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.core.model import ModelSpec

if TYPE_CHECKING:
    from planner.core.layout import Job


@dataclass(frozen=True, slots=True)
class Gemm:
    """A forward GEMM per micro-batch on one GPU: (m x k) @ (k x n), ``count`` of them."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    count: np.ndarray | float = 1.0

    @property
    def flops(self) -> np.ndarray:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def min_dim(self) -> np.ndarray:
        return np.minimum(np.minimum(self.m, self.n), self.k)


def layer_gemms(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray) -> list[Gemm]:
    """The weight GEMMs of one transformer layer, per GPU with tensor parallel ``tp``
    (Megatron's column/row split: QKV and MLP-in by output columns, proj and MLP-out by rows)."""
    tokens = micro_batch * model.seq_len
    h, f = model.hidden, model.ffn_hidden
    mlp_in = (2 if model.gated_mlp else 1) * f
    return [
        Gemm(tokens, (h + 2 * model.kv_hidden) / tp, h),  # fused QKV
        Gemm(tokens, h, h / tp),  # attention output projection
        Gemm(tokens, mlp_in / tp, h),  # MLP in (gate and up when gated)
        Gemm(tokens, h, f / tp),  # MLP out
    ]


def attention_core_flops(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """QK^T and AV forward FLOPs per layer per micro-batch per GPU, full (non-causal) s x s:
    2 * 2*b*s*s*h / tp. GQA does not change them (each query head still sees s keys)."""
    return 4.0 * micro_batch * model.seq_len**2 * model.hidden / tp


def logits_gemm(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray) -> Gemm:
    """The output head, vocabulary split across tensor-parallel ranks."""
    return Gemm(micro_batch * model.seq_len, model.vocab / tp, model.hidden)


def model_flops_per_token(model: ModelSpec, job: "Job | None" = None) -> float:
    """Training FLOPs per token without recomputation: 3x forward, where forward is
    2 FLOPs per matmul weight (layers and output head) plus 4*s*h per layer for attention.
    This is what MFU counts (PaLM convention, non-causal attention like Megatron's eq. 3).

    LoRA: frozen weights need only input gradients in backward (1x their forward, not 2x), the
    attention core still 2x, and the adapters 3x their forward: 4W + 3A + 3a per token."""
    from planner.core.finetune import lora_forward_flops_per_token

    weights = 2.0 * model.matmul_params_per_token
    attention = 4.0 * model.seq_len * model.hidden * model.layers
    if job is not None and job.lora:
        return 2 * weights + 3 * attention + 3 * lora_forward_flops_per_token(model, job)
    return 3.0 * (weights + attention)


def recompute_flops_per_token(model: ModelSpec, recompute: np.ndarray) -> np.ndarray:
    """Extra forward FLOPs per token that recomputation adds (HFU counts them, MFU does not).
    full: every layer's forward again (not the head); selective: attention core only
    (Korthikanti et al. 2022, Sec. 5)."""
    layer_forward = 2.0 * (model.matmul_params_per_token - model.vocab * model.hidden)
    attention = 4.0 * model.seq_len * model.hidden * model.layers
    return np.where(recompute == 2, layer_forward + attention, np.where(recompute == 1, attention, 0.0))


def megatron_eq3_flops(model: ModelSpec, batch_seqs: float) -> float:
    """FLOPs per iteration with full recompute, Narayanan et al. 2021 eq. 3:
    96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h)). For GPT shapes with ffn = 4h and MHA."""
    b, s, l, h, v = batch_seqs, model.seq_len, model.layers, model.hidden, model.vocab
    return 96.0 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
