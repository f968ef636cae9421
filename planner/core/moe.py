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
- Four all-to-alls per MoE layer per micro-batch (dispatch and combine, forward and backward), two
  more when the forward is recomputed, and under dropless routing one latency-bound exchange of
  token counts per forward. The stack says how they run (software_stacks/*.toml, [moe]): the bytes
  per element toward the experts (dispatch; the backward's output gradients) and back (combine;
  the input gradients), e.g. DeepSeek-V3's fp8 dispatch; whether a token crosses the network once
  per node it goes to and is forwarded over NVLink there (DeepEP), where a plain all-to-all sends
  every routed copy; and how much of the layer's compute (another micro-batch's, under DualPipe
  or Megatron-Core's --overlap-moe-expert-parallel-comm) hides them, at the price of the SMs the
  communication kernels hold while the compute runs. Group-limited routing (DeepSeek's n_group,
  topk_group) bounds the nodes a token can reach.
- MFU counts active parameters: 6 x (attention, router, shared and top_k experts' weights) per
  token (planner.core.model.ModelSpec.matmul_params_per_token).
"""

from __future__ import annotations

import math

import numpy as np

from planner.core import comm
from planner.core.columns import as_float, maximum, minimum, where
from planner.core.flops import Gemm
from planner.core.layout import Candidates, Job
from planner.core.model import ModelSpec
from planner.stacks import Stack


def routed_per_token(model: ModelSpec) -> float:
    """Expert MLP passes per token: top_k (dropless), or top_k x capacity factor (padded buffers)."""
    return model.top_k * (model.capacity_factor if model.capacity_factor > 0 else 1.0)


def imbalance(job: Job, c: Candidates) -> np.ndarray:
    return where(c.ep > 1, job.expert_imbalance, 1.0)


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
    out = [Gemm(tokens, c.full(router), h),  # router (replicated)
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


def remote_nodes_per_token(model: ModelSpec, nodes: np.ndarray) -> np.ndarray:
    """Expected other nodes one token's top_k experts lie on, when the ep group spans ``nodes`` nodes
    each holding an equal, contiguous block of the experts, and routing is uniform among the experts
    the token may reach. Group-limited routing (expert_groups, groups_per_token) first picks
    groups_per_token of the groups at random; the token's top_k distinct experts are drawn from
    those groups' E_R experts. A node holding x of them is missed with probability
    C(E_R - x, k) / C(E_R, k); x is a node's experts when its group was picked (a group spanning
    whole nodes), or j groups' experts with j hypergeometric (a node holding several groups). The
    token's own node is touched like any other, so (N - 1) x P(touched) of the others are."""
    n_all = maximum(np.asarray(nodes, dtype=float), 1.0)
    out = np.zeros(n_all.shape)
    e, g, pick, k = model.experts, model.expert_groups, model.groups_per_token, model.top_k
    reach = pick * e // g
    for n in np.unique(n_all):
        ni = round(float(n))
        if ni <= 1:
            continue
        if ni < g and g % ni == 0:  # a node holds g / n whole groups: j of them picked
            per = g // ni
            p_j = [math.comb(per, j) * math.comb(g - per, pick - j) / math.comb(g, pick)
                   for j in range(min(per, pick) + 1)]
            held = [(pj, j * e // g) for j, pj in enumerate(p_j)]
        else:  # a group spans whole nodes (or does not divide evenly: the node's share of a group)
            held = [(min(1.0, pick / g), e / ni), (1.0 - min(1.0, pick / g), 0.0)]
        touched = sum(p * (1.0 - _missed(reach, x, k)) for p, x in held)
        out[n_all == n] = (ni - 1) * touched
    return out


def _missed(pool: float, held: float, k: int) -> float:
    """Probability that k distinct picks from ``pool`` items miss all ``held`` of them."""
    miss = 1.0
    for i in range(k):
        miss *= max(pool - held - i, 0.0) / (pool - i)
    return miss


def all_to_all_time(model: ModelSpec, job: Job, c: Candidates, links: comm.Links, elem_bytes: float,
                    dedup: bool = False) -> np.ndarray:
    """One all-to-all (dispatch or combine) of one MoE layer per micro-batch on the busiest rank:
    its routed copies of its sequence shard (tokens / tp under sequence parallel), the share
    (ep - 1) / ep of which leaves the GPU, over the ep group (ranks tp apart).

    ``dedup`` (DeepEP's internode kernels): a token crosses the network once per other node it
    goes to (remote_nodes_per_token), to the GPU of its own rank there, which forwards the copies
    over NVLink; every copy bound for another GPU of a node (the share (k - 1) / k, k the group's
    GPUs per node) takes one NVLink hop. Both tiers at once; the slower sets the time."""
    tokens = c.micro_batch * model.seq_len / c.cp / c.tp
    per_copy = elem_bytes * tokens * model.hidden * imbalance(job, c)
    bytes_ = per_copy * routed_per_token(model)
    if not dedup:
        return comm.all_to_all(links, bytes_, c.ep, c.tp)
    size = as_float(c.ep)
    k = comm.in_node(links, size, c.tp)
    inside = bytes_ * (k - 1) / k / links.intra_bw + where(k > 1, links.intra_lat, 0.0)
    padded = model.capacity_factor if model.capacity_factor > 0 else 1.0  # buffers padded to capacity
    across = (per_copy * padded * remote_nodes_per_token(model, size / k) / links.inter_bw
              + where(size > k, links.inter_lat, 0.0))
    return where(size > 1, maximum(inside, across), 0.0)


def exposed_all_to_all(model: ModelSpec, job: Job, c: Candidates, links: comm.Links, elem_bytes: float,
                       recomputed: np.ndarray | float, stack: Stack | None = None,
                       compute: np.ndarray | float = 0.0) -> np.ndarray:
    """Expert parallel's exposed time per MoE layer per micro-batch: dispatch and combine in the
    forward and again (their gradients) in the backward, once more forward when it is recomputed
    (``recomputed``: the share of layers recomputed whole, planner.core.layout.recomputed_layers);
    dropless routing first exchanges each rank's token counts per expert (a latency-bound
    collective of ep x experts integers: Megatron-Core's alltoall dispatcher gathers them, the
    reference trainer all-to-alls them), in every forward.

    With a ``stack`` (planner.stacks.Stack, its [moe] table): dispatch-direction transfers at
    ep_dispatch_bytes, combine-direction ones at ep_combine_bytes (0: ``elem_bytes``), deduplicated
    per node with ep_dedup; ep_overlap x ``compute`` (the layer's forward, backward and recompute
    time per micro-batch) hides them, and while they run beside it the communication kernels hold
    the share ep_sm_share of the SMs: the compute they hide behind takes 1 / (1 - ep_sm_share) as long."""
    dispatch_b, combine_b, dedup, overlap, sms = elem_bytes, elem_bytes, False, 0.0, 0.0
    if stack is not None:
        dispatch_b = stack.ep_dispatch_bytes or elem_bytes
        combine_b = stack.ep_combine_bytes or elem_bytes
        dedup, overlap, sms = stack.ep_dedup, stack.ep_overlap, stack.ep_sm_share
    dispatch = all_to_all_time(model, job, c, links, dispatch_b, dedup)
    combine = dispatch if combine_b == dispatch_b else all_to_all_time(model, job, c, links, combine_b, dedup)
    counts = comm.all_to_all(links, 8.0 * model.experts, c.ep, c.tp) if model.capacity_factor == 0 else 0.0
    forwards = 1 + recomputed
    total = forwards * (dispatch + combine + counts) + dispatch + combine
    if overlap > 0:
        hidden = minimum(total, overlap * as_float(compute))
        total = total - hidden + hidden * sms / (1.0 - sms)
    return where(c.ep > 1, total, 0.0)


def activation_extra_per_token(model: ModelSpec, job: Job, c: Candidates, elem_bytes: float) -> np.ndarray:
    """Bytes per token an MoE layer keeps beyond a dense layer of its MLP width (no recompute):
    the permuted copies of the expert inputs (kept for the experts' weight gradients; gathered
    over tp, as the experts are split across it) and the router's fp32 logits and probabilities."""
    routed = routed_per_token(model) * imbalance(job, c)
    return elem_bytes * model.hidden * routed + 8.0 * model.experts / where(c.sequence_parallel, c.tp, 1)
