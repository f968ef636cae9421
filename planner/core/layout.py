"""How it runs: the parallel layout and the training job, plus the candidate arrays of a search.

Rank order (Megatron-LM's): tensor parallel innermost, then data parallel, then pipeline
parallel outermost. So a TP group is contiguous ranks (inside a node when tp <= gpus_per_node),
a DP group is strided by tp, and pipeline neighbours are tp*dp ranks apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.core.columns import maximum, minimum, where
from planner.core.model import ModelSpec
from planner.errors import PlannerError, require
from planner.hardware import PRECISIONS
from planner.memo import dict_of_slots, fast_init, kept_hash, slot_filler
from planner.schema import MAX_TOKENS
from planner.stacks import DEFAULT_STACK

# Activation recompute: none; selective (the stack's policy: the attention core, or torchtitan's
# op-level one); full (every layer's forward again); half and quarter (every second or fourth
# layer's forward again, the others keep everything: torchtitan's selective layer checkpointing,
# selective_ac_option = "2" or "4"; Megatron-LM's --recompute-method block on that share of each
# virtual stage's layers).
RECOMPUTE = ("none", "selective", "full", "half", "quarter")
PARTIAL = RECOMPUTE.index("half")  # from this code on: a share of the layers recomputed whole
# Every how many layers one is recomputed whole, for the choices that recompute whole layers.
RECOMPUTE_EVERY = {"full": 1, "half": 2, "quarter": 4}
PARTIAL_RECOMPUTE = tuple(r for r, every in RECOMPUTE_EVERY.items() if every > 1)  # a share of the layers
# The share of a stage's layers each choice recomputes whole, by code: the memory and the time of a
# layout of half (quarter) are those of its layers, that share kept as with full recompute and the
# rest as without.
RECOMPUTED_LAYERS = tuple(1 / RECOMPUTE_EVERY[r] if r in RECOMPUTE_EVERY else 0.0 for r in RECOMPUTE)
_RECOMPUTED_LAYERS = np.array(RECOMPUTED_LAYERS)


def recomputed_layers(recompute):
    """The share of layers recomputed whole (``RECOMPUTED_LAYERS``) of a recompute column (codes),
    or of one layout's code as a Python float."""
    if type(recompute) is int or type(recompute) is np.int64:
        return RECOMPUTED_LAYERS[recompute]
    return _RECOMPUTED_LAYERS.take(recompute)


MODES = ("pretrain", "full-finetune", "lora")
# LoRA target modules (Hu et al. 2021), named as in LLaMA/PEFT; for gpt, up_proj/down_proj are the
# MLP's fc1/fc2 and gate_proj does not exist.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FINETUNE_DEFAULT_TOKENS = 1e9  # fine-tuning has no Chinchilla rule: an assumption, stated in the output
ATTENTION = ("flash", "standard")
# Element-wise kernels: as the software stack runs them, fused (Megatron-LM, TE, torch.compile) or
# one PyTorch op at a time (eager).
KERNELS = ("stack", "fused", "eager")
SCHEDULES = ("1f1b", "gpipe", "dualpipev")  # 1f1b with vpp > 1 is interleaved 1F1B; dualpipev: two stages per rank in a V
GPIPE, DUALPIPEV = SCHEDULES.index("gpipe"), SCHEDULES.index("dualpipev")  # their codes in Candidates.schedule
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)  # searched when the micro-batch is free
TARGET_BATCH_TOKENS = 4 * 2**20  # the default global batch: about 4M tokens (LLaMA, Llama 2)
# Fine-tuning batches are far smaller (Llama 2 SFT: 64 sequences of 4096): about 256K tokens.
FINETUNE_BATCH_TOKENS = 2**18
MIN_TOKENS_PER_GPU = 1024  # below this per GPU per step, the default batch grows (up to 4x the target)
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022


