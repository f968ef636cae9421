"""Mixture-of-experts: the routed experts' GEMMs, the tokens each GPU computes, and the
all-to-all that carries tokens to their experts and back (expert parallel).

Conventions (stated in the README):
- Expert parallel ``ep`` is carved out of the dp*cp ranks, contiguous after tensor parallel (ranks
  ``tp`` apart), as Megatron-Core and torchtitan lay it out; each ep rank holds experts/ep of
  every MoE layer's routed experts. The routed experts are split across the tp ranks as well
  (Megatron-Core's default expert-tensor-parallel size = tp), so an MoE with tp > 1 runs
  sequence parallel (Megatron-Core requires it) and each GPU dispatches its sequence shard.
- Dropless routing sends each token to top_k experts; with a capacity factor every expert's
  buffer is padded to capacity_factor x its mean load (Switch Transformer), so top_k x cf per
  token is computed and moved.
- Load imbalance: with ep > 1 the busiest rank receives ``expert_imbalance`` x the mean tokens
  and sets the pace (its GEMMs, its all-to-all, its activations); with ep == 1 every expert is
  local and a rank's total expert work is exactly its tokens x top_k.
- The all-to-all is not overlapped with compute (Megatron-Core's --overlap-moe-expert-parallel-comm
  and DeepSeek's DualPipe hide it; not modelled): four per MoE layer per micro-batch (dispatch
  and combine, forward and backward), two more when the forward is recomputed, and under dropless
  routing one latency-bound exchange of token counts per forward.
- MFU counts active parameters: 6 x (attention, router, shared and top_k experts' weights) per
  token (planner.core.model.ModelSpec.matmul_params_per_token).
"""

from __future__ import annotations

import numpy as np

from planner.core import comm
from planner.core.flops import Gemm
from planner.core.layout import Candidates, Job
from planner.core.model import ModelSpec


def routed_per_token(model: ModelSpec) -> float:
    """Expert MLP passes per token: top_k (dropless), or top_k x capacity factor (padded buffers)."""
    return model.top_k * (model.capacity_factor if model.capacity_factor > 0 else 1.0)


def imbalance(job: Job, c: Candidates) -> np.ndarray:
    return np.where(c.ep > 1, job.expert_imbalance, 1.0)


def moe_mlp_width(model: ModelSpec, job: Job, c: Candidates) -> np.ndarray:
    """The MLP width one token of the busiest rank passes through in an MoE layer: its routed
    experts' (times the imbalance) plus the shared experts'; a dense MLP's width is ffn_hidden."""
    return (routed_per_token(model) * imbalance(job, c) + model.shared_experts) * model.expert_ffn


def moe_gemms(model: ModelSpec, job: Job, c: Candidates) -> list[Gemm]:
    """The forward GEMMs of one MoE layer's MLP block per micro-batch per GPU: the router, the
    shared MLP (dense-shaped), and the routed experts as a grouped GEMM: experts/ep local experts,
    each seeing the tokens routed to it from all ep ranks (tokens x routed x ep / experts, times
    the imbalance), its width split across tp."""
    tokens = c.micro_batch * model.seq_len / c.cp
    h, ef = model.hidden, model.expert_ffn
    inner = 2 if model.gated_mlp else 1
    per_expert = tokens * routed_per_token(model) * c.ep / model.experts * imbalance(job, c)
    local = model.experts / c.ep
    router = model.experts + model.shared_expert_gate  # Qwen's shared-expert gate: one more output
    out = [Gemm(tokens, np.full_like(c.tp, router, dtype=float), h),  # router (replicated)
           Gemm(per_expert, inner * ef / c.tp, h, local),  # experts in (gate and up when gated)
           Gemm(per_expert, h, ef / c.tp, local)]  # experts out
    if model.shared_experts:
        sf = model.shared_experts * ef
        out += [Gemm(tokens, inner * sf / c.tp, h), Gemm(tokens, h, sf / c.tp)]
    return out


def permute_bytes(model: ModelSpec, job: Job, c: Candidates, elem_bytes: float) -> np.ndarray:
    """HBM bytes of the forward's token permutation and un-permutation around the experts per
    micro-batch per GPU (read and write each routed copy, twice), plus the router's softmax and
    top-k over fp32 logits."""
    tokens = c.micro_batch * model.seq_len / c.cp
    routed = tokens * routed_per_token(model) * imbalance(job, c)
    return 4 * elem_bytes * routed * model.hidden / c.tp + 3 * 4 * tokens * model.experts / c.tp


def all_to_all_time(model: ModelSpec, job: Job, c: Candidates, links: comm.Links, elem_bytes: float) -> np.ndarray:
    """One all-to-all (dispatch or combine) of one MoE layer per micro-batch on the busiest rank:
    its routed copies of its sequence shard (tokens / tp under sequence parallel), the share
    (ep - 1) / ep of which leaves the GPU, over the ep group (ranks tp apart)."""
    tokens = c.micro_batch * model.seq_len / c.cp / c.tp
    bytes_ = elem_bytes * tokens * routed_per_token(model) * model.hidden * imbalance(job, c)
    return comm.all_to_all(links, bytes_, c.ep, c.tp)


def exposed_all_to_all(model: ModelSpec, job: Job, c: Candidates, links: comm.Links, elem_bytes: float,
                       recompute_full: np.ndarray) -> np.ndarray:
    """Expert parallel's exposed time per MoE layer per micro-batch: dispatch and combine in the
    forward and again (their gradients) in the backward, once more forward when it is recomputed;
    dropless routing first exchanges each rank's token counts per expert (a latency-bound
    collective of ep x experts integers: Megatron-Core's alltoall dispatcher gathers them, the
    reference trainer all-to-alls them), in every forward."""
    data = all_to_all_time(model, job, c, links, elem_bytes)
    counts = comm.all_to_all(links, 8.0 * model.experts, c.ep, c.tp) if model.capacity_factor == 0 else 0.0
    forwards = 1 + recompute_full
    return np.where(c.ep > 1, forwards * (2 * data + counts) + 2 * data, 0.0)


def activation_extra_per_token(model: ModelSpec, job: Job, c: Candidates, elem_bytes: float) -> np.ndarray:
    """Bytes per token an MoE layer keeps beyond a dense layer of its MLP width (no recompute):
    the permuted copies of the expert inputs (kept for the experts' weight gradients; gathered
    over tp, as the experts are split across it) and the router's fp32 logits and probabilities."""
    routed = routed_per_token(model) * imbalance(job, c)
    return elem_bytes * model.hidden * routed + 8.0 * model.experts / np.where(c.sequence_parallel, c.tp, 1)
