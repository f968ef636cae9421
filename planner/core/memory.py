"""Memory per GPU, by part and by pipeline stage.

Model states (ZeRO paper, Rajbhandari et al. 2020, Sec. 3.1): 16-bit weights, gradients and
AdamW states (fp32 master copy, momentum, variance: 12 bytes), each sharded over the
data-parallel group by ZeRO stage 1 (optimizer), 2 (+gradients) or 3 (+weights).
Activations per layer (Korthikanti et al. 2022, Sec. 4): s*b*h*(34 + 5*a*s/h) bytes for a GPT
layer, generalised below to GQA, gated MLPs and flash attention.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, make_dataclass

import numpy as np

from planner.core.columns import any_, as_float, maximum, minimum, not_, where
from planner.core.finetune import lora_params_per_layer
from planner.core.layout import DUALPIPEV, LAYER_DIMS, PARTIAL, Candidates, Job, per_distinct, recomputed_layers
from planner.core.model import ModelSpec
from planner.core.pipeline import in_flight, stage_layers
from planner.hardware import HardwareProfile
from planner.memo import by_identity, fast_init
from planner.stacks import Software, software

# fp8 keeps bf16 weights; Transformer Engine's delayed scaling also caches an fp8 copy (+1 byte),
# torchao's dynamic tensorwise scaling casts them on the fly (fp8_weight_bytes below).
WEIGHT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}
# fp16 reduces gradients in fp16 (ZeRO paper's 2 bytes); bf16 and fp8 accumulate them in fp32
# (Megatron-LM forces fp32 main grads for bf16; torchtitan's FSDP reduce_dtype is fp32).
GRAD_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 4, "fp8": 4}
# AdamW: fp32 momentum + variance (8), plus the fp32 master weights (4) under mixed precision.
OPTIMIZER_BYTES = {"fp32": 8, "tf32": 8, "fp16": 12, "bf16": 12, "fp8": 12}
ACT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}


# The parameter counts the memory and step-time models read per stage: ModelSpec's properties,
# which recount the whole model on every read, read once per model (the same numbers).
Counts = make_dataclass("Counts", [(n, float) for n in ("layer_params", "layer_expert_params", "embedding_params",
                                                        "norm_params", "head_params", "indexer_params")],
                        frozen=True, slots=True)


@by_identity  # the same objects again (an estimate reads it several times): no hashing
@functools.lru_cache(maxsize=256)
def counts(model: ModelSpec) -> Counts:
    """``model``'s per-layer, embedding, norm and head parameters, remembered (a ModelSpec is frozen)."""
    return Counts(*(getattr(model, f) for f in Counts.__slots__))


def whole_on_tp_ranks(n: Counts, tp: np.ndarray) -> np.ndarray | float:
    """Per layer, the parameters a TP rank holds beyond its 1/tp share of the layer: DSA's indexer,
    whole on every rank (Megatron-Core's duplicated linears)."""
    return n.indexer_params * (1 - 1 / tp)


MASTER_BYTES = 4  # an fp32 master weight


def param_master(job: Job, sw: Software) -> bool:
    """Whether a mixed-precision job's fp32 master weights are its parameters (the stack's
    ``master_weights = "param"``: FSDP2, DDP under autocast) rather than a separate optimizer copy
    beside 16-bit weights. Per parameter: 4 (fp32 weights) + 4 (fp32 gradients) + 8 (AdamW) = 16
    bytes, against 2 + 4 + 12 = 18 for Megatron and DeepSpeed. Offloaded layouts keep the
    separate count (planner.core.offload)."""
    return sw.stack.master_weights == "param" and OPTIMIZER_BYTES[job.precision] > 2 * MASTER_BYTES


def state_bytes(job: Job, sw: Software) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per trained parameter as the stack keeps them: 16-bit
    weights, gradients and a separate fp32 master with AdamW's moments, or (``param_master``)
    fp32 weights that are the master, fp32 gradients and the moments alone."""
    if param_master(job, sw):
        return MASTER_BYTES, MASTER_BYTES, OPTIMIZER_BYTES[job.precision] - MASTER_BYTES
    return WEIGHT_BYTES[job.precision], GRAD_BYTES[job.precision], OPTIMIZER_BYTES[job.precision]


def fp8_weight_bytes(sw: Software) -> float:
    """Bytes per parameter an fp8 job holds beside its 16-bit weights: TE's cached fp8 copy."""
    return 1.0 if sw.fp8 and sw.stack.fp8_recipe == "delayed" else 0.0