@dataclass(frozen=True, kw_only=True, slots=True)
class Dim:
    """One dimension of the parallel layout, declared once (as a field of ``Layout``, below).

    Everything else is derived from it: the Layout field and its check, the search's column
    (``Candidates``), ``Pins``, the CLI flag (``--`` + name with dashes), JSON keys and CSV columns,
    the explorer's field and URL key, and the run record's layout. ``name`` and ``type`` come from
    the Layout field. As torchtitan derives its flags from job-config dataclasses.
    """

    help: str
    label: str  # the explorer's label
    choices: tuple = ()  # the allowed values (str and bool dimensions; ints listed when few)
    low: int = 1  # ints: the smallest allowed value
    high: int = 1 << 20  # ints: the largest the explorer offers
    pinnable: bool = True  # a user may fix it (a Pins field, a flag); global_batch is the job's
    # Values the search tries when the dimension is free, from the job and the model; None: a
    # dimension of the device mesh (dp, tp, pp, vpp, cp), enumerated together so that their
    # product is the GPU count.
    searched: Callable[["Job", ModelSpec], tuple] | None = None
    flag_aliases: tuple[str, ...] = ()  # older spellings of the flag, still accepted
    gpu_factor: bool = False  # a degree of the device mesh: the GPU count is the product of these
    name: str = ""
    type: type = int

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def argparse_spec(self) -> tuple[tuple[str, ...], dict]:
        """The flag's option strings and ``add_argument`` keywords: destination the name, default None
        (not given). The CLI's layout flags and the trainer's launcher both build theirs from it."""
        flags = (self.flag, *self.flag_aliases)
        if self.type is bool:
            return flags, {"dest": self.name, "action": argparse.BooleanOptionalAction, "default": None,
                           "help": self.help}
        if self.type is str:
            return flags, {"dest": self.name, "choices": self.choices, "help": self.help}
        return flags, {"dest": self.name, "type": int, "help": self.help}

    def check(self, value: object) -> None:
        """The dimension's own rule (rules across dimensions live in the search)."""
        if self.type is int and type(value) is int:  # the usual value: checked without building a text
            if self.low <= value <= self.high and (not self.choices or value in self.choices):
                return
        elif self.type is not int and value in self.choices:
            return
        choices = lambda: f"one of {', '.join(map(str, self.choices))}"  # the text, on failure only
        if self.type is int:  # within [low, high]: a value past high (10**30) would overflow int64 columns
            require(isinstance(value, (int, np.integer)) and not isinstance(value, bool)
                    and self.low <= value <= self.high, self.name, value,
                    (lambda: f"an integer from {self.low} to {self.high:,}") if not self.choices else choices)
        if self.choices:
            require(value in self.choices, self.name, value, choices)

    def code(self, value: object) -> int | bool:
        """One value as a column holds it (``encode``'s element, a Python int or bool)."""
        if self.type is bool:
            return bool(value)
        if self.type is str:
            return self.choices.index(value)
        return int(value)

    def encode(self, values: list) -> np.ndarray:
        """A column: ints as int64, bools as bool, strings as their index in ``choices``."""
        if self.type is bool:
            return np.array(values, dtype=bool)
        if self.type is str:
            return np.array([self.choices.index(v) for v in values], dtype=np.int64)
        return np.array(values, dtype=np.int64)

    def decode(self, code: object) -> object:
        """One value of a column as the Layout field holds it."""
        if self.type is bool:
            return bool(code)
        if self.type is str:
            return self.choices[int(code)]
        return int(code)


def _dim(default: object = dataclasses.MISSING, **spec: object):
    return dataclasses.field(default=default, metadata={"dim": Dim(**spec)})


def _searched_zero(job: "Job", model: ModelSpec) -> tuple:
    # LoRA's optimizer states and gradients are tiny: sharding them (ZeRO-1/2) buys nothing.
    return (0, 3) if job.lora else (0, 1, 2, 3)


OFFLOAD = ("none", "optimizer", "params")
SHARDING = ("full", "hybrid")


def _searched_offload(job: "Job", model: ModelSpec) -> tuple:
    # Offload trades step time for memory: searched for fine-tuning (one workstation GPU, a small
    # node), where it is what makes a full fine-tune fit; pinned (--offload) for pretraining.
    return ("none",) if job.mode == "pretrain" else OFFLOAD


def _searched_recompute(job: "Job", model: ModelSpec) -> tuple:
    # Selective recompute recomputes the attention core, which flash attention already does in
    # its backward: the two are the same layout then, so it is searched only with standard attention.
    return ("none", "full", "half", "quarter") if job.attention == "flash" else RECOMPUTE


EP_DEGREES = (1, 2, 4, 8, 16, 32, 64)  # expert-parallel degrees searched for an MoE (pinned: any)


