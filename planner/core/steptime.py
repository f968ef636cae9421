"""Step time and where it goes.

Per micro-batch and pipeline stage: GEMMs at a size-dependent fraction of peak (bounded below by
their memory traffic, the roofline), attention core, element-wise kernels as bytes over HBM
bandwidth, tensor-parallel collectives; then the pipeline (1F1B, interleaved, GPipe) with its
bubble and point-to-point sends (on a CPU host whose processes share cores, the stage that runs
alone in the fill and drain runs faster), the data-parallel gradient reduction with the part
hidden behind backward (never the last bucket), and the optimizer step as memory-bound work plus
its host work per parameter tensor and its all-reduces.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from math import isnan

import numpy as np

from planner.core import comm
from planner.core.columns import all_, any_, as_float, maximum, minimum, not_, select, where
from planner.core.finetune import lora_params_per_layer
from planner.core.flops import (Gemm, attention_core_flops, indexer_flops, indexer_gemms, layer_gemms,
                                linear_core_flops, logits_gemm, op_sac_recomputed_share)
from planner.core.layout import (DUALPIPEV, LAYER_DIMS, SHARDING, Candidates, Job, is_one_row, per_distinct,
                                 recomputed_layers)
from planner.core.memory import (ACT_BYTES, GRAD_BYTES, STATE_DIMS, attention_kv_width, counts, param_master,
                                 stage_params, whole_on_tp_ranks)
from planner.core.model import ModelSpec
from planner.core.pipeline import dualpipe_bubble_ratio, stage_layers
from planner.hardware import HardwareProfile
from planner.memo import fast_init
from planner.stacks import Software, software

FLASH_BACKWARD_RATIO = 2.5  # flash attention backward / forward time (Dao 2023, FlashAttention-2, Sec. 3)
LOGIT_TRAFFIC_BYTES = 12  # per logit, forward + backward cross-entropy (16-bit in, fp32 exp, 16-bit grad)


@fast_init
@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds per optimizer step on the critical path, by part (they add up to ``step``)."""

    compute: np.ndarray
    tp_comm: np.ndarray
    cp_comm: np.ndarray
    ep_comm: np.ndarray
    pp_comm: np.ndarray
    dp_comm: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    other: np.ndarray
    step: np.ndarray  # the sum of the parts, computed once by ``StepTime.of`` (read ~20 times per estimate)
    # Not a part of the step: one forward-only pass over a global batch (evaluation), 0 without one.
    eval_batch: np.ndarray

    @classmethod
    def of(cls, *, compute, tp_comm, cp_comm, ep_comm, pp_comm, dp_comm, bubble, optimizer, other,
           eval_batch=None) -> "StepTime":
        return cls(compute, tp_comm, cp_comm, ep_comm, pp_comm, dp_comm, bubble, optimizer, other,
                   compute + tp_comm + cp_comm + ep_comm + pp_comm + dp_comm + bubble + optimizer + other,
                   np.zeros_like(compute, dtype=float) if eval_batch is None else eval_batch)


def linear_peak(hw: HardwareProfile, precision: str) -> float:
    """Dense peak of the linear layers' GEMMs: fp8 runs them at the fp8 rate where the GPU has
    one (at 16-bit where it has none)."""
    return hw.gpu.peak_flops["bf16" if precision == "fp8" and not hw.gpu.supports("fp8") else precision]


def reference_peak(hw: HardwareProfile, precision: str) -> float:
    """The 16-bit peak for fp8 jobs (attention, element-wise work and the head stay in bf16, and
    MFU is reported against it, as torchtitan and Megatron-LM report fp8 MFU); else the precision's."""
    return hw.gpu.peak_flops["bf16" if precision == "fp8" else precision]


def gemm_efficiency(hw: HardwareProfile, d: np.ndarray, fp8: bool = False) -> np.ndarray:
    """The compute roof of a GEMM whose smallest dimension is ``d``: ``matmul * d/(d + half_dim)``
    of peak (``fp8_matmul`` for fp8 GEMMs): small GEMMs fill the GPU less."""
    e = hw.efficiency
    return (e.fp8_matmul if fp8 else e.matmul) * d / (d + e.matmul_half_dim)


def gemm_time(g: Gemm, hw: HardwareProfile, peak: float, elem_bytes: float, fp8: bool = False) -> np.ndarray:
    """max(compute at size-dependent efficiency, memory traffic of A, B and C): a roofline."""
    compute = g.flops / (peak * gemm_efficiency(hw, g.min_dim, fp8))
    hbm = hw.gpu.hbm_bytes_per_s * hw.efficiency.memory
    traffic = elem_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count / hbm
    return maximum(compute, traffic)


def gemms_time(gs: list[Gemm], rows: int, hw: HardwareProfile, peak: float, elem_bytes: float,
               fp8: bool = False, scalars: bool = False) -> np.ndarray:
    """``sum(gemm_time(g, ...) for g in gs)`` for ``rows`` layouts, the GEMMs as the rows of one
    array: one pass instead of one per GEMM, the same numbers (each element sees the same
    operations, in float64, where integer sizes are exact; the GEMMs are added in order). One
    layout whose columns are scalars (``Candidates.one_row``; ``scalars``: the caller knows it):
    the GEMMs one by one, as scalars."""
    if scalars or (rows == 1 and all(type(x) is not np.ndarray for g in gs for x in (g.m, g.n, g.k, g.count))):
        try:
            return _gemms_time_floats(gs, hw, peak, elem_bytes, fp8)
        except ZeroDivisionError:  # a zero divisor (a GEMM of no size, a zero roof): numpy's NaN or inf, as a row
            times = [gemm_time(Gemm(*map(np.float64, (g.m, g.n, g.k, g.count))), hw, peak, elem_bytes, fp8)
                     for g in gs]
    else:
        dims = [np.empty((len(gs), rows)) for _ in range(4)]
        for i, g in enumerate(gs):
            for out, value in zip(dims, (g.m, g.n, g.k, g.count)):
                out[i] = value
        times = gemm_time(Gemm(*dims), hw, peak, elem_bytes, fp8)
    total = 0
    for t in times:
        total = total + t
    return total


def _gemms_time_floats(gs: list[Gemm], hw: HardwareProfile, peak: float, elem_bytes: float, fp8: bool) -> float:
    """``gemms_time`` of one layout in Python floats: ``gemm_time``'s operations in its order on
    each GEMM's dimensions as float64 values (IEEE double either way, so the same number, in a
    third of numpy scalars' time). Raises ZeroDivisionError where numpy would give NaN."""
    e = hw.efficiency
    roof = e.fp8_matmul if fp8 else e.matmul
    hbm = hw.gpu.hbm_bytes_per_s * e.memory
    total = 0
    for g in gs:
        m, n, k, count = float(g.m), float(g.n), float(g.k), float(g.count)
        d = min(min(m, n), k)
        compute = 2.0 * m * n * k * count / (peak * (roof * d / (d + e.matmul_half_dim)))
        traffic = elem_bytes * (m * k + k * n + m * n) * count / hbm
        total = total + (compute if compute > traffic or isnan(compute) else traffic)
    return total


