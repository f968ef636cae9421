"""Fine-tuning: which parameters train. Full fine-tuning trains all of them, like pre-training;
LoRA (Hu et al. 2021) freezes the model and trains a rank-r update B @ A beside each target
matrix: r * (d_in + d_out) parameters per target per layer.
"""

from __future__ import annotations

from planner.core.layout import Job
from planner.core.model import ModelSpec
from planner.errors import require


def target_shapes(model: ModelSpec, full: bool = False) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each LoRA-targetable matrix of one layer; with ``full``, of a full-attention
    layer with its own shape (``global_*``: Gemma 4's, without v_proj where K is used as V)."""
    h, f = model.hidden, model.ffn_hidden
    # the attention projections at the heads' widths (h, h_kv, h_kv, h for standard attention;
    # Qwen3's 32 heads x 128 on a 2048 residual stream make q_proj 2048 x 4096)
    # (a gated attention output doubles q_proj: the query and the gate, Qwen3-Next's and Qwen3.5's)
    q_width, k_width, v_width, out_width = model.attention_widths(full)
    q = q_width * (2 if model.output_gate else 1)
    shapes = {"q_proj": (h, q), "k_proj": (h, k_width), "v_proj": (h, v_width), "o_proj": (out_width, h),
              "up_proj": (h, f), "down_proj": (f, h)}
    if full and model.global_k_eq_v:
        del shapes["v_proj"]
    if model.gated_mlp:
        shapes["gate_proj"] = (h, f)
    return shapes


def lora_params_per_layer(model: ModelSpec, job: Job) -> float:
    """Adapter parameters per layer: a linear-attention layer (Gated DeltaNet) has no q, k, v or o
    projection to adapt, only its MLP's; a full-attention layer of its own shape (Gemma 4) its own;
    the mean over layers where the layers differ."""
    attention, mlp = _lora_params(model, job)
    if model.global_layers:
        full = model.global_layers
        return ((model.layers - full) * attention + full * _lora_params(model, job, True)[0]) / model.layers + mlp
    if not model.linear_layers:
        return attention + mlp
    return attention * model.softmax_share + mlp


def _lora_params(model: ModelSpec, job: Job, full: bool = False) -> tuple[int, int]:
    """(attention's, the MLP's) adapter parameters in a softmax-attention layer (``full``: a
    full-attention layer of its own shape)."""
    shapes = target_shapes(model, full)
    attention = mlp = 0
    for name in job.lora_targets:
        if full and name == "v_proj" and model.global_k_eq_v:
            continue  # K used as V: the layer has no v_proj to adapt
        require(name in shapes, "lora_targets", name, f"{model.arch} layers have {', '.join(shapes)}")
        d_in, d_out = shapes[name]
        require(job.lora_r <= min(d_in, d_out), "lora_r", job.lora_r,
                f"at most the smaller side of {name} ({min(d_in, d_out)}); a rank above it adds nothing")
        if name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            attention += job.lora_r * (d_in + d_out)
        else:
            mlp += job.lora_r * (d_in + d_out)
    return attention, mlp


def trainable_params(model: ModelSpec, job: Job) -> int:
    """Parameters that receive gradients and optimizer states (the multi-token-prediction modules'
    too: they train beside the model)."""
    if job.mode != "lora":
        return model.params + model.mtp_params
    attention, mlp = _lora_params(model, job)
    full = model.global_layers
    full_attention = _lora_params(model, job, True)[0] if full else 0
    return (model.layers - model.linear_layers - full) * attention + full * full_attention + model.layers * mlp


def lora_forward_flops_per_token(model: ModelSpec, job: Job) -> float:
    """x @ A then @ B: 2 * r * (d_in + d_out) per target per layer."""
    return 2.0 * trainable_params(model, job) if job.mode == "lora" else 0.0