def _searched_ep(job: "Job", model: ModelSpec) -> tuple:
    return EP_DEGREES if model.moe else (1,)


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One parallel layout. Each field is a dimension, declared here once (see ``Dim``)."""

    dp: int = _dim(help="data-parallel replicas (dp*tp*pp*cp = GPUs)", label="Data parallel", gpu_factor=True)
    tp: int = _dim(1, help="tensor-parallel ranks (divides heads and kv_heads)", label="Tensor parallel",
                   gpu_factor=True)
    pp: int = _dim(1, help="pipeline stages", label="Pipeline stages", gpu_factor=True)
    cp: int = _dim(1, help="context-parallel ranks: each sequence split across cp GPUs in 2*cp load-balanced "
                           "causal chunks, K/V exchanged per layer (seq_len divisible by 2*cp)",
                   label="Context parallel", gpu_factor=True, high=256)
    ep: int = _dim(1, help="expert-parallel ranks: each holds experts/ep of every MoE layer's routed experts, "
                           "tokens reach them by all-to-all; carved out of the dp*cp ranks (divides dp*cp and "
                           "experts), not a factor of the GPU count; 1 for dense models",
                   label="Expert parallel", high=1024, searched=_searched_ep)
    vpp: int = _dim(1, help="virtual stages per pipeline rank (interleaved 1F1B; needs pp > 1)",
                    label="Virtual stages per rank", high=128)
    micro_batch: int = _dim(1, help="sequences per micro-batch", label="Micro-batch",
                            searched=lambda job, model: MICRO_BATCHES)
    global_batch: int = _dim(help="sequences per step (--global-batch, a job option)", label="Global batch",
                             pinnable=False, high=10_000_000)  # the job option's bound (Job.global_batch)
    zero_stage: int = _dim(0, help="ZeRO stage: 0 none, 1 optimizer states, 2 + gradients, 3 + weights",
                           label="ZeRO stage", low=0, choices=(0, 1, 2, 3), searched=_searched_zero,
                           flag_aliases=("--zero",))
    recompute: str = _dim("none", help="activation recompute: none; selective (the stack's policy: the attention "
                                           "core, or torchtitan's op-level one); full (every layer); half, quarter "
                                           "(every second, fourth layer whole, the others keep all: torchtitan's "
                                           "selective layer checkpointing, Megatron-LM's --recompute-method "
                                           "block)", label="Activation recompute", choices=RECOMPUTE,
                          searched=_searched_recompute)
    sequence_parallel: bool = _dim(False, help="sequence parallel (with tp > 1)", label="Sequence parallel",
                                   choices=(False, True), searched=lambda job, model: (False, True))
    schedule: str = _dim("1f1b", help="pipeline schedule: 1f1b (interleaved when vpp > 1), gpipe, or dualpipev "
                                      "(DeepSeek's DualPipe cut in half: two stages per rank in a V, vpp 2; "
                                      "pinned only)",
                         label="Pipeline schedule", choices=SCHEDULES, searched=lambda job, model: ("1f1b",))
    sharding: str = _dim("full", help="how ZeRO shards: full (over all dp*cp ranks) or hybrid (HSDP, ZeRO++ hpZ / "
                                       "MiCS: shard over the group's ranks inside one node, replicate across "
                                       "nodes, gradients all-reduced between the replicas)",
                         label="Sharding", choices=SHARDING, searched=lambda job, model: SHARDING)
    offload: str = _dim("none", help="CPU offload: none, optimizer (AdamW states, fp32 master weights and "
                                     "gradients in host memory, the step on the CPU: ZeRO-Offload) or params "
                                     "(weights too, streamed in per layer: ZeRO-Infinity, FSDP CPU offload)",
                        label="CPU offload", choices=OFFLOAD, searched=_searched_offload)

    def __post_init__(self) -> None:
        for d in LAYOUT_DIMS:
            d.check(getattr(self, d.name))

    @property
    def gpus(self) -> int:
        return math.prod(getattr(self, d.name) for d in LAYOUT_DIMS if d.gpu_factor)

    @property
    def grad_accum(self) -> int:
        """Micro-batches per pipeline per step (m)."""
        return self.global_batch // (self.dp * self.micro_batch)

    def replace(self, **changes: object) -> "Layout":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, object]:
        """The layout's JSON form: every dimension by its name, plus grad_accum."""
        out = _LAYOUT_JSON(self)
        out["grad_accum"] = self.grad_accum
        return out


_TYPES = {"int": int, "str": str, "bool": bool}
LAYOUT_DIMS: tuple[Dim, ...] = tuple(dataclasses.replace(f.metadata["dim"], name=f.name, type=_TYPES[f.type])
                                     for f in dataclasses.fields(Layout))