def _elementwise_bytes(model: ModelSpec, c: Candidates, job: Job, sw: Software,
                       ffn: np.ndarray | float | None = None, extra_norms: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes of the element-wise kernels of one layer's forward per micro-batch per GPU:
    (layer without attention core, attention-core softmax/dropout).

    fused (Megatron-LM, TE, torch.compile): one kernel each for norm, bias-dropout-add, bias-GELU
    or SwiGLU, scale-mask-softmax, RoPE on Q and K. eager (plain PyTorch ops): the same for GPT
    (LayerNorm, GELU and SDPA are single ops), but RMSNorm, RoPE and SwiGLU are several ops each,
    every one reading and writing its operands: RMSNorm ~7h per norm (square, mean, rsqrt, two
    products), RoPE ~9 reads/writes per Q and K element plus Q's copy out of the fused QKV (2h),
    SwiGLU 5f (SiLU, product). ``ffn``: the MLP width (an MoE layer's routed width per token);
    ``extra_norms``: norms beyond ``layer_norms`` (an MoE layer's ``moe_norms``)."""
    e = ACT_BYTES[job.precision]
    h, hkv, a, s = model.hidden, model.kv_hidden, model.heads, model.seq_len
    f = model.ffn_hidden if ffn is None else ffn
    drop = 1.0 if model.has_dropout else 0.0
    eager = sw.eager and model.gated_mlp
    # Two norms (read + write h each; four with post-norms), two residual adds (read 2h, write h,
    # + 1-byte mask).
    norms = (model.layer_norms + extra_norms) * (7 if eager else 2) * h
    replicated = norms + 2 * (3 * h + 0.5 * h * drop)
    if model.gated_mlp:  # SwiGLU + RoPE
        split = 5 * f + 9 * (h + hkv) + 2 * h if eager else 3 * f + 2 * (h + hkv)
    else:  # bias-GELU
        split = 2 * f
    softmax = (2 + 2.5 * drop) * a * s if sw.attention == "standard" else 0.0
    tp = as_float(c.tp)
    tokens = c.micro_batch * s / c.cp  # this GPU's tokens: context parallel splits the sequence
    layer = e * tokens * (where(c.sequence_parallel, replicated / tp, replicated) + split / tp)
    return layer, e * tokens * softmax / tp


def fp8_cast_elements(model: ModelSpec, ffn: np.ndarray | float | None = None) -> np.ndarray | float:
    """Elements per token per layer that fp8 training casts (amax, scale, cast, transposed copy):
    forward, the inputs of the four linear groups (QKV, proj and MLP-in read h each; MLP-out reads
    f); backward, the gradients of their outputs (h + 2 h_kv, h, MLP-in width, h). torchao float8
    and Transformer Engine cast these three operands of every GEMM (Micikevicius et al. 2022)."""
    h, hkv = model.hidden, model.kv_hidden
    f = model.ffn_hidden if ffn is None else ffn
    mlp_in = (2 if model.gated_mlp else 1) * f
    return (3 * h + f) + (h + 2 * hkv + h + mlp_in + h)


@fast_init
@dataclass(frozen=True, slots=True)
class _LayerTimes:
    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray
    tp_comm: np.ndarray  # exposed link time, forward + backward + recompute
    tp_calls: np.ndarray  # TP collectives per layer per micro-batch on the critical path
    cp_comm: np.ndarray  # exposed context-parallel K/V exchange, forward + backward + recompute
    ep_comm: np.ndarray  # exposed expert-parallel all-to-all, forward + backward + recompute (mean per layer)
    weight_grad: np.ndarray  # of ``backward``: the weight-gradient GEMMs (DualPipe's W)


def attention_times(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates,
                    sw: Software) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward time of the attention core (QK^T, softmax, AV) per layer per micro-batch.

    Flash kernels (FlashAttention-2, or the GPU's own fused kernel: FlashAttention-3 / cuDNN on
    Hopper) skip the masked upper triangle (unless the stack's ``attention_square`` is "full": a
    dense bias or mask, every block computed) and run at their measured fraction of the 16-bit peak,
    the backward taking 2.5x the forward (Dao 2023, FlashAttention-2, Sec. 3 and 4.1). Standard
    attention runs two batched GEMMs of head_dim width over the full square (the mask is applied
    after), backward twice forward.

    Linear-attention layers (Gated DeltaNet) run their chunked delta-rule kernel (flash-linear-
    attention's, Triton) instead: its FLOPs (``linear_core_flops``) at the flash kernel's fraction of
    the peak, backward 2.5x forward as flash's (it too recomputes, its chunk states); not calibrated."""
    e = hw.efficiency
    half_peak = reference_peak(hw, job.precision)
    linear = linear_kernel_time(model, hw, job, c) if model.linear_layers else 0.0
    if sw.attention == "standard":
        flops = attention_core_flops(model, c.micro_batch, c.tp, causal=False, cp=c.cp)
        rate = half_peak * gemm_efficiency(hw, float(model.head_dim))
        fwd = flops / rate
        if model.index_topk:  # Megatron-Core's unfused DSA: the dense square masked to the selected keys
            index_fwd, index_bwd = indexer_times(model, hw, job, c, rate)
            return fwd + index_fwd, 2 * fwd + index_bwd
        return (fwd, 2 * fwd) if not model.linear_layers else (fwd + linear, 2 * fwd + FLASH_BACKWARD_RATIO * linear)
    kernel = e.fused_attention if sw.attention == "fused" else e.flash_attention
    # A kernel given a dense bias or mask without block skipping (the stack's attention_square =
    # "full") computes the whole square at the same rate: twice the causal work.
    causal = sw.stack.attention_square != "full"
    fwd = attention_core_flops(model, c.micro_batch, c.tp, causal=causal, cp=c.cp) / (half_peak * kernel)
    if model.linear_layers:
        fwd = fwd + linear
    if model.index_topk:
        index_fwd, index_bwd = indexer_times(model, hw, job, c, half_peak * kernel)
        return fwd + index_fwd, FLASH_BACKWARD_RATIO * fwd + index_bwd
    return fwd, FLASH_BACKWARD_RATIO * fwd


def indexer_times(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates,
                  rate: float) -> tuple[np.ndarray, np.ndarray]:
    """DSA's indexer per layer per micro-batch, forward and backward (Megatron-Core's cuDNN DSA
    backend), beside the sparse attention core that ``attention_core_flops`` counts: forward, the
    scores of every causal pair (``indexer_flops``, whole on every TP rank) and their top-k, which
    writes and reads each query's fp32 scores over the whole key length (8 bytes a pair); backward,
    the KL loss's over the selected keys (3 x 2 H_I d_I a pair, not split by TP) and its target, the
    main scores over them again (2 (kv_lora_rank + qk_rope_dim) a head and pair, heads split by TP);
    none under LoRA (the indexer frozen, its loss off). Every kernel at ``rate`` (the attention
    kernel's); not calibrated: no measured DSA run."""
    s = model.seq_len
    queries = c.micro_batch * s / c.cp  # this GPU's queries, each against the whole sequence's keys
    selected = queries * 0.5 * model.attention_span * s  # min(i, index_topk) keys a query
    index = 2.0 * model.index_heads * model.index_head_dim
    topk = 8.0 * queries * s / (hw.gpu.hbm_bytes_per_s * hw.efficiency.memory)
    fwd = indexer_flops(model, c.micro_batch, c.cp) / rate + topk
    target = 2.0 * model.heads * model.kv_cache_width / c.tp
    return fwd, (0.0 if job.lora else (3 * index + target) * selected / rate)


def linear_kernel_time(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates) -> np.ndarray:
    """The forward time of the gated delta rule per layer (the mean over layers) per micro-batch: its
    FLOPs (context parallel's all-to-all leaves each rank 1/cp of the heads) at the flash kernel's
    fraction of the 16-bit peak. Its backward is FLASH_BACKWARD_RATIO of it."""
    return (linear_core_flops(model, c.micro_batch, c.tp, c.cp)
            / (reference_peak(hw, job.precision) * hw.efficiency.flash_attention))


def layer_times(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, links: comm.Links,
                sw: Software) -> _LayerTimes:
    e = hw.efficiency
    act = ACT_BYTES[job.precision]
    peak = linear_peak(hw, job.precision)
    fp8 = sw.fp8 and hw.gpu.supports("fp8")
    one = is_one_row(c)

    def timed(gs: list[Gemm]) -> np.ndarray:
        return gemms_time(gs, len(c), hw, peak, 1 if fp8 else act, fp8, one)

    gs = layer_gemms(model, c.micro_batch, c.tp, c.cp)
    attention_gemms, dense_mlp = gs[:-2], gs[-2:]  # QKV and projection (and the linear layers'); MLP in and out
    tokens = c.micro_batch * model.seq_len / c.cp  # this GPU's tokens per micro-batch
    attn_fwd, attn_bwd = attention_times(model, hw, job, c, sw)
    hbm = hw.gpu.hbm_bytes_per_s * e.memory
    ew_layer, ew_softmax = _elementwise_bytes(model, c, job, sw)
    # fp8: amax, scaling and casts of each GEMM's operands, memory-bound, forward and backward.
    cast_elements = fp8_cast_elements(model)
    mlp = timed(dense_mlp)
    ep_comm = c.full(0.0)
    if model.moe:  # the mean over layers: the leading dense ones and the MoE ones
        from planner.core import moe

        share = model.moe_layers / model.layers
        width = moe.moe_mlp_width(model, job, c)
        mlp = (1 - share) * mlp + share * timed(moe.moe_gemms(model, job, c))
        ew_moe = (_elementwise_bytes(model, c, job, sw, ffn=width, extra_norms=model.moe_norms)[0]
                  + moe.permute_bytes(model, job, c, act))
        ew_layer = (1 - share) * ew_layer + share * ew_moe
        cast_elements = (1 - share) * cast_elements + share * fp8_cast_elements(model, width)
    gemms = timed(attention_gemms) + mlp
    cast = sw.fp8_cast_bytes * tokens * cast_elements / c.tp / hbm if fp8 else 0.0
    # LoRA: frozen weights need input gradients only (one GEMM, not two); the adapters' small
    # GEMMs run at the matmul roof (they are < 1% of the FLOPs at the ranks people use).
    weight_grads = 0 if job.lora else 1
    adapter = (lora_params_per_layer(model, job) * 2.0 * tokens / c.tp / (peak * e.matmul) if job.lora else 0.0)
    fwd = gemms + adapter + attn_fwd + (ew_layer + ew_softmax) / hbm + 0.4 * cast
    # DSA's indexer projections (in ``gemms``): inputs detached, so weight gradients alone, none under LoRA.
    detached = timed(indexer_gemms(model, c.micro_batch, c.cp)) if model.index_topk else 0.0
    bwd = ((1 + weight_grads) * gemms - detached + 2 * adapter + attn_bwd + 2 * (ew_layer + ew_softmax) / hbm
           + 0.6 * cast)
    if sw.stack.selective == "op":  # every second matmul and all element-wise work again
        selective = op_sac_recomputed_share(model) * gemms + ew_layer / hbm + 0.4 * cast
    else:  # the attention core again (Korthikanti et al. 2022); flash attention recomputes it anyway
        selective = where(sw.attention == "standard", attn_fwd + ew_softmax / hbm, 0.0)
    # Recomputed whole: every layer's forward again (full), every second or fourth one's (half,
    # quarter): per layer, the share of them (``recomputed_layers``) times a forward.
    again_share = recomputed_layers(c.recompute)
    recompute = again_share * fwd + where(c.recompute == 1, selective, 0.0)
    if model.moe:  # what its all-to-alls may hide behind: the layer's own compute per micro-batch
        ep_comm = share * moe.exposed_all_to_all(model, job, c, links, act, again_share, sw.stack,
                                                 fwd + bwd + recompute)
    # Megatron TP: 2 all-reduces forward, 2 backward, 2 more when the forward is recomputed
    # (Narayanan et al. 2021, Sec. 3.2); sequence parallel swaps each for RS + AG, same bytes.
    # torch's non-reentrant checkpoint stops recomputing once the layer's saved tensors are back,
    # before its last collective (the MLP output's all-reduce, or reduce-scatter: half of one); the
    # host work around the collectives (tp_calls: DTensor's dispatch) is all redone up to there.
    if any_(c.tp > 1):
        # Under sequence parallel half the collectives are all-gathers; a stack that gathers fp8
        # (``fp8_tp_all_gather``) sends those at 1 byte, the reduce-scatters at the activations'.
        tp_bytes = where(c.sequence_parallel, (1 + act) / 2, act) if fp8 and sw.stack.fp8_tp_all_gather else act
        collective = comm.tp_collective(links, tp_bytes * tokens * model.hidden, c.tp)
        again = 2 - sw.stack.recompute_early_stop * where(c.sequence_parallel, 0.5, 1.0)
        calls = where(c.tp > 1, (4 + 2 * again_share) * (1 - e.tp_overlap), 0.0)
        sent = where(c.tp > 1, (4 + again * again_share) * (1 - e.tp_overlap), 0.0) * collective
    else:  # no layout splits the layers: the same zeros
        calls = sent = c.full(0.0)
    if model.linear_layers and any_(c.cp > 1):  # the ring passes the softmax layers' K/V alone
        linear = linear_kernel_time(model, hw, job, c)
        attn_fwd, attn_bwd = attn_fwd - linear, attn_bwd - FLASH_BACKWARD_RATIO * linear
    return _LayerTimes(fwd, bwd, recompute, sent, calls,
                       context_parallel_exchange(model, job, c, links, sw, attn_fwd, attn_bwd, hbm), ep_comm,
                       weight_grads * gemms + adapter)


def context_parallel_exchange(model: ModelSpec, job: Job, c: Candidates, links: comm.Links, sw: Software,
                              attn_fwd: np.ndarray, attn_bwd: np.ndarray, hbm: float) -> np.ndarray:
    """Exposed time of context parallel's K/V exchange per layer per micro-batch, with the
    element-wise work it adds. Each rank holds 1/cp of the sequence and needs every earlier
    token's keys and values: 2 * s * width values per sequence, split by TP (width h_kv, or h
    where the model repeats K/V to the query heads before attention: the stack's ``attention_kv_heads``),
    over the cp ranks (stride tp: inside a node while tp*cp fits). A full recompute exchanges again.

    gather: the forward receives the other ranks' K/V, the backward receives them again and
    returns their gradients; the stack's ``cp_overlap`` of the attention time hides them (ring
    attention passes the chunks while it computes: Liu et al. 2023; Megatron-Core/TE).
    torch: ``_templated_ring_attention`` (torch.distributed.tensor.experimental, rotate method
    allgather) issues one all-gather before the local chunk's attention (1/cp of it) and waits
    after it; the backward all-gathers K/V again and passes each step's dK/dV (cp_grad_bytes per
    value) to the next rank, waited after the next step's attention: cp sends, the last exposed.
    Each of the cp - 1 remote steps merges the partial output in fp32 (forward) and accumulates
    dQ/dK/dV (backward): ``cp_merge_bytes`` / ``cp_accumulate_bytes`` per local output element.

    DSA (Megatron-Core's allgather, the only kind it runs): the latent key and the indexer's key of
    the whole sequence (kv_lora_rank + qk_rope_dim + index_head_dim a token, every head's, not split
    by TP) gathered before the attention, their gradients reduce-scattered after its backward, again
    in a recomputed forward; the queries stay local.

    With linear-attention layers the mean layer: the softmax layers' exchange (``attn_fwd`` and
    ``attn_bwd`` are their attention times alone, the mean over all layers), and the linear
    layers' all-to-alls (``linear_all_to_all``)."""
    if not any_(c.cp > 1):  # no layout splits the sequence: nothing exchanged (the last line's zeros)
        return c.full(0.0)
    if model.index_topk:  # Megatron-Core's DSA runs cp_comm_type allgather only: nothing hides it
        gathered = (ACT_BYTES[job.precision] * c.micro_batch * model.seq_len
                    * (model.kv_cache_width + model.index_head_dim))
        once = comm.group_collective(links, gathered, c.cp, c.tp, 1.0)
        return where(c.cp > 1, (2 + recomputed_layers(c.recompute)) * once, 0.0)
    if model.linear_layers:
        soft = model.softmax_share
        ring = _ring_exchange(model, job, c, links, sw, attn_fwd / soft, attn_bwd / soft, hbm) if soft else 0.0
        return where(c.cp > 1, soft * ring + (1 - soft) * linear_all_to_all(model, job, c, links), 0.0)
    return where(c.cp > 1, _ring_exchange(model, job, c, links, sw, attn_fwd, attn_bwd, hbm), 0.0)


def _ring_exchange(model: ModelSpec, job: Job, c: Candidates, links: comm.Links, sw: Software,
                   attn_fwd: np.ndarray, attn_bwd: np.ndarray, hbm: float) -> np.ndarray:
    """``context_parallel_exchange`` of one softmax-attention layer, ``attn_fwd`` and ``attn_bwd``
    its attention core's times (the layouts with cp = 1 included: the caller zeroes them)."""
    st, act, cp = sw.stack, ACT_BYTES[job.precision], as_float(c.cp)
    grad_bytes = max(st.cp_grad_bytes, act)  # gradients travel at least at the activations' width
    width = attention_kv_width(model, sw)
    kv = 2 * act * c.micro_batch * model.seq_len * width / c.tp
    gather = comm.group_collective(links, kv, c.cp, c.tp, 1.0)
    if st.cp_exchange == "gather":
        fwd = maximum(0.0, gather - st.cp_overlap * attn_fwd)
        bwd = maximum(0.0, (1 + grad_bytes / act) * gather - st.cp_overlap * attn_bwd)
    else:
        grads = grad_bytes / act * kv / maximum(cp, 1)  # one rank's dK/dV
        across = c.cp * c.tp > links.gpus_per_node  # the ring leaves the node somewhere: that hop sets the pace
        send = where(across, grads / links.inter_bw + links.inter_lat, grads / links.intra_bw + links.intra_lat)
        step_f, step_b = st.cp_overlap * attn_fwd / cp, st.cp_overlap * attn_bwd / cp
        elems = c.micro_batch * model.seq_len / cp * model.attn_out_width / c.tp  # the local attention output
        fwd = maximum(0.0, gather - step_f) + (cp - 1) * st.cp_merge_bytes * elems / hbm
        bwd = (maximum(0.0, gather - step_b) + (cp - 1) * maximum(0.0, send - step_b) + send
               + (cp - 1) * st.cp_accumulate_bytes * elems / hbm)
    return fwd + bwd + recomputed_layers(c.recompute) * fwd


def linear_all_to_all(model: ModelSpec, job: Job, c: Candidates, links: comm.Links) -> np.ndarray:
    """Context parallel's exchange in one linear-attention layer per micro-batch (Megatron-Core's
    gated_delta_net, a2a_cp_to_hp and a2a_hp_to_cp): the input projection's output (q, k, v, the
    gate z, beta and the decay's input: 2 key + 2 value widths + 2 per value head, split by TP)
    goes from this rank's 1/cp of the sequence to 1/cp of the heads over the whole sequence, one
    all-to-all over the cp ranks (tp apart); after the gated norm its output (the value width)
    comes back the same way. The backward sends both gradients back, a full recompute both
    forward ones again. Synchronous: nothing hides them (the kernel waits for its inputs)."""
    act = ACT_BYTES[job.precision]
    tokens = c.micro_batch * model.seq_len / c.cp
    into = comm.all_to_all(links, act * tokens * model.linear_projection_width / c.tp, c.cp, c.tp)
    back = comm.all_to_all(links, act * tokens * model.linear_value_heads * model.linear_value_dim / c.tp,
                           c.cp, c.tp)
    return (2 + recomputed_layers(c.recompute)) * (into + back)


def time_shared(hw: HardwareProfile, c: Candidates) -> np.ndarray:
    """Layouts whose processes outnumber their CPU host's cores (``_host_sharing``'s busy > 1)."""
    return np.asarray(_host_sharing(hw, c)[1]) > 1


def _host_sharing(hw: HardwareProfile, c: Candidates) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(slow, busy) for a CPU host whose cores its processes share (threads per process = cores /
    processes, as the trainer's launcher sets them): compute runs ``slow`` times slower, fixed
    single-threaded costs ``busy`` times (time-sliced). GPUs: (1, 1)."""
    if not hw.network.compute_slots:
        return 1.0, 1.0
    e = hw.efficiency
    on_node = minimum(c.gpus, hw.network.gpus_per_node)
    share = on_node / hw.network.compute_slots  # processes per core
    threads = 1.0 / minimum(share, 1.0)  # cores per process, when it has more than one
    slow = where(share >= 1, share, 1.0 / (1.0 + (threads - 1.0) * e.thread_scaling))
    return slow, maximum(1.0, share)


@fast_init
@dataclass(frozen=True, slots=True)
class _Collectives:
    """The data-parallel collectives of a step before any overlap (``_dp_collectives``), and which
    ZeRO stages the table holds (a stage's times are computed only where some layout has it)."""

    ar: np.ndarray | float  # ZeRO 0: the gradients' all-reduce
    rs: np.ndarray | float  # their reduce-scatter (with the replicas' all-reduce under hybrid sharding)
    ag3: np.ndarray | float  # ZeRO-3's gather of the weights
    rs3: np.ndarray | float  # ZeRO-3's reduce-scatter of the gradients
    ar_last: np.ndarray | float  # the last bucket's all-reduce
    rs_last: np.ndarray | float  # the last bucket's reduce-scatter
    ag_step: np.ndarray | float  # ZeRO-1/2's gather of the updated weights
    has0: bool
    has12: bool
    has3: bool


def _dp_collectives(hw: HardwareProfile, job: Job, c: Candidates, sw: Software, links: comm.Links,
                    trained: np.ndarray, shard: np.ndarray, busy, expert_share=0.0) -> _Collectives:
    """The data-parallel collectives of a step, before what compute hides (``_dp_exposed``): the
    gradient reduction and, by ZeRO stage, the gathers of weights. ``expert_share`` of the bytes (an
    MoE's routed experts) go over the dp*cp/ep ranks holding the same experts, tp*ep apart. They
    read the layouts' groups and the stage's parameters, not the micro-batches."""
    act = ACT_BYTES[job.precision]
    # Gradients reduced in the stack's reduce dtype (fp32 for FSDP2 and Megatron-Core main grads),
    # never wider than the precision keeps them.
    grad_bytes = trained * min(GRAD_BYTES[job.precision], sw.stack.grad_reduce_bytes)
    param_bytes = shard * (1 if sw.fp8 and sw.stack.fp8_all_gather else act)  # what ZeRO-3 gathers
    group = c.shard_group  # data-parallel x context-parallel ranks, tp apart
    # Hybrid sharding (HSDP): ZeRO's collectives over the group's ranks inside a node, and the
    # gradients, reduce-scattered there, all-reduced between the replicas across nodes.
    hybrid = c.sharding == SHARDING.index("hybrid")
    group = where(hybrid, c.zero_group(links.gpus_per_node), group)
    replicas = where(hybrid, c.shard_group // group, 1)

    moe_ = any_(expert_share)
    groups = {"dense": (group, c.tp), "routed": (group // c.ep, c.tp * c.ep)}  # (size, stride)
    lines: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each group's collective as a line, computed once

    def one(collective, bytes_: np.ndarray, which: str, passes: float) -> np.ndarray:
        if collective is not comm.group_collective:
            return collective(links, bytes_, *groups[which], passes)
        if which not in lines:  # the same figures as the call, from the group's line
            lines[which] = comm.group_coefficients(links, *groups[which])
        per_byte, latency = lines[which]
        return passes * (bytes_ * per_byte + latency)

    def over(collective, bytes_: np.ndarray, passes: float) -> np.ndarray:
        dense = one(collective, bytes_ * (1 - expert_share), "dense", passes)
        if not moe_:
            return dense * busy
        routed = one(collective, bytes_ * expert_share, "routed", passes)
        return (dense + where(expert_share > 0, routed, 0.0)) * busy

    # Each ZeRO stage's time is computed only when some layout has that stage (np.select below
    # reads a stage's value only for those layouts; 0.0 stands in for the others).
    zero = c.zero_stage
    if type(zero) is np.ndarray:
        present = np.bincount(np.ravel(zero), minlength=4)
        has0, has12, has3 = bool(present[0]), bool(present[1] or present[2]), bool(present[3:].any())
    else:  # one layout: its stage alone
        has0, has12, has3 = bool(zero == 0), bool(zero == 1 or zero == 2), bool(zero >= 3)
    ar = over(comm.group_collective, grad_bytes, 2.0) if has0 else 0.0
    # ZeRO-3 gathers and reduce-scatters hierarchically (NCCL inside the node first), or as one
    # flat ring over the data-parallel group (the stack's ``hierarchical``).
    zcoll = comm.group_collective if sw.stack.hierarchical else comm.flat_collective
    replica_ar = (where(replicas > 1, comm.group_collective(links, grad_bytes / group, replicas, c.tp * group, 2.0),
                           0.0) * busy if (has12 or has3) and any_(replicas > 1) else 0.0)
    rs = (over(comm.group_collective, grad_bytes, 1.0) + replica_ar
          if has12 or (has3 and zcoll is comm.group_collective) else 0.0)
    ag3 = over(zcoll, param_bytes, 1.0) if has3 or has12 else 0.0  # ZeRO-1/2's step gather may be this call
    rs3 = (rs if zcoll is comm.group_collective else over(zcoll, grad_bytes, 1.0) + replica_ar) if has3 else 0.0
    # Bucketed reduction (torch DDP, Megatron-Core, DeepSpeed; Li et al. 2020, PyTorch Distributed,
    # Sec. 3.2.3): buckets fill in reverse parameter order and each is reduced once its gradients
    # are ready, so the last one (the first layers and the embedding) starts only when the backward
    # ends: at least that bucket is exposed, and a model that fits in one bucket is all exposed.
    # The stack's ``dp_bucket_bytes`` (0: one bucket, reduced after the backward).
    bucket = sw.stack.dp_bucket_bytes
    whole = bucket <= 0 or all_(grad_bytes <= bucket)  # one bucket: the reduction itself
    last_bucket = grad_bytes if whole else minimum(grad_bytes, bucket)
    ar_last = (ar if whole else over(comm.group_collective, last_bucket, 2.0)) if has0 else 0.0
    rs_last = over(comm.group_collective, last_bucket, 1.0) if has12 else 0.0
    ag_step = 0.0
    if has12:
        step_bytes = trained * act
        same = zcoll is comm.group_collective and np.array_equal(step_bytes, param_bytes)  # the same call as ag3
        ag_step = ag3 if same else over(comm.group_collective, step_bytes, 1.0)
    return _Collectives(ar, rs, ag3, rs3, ar_last, rs_last, ag_step, has0, has12, has3)


def _dp_exposed(hw: HardwareProfile, sw: Software, c: Candidates, coll: _Collectives, fwd_mb: np.ndarray,
                bwd_mb: np.ndarray, layers_pace: np.ndarray, rc_mb: np.ndarray | float = 0.0) -> np.ndarray:
    """Exposed data-parallel time per step: the collectives ``coll`` (``_dp_collectives``) less what
    the stack hides behind the micro-batches' compute."""
    e, m, zero = hw.efficiency, as_float(c.m), c.zero_stage
    ar, rs, ag3, rs3, ar_last, rs_last = coll.ar, coll.rs, coll.ag3, coll.rs3, coll.ar_last, coll.rs_last
    has0, has12, has3 = coll.has0, coll.has12, coll.has3
    hidden = e.dp_overlap * bwd_mb  # the last micro-batch's backward hides the reduction
    # ZeRO-3 / FSDP: each wrapped block's weights gathered before its forward and again before its
    # backward, its gradients reduce-scattered after; the next block's gather is prefetched behind
    # the current block's compute. The first gather and the last reduce-scatter of a pass have
    # nothing to hide behind: one block's worth. A stack that keeps a pipeline stage's weights
    # gathered across micro-batches (FSDP2 under pp) gathers and reduces once per step.
    zero3 = ag_step = zero1 = zero2 = 0.0
    if has3:
        edge = (ag3 + rs3) / maximum(layers_pace, 1)
        # A pass's prefetch hides the next block's collectives behind this block's compute in the
        # same pass: the forward's gathers behind the forward, the backward's gathers and
        # reduce-scatters behind the backward (and the forward it recomputes under recompute).
        fwd_hides, bwd_hides = e.zero3_overlap * fwd_mb, e.zero3_overlap * (bwd_mb + rc_mb)
        each = maximum(0.0, ag3 - fwd_hides) + maximum(0.0, ag3 + rs3 - bwd_hides) + edge
        # Kept gathered under pp: gathered in the first micro-batch's forward, reduce-scattered in
        # the last one's backward.
        once = maximum(0.0, ag3 - fwd_hides) + maximum(0.0, rs3 - bwd_hides) + edge
        zero3 = where((c.pp > 1) & (not sw.stack.reshard_in_pipeline), once, m * each)
    # ZeRO-1/2 gather the updated weights after the step; Megatron-Core's --overlap-param-gather
    # hides it behind the next step's forward (the stack's ``param_gather_overlap``).
    if has12:
        ag_step = maximum(0.0, coll.ag_step - sw.stack.param_gather_overlap * m * fwd_mb)
        zero1 = maximum(rs_last, rs - hidden)
        zero2 = (1 if sw.stack.grad_sync_once_per_step else m) * zero1 + ag_step
        zero1 = zero1 + ag_step
    if not (has0 or has12):  # ZeRO-3 only (FSDP searches, most pinned estimates): no selection
        return zero3 * c.full(1.0)
    return select([zero == 0, zero == 1, zero == 2], [maximum(ar_last, ar - hidden), zero1, zero2], zero3)


def param_tensors(model: ModelSpec) -> tuple[float, float, float]:
    """Parameter tensors, each its own optimizer entry: (per layer, the first stage's beyond its
    layers, the last stage's beyond its layers), laid out as PyTorch modules hold them
    (reference_trainer/model.py, torchtitan): fused QKV and one Linear per other matrix, each
    bias and norm weight a tensor of its own; an MoE layer's experts stacked, one tensor per
    matrix, plus the router. The embedding and learned positions on the first stage; the final
    norm and an untied head on the last (a tied head is a copy there when pp > 1, not counted)."""
    norm = model.norm_params // model.hidden  # LayerNorm: weight and bias; RMSNorm: weight
    biases = 2 if model.has_bias else (1 if model.qkv_bias else 0)
    attention = 2 + biases + (2 if model.qk_norm != "none" else 0) + model.out_bias + model.attention_sinks
    mlp = (3 if model.gated_mlp else 2) + (2 if model.has_bias else 0)
    router = model.moe_layers / model.layers * (1 + 3 * model.expert_bias) if model.moe else 0.0  # + the biases
    per_layer = model.layer_norms * norm + attention + mlp + router
    return per_layer, 1.0 + model.learned_positions, norm + (0.0 if model.tied_embeddings else 1.0)


def optimizer_host_time(model: ModelSpec, hw: HardwareProfile, c: Candidates, sw: Software, links: comm.Links,
                        first: np.ndarray, fullest: np.ndarray, last: np.ndarray, busy) -> np.ndarray:
    """Host work of the optimizer step that no byte count sees, on the stage with the most tensors:
    an eager optimizer's per-tensor ops (the gradient norm's and clipping's foreach kernels,
    torch.optim.AdamW's single-tensor loop on a CPU, zero_grad) at the profile's
    ``optimizer_tensor_overhead_s`` each, times the stack's ``dtensor_optimizer_ratio`` where the
    parameters are DTensors (tensor parallel, or ZeRO >= 1 sharded by FSDP2: every op dispatched
    through DTensor; benchmarks/calibration_cpu.py --mechanism measures both on a host); then the
    collectives of the step: the gradient norm's all-reduce over every rank (a few bytes: latency)
    and, with tied embeddings under pp > 1, the embedding gradient's all-reduce between the first
    and last stages (Narayanan et al. 2021, Sec. 4: Megatron-LM sums them there too)."""
    e, act_grad = hw.efficiency, 4.0  # the tied gradient summed in fp32 (main gradients)
    out = comm.small_all_reduce(links, c.gpus, c.full(1.0))
    if e.optimizer_tensor_overhead_s > 0:  # (0 on the GPU profiles: nothing to count)
        per_layer, embed, head = param_tensors(model)
        tensors = where(c.pp > 1, maximum(maximum(first * per_layer + embed, fullest * per_layer),
                                                last * per_layer + head), first * per_layer + embed + head)
        dtensor = (c.tp > 1) | ((c.zero_stage >= 1) & (c.shard_group > 1))
        ratio = where(dtensor, sw.stack.dtensor_optimizer_ratio, 1.0)
        out = out + tensors * e.optimizer_tensor_overhead_s * ratio
    # The embedding's gradient summed between the first and the last stage: tied to the head, or the
    # multi-token-prediction modules' copy (Megatron-Core's embedding group).
    if (model.tied_embeddings or model.mtp_layers) and any_(c.pp > 1):
        tied_bytes = act_grad * model.vocab * model.hidden / c.tp
        tied = comm.group_collective(links, tied_bytes, c.full(2, int), c.gpus // c.pp * (c.pp - 1), 2.0)
        out = out + where(c.pp > 1, tied, 0.0)
    return out * busy


@dataclass(frozen=True, slots=True)
class _Offload:
    optimizer: np.ndarray  # the optimizer step on the host, with the copies it waits for
    params: np.ndarray  # exposed streaming of offloaded weights to the GPU, per step


def offload_times(hw: HardwareProfile, job: Job, c: Candidates, held: np.ndarray, weights: np.ndarray,
                  optim_bytes_per_param: float, fwd_mb: np.ndarray, bwd_mb: np.ndarray,
                  sw: Software) -> _Offload:
    """CPU offload's time (Ren et al. 2021, ZeRO-Offload, Sec. 4; Rajbhandari et al. 2021,
    ZeRO-Infinity): each GPU copies its 16-bit gradients to the host over PCIe during the backward,
    as each bucket or block is reduced (hidden as the DP reduction is), the CPU runs AdamW over its
    ``held`` parameters at the host's memory bandwidth, shared by the node's GPUs, and the updated
    16-bit weights come back; none of it overlaps the next step here (DeepSpeed's one-step-delayed
    update is not modelled). A stack that keeps its gradient buffer on the GPU (``offload_grads``
    "shard": Megatron-Core) copies its shard out at the step, in the buffer's dtype, hidden by
    nothing. Offloaded parameters stream in per layer for the forward and again for the backward,
    hidden behind compute as ZeRO-3's gathers are."""
    e, net, m = hw.efficiency, hw.network, as_float(c.m)
    act = ACT_BYTES[job.precision]
    sharing = minimum(c.gpus, net.host_gpus)  # GPUs whose optimizer steps share the host
    cpu_step = held * optim_bytes_per_param / (net.host_memory_bytes_per_s / sharing)
    h2d = held * act / net.pcie_bytes_per_s
    if sw.stack.offload_grads == "shard":
        optimizer = cpu_step + h2d + held * GRAD_BYTES[job.precision] / net.pcie_bytes_per_s
    else:
        optimizer = cpu_step + h2d + maximum(0.0, held * act / net.pcie_bytes_per_s - e.dp_overlap * bwd_mb)
    stream = 2 * weights * act / net.pcie_bytes_per_s
    params = where(c.offload == 2, m * maximum(0.0, stream - e.zero3_overlap * (fwd_mb + bwd_mb)), 0.0)
    return _Offload(optimizer=optimizer, params=params)


def optim_bytes_per_param(job: Job, sw: Software) -> int:
    """AdamW step: read gradient, read+write master, momentum, variance; write 16-bit weights
    (none where the fp32 parameters are the master: FSDP2 casts them at each gather)."""
    mixed = job.precision in ("fp16", "bf16", "fp8")
    return GRAD_BYTES[job.precision] + 24 + (2 if mixed and not param_master(job, sw) else 0)


def _stage_states(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw: Software,
                  links: comm.Links) -> tuple:
    """What ``step_time`` reads of the stages' layers and parameters and the groups (STATE_DIMS):
    the first, fullest and last stage's layers, the parameters this GPU holds of the stage with
    the most and of them what its optimizer steps (``held``, sharded over ``zg`` ranks under
    ZeRO), the data-parallel collectives (``_dp_collectives``) and the optimizer step's time."""
    slow, busy = _host_sharing(hw, c)
    first, fullest, last = stage_layers(model, c, sw)
    v_shape = c.schedule == DUALPIPEV  # DualPipeV: rank 0 holds the first and the last stage (embedding and head)
    # Data parallel: the stage with the most parameters reduces the most gradient bytes.
    pp = c.pp
    n, most = counts(model), maximum(maximum(fullest, first), last)
    ends = ((fullest, pp == 1, pp == 1), (first, True, (pp == 1) | v_shape), (last, pp == 1, not_(v_shape)))
    if model.mtp_layers:  # the stage with the modules may hold the most: the most's own parameters and experts
        def held(layers, is_first, is_last) -> tuple:
            return (stage_params(model, pp, layers, is_first, is_last),
                    layers * n.layer_expert_params + where(is_last, model.mtp_expert_params, 0))

        params, expert_layers = held(*ends[0])
        for p, e in (held(*end) for end in ends[1:]):
            more = p > params
            params, expert_layers = where(more, p, params), where(more, e, expert_layers)
    else:
        fullest_params, first_params, last_params = (stage_params(model, pp, *end) for end in ends)
        params = maximum(maximum(fullest_params, first_params), last_params)
        # Routed experts: split over ep too, reduced over the dp*cp/ep ranks holding the same experts.
        expert_layers = most * n.layer_expert_params
    experts = expert_layers / (c.tp * c.ep)
    shard = (params - expert_layers) / c.tp + experts
    if n.indexer_params:
        shard = shard + most * whole_on_tp_ranks(n, as_float(c.tp))
    expert_share = 0.0 if job.lora else experts / shard
    trained = shard if not job.lora else maximum(fullest, first) * lora_params_per_layer(model, job) / c.tp
    coll = _dp_collectives(hw, job, c, sw, links, trained, shard, busy, expert_share)
    zg = c.zero_group(hw.network.gpus_per_node)
    held = trained * ((1 - expert_share) / where(c.zero_stage >= 1, zg, 1)
                      + expert_share / where(c.zero_stage >= 1, zg / c.ep, 1))
    hbm = hw.gpu.hbm_bytes_per_s * hw.efficiency.memory
    optimizer = held * optim_bytes_per_param(job, sw) / hbm * slow
    optimizer = optimizer + optimizer_host_time(model, hw, c, sw, links, first, fullest, last, busy)
    return first, fullest, last, shard, zg, held, coll, optimizer


def _spread(gpus: np.ndarray | int) -> np.ndarray | float:
    """sqrt(2 ln N) of a GPU count (the stragglers' factor): numpy's log; of one layout's count
    (a Python int) as a Python float, remembered per count."""
    if type(gpus) is int:
        return _spread_of(gpus)
    return np.sqrt(2 * np.log(as_float(gpus)))


@functools.lru_cache(maxsize=256)
def _spread_of(gpus: int) -> float:
    return float(np.sqrt(2 * np.log(float(gpus))))


def step_time(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw: Software | None = None) -> StepTime:
    """The step's breakdown: seconds per optimizer step on the critical path, by part. ``hw``
    carries the stack's software factors already (planner.stacks.effective)."""
    sw = sw or software(job)
    e = hw.efficiency
    links = comm.Links.of(hw)
    act = ACT_BYTES[job.precision]
    hbm = hw.gpu.hbm_bytes_per_s * e.memory

    mtp = model.mtp_layers  # multi-token-prediction modules, on the stage with the head

    def per_micro_batch(p: Candidates) -> tuple:
        """A layer's times, the head's GEMM and the loss's traffic per micro-batch (and with ``mtp``,
        a module's projection, 2h -> h split by TP, forward): of LAYER_DIMS alone."""
        peak = reference_peak(hw, job.precision)
        head = gemm_time(logits_gemm(model, p.micro_batch, p.tp, p.cp), hw, peak, act)
        loss = LOGIT_TRAFFIC_BYTES * p.micro_batch * model.seq_len / p.cp * model.vocab / p.tp / hbm
        if not mtp:
            return layer_times(model, hw, job, p, links, sw), head, loss
        projection = gemm_time(Gemm(p.micro_batch * model.seq_len / p.cp, model.hidden / p.tp, 2 * model.hidden),
                               hw, peak, act)
        return layer_times(model, hw, job, p, links, sw), head, loss, projection

    # Computed once per distinct (tp, cp, ep, micro-batch, SP, recompute): a table holds 6-60
    # layouts of each (dp, pp, vpp, ZeRO and sharding vary around them).
    lt, head, loss, *projection = per_distinct(c, LAYER_DIMS, per_micro_batch)
    slow, busy = _host_sharing(hw, c)
    head_time = ((2 if job.lora else 3) * head + loss) * slow  # forward + backward of the head, and the loss
    # What reads the stage's parameters and the groups alone (STATE_DIMS): the data-parallel
    # collectives and the optimizer step, once per distinct combination.
    first, fullest, last, shard, zg, held, coll, optimizer = per_distinct(
        c, STATE_DIMS, lambda part: _stage_states(model, hw, job, part, sw, links))
    v_shape = c.schedule == DUALPIPEV  # DualPipeV: rank 0 holds the first and the last stage (embedding and head)
    # Framework overhead per layer: once forward, twice backward, once more when recomputed.
    overhead_layer = (3 + recomputed_layers(c.recompute)) * e.layer_overhead_s * busy
    per_layer = (lt.forward + lt.backward + lt.recompute) * slow + overhead_layer
    # The pace of the pipeline is set by its slowest stage (the one with the head: the last, or
    # under DualPipeV the first).
    headed = where(v_shape, first, last)
    headed_work = headed * per_layer + head_time
    if not mtp:
        compute_mb = maximum(fullest * per_layer, headed_work)
        layers_pace = where(fullest * per_layer >= headed_work, fullest, headed)
    else:  # each module: one more layer (the model's mean layer's time), its projection and the head again
        # (the projection forward, backward twice as long, and again where its layer is recomputed whole)
        passes = 3 + recomputed_layers(c.recompute)
        headed_work = headed_work + mtp * (per_layer + head_time + passes * projection[0] * slow)
        headed = headed + mtp  # its layers' collectives too
        # The projection gathers its input over TP under sequence parallel (2h a token) and its output
        # (h) always, reduce-scattered back in the backward.
        tokens = c.micro_batch * model.seq_len / c.cp
        width = model.hidden * (1 + where(c.sequence_parallel, 2, 0))
        gathers = mtp * 2 * comm.tp_collective(links, act * tokens * width, c.tp, passes=1.0) * busy
        # The slower of the two stages with their layers' collectives: the modules' stage may hold
        # fewer layers, and so fewer of them, than the fullest (the head's work is not a layer's).
        per_comm = (lt.tp_comm + lt.cp_comm + lt.ep_comm + lt.tp_calls * e.tp_collective_overhead_s) * busy
        headed_paces = headed_work + headed * per_comm + gathers > fullest * (per_layer + per_comm)
        compute_mb = where(headed_paces, headed_work, fullest * per_layer)
        layers_pace = where(headed_paces, headed, fullest)
    # Each TP collective also pays a fixed software cost, time-sliced when processes share cores.
    # On a CPU host the collectives' copies and reductions run on the shared cores as well.
    # That fixed cost is host work on the training thread (DTensor's redistribute and dispatch, the
    # collective's enqueue: 0.6-0.8 ms per collective on one CPU core, README "Calibration"), which a
    # trace books as compute, not as a wait: it is compute here too; the link time is TP's.
    tp_host = layers_pace * lt.tp_calls * e.tp_collective_overhead_s * busy
    tp_mb = layers_pace * lt.tp_comm * busy
    if mtp:  # the projection's gathers, where the modules' stage sets the pace
        tp_mb = tp_mb + where(headed_paces, gathers, 0.0)
    compute_mb = compute_mb + tp_host
    cp_mb = layers_pace * lt.cp_comm * busy
    ep_mb = layers_pace * lt.ep_comm * busy
    m = as_float(c.m)
    p, v = c.pp, as_float(c.vpp)
    p2p_one = comm.p2p(links, act * c.micro_batch * model.seq_len / c.cp * model.hidden, c.tp, c.shard_group) * busy
    pp_mb = where(p > 1, 2 * v * p2p_one, 0.0)  # forward send + backward send per chunk
    # On a CPU host whose cores the processes time-share (busy > 1), the pipeline's fill and drain
    # leave about half the stages idle: the working ones get their cores back and run those
    # micro-batches up to ``busy`` times faster (one thread each, so never faster than alone).
    # Each stage runs (p-1)/v micro-batches' worth of its work in that phase, where the others
    # idle: the bubble shortens by ``ramp``, and so do those micro-batches (``runs``: the
    # micro-batches' worth of time at the shared pace). A host with a core per process (busy 1),
    # and every GPU, keeps m and the whole bubble.
    ramp = maximum(1.0, as_float(busy) / 2) / busy
    share = 1 / v  # of (p - 1) micro-batches' time: 1F1B, interleaved, GPipe
    if any_(v_shape):
        share = where(v_shape, dualpipe_bubble_ratio(lt.forward, lt.backward + lt.recompute, lt.weight_grad), share)
    bubble = (p - 1) * share * (compute_mb + tp_mb + cp_mb + ep_mb + pp_mb) * ramp
    runs = maximum(m - (1 - ramp) * (p - 1) / v, m * ramp)

    dp = _dp_exposed(hw, sw, c, coll, layers_pace * lt.forward * slow, layers_pace * lt.backward * slow, layers_pace,
                     layers_pace * lt.recompute * slow)
    if any_(c.offload >= 1):
        offload = offload_times(hw, job, c, held, shard / where(c.zero_stage >= 3, zg, 1),
                                optim_bytes_per_param(job, sw), layers_pace * lt.forward * slow,
                                layers_pace * lt.backward * slow, sw)
        optimizer = where(c.offload >= 1, offload.optimizer, optimizer)
        dp = dp + offload.params

    eval_batch = c.full(0.0)
    if job.evaluates:
        # Evaluation: the forward of each micro-batch alone on the same layout and kernels (no
        # backward, recompute or optimizer), its forward TP collectives (2 of the 4 + recomputed
        # ones per layer: Narayanan et al. 2021, Sec. 3.2), the forward share of the CP/EP
        # exchanges, one p2p send per chunk, and a forward-only pipeline's own fill and drain:
        # (p - 1) / v micro-batches of forward on the slowest stage (GPipe's forward half).
        fwd_layer = lt.forward * slow + e.layer_overhead_s * busy
        fwd_share = lt.forward / (lt.forward + lt.backward + lt.recompute)
        again = 2 - sw.stack.recompute_early_stop * where(c.sequence_parallel, 0.5, 1.0)
        recomputed = recomputed_layers(c.recompute)
        tp_fwd = (2 / (4 + again * recomputed) * lt.tp_comm
                  + 2 / (4 + 2 * recomputed) * lt.tp_calls * e.tp_collective_overhead_s) * busy
        fwd_head = (head + loss / 3) * slow
        if mtp:  # (``headed`` counts the modules' layers already)
            fwd_head = fwd_head + mtp * (head + loss / 3 + projection[0]) * slow
        fwd_mb = (maximum(fullest * fwd_layer, headed * fwd_layer + fwd_head)
                  + layers_pace * (tp_fwd + fwd_share * (lt.cp_comm + lt.ep_comm) * busy)
                  + where(p > 1, v * p2p_one, 0.0))
        eval_batch = (m + (p - 1) / v) * fwd_mb
    overhead_mb = layers_pace * overhead_layer
    # Stragglers: the slowest of N GPUs sets the pace of a synchronous step (Efficiency.step_jitter).
    busy_s = runs * (compute_mb + tp_mb + cp_mb + ep_mb + pp_mb) + bubble + dp + optimizer
    stragglers = busy_s * e.step_jitter * _spread(c.gpus)
    return StepTime.of(compute=runs * (compute_mb - overhead_mb), tp_comm=runs * tp_mb, cp_comm=runs * cp_mb,
                       ep_comm=runs * ep_mb, pp_comm=runs * pp_mb, dp_comm=dp, bubble=bubble, optimizer=optimizer,
                       other=runs * overhead_mb + e.step_overhead_s + stragglers, eval_batch=eval_batch)
