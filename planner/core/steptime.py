"""Step time and where it goes.

Per micro-batch and pipeline stage: GEMMs at a size-dependent fraction of peak (bounded below by
their memory traffic, the roofline), attention core, element-wise kernels as bytes over HBM
bandwidth, tensor-parallel collectives; then the pipeline (1F1B, interleaved, GPipe) with its
bubble and point-to-point sends, the data-parallel gradient reduction with the part hidden
behind backward, and the optimizer step as memory-bound work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core import comm
from planner.core.finetune import lora_params_per_layer
from planner.core.flops import Gemm, attention_core_flops, layer_gemms, logits_gemm
from planner.core.layout import Candidates, Job
from planner.core.memory import ACT_BYTES, GRAD_BYTES
from planner.core.model import ModelSpec
from planner.core.pipeline import stage_layers_arrays
from planner.hardware import HardwareProfile

FLASH_BACKWARD_RATIO = 2.5  # flash attention backward / forward time (Dao 2023, FlashAttention-2, Sec. 3)
LOGIT_TRAFFIC_BYTES = 12  # per logit, forward + backward cross-entropy (16-bit in, fp32 exp, 16-bit grad)


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds per optimizer step on the critical path, by part (they add up to ``step``)."""

    compute: np.ndarray
    tp_comm: np.ndarray
    pp_comm: np.ndarray
    dp_comm: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    other: np.ndarray

    @property
    def step(self) -> np.ndarray:
        return self.compute + self.tp_comm + self.pp_comm + self.dp_comm + self.bubble + self.optimizer + self.other


def _peak(hw: HardwareProfile, precision: str) -> float:
    return hw.gpu.peak_flops["bf16" if precision == "fp8" and not hw.gpu.supports("fp8") else precision]


def gemm_time(g: Gemm, hw: HardwareProfile, peak: float, elem_bytes: float) -> np.ndarray:
    """max(compute at size-dependent efficiency, memory traffic of A, B and C): a roofline whose
    compute roof is ``matmul * d/(d + matmul_half_dim)`` of peak, d the smallest GEMM dimension."""
    e = hw.efficiency
    d = g.min_dim
    compute = g.flops / (peak * e.matmul * d / (d + e.matmul_half_dim))
    traffic = elem_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count / (hw.gpu.hbm_bytes_per_s * e.memory)
    return np.maximum(compute, traffic)