PIN_DIMS: tuple[Dim, ...] = tuple(d for d in LAYOUT_DIMS if d.pinnable)  # the fields a user may fix
DIMS: dict[str, Dim] = {d.name: d for d in LAYOUT_DIMS}
GPU_FACTORS: tuple[str, ...] = tuple(d.name for d in LAYOUT_DIMS if d.gpu_factor)  # ("dp", "tp", "pp", "cp")
_LAYOUT_JSON = dict_of_slots(Layout)  # its fields by name, in LAYOUT_DIMS' order
assert tuple(Layout.__slots__) == tuple(DIMS), Layout.__slots__


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One option of the job (a field of ``Job``, below) or of operations, declared once: the CLI
    flag, the explorer's field and the default all come from here. ``name``, ``type`` and
    ``default`` come from the dataclass field."""

    help: str
    label: str = ""  # the explorer's label; empty: not in the explorer
    choices: tuple = ()
    low: float | None = None  # the explorer's bounds
    high: float | None = None
    step: float | None = None
    flag: str = ""  # default: "--" + the name with dashes
    count: bool = False  # given as a count with a suffix (1T, 2.5B; planner.units.parse_count)
    repeat: bool = False  # a list given one item per flag (``--set A --set B``); as text, items split by ``separator``
    separator: str = ","
    group: str = "job"  # the explorer's sidebar section
    name: str = ""
    type: str = ""  # the annotation: "int", "float | None", "tuple[str, ...]", ...
    default: object = None
    base_type: str = ""  # the annotation's base: "int", "float", "tuple", ... (``options_of`` sets it)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def optional(self) -> bool:
        return self.type.endswith("| None")


def _opt(default: object, **spec: object):
    return dataclasses.field(default=default, metadata={"option": Option(**spec)})


def options_of(cls: type) -> tuple[Option, ...]:
    """The options a dataclass declares with ``_opt``, with their names, types and defaults."""
    return tuple(dataclasses.replace(f.metadata["option"], name=f.name, type=str(f.type), default=f.default,
                                     base_type=str(f.type).split("|")[0].split("[")[0].strip())
                 for f in dataclasses.fields(cls) if "option" in f.metadata)


# Job.__post_init__'s texts of what is allowed, built once (a job is checked in every estimate).
_ALLOWED = {"precision": f"one of {', '.join(PRECISIONS)}", "attention": f"one of {', '.join(ATTENTION)}",
            "kernels": f"one of {', '.join(KERNELS)}", "tokens": f"from 1 to {MAX_TOKENS:g} (planner/schema.py)",
            "mode": f"one of {', '.join(MODES)}", "eval_tokens": f"from 1 to {MAX_TOKENS:g} tokens",
            "lora_targets": f"one or more of {', '.join(LORA_TARGETS)}",
            "lora_target": f"each one of {', '.join(LORA_TARGETS)}"}


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """The training job: how much, in what precision, at what price. Each field is an option,
    declared here once (see ``Option``)."""

    tokens: float | None = _opt(None, help="tokens to train, e.g. 1T (default: 20 per parameter, Chinchilla)",
                                label="Tokens to train (billions; 0: default)", low=0.0, high=1e6, step=100.0,
                                count=True)
    global_batch: int | None = _opt(None, help="sequences per step (default: about 4M tokens)",
                                    label="Global batch, sequences (0: about 4M tokens)", low=0, high=10_000_000,
                                    group="layout")
    precision: str = _opt("bf16", help="number format of the matmuls", label="Precision", choices=PRECISIONS)
    attention: str = _opt("flash", help="flash (fused, no score matrix kept) or standard", label="Attention",
                          choices=ATTENTION)
    # DP gradient reduction overlapped with backward (DDP/FSDP do)
    overlap_grad_reduce: bool = _opt(True, help="DP gradient reduction after backward, not during it",
                                     label="Overlap DP reduction with backward", flag="--no-overlap")
    price_usd_per_gpu_hour: float | None = _opt(None, help="USD (default: the profile's indicative rate)",
                                                label="Price per GPU-hour (USD; empty: the profile's)", low=0.0,
                                                high=1000.0, step=0.25, flag="--price-per-gpu-hour")
    pue: float = _opt(1.2, help="data-centre power usage effectiveness (default 1.2)", label="PUE", low=1.0,
                      high=3.0, step=0.05)
    mode: str = _opt("pretrain", help="pretrain, full-finetune, or lora (frozen model + rank-r adapters)",
                     label="Training", choices=MODES, group="finetune")
    # LoRA defaults: r=8, alpha=16 on q_proj and v_proj, as in Hu et al. 2021 (Sec. 7.1) and PEFT's examples.
    lora_r: int = _opt(8, help="LoRA rank (default 8)", label="LoRA rank r", low=1, high=4096, group="finetune")
    lora_alpha: float = _opt(16.0, help="LoRA alpha (default 16; scales, costs nothing)", label="LoRA alpha",
                             low=0.01, high=65536.0, step=1.0, group="finetune")
    lora_targets: tuple[str, ...] = _opt(("q_proj", "v_proj"), label="LoRA targets", group="finetune",
                                         help=f"comma-separated, from {','.join(LORA_TARGETS)} (default q_proj,v_proj)")
    packing_efficiency: float = _opt(1.0, help="share of sequence positions holding real tokens (default 1.0: packed)",
                                     label="Packing efficiency", low=0.01, high=1.0, step=0.05, group="operations")
    kernels: str = _opt("stack", help="element-wise kernels: stack (as the --stack runs them, default), fused "
                                      "(Megatron-LM, TE, compiled) or eager (plain PyTorch)",
                        label="Element-wise kernels", choices=KERNELS)
    # The software stack (a name in software_stacks/ or a stack file): its kernels, overlaps, sharding
    # granularity and overheads (planner/stacks.py). torch.compile where the stack has it.
    stack: str = _opt(DEFAULT_STACK, help="software stack: a name `planner stacks` lists (fsdp2, megatron-core, "
                                          "megatron-fsdp, nemo, llama3, llm-foundry, deepspeed-zero, ...; "
                                          f"docs/stacks.md) or a stack file (default {DEFAULT_STACK})",
                      label="Software stack")
    # Stack keys set for this plan, TABLE.KEY=VALUE each (planner.stacks.with_overrides): checked as a
    # stack file's keys are, printed beside the stack; a setting that differs needs no stack file.
    stack_set: tuple[str, ...] = _opt((), help="set one stack key for this plan, TABLE.KEY=VALUE as in a stack "
                                               "file, e.g. sharding.grad_reduce_bytes=2 or kernels.attention=flash2 "
                                               "(repeat the flag for more; `planner stacks --keys` lists them)",
                                      label="Stack overrides (TABLE.KEY=VALUE; separated by ;)", flag="--set",
                                      repeat=True, separator=";")
    compile: bool = _opt(False, help="torch.compile (on stacks that have it)", label="torch.compile")
    expert_imbalance: float = _opt(1.1, help="MoE load imbalance: the busiest expert-parallel rank's routed tokens "
                                             "over the mean, when ep > 1 (default 1.1: auxiliary-loss balancing)",
                                   label="MoE load imbalance (busiest / mean)", low=1.0, high=8.0, step=0.05)
    async_tp: bool = _opt(False, help="asynchronous tensor parallel: TP communication overlapped with the matmuls "
                                      "(torchtitan async TP, TE --tp-comm-overlap)", label="Async TP")
    memory_headroom: float | None = _opt(None, help="share of each GPU's memory a plan leaves free; the plan is the "
                                                    "best layout up to what remains (0: up to the profile's capacity). "
                                                    "Default: the best under the stack's safe line, the stricter of "
                                                    "0.95 of capacity and its measured memory error below capacity, "
                                                    "faster ones above it listed",
                                  label="Memory headroom (share kept free; empty: the safe line)", low=0.0, high=0.5, step=0.05)

    # Periodic evaluation (forward only, on the training layout): every so many tokens or steps, on
    # so many tokens each time; none by default (planner.core.steptime.eval_batch_time).
    eval_every: float | None = _opt(None, help="evaluate every so many trained tokens, e.g. 2B (default: never; "
                                               "with --eval-tokens)", label="Evaluate every (billion tokens; 0: never)",
                                    low=0.0, high=1e6, step=1.0, count=True, group="operations")
    eval_every_steps: int | None = _opt(None, help="evaluate every so many optimizer steps (instead of --eval-every)",
                                        label="Evaluate every (steps; 0: never)", low=0, high=10**9,
                                        group="operations")
    eval_tokens: float | None = _opt(None, help="tokens each evaluation reads, e.g. 100M (forward only)",
                                     label="Evaluation tokens each time (billions; 0: none)", low=0.0, high=1e6,
                                     step=0.01, count=True, group="operations")

    def __hash__(self) -> int:  # the dataclass's, kept: a job keys several caches in each estimate
        return kept_hash(self)

    def __post_init__(self) -> None:
        require(self.precision in PRECISIONS, "precision", self.precision, _ALLOWED["precision"])
        require(self.attention in ATTENTION, "attention", self.attention, _ALLOWED["attention"])
        require(self.kernels in KERNELS, "kernels", self.kernels, _ALLOWED["kernels"])
        require(self.tokens is None or 1 <= self.tokens <= MAX_TOKENS, "tokens", self.tokens,
                _ALLOWED["tokens"])
        require(self.global_batch is None or self.global_batch >= 1, "global_batch", self.global_batch,
                "a positive integer (sequences)")
        require(self.price_usd_per_gpu_hour is None or 0 <= self.price_usd_per_gpu_hour <= 1e4,
                "price_usd_per_gpu_hour", self.price_usd_per_gpu_hour, "from 0 to 10,000 (USD)")
        require(1.0 <= self.pue <= 3.0, "pue", self.pue, "between 1.0 and 3.0")
        require(self.mode in MODES, "mode", self.mode, _ALLOWED["mode"])
        require(1e-3 <= self.packing_efficiency <= 1, "packing_efficiency", self.packing_efficiency,
                "in [0.001, 1]: the share of sequence positions holding real tokens")
        require(self.memory_headroom is None or 0.0 <= self.memory_headroom <= 0.5, "memory_headroom", self.memory_headroom,
                "in [0, 0.5]: the share of each GPU's memory a plan leaves free")
        every = (self.eval_every is not None) + (self.eval_every_steps is not None)  # how many of the two are given
        require(every < 2, "eval_every_steps", self.eval_every_steps,
                "give --eval-every (tokens) or --eval-every-steps, not both")
        require(self.eval_every is None or 1 <= self.eval_every <= MAX_TOKENS, "eval_every", self.eval_every,
                _ALLOWED["eval_tokens"])
        require(self.eval_every_steps is None or (isinstance(self.eval_every_steps, int)
                                                   and self.eval_every_steps >= 1), "eval_every_steps",
                self.eval_every_steps, "a positive whole number of steps")
        require(self.eval_tokens is None or 1 <= self.eval_tokens <= MAX_TOKENS, "eval_tokens", self.eval_tokens,
                _ALLOWED["eval_tokens"])
        if bool(every) != (self.eval_tokens is not None):
            raise PlannerError("eval_tokens" if every else every_name(self), self.eval_tokens if every else "none",
                               "--eval-tokens and one of --eval-every, --eval-every-steps go together (how much "
                               "each evaluation reads, and how often)")
        if self.mode == "lora":
            require(isinstance(self.lora_r, int) and self.lora_r >= 1, "lora_r", self.lora_r, "a positive integer")
            require(self.lora_alpha > 0, "lora_alpha", self.lora_alpha, "greater than zero")
            require(len(self.lora_targets) > 0, "lora_targets", "", _ALLOWED["lora_targets"])
        # Checked in every mode: a job is a key of the model's caches, and a target that is no name
        # (a run record's list, say) would make it unhashable.
        for t in self.lora_targets:
            require(t in LORA_TARGETS, "lora_targets", t, _ALLOWED["lora_target"])

    @property
    def lora(self) -> bool:
        return self.mode == "lora"

    @property
    def evaluates(self) -> bool:
        return self.eval_tokens is not None

    def batch_tokens_target(self, gpus: int = 1) -> int:
        """The default global batch in tokens when ``global_batch`` is not given: about 4M tokens;
        on clusters so large that 4M would leave each GPU under 1,024 tokens, 1,024 per GPU, up to
        16M (Llama 3 405B went 4M -> 8M -> 16M tokens as it scaled to 16,384 GPUs: Dubey et al.
        2024, Sec. 3.4.1)."""
        if self.mode != "pretrain":
            return FINETUNE_BATCH_TOKENS
        return int(min(4 * TARGET_BATCH_TOKENS, max(TARGET_BATCH_TOKENS, MIN_TOKENS_PER_GPU * gpus)))

    def train_tokens(self, model: ModelSpec) -> float:
        if self.tokens is not None:
            return self.tokens
        return CHINCHILLA_TOKENS_PER_PARAM * model.params if self.mode == "pretrain" else FINETUNE_DEFAULT_TOKENS

    def replace(self, **changes: object) -> "Job":
        return dataclasses.replace(self, **changes)


def every_name(job: Job) -> str:
    return "eval_every" if job.eval_every is not None or job.eval_every_steps is None else "eval_every_steps"


JOB_OPTIONS: tuple[Option, ...] = options_of(Job)


class _Kept:
    """What a table keeps beside its columns: ``Candidates.distinct``'s answers (carried to the
    tables ``take`` makes of it), and the columns its properties computed (``_once``: the
    formulas read m, gpus, the shard group and the ZeRO group many times a pass)."""

    __slots__ = ("_distinct", "_props")

    def _once(self, key, f: Callable, *args) -> np.ndarray:
        """``f(self, *args)``, computed once per table (a table's columns are never written: the
        column returned is shared by every reader)."""
        props = self._props
        value = props.get(key)
        if value is None:
            value = props[key] = f(self, *args)
        return value


def _computed(self, key, f: Callable, *args):
    """``_once`` of what keeps nothing (one layout's scalars, the distinct rows, the enumeration's
    product): ``f(self, *args)`` each time."""
    return f(self, *args)


def _micro_batches(c: Candidates) -> np.ndarray:
    return c.global_batch // (c.dp * c.micro_batch)


def _gpus(c: Candidates) -> np.ndarray:
    return c.dp * c.tp * c.pp * c.cp  # GPU_FACTORS' product (asserted below Candidates)


def _shard_group(c: Candidates) -> np.ndarray:
    return c.dp * c.cp


def _zero_group(c: Candidates, gpus_per_node: int) -> np.ndarray:
    in_node = minimum(c.shard_group, maximum(1, gpus_per_node // c.tp))
    return where(c.sharding == SHARDING.index("hybrid"), in_node, c.shard_group)


class Candidates(_Kept):
    """Layouts as columns (numpy arrays of equal length, one per Layout dimension, by its name):
    what the vectorised model evaluates. String dimensions are held as their index in the
    dimension's choices (recompute: 0 none, 1 selective, 2 full, 3 half, 4 quarter; schedule: 0 1f1b, 1 gpipe, 2 dualpipev),
    sequence_parallel as bool.
    """

    __slots__ = tuple(DIMS)

    def __init__(self, **columns: np.ndarray) -> None:
        missing, unknown = set(DIMS) - set(columns), set(columns) - set(DIMS)
        if missing or unknown:
            raise TypeError(f"Candidates: columns missing {sorted(missing)}, unknown {sorted(unknown)}")
        for name, column in columns.items():
            object.__setattr__(self, name, column)
        object.__setattr__(self, "_distinct", {})
        object.__setattr__(self, "_props", {})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Candidates are immutable")

    def __reduce__(self):  # pickled by its columns (st.cache_data, multiprocessing)
        return _candidates, (self.columns(),)

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in DIMS}

    @property
    def m(self) -> np.ndarray:
        """Micro-batches per pipeline per step."""
        return self._once("m", _micro_batches)

    @property
    def gpus(self) -> np.ndarray:
        return self._once("gpus", _gpus)

    @property
    def shard_group(self) -> np.ndarray:
        """Ranks that hold the same weights: the data-parallel replicas and the context-parallel
        ranks (they split sequences, not weights). Gradients are reduced, and ZeRO shards, over
        them (torchtitan's FSDP mesh dp_shard x cp; Megatron-Core's data-parallel-with-CP group)."""
        return self._once("shard_group", _shard_group)

    def zero_group(self, gpus_per_node: int) -> np.ndarray:
        """Ranks ZeRO shards over: the shard group, or under hybrid sharding its ranks inside one
        node (tp apart: gpus_per_node // tp of them, at most the group)."""
        return self._once(gpus_per_node, _zero_group, gpus_per_node)

    def full(self, value: float, dtype: type = float) -> np.ndarray:
        """``value`` in every row: a column of this table's length (float64, or int64 for ``int``)."""
        return np.full(len(self), value, dtype=np.float64 if dtype is float else np.int64)

    def one_row(self, i: int = 0) -> Candidates:
        """Layout ``i`` alone, its columns Python scalars (int, bool): the formulas evaluate one
        layout so 20-50x cheaper per operation, with the numbers its row of a table gets
        (planner.core.columns)."""
        return one_row_of({name: getattr(self, name).item(i) for name in DIMS})

    def take(self, index: np.ndarray) -> "Candidates":
        out = Candidates(**{name: column[index] for name, column in self.columns().items()})
        # The distinct rows found in this table hold those of any selection of it (a few more, at no
        # harm: each row's numbers are computed alone): the selection's rows index them alike.
        known = getattr(self, "_distinct", {})
        out._distinct.update({dims: (part, inverse[index]) for dims, (part, inverse) in known.items()})
        return out

    def distinct(self, dims: tuple[str, ...]) -> tuple["Candidates", np.ndarray]:
        """The distinct combinations of the columns ``dims`` as a table of their own, and each row's
        index in it (``np.unique``'s inverse, so ``part.tp[inverse]`` is ``self.tp``). Its other
        columns are None: a formula given it that reads one fails instead of reading another row's
        value. One key per row: the index of each column's value among that column's values, in mixed
        radix (a column of one value left out). Kept: the memory and the step time of a table ask
        for the same; a table ``take`` makes of this one reads this one's distinct rows (a superset
        of its own)."""
        known = getattr(self, "_distinct", None)
        if known is not None and dims in known:
            return known[dims]
        # (each column's values, each row's index in them: once per column, which several sets of
        # columns read)
        levels = [self._once(("levels", name), _column_levels, name) for name in dims]
        varied = [code for _, code in levels if code is not None]
        radix = [len(values) for values, code in levels if code is not None]
        part = object.__new__(_Part)
        for name in DIMS:
            object.__setattr__(part, name, None)
        if math.prod(radix) >= 1 << 62:  # no key in int64: the rows compared column by column
            _, first, inverse = np.unique(np.stack(varied, axis=1), axis=0, return_index=True, return_inverse=True)
            at = [code[first] for code in varied]
        else:  # one key per row: the value indices in mixed radix
            key = varied[0].astype(np.int64, copy=False) if varied else np.zeros(len(self), dtype=np.int64)
            for code, r in zip(varied[1:], radix[1:]):
                key = key * r + code
            unique, inverse = _distinct_keys(key, math.prod(radix))
            at = []
            for r in radix[::-1]:
                at.append(unique % r)
                unique = unique // r
            at = at[::-1]
        count = len(at[0]) if at else min(len(self), 1)
        index = iter(at)
        values = [values[next(index)] if code is not None else values.repeat(count) for values, code in levels]
        for name, value in zip(dims, values):
            object.__setattr__(part, name, value)
        object.__setattr__(part, "rows", count)
        if known is not None:
            known[dims] = part, inverse.reshape(-1)
        return part, inverse.reshape(-1)

    def layout(self, i: int) -> Layout:
        return _checked_layout({d.name: d.decode(getattr(self, d.name)[i]) for d in LAYOUT_DIMS})

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> "Candidates":
        return cls(**{d.name: d.encode([getattr(x, d.name) for x in layouts]) for d in LAYOUT_DIMS})

    @classmethod
    def empty(cls) -> "Candidates":
        return cls.from_layouts([])


assert GPU_FACTORS == ("dp", "tp", "pp", "cp"), GPU_FACTORS  # Candidates.gpus multiplies these


_KEPT_PROPERTIES = ("m", "gpus", "shard_group")


class _OneRow(Candidates):
    """One layout whose columns are Python scalars (``Candidates.one_row``)."""

    # Its Layout once read (or given: ``one_row_of``), and the properties the formulas read most,
    # computed once (Candidates' own properties, on the scalars).
    __slots__ = ("_layout", *_KEPT_PROPERTIES)
    _once = _computed

    def __len__(self) -> int:
        return 1

    def full(self, value: float, dtype: type = float) -> float | int:
        return float(value) if dtype is float else int(value)

    def one_row(self, i: int = 0) -> Candidates:
        return self

    def layout(self, i: int = 0) -> Layout:
        if self._layout is None:
            object.__setattr__(self, "_layout", _checked_layout({d.name: d.decode(getattr(self, d.name))
                                                                 for d in LAYOUT_DIMS}))
        return self._layout

    def table(self) -> Candidates:
        """This layout as a table of one row (each column an array of one value, ``Dim.encode``'s dtype)."""
        return Candidates(**{name: np.array([getattr(self, name)]) for name in DIMS})


def _checked_layout(values: dict[str, object]) -> Layout:
    """A Layout of values a table holds: each dimension's own rule was checked where the table was
    built (the pins, the values searched), so ``Layout.__post_init__`` is not run again."""
    layout = object.__new__(Layout)
    _fill_layout(layout, values)
    return layout


def one_row_of(columns: dict[str, int | bool], layout: Layout | None = None) -> Candidates:
    """One layout from its columns' values (a Python int or bool each, as ``Dim.code`` gives them),
    as ``Candidates.one_row`` gives it; ``layout``: the same layout as a Layout, when the caller has it."""
    row = object.__new__(_OneRow)
    _fill_row(row, columns)
    _fill_kept(row, {name: prop(row) for name, prop in _CANDIDATE_PROPERTY.items()})
    _set_layout(row, layout)
    return row


_CANDIDATE_PROPERTY = {"m": _micro_batches, "gpus": _gpus, "shard_group": _shard_group}
assert set(_CANDIDATE_PROPERTY) == set(_KEPT_PROPERTIES)
_fill_layout = slot_filler(Layout, tuple(DIMS))  # every field (a Layout's are the dimensions)
_fill_row, _fill_kept = slot_filler(_OneRow, tuple(DIMS)), slot_filler(_OneRow, _KEPT_PROPERTIES)
_set_layout = _OneRow._layout.__set__


def is_one_row(c: Candidates) -> bool:
    """Whether ``c`` is one layout of Python scalars (``Candidates.one_row``), not a table."""
    return type(c) is _OneRow


# The columns one layer's work per micro-batch reads (its GEMMs, attention, element-wise kernels,
# activations, TP/CP/EP exchanges): the same in every layout that agrees on these.
LAYER_DIMS = ("tp", "cp", "ep", "micro_batch", "sequence_parallel", "recompute")


class _Part(Candidates):
    """Some columns of a table's distinct rows (``Candidates.distinct``); the others None."""

    __slots__ = ("rows",)
    _once = _computed

    def __len__(self) -> int:
        return self.rows


LEVELS_MAX = 1 << 16  # a column's values indexed through a lookup table up to this value
RAW_LEVELS = 5  # a column of values below this is its own index (radix max + 1: no lookup table)


def _levels(column: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """A column's values, and each row's index in them (None: one value, or none): ascending, the
    index a value's rank among them; a column of small non-negative values (below RAW_LEVELS)
    its own index, with every value from 0 to its largest (some perhaps in no row); larger ones
    through a lookup table indexed by value (no sort) up to LEVELS_MAX, else ``np.unique``."""
    if not len(column):
        return column[:0], None
    low, high = column.min(), column.max()
    if low == high:
        return column[:1], None
    if column.dtype == bool:
        return np.array([False, True]), column.view(np.uint8)
    if low < 0 or high >= LEVELS_MAX:
        values, index = np.unique(column, return_inverse=True)
        return values, index.reshape(-1)
    if high < RAW_LEVELS:
        return np.arange(high + 1, dtype=column.dtype), column
    values = _present(column, int(high) + 1)
    return values.astype(column.dtype, copy=False), _ranks(values, int(high) + 1)[column]


def _column_levels(c: Candidates, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    return _levels(getattr(c, name))


def _present(index: np.ndarray, bound: int) -> np.ndarray:
    """The values of ``index`` (non-negative integers below ``bound``), ascending, once each."""
    seen = np.zeros(bound, dtype=bool)
    seen[index] = True
    return np.flatnonzero(seen)


def _ranks(values: np.ndarray, bound: int) -> np.ndarray:
    """A table over 0..bound-1 giving each of ``values`` (ascending) its rank (others undefined)."""
    table = np.empty(bound, dtype=np.int64)
    table[values] = np.arange(len(values))
    return table


def _distinct_keys(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``key`` (non-negative, below ``bound``) ascending, and each row's
    index in them (``np.unique``'s inverse): by a table of every possible key when there are few
    (no sort), else ``np.unique`` (a sort)."""
    if bound <= max(8 * len(key), 1024):
        unique = _present(key, bound)
        return unique, _ranks(unique, bound)[key]
    unique, inverse = np.unique(key, return_inverse=True)
    return unique, inverse.reshape(-1)


def per_distinct(c: Candidates, dims: tuple[str, ...], f: Callable):
    """``f(c)`` for a formula ``f`` that reads only the columns ``dims`` of ``c`` (and its length),
    row by row: computed once per distinct combination of them and gathered to every row, the
    same numbers in each (every element sees the same operations). ``f``'s result: a column, a
    scalar (the same in every row), or a tuple or slotted dataclass of them. One layout (columns
    as scalars), or a table with few repeats, is computed directly."""
    if type(c.dp) is not np.ndarray or len(c) < 64:
        return f(c)
    part, inverse = c.distinct(dims)
    if 2 * len(part) > len(c):
        return f(c)
    return _gathered(f(part), inverse)


def _gathered(value, inverse: np.ndarray):
    """Each column of ``value`` (a ``per_distinct`` result) at ``inverse``; scalars as they are."""
    if type(value) is np.ndarray:
        return value.take(inverse, axis=-1) if value.ndim else value
    if isinstance(value, tuple):
        return tuple(_gathered(v, inverse) for v in value)
    if hasattr(type(value), "__slots__") and dataclasses.is_dataclass(value):
        return type(value)(*(_gathered(getattr(value, f), inverse) for f in type(value).__slots__))
    return value


def _candidates(columns: dict[str, np.ndarray]) -> Candidates:
    return Candidates(**columns)


def default_global_batch(model: ModelSpec, dp_mb: np.ndarray | int,
                         target_tokens: int = TARGET_BATCH_TOKENS) -> np.ndarray:
    """About ``target_tokens`` per step, rounded to a multiple of dp*micro_batch (at least one)."""
    per_seq = target_tokens / model.seq_len
    return maximum(1, np.rint(per_seq / dp_mb)).astype(np.int64) * dp_mb
