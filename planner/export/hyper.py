"""Optimizer hyperparameters an export writes, by training mode, each with its source.

Pretraining follows Llama 2 (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat
Models", Sec. 2.2 and Table 1): AdamW with beta1 0.9, beta2 0.95, eps 1e-5; a cosine schedule with
2000 warm-up steps, decaying to 10% of the peak; weight decay 0.1; gradient clipping 1.0; peak rate
3.0e-4 for the 7B and 13B models, 1.5e-4 for 34B and 70B.
Fine-tuning (full or LoRA) keeps the trainer's defaults: peak rate 6e-5 (GPT-3 175B's, Brown et al.
2020, Table 2.1), torch.optim.AdamW's betas (0.9, 0.999) and eps 1e-8, weight decay 0.01, a short
warm-up (3% of the steps, as Hugging Face fine-tuning recipes commonly set), decay to 10%.
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA2_WARMUP_STEPS = 2000  # Touvron et al. 2023, Sec. 2.2
LLAMA2_LARGE_PARAMS = 20e9  # Table 1: 7B/13B at 3.0e-4, 34B/70B at 1.5e-4; the split between them


@dataclass(frozen=True, kw_only=True, slots=True)
class Hyper:
    lr: float
    min_lr_ratio: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_steps: int
    grad_clip: float
    source: str


def hyperparameters(mode: str, params: float, steps: int) -> Hyper:
    """AdamW settings for ``mode`` (pretrain, full-finetune, lora), a model of ``params`` parameters
    and a run of ``steps`` steps. The warm-up never exceeds a tenth of the run."""
    if mode == "pretrain":
        lr = 3.0e-4 if params < LLAMA2_LARGE_PARAMS else 1.5e-4
        return Hyper(lr=lr, min_lr_ratio=0.1, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1,
                     warmup_steps=min(LLAMA2_WARMUP_STEPS, steps // 10), grad_clip=1.0,
                     source="pretraining: Llama 2 (Touvron et al. 2023, Sec. 2.2, Table 1)")
    return Hyper(lr=6e-5, min_lr_ratio=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 warmup_steps=max(1, round(0.03 * steps)) if steps > 1 else 0, grad_clip=1.0,
                 source=f"{mode}: lr 6e-5 (GPT-3 175B, Brown et al. 2020, Table 2.1), torch AdamW betas/eps, "
                        "3% warm-up")
