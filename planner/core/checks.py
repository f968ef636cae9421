"""Troubleshooting checks on an estimate, each with its likely fix.

The thresholds are practitioners' rules of thumb, not measurements: the planning brief's
troubleshooting table (quoted and checked against the planner in docs/seed-check.md, claims 4 and
the troubleshooting row). The bubble fraction they judge is Narayanan et al. 2021, Sec. 2.2.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.core.resilience import DataFeedPlan, ReliabilityPlan

COMM_SHARE_LIMIT = 0.15  # "communication overhead should be < 15%"
BUBBLE_LIMIT = 0.15  # "more than 4 stages pushes the bubble over 15%"
MEMORY_HEADROOM = 0.05  # within 5% of capacity
# Above this share of what a plan may fill: the warning below, the estimate's roomier layout
# (planner.core.plan) and export's refusal (planner.export.plan).
ROOMY_SHARE = 1 - MEMORY_HEADROOM
DATA_WAIT_LIMIT = 0.10  # data wait over 10% of the step: the loader cannot keep up
MAX_STAGES_WITHOUT_WARNING = 4
MICRO_BATCHES_PER_STAGE = 4  # "few" micro-batches: fewer than 4 per pipeline stage
GOODPUT_FLOOR = 0.90  # warn when failures and checkpoints cost more than 10% of the run


# The exposed communication of a step by part (StepTime's), as the warning names the largest.
COMM_PARTS = {"tp": "tensor parallel's collectives are", "cp": "context parallel's K/V exchange is",
              "ep": "expert parallel's all-to-all is", "pp": "the pipeline's sends are",
              "dp": "the data-parallel gradient reduction is"}
# The layout fix of a part whose degree is a layout field of its name, and what a pinned one adds.
_FEWER = {"tp": ("a lower tp", " (traded for pp or dp)"), "cp": ("a lower cp", ""), "pp": ("fewer pipeline stages", "")}


def _comm_fix(part: str | None, *, tp: int, ep: int, gpus_per_node: int, searched: frozenset[str],
              overlap_grad_reduce: bool, async_tp_helps: bool) -> str:
    """The fix of communication over COMM_SHARE_LIMIT, by its largest part. A layout fix the
    search already made (its field in ``searched``: every other value ranked behind) is not one."""
    if part == "ep":
        inside = max(1, gpus_per_node // tp)
        return ((f"keep expert parallel inside a node (ep <= {inside}), or " if ep > inside and "ep" not in searched
                 else "")
                + "a stack that sends a token once per node and hides the all-to-all behind compute "
                  "(--stack hai-llm, or [moe] ep_dedup / ep_overlap in a stack file of your own)")
    if part == "dp":
        fix = "a larger global batch (each gradient reduction serves more tokens), or fewer GPUs"
        return fix if overlap_grad_reduce else "overlap the reduction with backward (drop --no-overlap), " + fix
    if part == "tp" and tp > gpus_per_node:
        if "tp" in searched:  # the search put it across nodes: the layouts keeping it inside ranked behind
            return (f"more GPUs, or GPUs with more memory: the layouts keeping tensor parallel inside a node "
                    f"(tp <= {gpus_per_node}) rank behind this one, slower or holding more memory")
        return "keep tensor parallel inside a node"
    if part not in _FEWER:  # no parts given
        return "a larger global batch, fewer GPUs, or a layout with less communication"
    fewer, how = _FEWER[part]
    async_tp = "asynchronous TP (--async-tp), which this stack overlaps further" if part == "tp" and async_tp_helps else ""
    if part in searched:
        return (f"the layouts with {fewer} rank behind this one, slower or holding more memory; "
                + (async_tp or "faster links, fewer GPUs, or a GPU with more memory"))
    return fewer + how + (f", or {async_tp}" if async_tp else "")


_PIPELINE_SPLIT = frozenset({"pp", "vpp", "micro_batch"})
_LARGER_BATCH = ("a larger global batch (more micro-batches per step): every other split into stages, interleaving "
                 "and micro-batches ranks behind this one, slower or holding more memory")


# The layout fields whose change the "does not fit" warning names as its fix.
_LAYOUT_FIXES = frozenset({"recompute", "zero_stage", "tp", "pp", "micro_batch"})


def warnings_for(*, comm_fraction: float, bubble_fraction: float, total_bytes: float, capacity_bytes: float,
                 pp: int, vpp: int, grad_accum: int, tp: int, gpus_per_node: int,
                 feed: "DataFeedPlan | None" = None, reliability: "ReliabilityPlan | None" = None,
                 comm_parts: dict[str, float] | None = None, ep: int = 1, gpu_bytes: float | None = None,
                 measured_under: tuple[float, str] = (0.0, ""), tight_bytes: float | None = None,
                 searched: frozenset[str] = frozenset(), overlap_grad_reduce: bool = True,
                 async_tp_helps: bool = False) -> list[str]:
    """The report's warnings. ``gpu_bytes``: the GPU's whole memory (``capacity_bytes`` is what a
    plan may fill: less with --memory-headroom); ``measured_under``: how far below the memory they
    used the measured runs like this plan were predicted at worst (a fraction of what they used: a
    plan that leaves that share of the GPU free covers them), and what they were. ``searched``: the
    layout fields a search chose for this layout, its best (empty: a layout pinned, or a row of a
    listing). Every other value of those ranked behind it, so a fix that changes one of them is no
    fix to make: tensor or expert parallel spanning nodes, or a layout that does not fit whatever
    its recompute, ZeRO stage, tp, pp and micro-batch. ``comm_parts``: the exposed communication by
    part (COMM_PARTS), each a share of the step: the largest is named, and its fix given;
    ``overlap_grad_reduce``: the job overlaps the gradient reduction with backward;
    ``async_tp_helps``: asynchronous TP (--async-tp) would hide more of TP's collectives on this
    stack than the job does."""
    out = []
    comm_parts = comm_parts or {}
    under_share, like = measured_under
    gpu_bytes = capacity_bytes if gpu_bytes is None else gpu_bytes
    tight_bytes = capacity_bytes if tight_bytes is None else tight_bytes
    # Every layout the search tried is over capacity too (the ranking puts any under it first).
    none_under = _LAYOUT_FIXES <= searched
    if capacity_bytes < total_bytes <= tight_bytes:  # above capacity, within the stack's measured error
        fix = ("more GPUs or a GPU with more memory: no layout is under the memory available on these GPUs, "
               "whatever its recompute, ZeRO stage, tp, pp and micro-batch" if none_under else
               "a smaller micro-batch, recompute or a higher ZeRO stage")
        out.append(f"tight: {total_bytes / 2**30:.1f} GiB predicted, above the {capacity_bytes / 2**30:.0f} GiB "
                   f"available but under {tight_bytes / 2**30:.1f} GiB, within the stack's measured memory error "
                   f"(measured runs used up to that much less than predicted): it may not fit; fix: {fix}")
    elif total_bytes > capacity_bytes:
        over = (total_bytes - capacity_bytes) / 2**30
        fix = ("more GPUs or a GPU with more memory: no layout fits on these GPUs, whatever its recompute, ZeRO "
               "stage, tp, pp and micro-batch" if none_under else
               "activation recompute, a higher ZeRO stage, more tp/pp, or a smaller micro-batch")
        out.append(f"does not fit: {total_bytes / 2**30:.1f} GiB needed, {capacity_bytes / 2**30:.0f} GiB available "
                   f"({over:.1f} GiB over); fix: {fix}")
    elif under_share > MEMORY_HEADROOM and total_bytes > (1 - under_share) * gpu_bytes:
        need = math.ceil(under_share * 100) / 100
        out.append(f"memory at {total_bytes / gpu_bytes:.0%} of the GPU's, and the measured runs like this plan "
                   f"({like}) were predicted up to {under_share:.1%} below the memory they used; fix: "
                   f"--memory-headroom {need:.2f} (plan with that share free), recompute, a smaller micro-batch or "
                   "a higher ZeRO stage")
    elif total_bytes > ROOMY_SHARE * capacity_bytes:
        out.append(f"memory at {total_bytes / capacity_bytes:.0%} of capacity (within {MEMORY_HEADROOM:.0%}): "
                   "torch's caching allocator may free its cache and retry (each retry synchronises the GPU, so "
                   "steps run slower than predicted) or OOM on a spike; fix: a smaller micro-batch, recompute or a "
                   "higher ZeRO stage")
    if comm_fraction > COMM_SHARE_LIMIT:
        part = max(comm_parts, key=comm_parts.get) if comm_parts else None
        what = f"; {COMM_PARTS[part]} {comm_parts[part]:.0%}" if part else ""
        fix = _comm_fix(part, tp=tp, ep=ep, gpus_per_node=gpus_per_node, searched=searched,
                        overlap_grad_reduce=overlap_grad_reduce, async_tp_helps=async_tp_helps)
        out.append(f"communication is {comm_fraction:.0%} of the step (> {COMM_SHARE_LIMIT:.0%}){what}; fix: {fix}")
    # The pipeline's split (stages, interleaving, micro-batch) chosen by the search: every other split
    # ranked behind, so only a larger global batch (more micro-batches per step) is left to change.
    split_searched = _PIPELINE_SPLIT <= searched
    if bubble_fraction > BUBBLE_LIMIT:
        fix = (_LARGER_BATCH if split_searched else
               "more micro-batches per step (larger global batch or smaller micro-batch), interleaving (--vpp), "
               "or fewer pipeline stages")
        out.append(f"pipeline bubble is {bubble_fraction:.0%} of the step (> {BUBBLE_LIMIT:.0%}); fix: {fix}")
    if pp > MAX_STAGES_WITHOUT_WARNING and grad_accum < MICRO_BATCHES_PER_STAGE * pp:
        fix = _LARGER_BATCH if split_searched else "at most 4 stages, or more micro-batches"
        out.append(f"{pp} pipeline stages with only {grad_accum} micro-batches per step (< {MICRO_BATCHES_PER_STAGE} "
                   f"per stage){' even interleaved' if vpp > 1 else ''}: the bubble grows as (pp-1)/(vpp*m); "
                   f"fix: {fix}")
    if feed is not None and not feed.keeps_up:
        out.append(f"the data feed needs {feed.bytes_per_s / 1e6:.0f} MB/s of tokens but storage reads "
                   f"{feed.storage_read_bytes_per_s / 1e6:.0f} MB/s; fix: cache the dataset on node-local SSD "
                   "or in memory (memory -> SSD -> HDD), or faster storage")
    if reliability is not None and reliability.goodput < GOODPUT_FLOOR:
        out.append(f"failures and checkpoints cost {1 - reliability.goodput:.0%} of the run "
                   f"({reliability.expected_interruptions:.0f} expected interruptions); fix: faster checkpoint "
                   "storage or asynchronous saves, fewer GPUs per job, or a shorter restart")
    return out