def _elementwise_bytes(model: ModelSpec, c: Candidates, job: Job) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes of the element-wise kernels of one layer's forward per micro-batch per GPU:
    (layer without attention core, attention-core softmax/dropout).

    fused (Megatron-LM): one kernel each for norm, bias-dropout-add, bias-GELU or SwiGLU,
    scale-mask-softmax, RoPE on Q and K. eager (plain PyTorch ops, as the reference trainer): the
    same for GPT (LayerNorm, GELU and SDPA are single ops), but RMSNorm, RoPE and SwiGLU are
    several ops each, every one reading and writing its operands: RMSNorm ~7h per norm (square,
    mean, rsqrt, two products), RoPE ~9 reads/writes per Q and K element plus Q's copy out of the
    fused QKV (2h), SwiGLU 5f (SiLU, product)."""
    e = ACT_BYTES[job.precision]
    h, hkv, f, a, s = model.hidden, model.kv_hidden, model.ffn_hidden, model.heads, model.seq_len
    drop = 1.0 if model.has_dropout else 0.0
    eager = job.kernels == "eager" and model.gated_mlp
    # Two norms (read + write h each), two residual adds (read 2h, write h, + 1-byte mask).
    norms = 2 * (7 if eager else 2) * h
    replicated = norms + 2 * (3 * h + 0.5 * h * drop)
    if model.gated_mlp:  # SwiGLU + RoPE
        split = 5 * f + 9 * (h + hkv) + 2 * h if eager else 3 * f + 2 * (h + hkv)
    else:  # bias-GELU
        split = 2 * f
    softmax = (2 + 2.5 * drop) * a * s if job.attention == "standard" else 0.0
    tp = c.tp.astype(float)
    tokens = c.micro_batch * s
    layer = e * tokens * (np.where(c.sequence_parallel, replicated / tp, replicated) + split / tp)
    return layer, e * tokens * softmax / tp


@dataclass(frozen=True, slots=True)
class _LayerTimes:
    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray
    tp_comm: np.ndarray  # exposed link time, forward + backward + recompute
    tp_calls: np.ndarray  # TP collectives per layer per micro-batch on the critical path


def layer_times(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates,
                links: comm.Links) -> _LayerTimes:
    e = hw.efficiency
    act = ACT_BYTES[job.precision]
    peak = _peak(hw, job.precision)
    gemms = sum(gemm_time(g, hw, peak, act) for g in layer_gemms(model, c.micro_batch, c.tp))
    attn_flops = attention_core_flops(model, c.micro_batch, c.tp)
    half_peak = _peak(hw, "bf16" if job.precision == "fp8" else job.precision)
    if job.attention == "flash":  # causal: flash skips the upper triangle
        attn_fwd = 0.5 * attn_flops / (half_peak * e.flash_attention)
        attn_bwd = FLASH_BACKWARD_RATIO * attn_fwd
    else:  # two batched GEMMs of (s x d) @ (d x s) and (s x s) @ (s x d) per head
        d = model.head_dim
        eff = e.matmul * d / (d + e.matmul_half_dim)
        attn_fwd = attn_flops / (half_peak * eff)
        attn_bwd = 2 * attn_fwd
    hbm = hw.gpu.hbm_bytes_per_s * e.memory
    ew_layer, ew_softmax = _elementwise_bytes(model, c, job)
    # LoRA: frozen weights need input gradients only (one GEMM, not two); the adapters' small
    # GEMMs run at the matmul roof (they are < 1% of the FLOPs at the ranks people use).
    weight_grads = 0 if job.lora else 1
    adapter = (lora_params_per_layer(model, job) * 2.0 * c.micro_batch * model.seq_len / c.tp / (peak * e.matmul)
               if job.lora else 0.0)
    fwd = gemms + adapter + attn_fwd + (ew_layer + ew_softmax) / hbm
    bwd = (1 + weight_grads) * gemms + 2 * adapter + attn_bwd + 2 * (ew_layer + ew_softmax) / hbm
    selective = np.where(job.attention == "standard", attn_fwd + ew_softmax / hbm, 0.0)
    recompute = np.where(c.recompute == 2, fwd, np.where(c.recompute == 1, selective, 0.0))
    # Megatron TP: 2 all-reduces forward, 2 backward, 2 more when the forward is recomputed
    # (Narayanan et al. 2021, Sec. 3.2); sequence parallel swaps each for RS + AG, same bytes.
    collective = comm.tp_collective(links, act * c.micro_batch * model.seq_len * model.hidden, c.tp)
    calls = np.where(c.tp > 1, (4 + 2 * (c.recompute == 2)) * (1 - e.tp_overlap), 0.0)
    return _LayerTimes(fwd, bwd, recompute, calls * collective, calls)


def step_time(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates) -> StepTime:
    """The step's breakdown: seconds per optimizer step on the critical path, by part."""
    e = hw.efficiency
    links = comm.Links.of(hw)
    lt = layer_times(model, hw, job, c, links)
    act = ACT_BYTES[job.precision]
    half_peak = _peak(hw, "bf16" if job.precision == "fp8" else job.precision)
    head = gemm_time(logits_gemm(model, c.micro_batch, c.tp), hw, half_peak, act)
    loss = LOGIT_TRAFFIC_BYTES * c.micro_batch * model.seq_len * model.vocab / c.tp / (hw.gpu.hbm_bytes_per_s * e.memory)
    head_time = (2 if job.lora else 3) * head + loss  # forward + backward of the head, and the loss

    # A CPU host's cores are shared by its processes (threads per process = cores / processes,
    # as the trainer's launcher sets them): each computes at cores/processes of one core's speed.
    # Fixed (framework) overheads run on one thread: threads do not shorten them, sharing a core does.
    slow = busy = 1.0
    if hw.network.compute_slots:
        on_node = np.minimum(c.dp * c.tp * c.pp, hw.network.gpus_per_node)
        share = on_node / hw.network.compute_slots  # processes per core
        threads = 1.0 / np.minimum(share, 1.0)  # cores per process, when it has more than one
        slow = np.where(share >= 1, share, 1.0 / (1.0 + (threads - 1.0) * e.thread_scaling))
        busy = np.maximum(1.0, share)
    head_time = head_time * slow
    first, fullest, last = stage_layers_arrays(model.layers, c.pp)
    # Framework overhead per layer: once forward, twice backward, once more when recomputed.
    overhead_layer = (3 + (c.recompute == 2)) * e.layer_overhead_s * busy
    per_layer = (lt.forward + lt.backward + lt.recompute) * slow + overhead_layer
    # The pace of the pipeline is set by its slowest stage (the last one carries the head).
    compute_mb = np.maximum(fullest * per_layer, last * per_layer + head_time)
    layers_pace = np.where(fullest * per_layer >= last * per_layer + head_time, fullest, last)
    # Each TP collective also pays a fixed software cost, time-sliced when processes share cores.
    # On a CPU host the collectives' copies and reductions run on the shared cores as well.
    tp_mb = layers_pace * (lt.tp_comm + lt.tp_calls * e.tp_collective_overhead_s) * busy
    m = c.m.astype(float)
    p, v = c.pp, c.vpp.astype(float)
    p2p_one = comm.p2p(links, act * c.micro_batch * model.seq_len * model.hidden, c.tp, c.dp) * busy
    pp_mb = np.where(p > 1, 2 * v * p2p_one, 0.0)  # forward send + backward send per chunk
    per_mb = compute_mb + tp_mb + pp_mb
    bubble = (p - 1) / v * per_mb

    # Data parallel: the stage with the most parameters reduces the most gradient bytes.
    params = np.maximum(fullest * model.layer_params, first * model.layer_params + model.embedding_params)
    shard = params / c.tp
    trained = shard if not job.lora else np.maximum(fullest, first) * lora_params_per_layer(model, job) / c.tp
    grad_bytes = trained * GRAD_BYTES[job.precision]
    param_bytes = shard * act
    ar = comm.group_collective(links, grad_bytes, c.dp, c.tp, 2.0) * busy
    rs = comm.group_collective(links, grad_bytes, c.dp, c.tp, 1.0) * busy
    ag = comm.group_collective(links, param_bytes, c.dp, c.tp, 1.0) * busy  # ZeRO-3: gather the weights
    ag_step = comm.group_collective(links, trained * act, c.dp, c.tp, 1.0) * busy  # ZeRO-1/2: updated weights
    bwd_mb = layers_pace * lt.backward * slow
    hidden = e.dp_overlap * bwd_mb if job.overlap_grad_reduce else np.zeros_like(bwd_mb)
    fwd_mb = layers_pace * lt.forward * slow
    zero3 = m * np.maximum(0.0, 2 * ag + rs - e.zero3_overlap * (fwd_mb + bwd_mb))
    dp = np.select([c.zero_stage == 0, c.zero_stage == 1, c.zero_stage == 2],
                   [np.maximum(0.0, ar - hidden), np.maximum(0.0, rs - hidden) + ag_step,
                    m * np.maximum(0.0, rs - hidden) + ag_step], zero3)

    # AdamW step: read gradient, read+write master, momentum, variance; write 16-bit weights.
    mixed = job.precision in ("fp16", "bf16", "fp8")
    optim_bytes_per_param = GRAD_BYTES[job.precision] + 24 + (2 if mixed else 0)
    held = trained / np.where(c.zero_stage >= 1, c.dp, 1)
    optimizer = held * optim_bytes_per_param / (hw.gpu.hbm_bytes_per_s * e.memory) * slow

    overhead_mb = layers_pace * overhead_layer
    st = StepTime(compute=m * (compute_mb - overhead_mb), tp_comm=m * tp_mb, pp_comm=m * pp_mb, dp_comm=dp,
                  bubble=bubble, optimizer=optimizer, other=m * overhead_mb + e.step_overhead_s)
    return st
