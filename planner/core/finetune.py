"""Fine-tuning: which parameters train. Full fine-tuning trains all of them, like pre-training;
LoRA (Hu et al. 2021) freezes the model and trains a rank-r update B @ A beside each target
matrix: r * (d_in + d_out) parameters per target per layer.
"""

from __future__ import annotations

from planner.core.layout import Job
from planner.core.model import ModelSpec
from planner.errors import require


def target_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each LoRA-targetable matrix of one layer."""
    h, f = model.hidden, model.ffn_hidden
    # the attention projections at the heads' widths (h, h_kv, h_kv, h for standard attention;
    # Qwen3's 32 heads x 128 on a 2048 residual stream make q_proj 2048 x 4096)
    # (a gated attention output doubles q_proj: the query and the gate, Qwen3-Next's and Qwen3.5's)
    q = model.q_width * (2 if model.output_gate else 1)
    shapes = {"q_proj": (h, q), "k_proj": (h, model.k_width), "v_proj": (h, model.v_width),
              "o_proj": (model.attn_out_width, h),
              "up_proj": (h, f), "down_proj": (f, h)}
    if model.gated_mlp:
        shapes["gate_proj"] = (h, f)
    return shapes


def lora_params_per_layer(model: ModelSpec, job: Job) -> float:
    """Adapter parameters per layer: a linear-attention layer (Gated DeltaNet) has no q, k, v or o
    projection to adapt, only its MLP's; the mean over layers where some are linear."""
    attention, mlp = _lora_params(model, job)
    if not model.linear_layers:
        return attention + mlp
    return attention * model.softmax_share + mlp


def _lora_params(model: ModelSpec, job: Job) -> tuple[int, int]:
    """(attention's, the MLP's) adapter parameters in a softmax-attention layer."""
    shapes = target_shapes(model)
    attention = mlp = 0
    for name in job.lora_targets:
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
    """Parameters that receive gradients and optimizer states."""
    if job.mode != "lora":
        return model.params
    attention, mlp = _lora_params(model, job)
    return (model.layers - model.linear_layers) * attention + model.layers * mlp


def lora_forward_flops_per_token(model: ModelSpec, job: Job) -> float:
    """x @ A then @ B: 2 * r * (d_in + d_out) per target per layer."""
    return 2.0 * trainable_params(model, job) if job.mode == "lora" else 0.0
