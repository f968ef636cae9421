"""How it runs: the parallel layout and the training job, plus the candidate arrays of a search.

Rank order (Megatron-LM's): tensor parallel innermost, then data parallel, then pipeline
parallel outermost. So a TP group is contiguous ranks (inside a node when tp <= gpus_per_node),
a DP group is strided by tp, and pipeline neighbours are tp*dp ranks apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from planner.core.model import ModelSpec
from planner.errors import require
from planner.hardware import PRECISIONS

RECOMPUTE = ("none", "selective", "full")
MODES = ("pretrain", "full-finetune", "lora")
# LoRA target modules (Hu et al. 2021), named as in LLaMA/PEFT; for gpt, up_proj/down_proj are the
# MLP's fc1/fc2 and gate_proj does not exist.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FINETUNE_DEFAULT_TOKENS = 1e9  # fine-tuning has no Chinchilla rule: an assumption, stated in the output
ATTENTION = ("flash", "standard")
KERNELS = ("fused", "eager")  # element-wise kernels: fused (Megatron-LM, TE) or one PyTorch op at a time
SCHEDULES = ("1f1b", "gpipe")  # 1f1b with vpp > 1 is interleaved 1F1B
TARGET_BATCH_TOKENS = 4 * 2**20  # the default global batch: about 4M tokens (LLaMA, Llama 2)
# Fine-tuning batches are far smaller (Llama 2 SFT: 64 sequences of 4096): about 256K tokens.
FINETUNE_BATCH_TOKENS = 2**18
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One parallel layout. ``global_batch`` is in sequences."""

    dp: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    micro_batch: int = 1
    global_batch: int
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "vpp", "micro_batch", "global_batch"):
            value = getattr(self, f)
            require(isinstance(value, (int, np.integer)) and value >= 1, f, value, "a positive integer")
        require(self.zero_stage in (0, 1, 2, 3), "zero_stage", self.zero_stage, "0, 1, 2 or 3")
        require(self.recompute in RECOMPUTE, "recompute", self.recompute, f"one of {', '.join(RECOMPUTE)}")
        require(self.schedule in SCHEDULES, "schedule", self.schedule, f"one of {', '.join(SCHEDULES)}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def grad_accum(self) -> int:
        """Micro-batches per pipeline per step (m)."""
        return self.global_batch // (self.dp * self.micro_batch)

    def replace(self, **changes: object) -> "Layout":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """The training job: how much, in what precision, at what price."""

    tokens: float | None = None  # None: 20 tokens per parameter (Chinchilla)
    global_batch: int | None = None  # sequences; None: about 4M tokens per step
    precision: str = "bf16"
    attention: str = "flash"
    overlap_grad_reduce: bool = True  # DP gradient reduction overlapped with backward (DDP/FSDP do)
    price_usd_per_gpu_hour: float | None = None  # None: the hardware profile's figure
    pue: float = 1.2  # power usage effectiveness of the data centre
    mode: str = "pretrain"  # pretrain | full-finetune | lora
    lora_r: int = 8  # the seed article's LoRA config: r=8, alpha=16, q_proj and v_proj
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    packing_efficiency: float = 1.0  # real tokens / sequence positions (1.0: documents packed, no padding)
    kernels: str = "fused"  # element-wise kernels: fused (Megatron-LM) or eager (the reference trainer)
    # The software stack (a name in stacks/ or a stack file): its kernels, overlaps, sharding
    # granularity and overheads (planner/stacks.py). torch.compile where the stack has it.
    stack: str = "fsdp2"
    compile: bool = False

    def __post_init__(self) -> None:
        require(self.precision in PRECISIONS, "precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        require(self.attention in ATTENTION, "attention", self.attention, f"one of {', '.join(ATTENTION)}")
        require(self.kernels in KERNELS, "kernels", self.kernels, f"one of {', '.join(KERNELS)}")
        require(self.tokens is None or self.tokens > 0, "tokens", self.tokens, "greater than zero")
        require(self.global_batch is None or self.global_batch >= 1, "global_batch", self.global_batch,
                "a positive integer (sequences)")
        require(self.price_usd_per_gpu_hour is None or self.price_usd_per_gpu_hour >= 0,
                "price_per_gpu_hour", self.price_usd_per_gpu_hour, "zero or more (USD)")
        require(1.0 <= self.pue <= 3.0, "pue", self.pue, "between 1.0 and 3.0")
        require(self.mode in MODES, "mode", self.mode, f"one of {', '.join(MODES)}")
        require(0 < self.packing_efficiency <= 1, "packing_efficiency", self.packing_efficiency,
                "in (0, 1]: the share of sequence positions holding real tokens")
        if self.mode == "lora":
            require(isinstance(self.lora_r, int) and self.lora_r >= 1, "lora_r", self.lora_r, "a positive integer")
            require(self.lora_alpha > 0, "lora_alpha", self.lora_alpha, "greater than zero")
            require(len(self.lora_targets) > 0, "lora_targets", "", f"one or more of {', '.join(LORA_TARGETS)}")
            for t in self.lora_targets:
                require(t in LORA_TARGETS, "lora_targets", t, f"each one of {', '.join(LORA_TARGETS)}")

    @property
    def lora(self) -> bool:
        return self.mode == "lora"

    @property
    def batch_tokens_target(self) -> int:
        """The default global batch in tokens when ``global_batch`` is not given."""
        return TARGET_BATCH_TOKENS if self.mode == "pretrain" else FINETUNE_BATCH_TOKENS

    def train_tokens(self, model: ModelSpec) -> float:
        if self.tokens is not None:
            return self.tokens
        return CHINCHILLA_TOKENS_PER_PARAM * model.params if self.mode == "pretrain" else FINETUNE_DEFAULT_TOKENS

    def replace(self, **changes: object) -> "Job":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidates:
    """Layouts as columns (numpy arrays of equal length): what the vectorised model evaluates.

    recompute: 0 none, 1 selective, 2 full. schedule: 0 1f1b, 1 gpipe. sequence_parallel: bool.
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    schedule: np.ndarray

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    @property
    def m(self) -> np.ndarray:
        """Micro-batches per pipeline per step."""
        return self.global_batch // (self.dp * self.micro_batch)

    def take(self, index: np.ndarray) -> "Candidates":
        return Candidates(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})

    def layout(self, i: int) -> Layout:
        return Layout(dp=int(self.dp[i]), tp=int(self.tp[i]), pp=int(self.pp[i]), vpp=int(self.vpp[i]),
                      micro_batch=int(self.micro_batch[i]), global_batch=int(self.global_batch[i]),
                      zero_stage=int(self.zero_stage[i]), recompute=RECOMPUTE[int(self.recompute[i])],
                      sequence_parallel=bool(self.sequence_parallel[i]),
                      schedule=SCHEDULES[int(self.schedule[i])])

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> "Candidates":
        col = lambda f: np.array([f(x) for x in layouts], dtype=np.int64)  # noqa: E731
        return cls(dp=col(lambda x: x.dp), tp=col(lambda x: x.tp), pp=col(lambda x: x.pp),
                   vpp=col(lambda x: x.vpp), micro_batch=col(lambda x: x.micro_batch),
                   global_batch=col(lambda x: x.global_batch), zero_stage=col(lambda x: x.zero_stage),
                   recompute=col(lambda x: RECOMPUTE.index(x.recompute)),
                   sequence_parallel=np.array([x.sequence_parallel for x in layouts], dtype=bool),
                   schedule=col(lambda x: SCHEDULES.index(x.schedule)))


def default_global_batch(model: ModelSpec, dp_mb: np.ndarray | int,
                         target_tokens: int = TARGET_BATCH_TOKENS) -> np.ndarray:
    """About ``target_tokens`` per step, rounded to a multiple of dp*micro_batch (at least one)."""
    per_seq = target_tokens / model.seq_len
    return np.maximum(1, np.rint(per_seq / dp_mb)).astype(np.int64) * dp_mb
