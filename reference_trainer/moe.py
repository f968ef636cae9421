"""Mixture-of-experts MLP with expert parallel, the shape of a planner ``ModelSpec`` with experts > 0.

One MoE layer's MLP (planner/core/model.py counts the same parameters):
- router: Linear(hidden, experts, bias=False). Gating (Mixtral / Qwen-MoE style): softmax over all
  experts' logits, the top_k largest kept and renormalised to sum to 1 (equal to Mixtral's softmax
  over the top-k logits); with group-limited routing (expert_groups, groups_per_token) the top_k
  are taken inside the token's groups_per_token groups of highest best-expert probability;
- routed experts: each the dense MLP of the arch (SwiGLU for llama, GELU with biases for gpt) at
  width expert_ffn, stored stacked per rank: (experts/ep, ...) tensors;
- shared experts: ONE always-on MLP of width shared_experts * expert_ffn (DeepSeekMoE's fused
  shared experts), with Qwen-MoE's sigmoid gate Linear(hidden, 1) when shared_expert_gate.
- capacity_factor > 0: each expert takes at most ceil(cf * tokens * top_k / experts) of this rank's
  micro-batch's token slots, first come first served in token order (Switch Transformer, Fedus et
  al. 2022, Sec. 2.2); the others are dropped (their residual passes unchanged). 0: dropless.
- auxiliary load-balancing loss (``training.moe_aux_loss_coef``, default 0: off, so losses stay
  comparable with a one-process run): Switch Transformer's coef * E * sum_e f_e * P_e per MoE
  layer (Fedus et al. 2022, eqs. 4-6), f_e the share of this rank's N*k token slots the router
  sent to expert e (before capacity drops), P_e the mean router probability of e; added to the
  loss that backward starts from, not to the reported loss.

Expert parallel (GShard, Lepikhin et al. 2020): rank r of an ep group holds experts
[r*E/ep, (r+1)*E/ep). Each rank sorts its token slots by expert, sends each ep peer the rows for
its experts with ``all_to_all_single`` (sizes exchanged first), runs its experts on what it
received, and sends the outputs back with the reverse all-to-all; both are autograd Functions
whose backward is the reverse all-to-all. Expert weights are left out of DDP/FSDP; their gradients
are summed over the expert-data-parallel group (the dp*cp/ep ranks holding the same experts) and
divided by dp*cp, which is what averaging the dense weights over dp*cp gives them
(Megatron-Core's expert gradient scaling).

Shapes: N tokens (B*T), C hidden, E experts, El = E/ep local experts, k top_k, F expert_ffn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from planner.core.model import ModelSpec
from reference_trainer import exchange


class _AllToAll(torch.autograd.Function):
    """Rows of x sent in ``send`` sized pieces to the group's ranks; ``recv`` sized pieces received."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        with exchange.timed("all_to_all", x.device):
            dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        with exchange.timed("all_to_all", grad.device):
            dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv,
                                   group=ctx.group)
        return out, None, None, None


