"""FLOPs: the matmuls of one layer as GEMM shapes, and the model FLOPs behind MFU.

Forward FLOPs of a GEMM (m x k) @ (k x n) are 2*m*n*k; backward is twice forward (input and
weight gradients). Attention scores and values (QK^T and AV) cost 4*s*h FLOPs per token per layer
forward over the full s x s square (Narayanan et al. 2021, eq. 3; PaLM, Chowdhery et al. 2022,
App. B; torchtitan's MFU). A causal model needs only the lower triangle: 2*s*h.

The convention here, the same in the MFU numerator and in the time: attention is counted CAUSAL
(half the square), because that is the work a causal kernel (FlashAttention, cuDNN) does and what
its time pays for. Megatron's eq. 3 and torchtitan's reported MFU count the full square; at 8K
tokens that adds 12-14% to a Llama 3 8B's FLOPs, at 128K it more than doubles them.
``causal=False`` gives the full-square count for comparing with those.

MFU counts model FLOPs only, causal, whatever the kernel: a kernel that computes the whole square
(standard attention, or a flash kernel under a dense bias or mask: the stack's
``attention_square = "full"``) spends twice the attention time for the same model FLOPs, so its MFU
is lower; HFU (``hardware_flops_per_token``) counts the square it really computes, and recompute.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.core.columns import minimum, where
from planner.core.layout import recomputed_layers
from planner.core.model import ModelSpec
from planner.memo import by_identity, fast_init

if TYPE_CHECKING:
    from planner.core.layout import Job


@fast_init
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
        return minimum(minimum(self.m, self.n), self.k)


def layer_gemms(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray, cp: np.ndarray | int = 1) -> list[Gemm]:
    """The weight GEMMs of one transformer layer, per GPU with tensor parallel ``tp``
    (Megatron's column/row split: QKV and MLP-in by output columns, proj and MLP-out by rows);
    context parallel ``cp`` gives each GPU 1/cp of the sequence's tokens."""
    tokens = micro_batch * model.seq_len / cp
    h, f = model.hidden, model.ffn_hidden
    mlp_in = (2 if model.gated_mlp else 1) * f
    # Q, K and V projections as one GEMM of the attention block's input width (MLA's low-rank
    # pairs and an explicit head_dim included: its FLOPs are those of attention_matmul_params).
    out = model.attn_out_width
    qkv = (model.attention_matmul_params - out * h) / h
    if model.linear_layers:  # the mean layer: softmax attention's projections in some, Gated DeltaNet's in the rest
        lin, soft = model.linear_layers / model.layers, model.softmax_share
        value = model.linear_value_heads * model.linear_value_dim
        return [
            Gemm(tokens, qkv / tp, h, soft),  # q (and its gate), k, v
            Gemm(tokens, h, out / tp, soft),  # attention output projection
            Gemm(tokens, model.linear_projection_width / tp, h, lin),  # q, k, v, z, b, a
            Gemm(tokens, h, value / tp, lin),  # the linear layer's output projection
            Gemm(tokens, mlp_in / tp, h),
            Gemm(tokens, h, f / tp),
        ]
    gemms = [
        Gemm(tokens, qkv / tp, h),  # fused QKV (h + 2 h_kv for standard attention)
        Gemm(tokens, h, out / tp),  # attention output projection
        Gemm(tokens, mlp_in / tp, h),  # MLP in (gate and up when gated)
        Gemm(tokens, h, f / tp),  # MLP out
    ]
    if model.index_topk:
        gemms[2:2] = indexer_gemms(model, micro_batch, cp)
    return gemms


def indexer_gemms(model: ModelSpec, micro_batch: np.ndarray, cp: np.ndarray | int = 1) -> list[Gemm]:
    """DSA's indexer projections in one layer (in ``layer_gemms``), whole on every TP rank
    (Megatron-Core duplicates its linears): wq_b from the q latent, wk and weights_proj from the
    hidden state. Their inputs are detached (Megatron-Core's DSAIndexer: ``x.detach()``,
    ``qr.detach()``), so their backward computes the weights' gradients alone."""
    tokens, h = micro_batch * model.seq_len / cp, model.hidden
    return [Gemm(tokens, model.index_heads * model.index_head_dim, model.q_lora_rank or h),  # wq_b
            Gemm(tokens, model.index_head_dim + model.index_heads, h)]  # wk, weights_proj


def attention_core_flops(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray,
                         causal: bool = True, cp: np.ndarray | int = 1) -> np.ndarray:
    """QK^T and AV forward FLOPs per layer per micro-batch per GPU: 2*b*s*s*(heads*qk_dim + heads*v_dim) / tp
    over the full square (= 2 * 2*b*s*s*h for standard attention; MLA: qk_dim = qk_nope + qk_rope,
    v_dim = v_head_dim), half of it causal. GQA does not change them (each query head still sees its keys).
    Context parallel splits them evenly over ``cp`` GPUs (load-balanced causal chunks: each rank
    holds chunks i and 2cp-1-i, so every rank does the same share of the triangle). Causal, a sliding
    window leaves the ``attention_span`` share of the triangle; the full square is the full square
    (of the softmax layers: linear-attention layers have none)."""
    if causal and model.global_layers:  # each kind of layer its own share of the triangle at its own width
        return 0.5 * 2.0 * micro_batch * model.seq_len**2 * model.attention_pair_width / tp / cp
    half = 0.5 * model.attention_span if causal else model.softmax_share
    return half * 2.0 * micro_batch * model.seq_len**2 * model.attn_core_width / tp / cp


def linear_core_flops(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray,
                      cp: np.ndarray | int = 1) -> np.ndarray:
    """The gated delta rule's forward FLOPs per layer (the mean over layers) per micro-batch per GPU:
    ``linear_core_flops`` per token of each linear layer, value heads split by tensor parallel and
    by context parallel (its all-to-all gives each rank the whole sequence of 1/cp of the heads)."""
    return micro_batch * model.seq_len * model.linear_core_flops * (model.linear_layers / model.layers) / tp / cp


def indexer_flops(model: ModelSpec, micro_batch: np.ndarray, cp: np.ndarray | int = 1) -> np.ndarray:
    """DSA's lightning indexer, its scores' forward FLOPs per layer per micro-batch per GPU: 2 x
    index_heads x index_head_dim per causal (query, key) pair (q_h . k, ReLU, weighted sum over
    heads), this GPU's 1/cp of the queries against every earlier key; not split by TP (Megatron-
    Core gathers the sequence and runs the whole indexer on every TP rank)."""
    return 0.5 * 2.0 * micro_batch * model.seq_len**2 * model.index_heads * model.index_head_dim / cp


def indexer_training_flops_per_token(model: ModelSpec, trains: bool = True) -> float:
    """What DSA adds to a token's training FLOPs, all layers (0 without DSA): the indexer's scores
    forward (2 H_I d_I a causal pair: s/2 pairs a token on average); where the indexer ``trains``
    (not under LoRA, which freezes it: its loss coefficient 0, no gradient), its KL loss's backward over
    the selected keys (Megatron-Core's sparse loss: the logits again, dQ and dK, 3 x 2 H_I d_I a
    pair; the indexer's inputs are detached, nothing flows further); and the loss's target, the
    main attention's scores over the selected keys again (QK^T against the latent key, 2 x
    (kv_lora_rank + qk_rope_dim) a head and pair; cuDNN's backend, from the forward's log-sum-exp).
    min(i, index_topk) keys for query i: ``attention_span`` x s/2 a token on average."""
    if not model.index_topk:
        return 0.0
    s = model.seq_len
    selected = 0.5 * model.attention_span * s
    index = 2.0 * model.index_heads * model.index_head_dim
    target = 2.0 * model.heads * model.kv_cache_width
    return model.layers * (index * 0.5 * s + (3 * index + target) * selected * trains)


def logits_gemm(model: ModelSpec, micro_batch: np.ndarray, tp: np.ndarray, cp: np.ndarray | int = 1) -> Gemm:
    """The output head, vocabulary split across tensor-parallel ranks, tokens across context-parallel ones."""
    return Gemm(micro_batch * model.seq_len / cp, model.vocab / tp, model.hidden)


def attention_flops_per_token(model: ModelSpec, causal: bool = True) -> float:
    """Forward attention-core FLOPs per token, all layers: 2*s*heads*(qk_dim + v_dim) per layer (4*s*h
    for standard attention), half of it causal (and of that the ``attention_span`` share: sliding windows,
    linear layers); a linear layer's gated delta rule, ``linear_core_flops`` a token."""
    if causal and model.global_layers:
        return 0.5 * 2.0 * model.seq_len * model.attention_pair_width * model.layers
    half = 0.5 * model.attention_span if causal else model.softmax_share
    core = half * 2.0 * model.seq_len * model.attn_core_width * model.layers
    return core + model.linear_layers * model.linear_core_flops if model.linear_layers else core


def mtp_attention_flops_per_token(model: ModelSpec, causal: bool = True) -> float:
    """The multi-token-prediction modules' attention cores, forward, per token: each module's layer
    as the model's mean layer (every layer's alike in a model of one attention kind)."""
    return model.mtp_layers * attention_flops_per_token(model, causal) / model.layers


def model_flops_per_token(model: ModelSpec, job: "Job | None" = None, causal: bool = True) -> float:
    """Training FLOPs per token without recomputation: 3x forward, where forward is
    2 FLOPs per matmul weight (layers and output head) plus the attention core (causal: 2*s*h
    per layer; ``causal=False``: 4*s*h, Megatron's eq. 3 and torchtitan's count).
    This is what MFU counts. Multi-token-prediction modules (``mtp_layers``) count too, as
    Megatron-LM's FLOPs count does: each one's layer, projection and output head pass.

    LoRA: frozen weights need only input gradients in backward (1x their forward, not 2x), the
    attention core still 2x, and the adapters 3x their forward: 4W + 3A + 3a per token.

    DeepSeek sparse attention adds its indexer (``indexer_training_flops_per_token``), and its
    projections, whose inputs are detached, take no input gradients: 2x their forward (1x under
    LoRA, which freezes them), not 3x (2x)."""
    return _model_flops(model, job, causal)


@by_identity  # the same model and job again (several reads an estimate): no hashing
@functools.lru_cache(maxsize=256)  # model and job are frozen: read once per pair (6 us for an MoE)
def _model_flops(model: ModelSpec, job: Job | None, causal: bool) -> float:
    from planner.core.finetune import lora_forward_flops_per_token

    weights = 2.0 * model.matmul_params_per_token
    attention = attention_flops_per_token(model, causal)
    if model.mtp_layers:  # the multi-token-prediction modules train beside the model (not under LoRA: refused)
        weights += 2.0 * model.mtp_matmul_params_per_token
        attention += mtp_attention_flops_per_token(model, causal)
    indexer = indexer_training_flops_per_token(model, not (job is not None and job.lora))  # DSA's (0 without)
    if model.index_topk:  # DSA's indexer projections, in ``weights``: inputs detached, so no input gradients
        # (weight gradients only; none under LoRA, which freezes the indexer): 2 FLOPs a weight a token fewer
        indexer -= 2.0 * model.layers * model.indexer_matmul_params
    if job is not None and job.lora:
        return 2 * weights + 3 * attention + 3 * lora_forward_flops_per_token(model, job) + indexer
    return 3.0 * (weights + attention) + indexer


def op_sac_recomputed_share(model: ModelSpec) -> float:
    """The share of a layer's weight-GEMM FLOPs that torchtitan's op-level selective checkpointing
    recomputes: it saves every matmul's output except every second one per block (counted in
    forward order wq, wk, wv, wo, w1, w3, w2 for a gated MLP: wk, wo and w3 are recomputed; for a
    GELU MLP fused QKV, proj, fc1, fc2: proj and fc2) (torchtitan parallelize_llama,
    _apply_ac_to_transformer_block, "op" policy)."""
    h, f = model.hidden, model.ffn_hidden
    q, k, v, o = model.q_width, model.k_width, model.v_width, model.attn_out_width  # h, hkv, hkv, h when standard
    if model.gated_mlp:
        return (h * k + o * h + f * h) / (h * (q + k + v) + o * h + 3 * f * h)
    return (o * h + f * h) / (h * (q + k + v) + o * h + 2 * f * h)


def recompute_flops_per_token(model: ModelSpec, recompute: np.ndarray, selective: str = "attention",
                              causal: bool = True) -> np.ndarray:
    """Extra forward FLOPs per token that recomputation adds (HFU counts them, MFU does not).
    full: every layer's forward again (not the head); selective "attention": the attention core
    (Korthikanti et al. 2022, Sec. 5); selective "op": the share of weight GEMMs torchtitan's
    op-level policy recomputes (attention's output is kept); half, quarter: every second, fourth
    layer's forward (``recomputed_layers``: the share recomputed whole)."""
    full, selective_flops = _recompute_flops(model, selective, causal)
    return recomputed_layers(recompute) * full + where(recompute == 1, selective_flops, 0.0)


@by_identity  # the same objects again (an estimate reads it several times): no hashing
@functools.lru_cache(maxsize=256)
def _recompute_flops(model: ModelSpec, selective: str, causal: bool) -> tuple[float, float]:
    """(full, selective) recomputation's extra forward FLOPs per token, read once per model."""
    layer_gemms = 2.0 * (model.matmul_params_per_token - model.vocab * model.hidden)
    attention = attention_flops_per_token(model, causal)
    if model.mtp_layers:  # the modules' layers and projections are recomputed as the others (not the head)
        layer_gemms += 2.0 * (model.mtp_matmul_params_per_token - model.mtp_layers * model.vocab * model.hidden)
        attention += mtp_attention_flops_per_token(model, causal)
    if model.index_topk:  # a whole layer's forward again scores every causal pair with the indexer again
        layer_gemms += model.layers * model.index_heads * model.index_head_dim * model.seq_len
    return (layer_gemms + attention,
            attention if selective == "attention" else op_sac_recomputed_share(model) * layer_gemms)


def hardware_flops_per_token(model: ModelSpec, job: "Job", recompute: np.ndarray, selective: str = "attention",
                             full_square: bool = False) -> np.ndarray:
    """What the GPUs compute per token (HFU's numerator): the model FLOPs (MFU's, attention causal),
    recomputation, and, where the attention kernel computes the whole s x s square (standard
    attention; a flash kernel under a dense bias or mask, the stack's ``attention_square = "full"``),
    the masked part it computes for nothing (the square less the causal work: half of it, more under a
    sliding window), forward and backward (3x, LoRA too), and in the recomputed forward."""
    extra = (3.0 * (attention_flops_per_token(model, causal=False) - attention_flops_per_token(model, causal=True))
             if full_square else 0.0)
    return (model_flops_per_token(model, job) + extra
            + recompute_flops_per_token(model, recompute, selective, causal=not full_square))


def megatron_eq3_flops(model: ModelSpec, batch_seqs: float) -> float:
    """FLOPs per iteration with full recompute, Narayanan et al. 2021 eq. 3:
    96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h)). For GPT shapes with ffn = 4h and MHA."""
    b, s, n, h, v = batch_seqs, model.seq_len, model.layers, model.hidden, model.vocab
    return 96.0 * b * s * n * h**2 * (1 + s / (6 * h) + v / (16 * n * h))
