"""Megatron-LM's model-shape arguments for a ModelSpec: the dense shape, the attention variants
and mixture-of-experts. Flag names are Megatron-LM's (megatron/training/arguments.py, and the
flags it derives from TransformerConfig / MLATransformerConfig fields, "--" + the field name with
dashes: megatron/core/transformer/transformer_config.py). What Megatron cannot express is
``rules.megatron_checks``; the parallel, batch and optimizer groups are render.megatron_args.
"""

from __future__ import annotations


def megatron_model_args(m, attention: str) -> list:
    """--num-layers ... for ``m``: shape, LLaMA-style blocks, attention variants, MoE."""
    out = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--num-attention-heads", m.heads,
           "--ffn-hidden-size", m.ffn_hidden, "--seq-length", m.seq_len, "--max-position-embeddings", m.seq_len,
           "--attention-backend", "flash" if attention == "flash" else "unfused"]
    if m.kv_heads != m.heads and not getattr(m, "mla", False):
        out += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    if m.arch == "llama":
        out += ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                "--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
        if not getattr(m, "expert_bias", False):  # else Megatron's default: every linear layer biased (gpt-oss)
            out.append("--disable-bias-linear")  # an output projection's bias alone has no flag (render's comment)
    if not m.tied_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    if getattr(m, "mtp_layers", 0):  # multi-token prediction (TransformerConfig.mtp_num_layers), on the last stage
        out += ["--mtp-num-layers", m.mtp_layers]
    return out + attention_args(m) + moe_args(m)


def attention_args(m) -> list:
    """Per-head width (kv_channels), q/k/v biases, per-head QK layernorm, sink logits, multi-head
    latent attention (DeepSeek-V2 Sec. 2.1: Megatron's qk_head_dim is the non-RoPE part,
    qk_pos_emb_head_dim the RoPE part; no --q-lora-rank means q is not compressed); sliding windows."""
    out: list = []
    if getattr(m, "mla", False):
        out.append("--multi-latent-attention")
        if m.q_lora_rank:
            out += ["--q-lora-rank", m.q_lora_rank]
        return out + ["--kv-lora-rank", m.kv_lora_rank, "--qk-head-dim", m.qk_nope_dim,
                      "--qk-pos-emb-head-dim", m.qk_rope_dim, "--v-head-dim", m.v_head_dim] + window_args(m) + dsa_args(m)
    head_dim = getattr(m, "head_dim", None)
    if head_dim and head_dim != m.hidden // m.heads:
        out += ["--kv-channels", head_dim]
    if getattr(m, "qkv_bias", False) and m.arch == "llama":
        out.append("--add-qkv-bias")
    if getattr(m, "qk_norm", "none") == "head":
        out.append("--qk-layernorm")
    if getattr(m, "attention_sinks", False):
        out += ["--softmax-type", "learnable"]  # a learned offset per head in the softmax (gpt-oss's sinks)
    if getattr(m, "output_gate", False):
        out.append("--attention-output-gate")  # q's projection twice as wide: the query and a sigmoid gate
    return out + window_args(m) + linear_args(m)


def dsa_args(m) -> list:
    """DeepSeek sparse attention (Megatron-Core's experimental attention variant ``dsa``, flags from
    TransformerConfig's dsa_* fields): the indexer's heads, width and top-k, its sparse KL loss
    (the sparse stage of DeepSeek-V3.2's training) at Megatron-Bridge's GLM-5 coefficient 0.001,
    and the cuDNN backend (FlashMLA's sparse kernel) the planner times."""
    if not getattr(m, "index_topk", 0):
        return []
    return ["--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", m.index_heads,
            "--dsa-indexer-head-dim", m.index_head_dim, "--dsa-indexer-topk", m.index_topk,
            "--dsa-indexer-loss-coeff", "0.001", "--dsa-indexer-use-sparse-loss", "--dsa-kernel-backend", "cudnn"]


def linear_args(m) -> list:
    """Gated DeltaNet layers (Megatron-Core's experimental attention variant, Qwen3-Next): every N-th
    layer softmax attention, the N - 1 before it linear (--linear-attention-freq N), and the linear
    layers' heads, widths and convolution. Another count of softmax layers is ``rules.megatron_checks``'."""
    every = linear_freq(m.layers, getattr(m, "linear_layers", 0) or 0)
    if not every:
        return []
    return ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", every,
            "--linear-conv-kernel-dim", m.linear_conv, "--linear-key-head-dim", m.linear_key_dim,
            "--linear-value-head-dim", m.linear_value_dim, "--linear-num-key-heads", m.linear_key_heads,
            "--linear-num-value-heads", m.linear_value_heads]


def linear_freq(layers: int, linear: int) -> int:
    """Megatron's --linear-attention-freq N for ``linear`` linear layers of ``layers``: every N-th
    layer softmax attention; 0 when there are none or their count is no such pattern."""
    return layers // (layers - linear) if linear and not layers % (layers - linear) else 0


def window_args(m) -> list:
    """Sliding-window attention: --window-size "w,0" (w keys back, none ahead), and where some
    layers attend to the whole context, --window-attn-skip-freq N: every N-th layer full (Gemma 2:
    2, Gemma 3: 6). Another count of full layers is ``rules.megatron_checks``'."""
    windowed = getattr(m, "window_layers", 0) or 0
    if not windowed:
        return []
    out = ["--window-size", f"{m.window},0"]
    every = skip_freq(m.layers, windowed)
    return out + (["--window-attn-skip-freq", every] if every else [])