class Experts(nn.Module):
    """This rank's routed experts, weights stacked (El, ...). ``first``: the global index of the first."""

    def __init__(self, spec: ModelSpec, local: int, first: int, dropout: float):
        super().__init__()
        h, f = spec.hidden, spec.expert_ffn
        self.gated, self.first, self.total = spec.gated_mlp, first, spec.experts
        if self.gated:  # SwiGLU per expert: down(silu(x gate) * (x up))
            self.gate = nn.Parameter(torch.empty(local, h, f))
            self.up = nn.Parameter(torch.empty(local, h, f))
            self.down = nn.Parameter(torch.empty(local, f, h))
        else:  # GELU MLP with biases
            self.fc1 = nn.Parameter(torch.empty(local, h, f))
            self.fc1_bias = nn.Parameter(torch.empty(local, f))
            self.fc2 = nn.Parameter(torch.empty(local, f, h))
            self.fc2_bias = nn.Parameter(torch.empty(local, h))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x (M, C) grouped by local expert, ``counts[j]`` rows for expert j -> (M, C)."""
        outs = []
        for j, rows in enumerate(x.split(counts)):
            if self.gated:
                outs.append((F.silu(rows @ self.gate[j]) * (rows @ self.up[j])) @ self.down[j])
            else:
                inner = F.gelu(rows @ self.fc1[j] + self.fc1_bias[j], approximate="tanh")
                outs.append(self.drop(inner @ self.fc2[j] + self.fc2_bias[j]))
        return torch.cat(outs) if outs else x


class MoE(nn.Module):
    """Router, routed experts (this ep rank's share), optional shared MLP. (B, T, C) -> (B, T, C)."""

    def __init__(self, spec: ModelSpec, dropout: float, mlp_cls, ep_rank: int = 0, ep: int = 1):
        super().__init__()
        self.spec, self.k, self.ep, self.ep_rank = spec, spec.top_k, ep, ep_rank
        self.local = spec.experts // ep
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)  # (E, C)
        self.experts = Experts(spec, self.local, ep_rank * self.local, dropout)
        width = spec.shared_experts * spec.expert_ffn
        self.shared = mlp_cls(spec, dropout, width) if width else None
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        self.group: dist.ProcessGroup | None = None  # the ep group, set by reference_trainer.parallel
        self.aux_coef = 0.0  # training.moe_aux_loss_coef, set by the stepper
        self.aux_loss: torch.Tensor | None = None  # this forward's load-balancing loss (aux_coef > 0)

    def _limited(self, probs: torch.Tensor) -> torch.Tensor:
        """Group-limited routing (DeepSeek-V2's group_limited_greedy): the experts form expert_groups
        equal groups, each scored by its best expert's probability; a token's experts are chosen
        among its groups_per_token best groups only (the others' probabilities masked to 0)."""
        g, keep = self.spec.expert_groups, self.spec.groups_per_token
        if keep >= g:
            return probs
        n, e = probs.shape
        best = probs.view(n, g, e // g).amax(dim=-1).topk(keep, dim=-1).indices  # (N, keep)
        allowed = torch.zeros(n, g, dtype=torch.bool, device=probs.device).scatter_(1, best, True)
        return probs.masked_fill(~allowed.repeat_interleave(e // g, dim=1), 0.0)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, C) -> (token, expert, weight) of every kept slot, sorted by expert (stable)."""
        n, e = x.shape[0], self.spec.experts
        probs = self.router(x).float().softmax(dim=-1)  # (N, E)
        weight, expert = self._limited(probs).topk(self.k, dim=-1)  # (N, k)
        weight = weight / weight.sum(dim=-1, keepdim=True)
        if self.aux_coef > 0:  # Switch Transformer eqs. 4-6, over the top-k slots
            share = torch.bincount(expert.reshape(-1), minlength=e).float() / (n * self.k)  # f_e
            self.aux_loss = self.aux_coef * e * (share * probs.mean(dim=0)).sum()
        token = torch.arange(n, device=x.device).repeat_interleave(self.k)
        expert, weight = expert.reshape(-1), weight.reshape(-1)  # (N*k,)
        order = torch.argsort(expert, stable=True)
        token, expert, weight = token[order], expert[order], weight[order]
        if self.spec.capacity_factor > 0:
            capacity = math.ceil(self.spec.capacity_factor * n * self.k / e)
            counts = torch.bincount(expert, minlength=e)
            starts = torch.cumsum(counts, 0) - counts
            keep = torch.arange(expert.numel(), device=x.device) - starts[expert] < capacity
            token, expert, weight = token[keep], expert[keep], weight[keep]
        return token, expert, weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        flat = x.reshape(-1, c)  # (N, C)
        token, expert, weight = self.route(flat)
        rows = flat[token]  # (M, C) grouped by expert
        counts = torch.bincount(expert, minlength=self.spec.experts)  # (E,)
        y = self._experts(rows, counts)
        out = torch.zeros_like(flat).index_add(0, token, (y.float() * weight[:, None]).to(flat.dtype))
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(b, t, c)

    def _experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows grouped by global expert -> their experts' outputs, same order (dispatch, compute, combine)."""
        if self.ep == 1:
            return self.experts(rows, counts.tolist())
        ep, el = self.ep, self.local
        send_counts = counts.view(ep, el)  # rows for each peer's local experts
        recv_counts = torch.empty_like(send_counts)  # (ep sources, El): rows each source sends me
        with exchange.timed("all_to_all", rows.device):
            dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
        got = _AllToAll.apply(rows, send, recv, self.group)  # (R, C): by source, then local expert
        local_id = torch.arange(el, device=rows.device).repeat(ep).repeat_interleave(recv_counts.reshape(-1))
        order = torch.argsort(local_id, stable=True)  # regroup by local expert
        y = self.experts(got[order], recv_counts.sum(0).tolist())
        back = torch.empty_like(y).index_copy(0, order, y)  # source order again
        return _AllToAll.apply(back, recv, send, self.group)


def expert_param_names(module: nn.Module) -> list[str]:
    """Fully qualified names of the routed experts' weights (what expert parallel shards)."""
    return [name for name, _ in module.named_parameters() if ".experts." in f".{name}"]


@dataclass(kw_only=True)
class ExpertGroups:
    """This rank's expert-parallel coordinates: the ep group (ranks that exchange tokens, each
    holding E/ep experts) and the expert-data-parallel group (the dp*cp/ep ranks holding the same
    experts, over which their gradients are summed)."""

    ep: int
    ep_rank: int
    ep_group: dist.ProcessGroup | None
    edp_group: dist.ProcessGroup | None
    grad_ranks: int  # dp*cp: the expert gradients' sum is divided by this (an average over dp*cp)


def expert_groups(mesh, layout) -> ExpertGroups:
    """Carve ep groups out of the dp*cp ranks of each (pp, tp) coordinate: consecutive runs of ep
    ranks in (dp, cp) order (Megatron-Core's order, ep inside dp), the expert-data-parallel groups
    strided across them. Every rank creates every group, in the same order."""
    n = layout.dp * layout.cp
    if layout.ep == 1:
        return ExpertGroups(ep=1, ep_rank=0, ep_group=None, edp_group=None, grad_ranks=n)
    ranks = mesh.mesh.reshape(layout.pp, n // layout.ep, layout.ep, layout.tp)  # (pp, edp, ep, tp)
    me = dist.get_rank()
    ep_group = edp_group = None
    ep_rank = 0
    for a in range(layout.pp):
        for t in range(layout.tp):
            for e in range(n // layout.ep):
                members = [int(r) for r in ranks[a, e, :, t]]
                group = dist.new_group(members)
                if me in members:
                    ep_group, ep_rank = group, members.index(me)
            for j in range(layout.ep):
                members = [int(r) for r in ranks[a, :, j, t]]
                group = dist.new_group(members)
                if me in members:
                    edp_group = group
    return ExpertGroups(ep=layout.ep, ep_rank=ep_rank, ep_group=ep_group, edp_group=edp_group, grad_ranks=n)


def set_ep_group(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    for sub in module.modules():
        if isinstance(sub, MoE):
            sub.group = group


def reduce_expert_grads(module: nn.Module, groups: ExpertGroups) -> None:
    """With ep > 1: sum each expert weight's gradient over the expert-data-parallel group and
    divide by dp*cp (the dense weights' gradients are averaged over dp*cp by DDP/FSDP)."""
    if groups.ep == 1:
        return
    names = set(expert_param_names(module))
    for name, p in module.named_parameters():
        if name in names and p.grad is not None:
            if groups.edp_group is not None and dist.get_world_size(groups.edp_group) > 1:
                dist.all_reduce(p.grad, group=groups.edp_group)
            p.grad.div_(groups.grad_ranks)