@fast_init
@dataclass(frozen=True, slots=True)
class Memory:
    """Bytes per GPU at the peak stage, by part; ``stage`` is the peak stage's index."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    other: np.ndarray
    stage: np.ndarray
    total: np.ndarray  # the sum of the five parts, computed once by ``Memory.of``
    host: np.ndarray  # bytes this GPU keeps in host memory (CPU offload), beside the total
    gathered: np.ndarray  # of ``other``: the ZeRO-3 / FSDP buffers of gathered weights (and gradients)

    @classmethod
    def of(cls, weights, gradients, optimizer, activations, other, stage, host, gathered) -> "Memory":
        return cls(weights, gradients, optimizer, activations, other, stage,
                   weights + gradients + optimizer + activations + other, host, gathered)


def layer_activation_bytes(model: ModelSpec, c: Candidates, job: Job, recompute: np.ndarray | None = None,
                           sw: Software | None = None) -> np.ndarray:
    """Activations one layer keeps for backward per micro-batch per GPU: a dense model's
    (``activation_bytes_per_layer``); for an MoE the mean over its layers, an MoE layer keeping
    its MLP's tensors at the routed width (planner.core.moe.moe_mlp_width) plus the permuted
    expert inputs and the router's logits (planner.core.moe.activation_extra_per_token)."""
    if not model.moe:
        return activation_bytes_per_layer(model, c, job, recompute, sw)
    from planner.core import moe

    rc = c.recompute if recompute is None else recompute
    # The dense and the MoE layer in one pass: row 0 at the dense MLP's width, row 1 at the routed
    # width (element by element the same arithmetic as two calls; integer widths are exact in float64).
    # An MoE layer's own norms (``moe_norms``), kept beside the dense layer's.
    if type(rc) is not np.ndarray:  # one layout (Candidates.one_row): the two as scalars
        dense, routed = (activation_bytes_per_layer(model, c, job, recompute, sw, ffn=float(w), extra_norms=n)
                         for w, n in ((model.ffn_hidden, 0), (moe.moe_mlp_width(model, job, c), model.moe_norms)))
    else:
        width = np.stack([c.full(model.ffn_hidden), moe.moe_mlp_width(model, job, c)])
        if np.ndim(rc) > np.ndim(c.dp):  # several recompute columns (rows of rc): each width against each
            width = width[:, None]
        norms = np.array([0, model.moe_norms]).reshape(2, *[1] * (width.ndim - 1)) if model.moe_norms else 0
        dense, routed = activation_bytes_per_layer(model, c, job, recompute, sw, ffn=width, extra_norms=norms)
    tokens = c.micro_batch * model.seq_len / c.cp
    # Kept by the layers not recomputed whole (none under full, half under half, 3/4 under quarter).
    extra = (1 - recomputed_layers(rc)) * moe.activation_extra_per_token(model, job, c, ACT_BYTES[job.precision]) * tokens
    return ((model.layers - model.moe_layers) * dense + model.moe_layers * (routed + extra)) / model.layers


