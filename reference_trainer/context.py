"""Context parallel: each sequence split across the cp ranks of a data-parallel replica.

The sequence is cut into 2*cp equal chunks; cp rank i holds chunks i and 2*cp-1-i, so every rank
gets the same share of the causal attention work (the load-balanced split of Megatron-Core and
torchtitan). Each rank embeds, projects and runs the MLP on its own T/cp tokens; attention needs
every earlier token's keys and values, so each layer all-gathers K and V over the cp group
(torchtitan's default ``allgather`` rotation, not a ring of point-to-point steps) and masks by
global position: query at position p sees keys at positions <= p. The backward of the gather
is a sum of the gathered gradient over the cp group (an all-reduce; each rank keeps its own
slice), written as a ``torch.autograd.Function``.

torch's own ``torch.distributed.tensor.experimental.context_parallel`` does not run here: on
CPU (gloo) it stops with "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does
not have a sharding strategy registered" (torch 2.13), so the trainer writes its own.

RoPE and the learned position table take each chunk's global positions (``GPT.set_positions``).
The cp ranks sit inside the data-parallel group: gradients are reduced over dp*cp ranks (the
mesh's flattened ``dp_cp`` dimension), as torchtitan's dp_shard x cp mesh and Megatron-Core's
data-parallel-with-context-parallel group do.

Shapes: B batch, T sequence, Tl = T/cp local tokens, nh/nkv heads, hd head dim.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from reference_trainer import exchange
from reference_trainer.model import GPT, AttentionCore


def chunk_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions (Tl,) of cp rank ``rank``'s tokens: chunks rank and 2*cp-1-rank."""
    c = seq_len // (2 * cp)
    first, second = rank * c, (2 * cp - 1 - rank) * c
    return torch.cat([torch.arange(first, first + c), torch.arange(second, second + c)])


class _GatherSequence(torch.autograd.Function):
    """Forward: all-gather x (B, Tl, ...) over the cp group along dim 1, rank order -> (B, cp*Tl, ...).
    Backward: the gradient summed over the group (all-reduce), this rank's slice kept."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, rank: int, size: int) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(size)]
        with exchange.timed("cp_comm", x.device):
            dist.all_gather(parts, x, group=group)
        ctx.group, ctx.rank, ctx.tl = group, rank, x.shape[1]
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        with exchange.timed("cp_comm", grad.device):
            dist.all_reduce(grad, group=ctx.group)
        return grad[:, ctx.rank * ctx.tl:(ctx.rank + 1) * ctx.tl], None, None, None


class ContextParallelCore(nn.Module):
    """Causal attention of this rank's queries over the whole sequence's keys and values."""

    def __init__(self, core: AttentionCore, group: dist.ProcessGroup, rank: int, cp: int, seq_len: int,
                 device: torch.device):
        super().__init__()
        self.kind, self.dropout = core.kind, core.dropout
        self.group, self.rank, self.cp = group, rank, cp
        q_pos = chunk_positions(seq_len, cp, rank)
        k_pos = torch.cat([chunk_positions(seq_len, cp, r) for r in range(cp)])  # gathered order
        self.mask = (k_pos[None, :] <= q_pos[:, None]).to(device)  # (Tl, T) True: may attend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, tl, _, hd = q.shape  # q (B, Tl, nh, hd), k and v (B, Tl, nkv, hd)
        kv = _GatherSequence.apply(torch.cat([k, v], dim=-1), self.group, self.rank, self.cp)  # (B, T, nkv, 2hd)
        k, v = kv.split([hd, hd], dim=-1)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, n, T or Tl, hd)
        p = self.dropout if self.training else 0.0
        if self.kind == "flash":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=p, enable_gqa=True)
        else:
            group = q.shape[1] // k.shape[1]  # query heads per KV head
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)  # (B, nh, Tl, T)
            att = F.dropout(att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1), p)
            y = att @ v  # (B, nh, Tl, hd)
        return y.transpose(1, 2).reshape(b, tl, -1)  # (B, Tl, nh_local * hd)


def apply_cp(module: GPT, group: dist.ProcessGroup, rank: int, cp: int, device: torch.device) -> torch.Tensor:
    """Swap each layer's attention core for the context-parallel one and hand the model its
    tokens' global positions; returns those positions (the step slices its batches with them)."""
    seq_len = module.spec.seq_len
    for block in module.layers.values():
        block.attn.core = ContextParallelCore(block.attn.core, group, rank, cp, seq_len, device)
    positions = chunk_positions(seq_len, cp, rank).to(device)
    module.set_positions(positions)
    return positions