def skip_freq(layers: int, windowed: int) -> int:
    """N such that every N-th of ``layers`` layers is full and the rest windowed (Megatron's
    --window-attn-skip-freq); 0 when all are windowed or no N gives ``windowed``."""
    full = layers - windowed
    if not full:
        return 0
    n = layers // full
    return n if n > 1 and layers // n == full else 0


def moe_args(m) -> list:
    """Megatron-Core's MoE flags: routed experts, top-k, expert FFN width, all-to-all dispatch,
    grouped GEMM; shared experts as one wider FFN (optionally gated); leading dense layers as a
    --moe-layer-freq pattern; DeepSeek-V3's routing bias (aux-loss-free balancing, which Megatron
    runs with sigmoid scores only); a capacity factor drops tokens, none is dropless."""
    experts = getattr(m, "experts", 0) or 0
    if not experts:
        return []
    out = ["--num-experts", experts, "--moe-router-topk", m.top_k, "--moe-ffn-hidden-size", m.expert_ffn,
           "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
    if getattr(m, "shared_experts", 0):
        out += ["--moe-shared-expert-intermediate-size", m.shared_experts * m.expert_ffn]
        if getattr(m, "shared_expert_gate", False):
            out.append("--moe-shared-expert-gate")
    dense, every = getattr(m, "dense_layers", 0), getattr(m, "moe_every", 1)
    if every > 1:  # 0 = dense layer, 1 = MoE layer (a Python list expression Megatron evaluates): after the
        # leading dense layers, the last of each run of `every` (Llama 4 Maverick: 0, 1, 0, 1, ...)
        runs, rest = divmod(m.layers - dense, every)
        out += ["--moe-layer-freq", f"([0]*{dense}+([0]*{every - 1}+[1])*{runs}+[0]*{rest})"]
    elif dense:
        out += ["--moe-layer-freq", f"([0]*{dense}+[1]*{m.layers - dense})"]
    if getattr(m, "router_bias", False):  # DeepSeek-V3 (Sec. 2.1.2): bias updated at 1e-3 (Megatron's default
        # --moe-router-bias-update-rate), plus a sequence-wise balance loss of weight 1e-4 (Sec. 4.2)
        out += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", 1e-4]
    else:  # the load-balancing loss of Switch Transformer (Fedus et al. 2022, Sec. 2.2: alpha = 1e-2); Megatron's
        # default coefficient is 0, no balancing
        out += ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", 1e-2]
    if getattr(m, "groups_per_token", 1) < getattr(m, "expert_groups", 1):  # group-limited routing (DeepSeek-V2/V3)
        out += ["--moe-router-num-groups", m.expert_groups, "--moe-router-group-topk", m.groups_per_token]
    if getattr(m, "capacity_factor", 0):
        out += ["--moe-expert-capacity-factor", m.capacity_factor, "--moe-token-drop-policy", "probs"]
    return out


def megatron_pipeline_layout(layers: int, pp: int, vpp: int = 1, mtp: int = 0) -> str:
    """--pipeline-model-parallel-layout (Megatron-Core, June 2025 on): the planner's split of layers
    into pp x vpp stages (planner.core.pipeline.stage_layer_counts), stages in virtual-stage order
    (stage k on rank k % pp, as Megatron reads the list) separated by "|", "E" the embedding on the
    first, "t" a transformer layer ("t*n": n of them), "m" a multi-token-prediction layer (``mtp`` of
    them, before the loss), "L" the loss on the last."""
    from planner.core.pipeline import stage_layer_counts

    counts = stage_layer_counts(layers, pp * vpp)
    last = ("m" * mtp) + "L"
    stages = [("E" if k == 0 else "") + (f"t*{n}" if n > 1 else "t") + (last if k == len(counts) - 1 else "")
              for k, n in enumerate(counts)]
    return "|".join(stages)


def block_recomputed_layers(layers: int, pp: int, vpp: int, every: int) -> int:
    """--recompute-num-layers for recompute half (every 2) or quarter (every 4) under
    --recompute-method block (Megatron-Core recomputes the first N layers of each virtual stage
    whole): that share of the fullest virtual stage's layers, rounded up
    (planner.core.pipeline.stage_layer_counts)."""
    from planner.core.pipeline import stage_layer_counts

    return -(-max(stage_layer_counts(layers, pp * vpp)) // every)


def block_recompute_note(layers: int, pp: int, vpp: int, every: int) -> str:
    """What --recompute-method block with ``block_recomputed_layers`` recomputes where a virtual
    stage has fewer layers than the fullest: the same N, so a larger share than the plan's 1/every
    (more time, less memory than planned); '' when every stage recomputes 1/every of its layers."""
    from planner.core.pipeline import stage_layer_counts

    n = block_recomputed_layers(layers, pp, vpp, every)
    counts = stage_layer_counts(layers, pp * vpp)
    least = min(counts)
    most = max(counts)
    if min(n, least) * every == least and n * every == most:
        return ""
    which = (f"{n} of each virtual stage's {most} layers" if least == most
             else f"{min(n, least)} of the smallest virtual stage's {least} layers and {n} of the fullest's {most}")
    return (f"--recompute-num-layers {n} recomputes {which}, not 1/{every} as planned: more time and less memory "
            "than the estimate")