def activation_bytes_per_layer(model: ModelSpec, c: Candidates, job: Job, recompute: np.ndarray | None = None,
                               sw: Software | None = None, ffn: np.ndarray | float | None = None,
                               extra_norms: np.ndarray | int = 0) -> np.ndarray:
    """Activations one layer keeps for backward, per micro-batch, per GPU.

    Per token, with 16-bit activations (e = 2 bytes) and 1-byte dropout masks:
      replicated over TP ranks unless sequence parallel: inputs of the two norms (four with
        ``post_norms``), of QKV and of the MLP (4 * e*h) and the two dropout masks (2 * h, GPT only);
      split by TP: Q, K, V and the attention output (e*(2h + 2h_kv); Q and the output at their own
        widths, heads x head widths, where those are not h), the MLP's internal
        tensors (2 * e*f for GELU, 3 * e*f for SwiGLU), and for standard attention the softmax
        output (e*a*s) plus dropout mask and output ((1 + e)*a*s with dropout); flash attention keeps
        only the fp32 log-sum-exp (4a). Selective recompute drops the s x s terms.
    GPT with f = 4h, MHA and dropout gives 34*h + 5*a*s (Korthikanti et al. 2022, eq. 2).
    Full recompute keeps only the layer input (e*h; split by TP under sequence parallel); half
    (quarter) recomputes every second (fourth) layer so, the others keep what they keep without
    recompute: per layer, the two weighted by that share (``recomputed_layers``).
    ``recompute`` overrides the candidates' recompute column (0 none, 1 selective, 2 full, 3 half,
    4 quarter; rows of such columns give rows of results);
    ``ffn`` the MLP width (an MoE layer's routed width per token); ``extra_norms``, norms the layer
    has beyond ``layer_norms`` (an MoE layer's ``moe_norms``: Gemma 4's three), each keeping what
    the layer's norms keep.

    Some of these are kept only for a weight gradient: the inputs of QKV, of the output
    projection, of MLP-in and of MLP-out. Under LoRA a frozen matmul needs no weight gradient, so
    its input is not kept unless an adapter on it reads the same tensor. Eager kernels (plain
    PyTorch, job.kernels == "eager") keep more for RMSNorm (the normalised output, for the norm's
    weight) and SwiGLU (the SiLU output, for the product's backward).

    Selective recompute is the stack's policy: "attention" (Megatron, Korthikanti et al. 2022)
    recomputes the attention core, dropping its s x s terms; "op" (torchtitan's op-level
    selective checkpointing) keeps the block input, the attention output and every matmul output
    but every second one (wq, wv, w1, w2 of a gated block; QKV and fc1 of a GELU one) and
    recomputes everything else.
    """
    sw = sw or software(job)
    rc = c.recompute if recompute is None else recompute
    e = ACT_BYTES[job.precision]
    h, hkv, a, s = model.hidden, model.kv_hidden, model.heads, model.seq_len
    f = model.ffn_hidden if ffn is None else ffn
    drop = 1.0 if model.has_dropout else 0.0
    targets = set(job.lora_targets) if job.lora else None
    trains = lambda *names: targets is None or bool(targets.intersection(names))  # noqa: E731
    eager = sw.eager and model.gated_mlp
    # The inputs of the column-parallel matmuls (QKV, MLP-in), kept for their weight gradients.
    # Under sequence parallel Megatron keeps its sequence shard and gathers it again in backward
    # (Korthikanti et al. 2022, Sec. 4.2.2); DTensor's autograd keeps the gathered input whole.
    gathered = e * h * trains("q_proj", "k_proj", "v_proj") + e * h * trains("gate_proj", "up_proj")
    if model.parallel_block:  # one normalised input feeds both halves: kept once
        gathered = e * h * trains("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    # Replicated over TP ranks unless sequence parallel.
    # What an eager RMSNorm keeps (the stack's eager_norm; measured: benchmarks/activation_memory.py):
    # one kernel its input (and rstd); op by op also the normalised tensor, for the weight's gradient
    # (frozen under LoRA: not kept); upcast, its input as the fp32 copy it normalised. Fused
    # kernels (and LayerNorm's native kernel) keep the input only.
    norm = sw.stack.eager_norm if sw.eager and model.arch != "gpt" else "fused"
    norm_in = 4.0 if norm == "upcast" else e
    norm_out = e * (targets is None) if norm != "fused" else 0.0
    replicated = ((model.layer_norms + extra_norms) * (norm_in + norm_out) * h  # the two norms (four with post-norms)
                  + (0 if sw.stack.tp_saves_gathered_inputs else gathered)
                  + 2 * h * drop)  # two dropout masks
    # Split by TP: Q, K, V for attention's backward, the projection input, the MLP's inside.
    # K and V as attention reads them: at the K/V heads, or repeated to the query heads (the
    # stack's attention_kv_heads: torchtitan's repeat_kv until 2026, SDPA keeping the copies). A
    # TP rank with one K/V head repeats it as a view (expand and reshape merge): no copy is kept.
    kv = hkv
    if sw.stack.attention_kv_heads == "query":
        kv = where(model.kv_heads > c.tp, attention_kv_width(model, sw), hkv)
    # A fused QKV projection split into views: with RoPE copying Q and K, attention keeps V's view
    # and with it the whole output, Q and K parts included (the stack's qkv_buffer_kept).
    qkv_buffer = sw.stack.qkv_buffer_kept and not model.learned_positions and not model.kv_lora_rank
    # Q, K and V as the attention kernel reads them (Q heads x qk width: wider than h where head_dim
    # x heads is, Qwen3-30B-A3B, Gemma 3, MLA), and its output (heads x v width), the output
    # projection's input: kept for that projection's weight gradient and for a flash kernel's
    # backward, which reads it whether or not the projection trains (standard attention's reads
    # the softmax output and V instead).
    q, out = model.q_width, model.attn_out_width
    out_kept = trains("o_proj") or job.attention != "standard"
    attention = e * (q + 2 * kv) + e * (q + model.k_width) * qkv_buffer + e * out * out_kept
    split = (attention
             + (e * 2 * f + e * f * eager if model.gated_mlp else e * f)  # gate, up (+ SiLU out) | GELU in
             + e * f * trains("down_proj"))  # MLP-out input
    if job.attention == "standard":
        # softmax out; mask + dropout out (half, quarter: in the layers not recomputed)
        scores = where((rc == 0) | (rc >= PARTIAL), e * a * s + (1 + e) * a * s * drop, 0.0)
    else:
        scores = c.full(4.0 * a)
    if model.linear_layers:  # the mean layer: a softmax layer's attention tensors, or a Gated DeltaNet's
        split = split - attention + _linear_layer_attention(model, e, attention, trains)
        scores = model.softmax_share * scores
    whole_sequence = 0.0
    if model.index_topk:
        split, whole_sequence = split - attention + _sparse_attention(model, e, out * out_kept), _indexer_kept(model, e, not job.lora)
    tp = as_float(c.tp)
    per_token = where(c.sequence_parallel, replicated / tp, replicated) + (split + scores) / tp + whole_sequence
    if sw.stack.tp_saves_gathered_inputs:
        per_token = per_token + gathered
    if sw.stack.selective == "op":  # input and the second matmul's output (replicated), the rest split
        kept_split = (q + hkv + f if model.gated_mlp else q + 2 * hkv + f) + out  # + attention output
        op = where(c.sequence_parallel, 2 * e * h / tp, 2 * e * h) + (e * kept_split + 4.0 * a) / tp
        per_token = where(rc == 1, op, per_token)
    full = where(c.sequence_parallel, e * h / tp, e * h)
    whole = recomputed_layers(rc)  # the share of layers recomputed whole, keeping their input alone
    per_token = whole * full + (1 - whole) * per_token
    return per_token * c.micro_batch * s / c.cp  # context parallel: each GPU keeps 1/cp of the tokens


def _sparse_attention(model: ModelSpec, e: float, out: float) -> float:
    """DSA's attention tensors split by TP, per token: what Megatron-Core's cuDNN DSA backend keeps
    for backward, MLA absorbed (FlashMLA's sparse kernel): every head's query against the latent
    key (kv_lora_rank + qk_rope_dim) and the kernel's latent-wide output (kv_lora_rank), and
    ``out``, the output projection's input (the value heads' up-projection) where kept."""
    return e * model.attn_core_width + e * out  # attn_core_width: heads x (576 + 512) absorbed


def _indexer_kept(model: ModelSpec, e: float, trains: bool) -> float:
    """DSA's tensors per token that every TP rank keeps whole (the indexer runs on the whole
    sequence on each): the latent key (kv_lora_rank + qk_rope_dim), the int32 indices of the
    selected keys (index_topk, at most the sequence), and where the indexer ``trains`` (not under
    LoRA) its loss gradients the cuDNN backend computes in the forward and keeps (its query's,
    index_heads x index_head_dim; its key's; the fp32 head weights')."""
    topk = min(model.index_topk, model.seq_len)
    grads = e * (model.index_heads * model.index_head_dim + model.index_head_dim) + 4 * model.index_heads
    return e * model.kv_cache_width + 4 * topk + grads * trains  # kv_cache_width: MLA's latent key


def dsa_scores_working(model: ModelSpec, c: Candidates) -> np.ndarray | float:
    """DSA's indexer scores in flight while a layer runs (its forward, or its recomputed forward in
    the backward): fp32 scores of this GPU's queries against the whole sequence, computed in row
    chunks of at most 1 GiB (Megatron-Core's cuDNN backend, _INDEXER_SCORE_CHUNK_MAX_BYTES)."""
    if not model.index_topk:
        return 0.0
    return minimum(float(2**30), 4.0 * c.micro_batch * model.seq_len / c.cp * model.seq_len)


def _linear_layer_attention(model: ModelSpec, e: float, attention: float, trains) -> float:
    """``activation_bytes_per_layer``'s attention tensors split by tensor parallel, per token, the mean
    over a model's softmax and linear-attention layers, from a softmax layer's (``attention``). A
    softmax layer with its output gated (Qwen3-Next, Qwen3.5) keeps the gate and the output before it
    too. A Gated DeltaNet layer keeps, for backward, the convolution's input and the delta-rule
    kernel's q, k, v (both 2*key + value wide), the output gate z, the kernel's output and the gated
    norm's (the output projection's input), and per value head beta (before and after its sigmoid),
    the fp32 decay and the chunk's solved triangle (64 values, flash-linear-attention's chunk size);
    the chunk states are recomputed in backward (fla.ops.gated_delta_rule)."""
    gated = attention + 2 * e * model.q_width * model.output_gate
    key, value = model.linear_key_heads * model.linear_key_dim, model.linear_value_heads * model.linear_value_dim
    heads = model.linear_value_heads
    linear = e * (2 * (2 * key + value) + 2 * value) + e * value * trains("out_proj") + heads * (2 * e + 4 + 64 * e)
    share = model.linear_layers / model.layers
    return (1 - share) * gated + share * linear


def hardware_read(hw: HardwareProfile) -> tuple:
    """All that ``memory`` reads of the hardware: profiles equal in these (and the same model, job
    and layouts) have the same memory to the bit. Keep it in step with ``memory``."""
    e = hw.efficiency
    return hw.network.gpus_per_node, e.fragmentation, e.cuda_context_bytes, e.comm_buffer_bytes


# The columns a stage's model states read (weights, gradients, optimizer states, ZeRO-3 buffers,
# the memory outside the allocator): not the micro-batch, recompute or sequence parallel.
STATE_DIMS = ("tp", "pp", "dp", "cp", "ep", "zero_stage", "sharding", "offload", "schedule")


def memory(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates,
           sw: Software | None = None) -> tuple[Memory, tuple[Memory, ...]]:
    """Peak memory per GPU, and the memory of the three stages that can hold the peak: the first
    (embedding, most micro-batches in flight), the fullest (an extra layer when layers do not
    divide) and the last (head, logits). Other stages hold less than one of these.

    ``other`` holds what torch's allocator does not see (the CUDA context, NCCL buffers: see
    ``outside_allocator``) and what it does (ZeRO-3 gather buffers, fragmentation)."""
    sw = sw or software(job)
    eff = hw.efficiency
    e = ACT_BYTES[job.precision]  # 16-bit weights as gathered and held (fp32 jobs: 4)

    def per_layer(p: Candidates) -> tuple[np.ndarray, np.ndarray]:
        act_layer, working = layer_activations_and_working(model, p, job, sw)
        working = working + context_parallel_working(model, p, job, sw)
        return act_layer, working + dsa_scores_working(model, p) if model.index_topk else working

    # What a layer keeps and works in, per micro-batch: once per distinct LAYER_DIMS.
    act_layer, working = per_distinct(c, LAYER_DIMS, per_layer)
    tp, pp = as_float(c.tp), c.pp
    tokens = c.micro_batch * model.seq_len / c.cp  # per GPU: context parallel splits the sequence
    # The embedding dropout mask on the first stage (Korthikanti et al. 2022, Sec. 4.3), per micro-batch in flight.
    mask_per_flight = (1.0 if model.has_dropout else 0.0) * tokens * model.hidden
    mask_split = where(c.sequence_parallel, tp, 1)
    # The loss's peak: the stack's bytes per logit (vocabulary split across TP ranks).
    logits = where(tp > 1, sw.logit_bytes_tp, sw.logit_bytes) * tokens * model.vocab / tp
    # torch.distributed.pipelining keeps each micro-batch's output on the last stage for the step's
    # merged return (stage.output_chunks): the 16-bit logits of the m - 1 earlier micro-batches.
    kept = (c.m - 1) * e * tokens * model.vocab / tp if sw.stack.pp_keeps_outputs else 0.0
    last_extra = logits + where(pp > 1, kept, 0.0)
    # Multi-token prediction on the last stage (the last chunk: one micro-batch in flight, whatever
    # the stage's other chunks hold): each module keeps one more layer's activations, its own logits
    # at the loss's peak, and its inputs (the two streams and their normalised concatenation, 4h a
    # token, split by TP under sequence parallel; 2h when its layer is recomputed whole).
    mtp = model.mtp_layers
    if mtp:
        inputs = (4 - 2 * recomputed_layers(c.recompute)) * model.hidden / where(c.sequence_parallel, tp, 1)
        mtp_extra = mtp * (act_layer + logits + e * tokens * inputs)

    def stage(index, layers, states: tuple) -> Memory:
        """The memory of the stages ``index`` holding ``layers`` layers, their model states
        ``states`` (``model_states``): rows (stages, layouts) of a table, or one layout's stage as
        scalars."""
        weights, grads, optim, host, gather, outside = states
        is_first, is_last = _ends(c, index, pp)
        flight = in_flight(pp, c.vpp, c.m, c.schedule, index)
        acts = layers * act_layer * flight + working
        acts = acts + where(is_first, mask_per_flight * flight / mask_split, 0.0)
        acts = acts + where(is_last, last_extra, 0.0)
        if mtp:
            acts = acts + where(is_last, mtp_extra, 0.0)
        other = outside + gather + eff.fragmentation * (acts + grads + gather)
        return Memory.of(weights, grads, optim, acts, other, index, host, gather)

    if type(pp) is not np.ndarray:  # one layout (Candidates.one_row): each stage as scalars
        first, fullest, last = stage_layers(model, c, sw)
        states = model_states(model, hw, job, c, sw)
        stages = [stage(0, first, states(0, first))]
        if pp > 1:
            mid = stage(1, fullest, states(1, fullest))
            # Two stages: the second is the fullest and the last (one computation when they hold as many layers).
            same = pp == 2 and last == fullest
            stages += [mid, mid if same else stage(pp - 1, last, states(pp - 1, last))]
        stages += [stages[0]] * (3 - len(stages))
        # The peak: the first stage that holds the most, as np.argmax picks it below.
        peak = stages[0]
        for s in stages[1:]:
            if s.total > peak.total:
                peak = s
        return peak, tuple(stages)
    # The three stages as rows of one (3, layouts) table (one row when no layout pipelines: the
    # stages are then one and the same), so each formula runs once for all of them. Their model
    # states (and which stage each row is, of how many layers) read STATE_DIMS alone: computed
    # once per distinct combination.
    piped = any_(pp > 1)

    def stage_states(p: Candidates) -> tuple:
        index, layers = _stage_rows(model, p, sw, piped)
        return index, layers, model_states(model, hw, job, p, sw)(index, layers)

    index, layers, states = per_distinct(c, STATE_DIMS, stage_states)
    table = stage(index, layers, states)
    columns = [getattr(table, f) for f in Memory.__slots__]  # each (stages, layouts): every part reads ``layers``
    assert all(col.shape == index.shape for col in columns), "memory: a part is not one value per stage and layout"
    stages = [Memory(*(col[k] for col in columns)) for k in range(len(index))]
    stages += [stages[0]] * (3 - len(stages))  # one stage: first, fullest and last are the same
    if len(index) == 1:
        return stages[0], tuple(stages)
    # The peak: the first stage that holds the most (a later stage only when it holds more).
    flat = np.argmax(table.total, axis=0) * len(c) + np.arange(len(c))  # (stage, layout) in the flattened table
    return Memory(*(np.ravel(col).take(flat) for col in columns)), tuple(stages)


def model_states(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw: Software):
    """``states(index, layers)``: the weights, gradients and optimizer states of the stages
    ``index`` holding ``layers`` layers, what of them is in host memory, the ZeRO-3 / bucket
    buffers (``Memory.gathered``) and the memory outside the allocator, of each layout of ``c``
    (rows (stages, layouts) of a table, or one layout's stage as scalars). They read the columns
    STATE_DIMS alone."""
    e = ACT_BYTES[job.precision]  # 16-bit weights as gathered and held (fp32 jobs: 4)
    # ZeRO shards over dp x cp (under hybrid sharding, over those ranks inside one node).
    tp, dp, pp = as_float(c.tp), as_float(c.zero_group(hw.network.gpus_per_node)), c.pp
    wb, gb, ob = WEIGHT_BYTES[job.precision], GRAD_BYTES[job.precision], OPTIMIZER_BYTES[job.precision]
    if sw.stack.grad_dtype == "model" and gb > wb:  # kept in the training dtype under ZeRO 1-3 (DeepSpeed)
        gb = where(c.zero_stage >= 1, float(wb), float(gb))
    # What does not depend on the stage: ZeRO's divisors by stage (dense, routed experts), the
    # memory outside the allocator, the offload flags.
    divisors = {k: (where(c.zero_stage >= k, dp, 1), where(c.zero_stage >= k, dp / c.ep, 1)) for k in (1, 2, 3)}
    outside = outside_allocator(hw, c)
    offload_opt, offload_par = c.offload >= 1, c.offload == 2
    offloads = any_(offload_opt)
    # ZeRO-3 gathers a wrapped block's weights and prefetches the next (``gather_layers`` in 16-bit).
    n = counts(model)
    block = (n.layer_params - n.layer_expert_params) / tp + n.layer_expert_params / (tp * c.ep)
    if n.indexer_params:
        block = block + whole_on_tp_ranks(n, tp)
    gather_blocks = where(c.zero_stage >= 3, zero3_live_params(model, c, sw, block) * e, 0.0)
    # Its backward also holds a block's gradients for the reduce-scatter (the stack's
    # ``reduce_scatter_bytes`` per parameter; a stage that keeps its gradients unsharded under
    # pipelining reduces them after the peak, below).
    if sw.stack.reduce_scatter_bytes:
        gather_blocks = gather_blocks + where(c.zero_stage >= 3, sw.stack.reduce_scatter_bytes * block, 0.0)
    # What does not depend on the stage either: bytes per weight held (TE's fp8 copy beside the
    # 16-bit ones), and where the fp32 parameters are the master, their bytes and ZeRO 1-2's flag.
    weight_b = wb + fp8_weight_bytes(sw)
    param_is_master = not job.lora and param_master(job, sw)
    if param_is_master:
        master, grad_b, optim_b = state_bytes(job, sw)
        mid = as_float((c.zero_stage == 1) | (c.zero_stage == 2))  # keep the 16-bit weights
    lora_layer = lora_params_per_layer(model, job) if job.lora else 0  # adapter parameters per layer

    def states(index, layers) -> tuple:
        is_first, is_last = _ends(c, index, pp)
        params = stage_params(model, pp, layers, is_first, is_last)
        # Routed experts are split over ep as well, and ZeRO shards them over the dp*cp/ep ranks
        # that hold the same experts (expert data parallel): sharded, a GPU holds 1/(tp*dp*cp) of both.
        layer_experts = layers * n.layer_expert_params
        if model.mtp_layers:  # the multi-token-prediction modules' experts (on the last stage), split alike
            layer_experts = layer_experts + where(is_last, model.mtp_expert_params, 0)
        experts = layer_experts / (tp * c.ep)
        shard = (params - layer_experts) / tp + experts
        if n.indexer_params:
            shard = shard + layers * whole_on_tp_ranks(n, tp)
        ratio = where(shard > 0, experts / where(shard > 0, shard, 1.0), 0.0)  # expert share of the shard

        def sharded(bytes_: np.ndarray, stage: int) -> np.ndarray:  # ZeRO stage >= ``stage`` shards it
            return bytes_ * ((1 - ratio) / divisors[stage][0] + ratio / divisors[stage][1])

        # What trains: everything, or under LoRA the adapters of this stage's layers; frozen
        # weights are kept in 16-bit only (no master copy, gradients or optimizer states).
        trained = shard if not job.lora else layers * lora_layer / tp
        if job.lora:
            weights = (shard * weight_b + trained * wb) / where(c.zero_stage >= 3, dp, 1)
            grads = trained * gb / where(c.zero_stage >= 2, dp, 1)
            optim = trained * ob / where(c.zero_stage >= 1, dp, 1)
        else:
            weights = sharded(shard * weight_b, 3)
            grads, optim = sharded(trained * gb, 2), sharded(trained * ob, 1)
            if param_is_master:
                # The fp32 parameters are the master (FSDP2, DDP under autocast): no 16-bit copy of
                # them is kept (ZeRO 0 and 3); ZeRO 1-2 keep the gathered 16-bit weights from the
                # forward to the backward beside their fp32 shard. Their gradients are fp32 (the
                # parameters' dtype, fp16 jobs too); the optimizer holds AdamW's 8 bytes.
                own = (weights * mid + sharded(shard * master, 1),
                       grads * (grad_b / gb), optim * (optim_b / ob))  # sharded alike: scaled
                if offloads:  # offloaded layouts keep the separate count
                    kept = c.offload == 0
                    own = tuple(where(kept, new, old) for new, old in zip(own, (weights, grads, optim)))
                weights, grads, optim = own
        # CPU offload (Ren et al. 2021, ZeRO-Offload; Rajbhandari et al. 2021, ZeRO-Infinity): the
        # fp32 master weights, AdamW states and fp32 gradients of this GPU's shard move to host
        # memory. What the GPU still holds of the gradients is the stack's ``offload_grads``: its
        # gradient buffer as without offload, copied out at the step (Megatron-Core), or, each
        # copied out as soon as it is reduced, one 16-bit DP bucket's (DeepSpeed) or one wrapped
        # block's, unsharded, in the reduce dtype (FSDP2). Offloaded parameters leave only the
        # gathered layers (``gather`` below) on the GPU.
        if offloads:
            # the host's gradients are fp32 (those kept in the training dtype are widened there)
            host = (where(offload_opt, optim + grads * (GRAD_BYTES[job.precision] / gb), 0.0)
                    + where(offload_par, weights, 0.0))
            if sw.stack.offload_grads == "bucket":
                held = minimum(grads * e / gb, sw.stack.dp_bucket_bytes)
            elif sw.stack.offload_grads == "block":
                held = minimum(grads, block * sw.stack.grad_reduce_bytes)
            else:  # "shard"
                held = grads
            grads = where(offload_opt, held, grads)
            optim = where(offload_opt, 0.0, optim)
            weights = where(offload_par, 0.0, weights)
        else:  # nothing offloaded: the same values as the lines above give
            host = c.full(0.0)
        # Under pipelining a stack that does not reshard between micro-batches (FSDP2 in torchtitan)
        # keeps the stage's weights gathered and its gradients unsharded (fp32).
        gather = gather_blocks
        if not sw.stack.reshard_in_pipeline:
            gather = where((c.zero_stage >= 3) & (pp > 1), trained * gb + shard * e, gather)
        if sw.stack.grad_bucket_buffer:  # DeepSpeed's gradient bucket (offloading, the gradients it holds are it)
            bucket = (c.zero_stage >= 1) & not_(offload_opt) if offloads else c.zero_stage >= 1
            gather = gather + where(bucket, sw.stack.dp_bucket_bytes, 0.0)
        if type(index) is np.ndarray:  # rows of stages: what is the same on every stage, on each
            host, gather = host * np.ones_like(weights), gather + np.zeros_like(weights)
        return weights, grads, optim, host, gather, outside

    return states


def _ends(c: Candidates, index, pp) -> tuple:
    """Whether the stages ``index`` are the first and the last (under DualPipeV rank 0 holds both)."""
    is_first, is_last = index == 0, index == pp - 1
    if any_(c.schedule == DUALPIPEV):  # the first and the last stage on rank 0 (two stages per rank in a V)
        is_last = where(c.schedule == DUALPIPEV, is_first, is_last)
    return is_first, is_last


def _stage_rows(model: ModelSpec, c: Candidates, sw: Software, piped: bool) -> tuple[np.ndarray, np.ndarray]:
    """The first, fullest and last stage of each layout as rows (stages, layouts): their indices
    and layers (one row, the first, when no layout pipelines: ``piped`` False)."""
    first, fullest, last = stage_layers(model, c, sw)
    pp = c.pp
    if piped:
        return np.stack([np.zeros_like(pp), minimum(1, pp - 1), pp - 1]), np.stack([first, fullest, last])
    return np.zeros_like(pp)[None], first[None]


def zero3_live_params(model: ModelSpec, c: Candidates, sw: Software, block: np.ndarray) -> np.ndarray:
    """Parameter elements ZeRO-3 holds gathered at once, per GPU: ``gather_layers`` wrapped blocks
    (the block in use and the prefetched one), or under the stack's ``gather_cap_params`` at most
    that many, never less than the largest single module, which is gathered whole. DeepSpeed
    (runtime/zero/partitioned_param_coordinator.py, fetch_sub_module, commit 03aecee): each leaf
    module's parameters are gathered when it runs, released after it unless reused within
    stage3_max_reuse_distance, and prefetch stops at stage3_max_live_parameters elements in
    flight (runtime/zero/config.py: default 1e9). The largest module: one projection of the
    attention or one matrix of the MLP (Hugging Face's separate projections), split by TP."""
    live = sw.stack.gather_layers * block
    if not sw.stack.gather_cap_params:
        return live
    h = model.hidden
    q, _, _, out = model.attention_widths(True)  # the full-attention layers' where theirs differ (Gemma 4: wider)
    largest = max(h * q, h * out, h * model.q_width, h * model.attn_out_width, h * model.ffn_hidden) / c.tp
    return minimum(live, maximum(sw.stack.gather_cap_params, largest))


def layer_activations_and_working(model: ModelSpec, c: Candidates, job: Job,
                                  sw: Software) -> tuple[np.ndarray, np.ndarray]:
    """What one layer keeps for its backward per micro-batch per GPU (``layer_activation_bytes``),
    and what the layer being run backward holds beside all that is kept (the working set): the
    tensors its backward reads that recompute did not keep (the layer's activations without
    recompute less those kept: computed beside them, recompute as two rows) and its MLP's
    gradients (``backward_working``). Measured in eager torch: benchmarks/activation_memory.py."""
    share = recomputed_layers(c.recompute)  # of the layers recomputed whole
    recomputed = (share > 0) | ((c.recompute == 1) & (sw.stack.selective == "op"))
    if type(recomputed) is not np.ndarray:  # one layout (Candidates.one_row): the two as scalars
        act_layer = layer_activation_bytes(model, c, job, sw=sw)
        no_rc = layer_activation_bytes(model, c, job, 0, sw=sw) if recomputed else 0.0
    elif any_(recomputed):
        act_layer, no_rc = layer_activation_bytes(model, c, job, np.stack([c.recompute, np.zeros_like(c.recompute)]),
                                                  sw=sw)
    else:
        act_layer, no_rc = layer_activation_bytes(model, c, job, sw=sw), 0.0
    # A layer recomputed whole holds its activations again less its input; with a share s of the
    # layers so (half, quarter), the kept mean (act_layer) is s of the way from all to the input:
    # the difference over s.
    again = (no_rc - act_layer) / where(share > 0, share, 1.0)
    return act_layer, where(recomputed, again, 0.0) + backward_working(model, c, job, sw)


def backward_working(model: ModelSpec, c: Candidates, job: Job, sw: Software) -> np.ndarray:
    """The activation gradients a layer's backward holds at its peak, per GPU, beside what the
    layer kept: the gradient arriving at the layer's output (split by TP under sequence parallel),
    and in the MLP's backward the gradient of its inner tensor plus, for a gated MLP, those of the
    gate and up outputs, less the inner tensor freed once the down projection's weight gradient is
    done: e*(h + 2f) per token gated (SwiGLU), e*(h + f) otherwise, f split by TP. Measured in
    eager torch (benchmarks/activation_memory.py); under torch.compile the working set is the
    compiler's schedule (measured on the CPU: less without recompute, more with full recompute,
    docs/validation.md), counted here as eager's. An MoE layer's MLP is its routed width per token
    (planner.core.moe.moe_mlp_width)."""
    e = ACT_BYTES[job.precision]
    width = c.full(model.ffn_hidden) if model.layers > model.moe_layers else c.full(0.0)
    if model.moe:
        from planner.core import moe

        width = maximum(width, moe.moe_mlp_width(model, job, c))
    inner = 2.0 if model.gated_mlp else 1.0
    arriving = where(c.sequence_parallel, model.hidden / c.tp, model.hidden)
    return e * (arriving + inner * width / c.tp) * c.micro_batch * model.seq_len / c.cp


def attention_kv_width(model: ModelSpec, sw: Software) -> float:
    """Width of K (and of V, their mean) as attention reads them, so as its backward keeps them and
    context parallel exchanges them: at the K/V heads, or repeated to the query heads before
    attention (the stack's ``attention_kv_heads`` = "query", torchtitan's ``repeat_kv`` until
    January 2026): heads * (qk + v head widths) / 2, which is ``hidden`` for standard attention."""
    if sw.stack.attention_kv_heads == "query":
        return (model.q_width + model.attn_out_width) / 2
    return model.kv_hidden


def context_parallel_working(model: ModelSpec, c: Candidates, job: Job, sw: Software) -> np.ndarray:
    """What one layer's context-parallel attention holds at once, per GPU (transient, the layer
    being run backward). torch (``_templated_ring_attention_backward``): the all-gathered K/V of
    the whole sequence at the exchanged width (planner.core.steptime.context_parallel_exchange),
    dQ, dK, dV accumulated in ``cp_grad_bytes`` and dK/dV concatenated for the send and received
    (4 more local tensors). gather: the gathered K/V and their gradient, both whole-sequence."""
    st, e = sw.stack, ACT_BYTES[job.precision]
    if model.index_topk:  # the gathered latent and indexer keys of the whole sequence, and their gradients
        width = model.kv_cache_width + model.index_head_dim
        return where(c.cp > 1, 2 * e * c.micro_batch * model.seq_len * width, 0.0)
    width = attention_kv_width(model, sw)
    local = c.micro_batch * model.seq_len / c.cp / c.tp  # this GPU's tokens, per TP rank's heads
    gathered = 2 * e * local * c.cp * width
    # dQ (query width), dK and dV (exchanged width), fp32, and their copies for the send and receive
    grads = model.q_width + 2 * width + 4 * width
    extra = where(st.cp_exchange == "torch", st.cp_grad_bytes * local * grads, gathered)
    working = gathered + extra
    if model.linear_layers:
        # A linear-attention layer under Megatron-Core's all-to-all: its input projection's output
        # (2 key + 2 value widths + 2 per value head) twice beside what the layer keeps, the copy
        # permuted for the exchange and the exchange's output before its load balancing is undone.
        projected = 2 * e * local * model.linear_projection_width
        working = maximum(working if model.softmax_share else 0.0, projected)
    return where(c.cp > 1, working, 0.0)


def stage_params(model: ModelSpec, pp: np.ndarray, layers: np.ndarray, is_first, is_last) -> np.ndarray:
    """Parameters of a pipeline stage: its layers, the embedding on the first, the final norm and
    the head on the last (a tied head is a copy there when pp > 1); and the multi-token-prediction
    modules on the last, with a copy of the token embedding there when it is not the first
    (Megatron-Core builds the embedding where the modules are: they look the next tokens up)."""
    n = counts(model)
    head = n.head_params if not model.tied_embeddings else where(pp > 1, model.vocab * model.hidden, 0)
    out = (layers * n.layer_params + where(is_first, n.embedding_params, 0)
           + where(is_last, n.norm_params + head, 0))
    if model.mtp_layers:
        out = out + where(is_last, model.mtp_params, 0)
        if not model.tied_embeddings:  # (a tied one is there already: the head)
            out = out + where(is_last & not_(is_first), model.vocab * model.hidden, 0)
    return out


def allocated_bytes(m: Memory) -> np.ndarray:
    """What torch.cuda.max_memory_allocated counts at the peak: the tensors (weights, gradients,
    optimizer states, activations and the ZeRO-3 gather buffers), not the rest of ``other``: the
    memory outside the allocator (``outside_allocator``) and the allocator's fragmentation."""
    return m.weights + m.gradients + m.optimizer + m.activations + m.gathered


def outside_allocator(hw: HardwareProfile, c: Candidates) -> np.ndarray:
    """Memory torch's caching allocator does not count (max_memory_reserved leaves it out): the
    CUDA context with its library workspaces, and NCCL's buffers when any group has > 1 rank."""
    distributed = c.gpus > 1
    return hw.efficiency.cuda_context_bytes + where(distributed, hw.efficiency.comm_buffer_bytes, 0.0)
