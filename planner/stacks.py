"""How the job runs in software: the stack (Megatron-LM, Megatron-Core + Transformer Engine,
torchtitan's FSDP2, DeepSpeed ZeRO, this project's reference trainer).

The same GPU runs 1.5-2x apart under different software. A stack file (``software_stacks/*.toml``) names
what kernels it runs, what overlaps with what, how it shards and gathers, its overheads and its
fp8 recipe, each cited. Hardware factors (peak rates, GEMM and attention efficiency, bandwidths)
stay in the hardware profile; a stack's factors set the software ones, unless a calibrated
hardware profile (fitted on runs of a stack) sets them itself. Keys carry their units; values are
converted to SI once, here.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerError, closest_names
from planner.memo import by_identity, fast_init

ELEMENTWISE = ("fused", "eager")
ATTENTION_KERNELS = ("flash2", "fused", "standard")  # fused: FlashAttention-3 / cuDNN / TE on Hopper
SELECTIVE = ("attention", "op")
FP8_RECIPES = ("none", "tensorwise", "delayed")
CP_EXCHANGES = ("gather", "torch")  # planner.core.steptime.context_parallel_exchange
# Context parallel over linear-attention (Gated DeltaNet) layers: not run ("none": torchtitan's
# Qwen3.5 refuses it), or by two all-to-alls a layer that trade the sequence split for a head
# split around the kernel ("all_to_all": Megatron-Core's gated_delta_net, a2a_cp_to_hp/a2a_hp_to_cp).
LINEAR_CPS = ("none", "all_to_all")
ATTENTION_KV_HEADS = ("kv", "query")
# How much of the s x s score square a flash-style attention kernel computes (planner.core.steptime
# attention_times): "causal" skips the blocks above the diagonal (FlashAttention-2/3/4, cuDNN, TE,
# the Triton FlashAttention kernel when called causal); "full" computes every block and masks
# after: a kernel given a dense additive bias or mask and no causal flag (SDPA's efficient/math
# backends with attn_mask, a non-causal Triton call with a matrix bias, FlexAttention without a
# block mask). Standard (unfused) attention always computes the full square.
ATTENTION_SQUARES = ("causal", "full")
# What an eager RMSNorm keeps for its backward (planner.core.memory.activation_bytes_per_layer):
# one kernel's 16-bit input and rstd (torch's nn.RMSNorm on CUDA, Triton, Transformer Engine), the
# input and the normalised tensor op by op (for the weight's gradient), or an fp32 copy of the
# input in their place (x.float(): torchtitan's 2024 RMSNorm, Hugging Face's LlamaRMSNorm).
EAGER_NORMS = ("fused", "plain", "upcast")
# Mixed precision's fp32 master weights: a "separate" copy in the optimizer beside the 16-bit
# weights the model computes with (Megatron, DeepSpeed: 2 + 4 + 12 bytes per parameter), or the
# fp32 parameters themselves, cast per use (FSDP2's MixedPrecisionPolicy, DDP under autocast:
# 4 + 4 + 8). planner.core.memory.model_state_bytes.
MASTER_WEIGHTS = ("separate", "param")
# Under CPU offload of the optimizer, the gradients the GPU holds (planner.core.memory): its
# gradient buffer as without offload, its shard copied out at the step ("shard": Megatron-Core's
# buffer stays on the GPU; the default for a file that does not say), or only those in flight,
# each sent to the host as soon as it is reduced: one 16-bit bucket ("bucket": DeepSpeed
# ZeRO-Offload's reduce_bucket_size, ``dp_bucket_mib``) or one wrapped block's, unsharded, in the
# reduce dtype ("block": FSDP2's CPUOffloadPolicy).
OFFLOAD_GRADS = ("shard", "bucket", "block")
# The dtype a 16-bit job's gradients are kept (accumulated) in under ZeRO 1-3: fp32 (Megatron's
# main grads, FSDP2's fp32 parameters; planner.core.memory.GRAD_BYTES), or the training dtype
# ("model": DeepSpeed's grad_accum_dtype default under ZeRO, engine.get_data_types; ZeRO 0 fp32).
GRAD_DTYPES = ("fp32", "model")
DEFAULT_STACK = "fsdp2"


@dataclass(frozen=True, kw_only=True, slots=True)
class Stack:
    name: str
    description: str
    source: str
    path: str = ""
    not_modelled: str = ""  # what the stack does that the planner does not model (said beside every estimate)
    # Kernels
    elementwise: str  # fused (one kernel per norm, activation, RoPE) or eager (one PyTorch op at a time)
    attention_kernel: str
    logit_bytes: float  # bytes per logit element held at the loss's peak (per token x vocab / tp)
    logit_bytes_compiled: float  # the same when torch.compile fuses the loss
    logit_bytes_tp: float  # the same with the vocabulary split across TP ranks (loss parallel)
    eager_norm: str  # what an eager RMSNorm keeps for its backward: fused (input, rstd), plain (+ normalised), upcast (fp32 input + normalised)
    attention_square: str = "causal"  # a flash kernel skips the masked blocks ("causal") or computes the whole square ("full")
    attention_kv_heads: str  # K/V as attention reads them: at the K/V heads, or repeated to the query heads before it
    qkv_buffer_kept: bool  # V reaches attention as a view of the fused QKV output: all of it stays beside the rotated Q, K
    selective: str  # what "selective" recompute recomputes: the attention core, or torchtitan's op-level policy
    recompute_early_stop: bool  # full recompute stops at the layer's last saved tensor (its last TP collective not redone)
    # Overlap (fractions)
    dp_overlap: float  # of the last micro-batch's backward that hides the DP gradient reduction
    zero3_overlap: float  # of compute that hides ZeRO-3 / FSDP parameter gathers and gradient reduce-scatters
    param_gather_overlap: float  # of the next forward that hides ZeRO-1/2's all-gather of updated weights
    tp_overlap: float  # of tensor-parallel communication hidden behind GEMMs
    tp_overlap_async: float  # the same with asynchronous TP (--async-tp: torchtitan's, TE's comm overlap)
    cp_overlap: float  # of the attention time that hides context parallel's K/V exchange (ring: 1; all-gather: 0)
    cp_exchange: str  # gather (K/V gathered, gradients reduced) or torch (context_parallel: all-gather + dK/dV ring)
    cp_grad_bytes: float  # bytes per dK/dV element passed back between context-parallel ranks
    cp_merge_bytes: float  # HBM bytes per local attention-output element per CP step, forward (partial merge)
    cp_accumulate_bytes: float  # the same in the backward (dQ/dK/dV accumulation and copies)
    linear_attention_cp: str = "none"  # context parallel over linear-attention layers (LINEAR_CPS)
    sparse_attention: bool = False  # runs DeepSeek sparse attention (Megatron-Core's dsa variant: indexer, top-k)
    multi_token_prediction: bool = False  # trains multi-token-prediction modules (Megatron-Core's --mtp-num-layers)
    # Sharding
    grad_reduce_bytes: float  # bytes per gradient element in the data-parallel reduction
    zero_stages: tuple[int, ...]  # the ZeRO stages it runs
    model_parallel: bool = True  # False: data parallel only (tp = pp = cp = ep = 1: Composer / llm-foundry's FSDP)
    hierarchical: bool  # ZeRO-3 collectives inside the node first, then across (NCCL); else one flat ring
    tp_saves_gathered_inputs: bool  # sequence parallel keeps the gathered (whole) matmul inputs (DTensor)
    gather_layers: float  # layers of unsharded 16-bit weights held at once under ZeRO-3 (current + prefetch)
    reshard_in_pipeline: bool  # False: under pp > 1 a stage keeps its weights gathered across micro-batches
    master_weights: str  # mixed precision: "separate" fp32 copy beside 16-bit weights, or the fp32 "param"s are it
    offload: tuple[str, ...]  # the CPU offload modes it runs (none always)
    offload_grads: str = "shard"  # under offload, the gradients the GPU holds: its shard, one bucket or one block (OFFLOAD_GRADS)
    grad_dtype: str = "fp32"  # a 16-bit job's gradients under ZeRO 1-3: kept in fp32 or in the training dtype (GRAD_DTYPES)
    reduce_scatter_bytes: float = 0.0  # per parameter of one block, ZeRO-3's gradient buffers at the backward's peak
    # ZeRO-3's cap on gathered parameter elements held at once (DeepSpeed's stage3_max_live_parameters;
    # never below the largest module, gathered whole); 0: no cap (the gather_layers blocks)
    gather_cap_params: float = 0.0
    grad_bucket_buffer: bool = False  # ZeRO 1-3 copy gradients into a bucket buffer of dp_bucket_bytes (DeepSpeed's contiguous_gradients)
    grad_sync_once_per_step: bool  # ZeRO-1/2 with accumulation: reduce once per step (Megatron) or per micro-batch
    dp_bucket_bytes: float  # ZeRO 0-2 gradient bucket; the last one is reduced after the backward (0: one bucket)
    # Pipeline
    schedules: tuple[str, ...]
    interleaved: bool
    uneven_interleave: bool  # interleaving where layers do not divide pp*vpp (uneven virtual stages)
    balance_pipeline: bool  # fewer layers on the last stage, to balance the output head and loss
    pp_keeps_outputs: bool  # the last stage keeps every micro-batch's output (logits) until the step ends
    # Fixed overheads (seconds)
    layer_overhead_s: float  # per layer per micro-batch per pass that the GPU waits for (launch, dispatch)
    step_overhead_s: float  # per optimizer step
    tp_collective_overhead_s: float  # per tensor-parallel collective
    optimizer_tensor_overhead_s: float  # host work per parameter tensor per optimizer step (norm, clip, AdamW, zero_grad)
    dtensor_optimizer_ratio: float  # the same for a DTensor parameter (TP or FSDP2), relative to a plain tensor's
    # torch.compile
    compiles: bool  # --compile means something on this stack
    # fp8
    fp8_recipe: str
    fp8_cast_bytes: float  # HBM bytes per element cast to fp8 (amax, scale, cast, transposed copy)
    fp8_cast_bytes_compiled: float  # the same when compiled (casts fused into neighbouring kernels)
    fp8_all_gather: bool  # ZeRO-3 / FSDP gathers fp8 weights (1 byte) instead of 16-bit ones
    # Sequence-parallel TP all-gathers activations (forward) and output gradients (backward) in fp8
    # (torchao's Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput, which
    # torchtitan uses with Float8 and TP); the reduce-scatters stay 16-bit.
    fp8_tp_all_gather: bool = False
    # Mixture of experts: expert parallel's all-to-all (planner.core.moe)
    ep_dispatch_bytes: float  # bytes per hidden element a token carries to its experts (0: the activations')
    ep_combine_bytes: float  # the same back from them, and for the gradients (0: the activations')
    ep_dedup: bool  # a token crosses the network once per node it goes to, then NVLink (DeepEP); else once per expert
    ep_overlap: float  # of the layer's compute (another micro-batch's) that hides its all-to-alls (DualPipe: 1)
    ep_sm_share: float  # of the SMs the overlapped all-to-all kernels hold while that compute runs
    base: str = ""  # the stack this file starts from (``base = "NAME"``), by name: its evidence stands in where it has none
    # Keys set for one plan (``--set TABLE.KEY=VALUE``; ``with_overrides``): (table.key, the value as given).
    overrides: tuple[tuple[str, object], ...] = ()

    def elementwise_for(self, compile: bool) -> str:
        return "fused" if compile and self.compiles else self.elementwise

    def logit_bytes_for(self, compile: bool) -> float:
        return self.logit_bytes_compiled if compile and self.compiles else self.logit_bytes

    def cast_bytes_for(self, compile: bool) -> float:
        return self.fp8_cast_bytes_compiled if compile and self.compiles else self.fp8_cast_bytes


# file key -> (attribute, kind, allowed): kind "float" with (low, high), "str" with choices,
# "bool", "ints" / "strs" (lists).
_KEYS: dict[str, tuple[str, str, object]] = {
    "elementwise": ("elementwise", "str", ELEMENTWISE),
    "attention": ("attention_kernel", "str", ATTENTION_KERNELS),
    "logit_bytes": ("logit_bytes", "float", (2.0, 32.0)),
    "logit_bytes_compiled": ("logit_bytes_compiled", "float", (2.0, 32.0)),
    "logit_bytes_tp": ("logit_bytes_tp", "float", (2.0, 32.0)),
    "eager_norm": ("eager_norm", "str", EAGER_NORMS),
    "attention_kv_heads": ("attention_kv_heads", "str", ATTENTION_KV_HEADS),
    "attention_square": ("attention_square", "str", ATTENTION_SQUARES),
    "qkv_buffer_kept": ("qkv_buffer_kept", "bool", None),
    "selective": ("selective", "str", SELECTIVE),
    "recompute_early_stop": ("recompute_early_stop", "bool", None),
    "dp_overlap": ("dp_overlap", "float", (0.0, 1.0)),
    "zero3_overlap": ("zero3_overlap", "float", (0.0, 1.0)),
    "tp_overlap": ("tp_overlap", "float", (0.0, 1.0)),
    "param_gather_overlap": ("param_gather_overlap", "float", (0.0, 1.0)),
    "tp_overlap_async": ("tp_overlap_async", "float", (0.0, 1.0)),
    "cp_overlap": ("cp_overlap", "float", (0.0, 1.0)),
    "cp_exchange": ("cp_exchange", "str", CP_EXCHANGES),
    "cp_grad_bytes": ("cp_grad_bytes", "float", (1.0, 4.0)),
    "cp_merge_bytes": ("cp_merge_bytes", "float", (0.0, 256.0)),
    "cp_accumulate_bytes": ("cp_accumulate_bytes", "float", (0.0, 256.0)),
    "linear_attention_cp": ("linear_attention_cp", "str", LINEAR_CPS),
    "sparse_attention": ("sparse_attention", "bool", None),
    "multi_token_prediction": ("multi_token_prediction", "bool", None),
    "grad_reduce_bytes": ("grad_reduce_bytes", "float", (1.0, 4.0)),
    "zero_stages": ("zero_stages", "ints", (0, 1, 2, 3)),
    "model_parallel": ("model_parallel", "bool", None),
    "gather_layers": ("gather_layers", "float", (0.0, 64.0)),
    "tp_saves_gathered_inputs": ("tp_saves_gathered_inputs", "bool", None),
    "hierarchical": ("hierarchical", "bool", None),
    "reshard_in_pipeline": ("reshard_in_pipeline", "bool", None),
    "master_weights": ("master_weights", "str", MASTER_WEIGHTS),
    "grad_sync_once_per_step": ("grad_sync_once_per_step", "bool", None),
    "dp_bucket_mib": ("dp_bucket_bytes", "mib", (0.0, 1e6)),
    "offload": ("offload", "strs", ("none", "optimizer", "params")),
    "offload_grads": ("offload_grads", "str", OFFLOAD_GRADS),
    "grad_dtype": ("grad_dtype", "str", GRAD_DTYPES),
    "reduce_scatter_bytes": ("reduce_scatter_bytes", "float", (0.0, 64.0)),
    "gather_cap_params": ("gather_cap_params", "float", (0.0, 1e13)),
    "grad_bucket_buffer": ("grad_bucket_buffer", "bool", None),
    "schedules": ("schedules", "strs", ("1f1b", "gpipe", "dualpipev")),
    "interleaved": ("interleaved", "bool", None),
    "balance_pipeline": ("balance_pipeline", "bool", None),
    "uneven_interleave": ("uneven_interleave", "bool", None),
    "pp_keeps_outputs": ("pp_keeps_outputs", "bool", None),
    "layer_overhead_us": ("layer_overhead_s", "us", (0.0, 1e5)),
    "step_overhead_ms": ("step_overhead_s", "ms", (0.0, 1e5)),
    "tp_collective_overhead_us": ("tp_collective_overhead_s", "us", (0.0, 1e5)),
    "optimizer_tensor_overhead_us": ("optimizer_tensor_overhead_s", "us", (0.0, 1e5)),
    "dtensor_optimizer_ratio": ("dtensor_optimizer_ratio", "float", (1.0, 100.0)),
    "compiles": ("compiles", "bool", None),
    "fp8_recipe": ("fp8_recipe", "str", FP8_RECIPES),
    "fp8_cast_bytes": ("fp8_cast_bytes", "float", (0.0, 64.0)),
    "fp8_cast_bytes_compiled": ("fp8_cast_bytes_compiled", "float", (0.0, 64.0)),
    "fp8_all_gather": ("fp8_all_gather", "bool", None),
    "fp8_tp_all_gather": ("fp8_tp_all_gather", "bool", None),
    "ep_dispatch_bytes": ("ep_dispatch_bytes", "float", (0.0, 4.0)),
    "ep_combine_bytes": ("ep_combine_bytes", "float", (0.0, 4.0)),
    "ep_dedup": ("ep_dedup", "bool", None),
    "ep_overlap": ("ep_overlap", "float", (0.0, 1.0)),
    "ep_sm_share": ("ep_sm_share", "float", (0.0, 0.5)),
}
# Keys added after stack files were published: a file without one has the Stack field's default.
OPTIONAL_KEYS = ("fp8_tp_all_gather", "offload_grads", "grad_dtype", "reduce_scatter_bytes", "grad_bucket_buffer",
                 "attention_square", "model_parallel", "gather_cap_params", "linear_attention_cp", "sparse_attention",
                 "multi_token_prediction")
_TABLES = ("kernels", "overlap", "sharding", "pipeline", "overhead", "compile", "fp8", "moe")
_TOP = ("name", "description", "source", "not_modelled", "aliases", "base", *_TABLES)


def _value(where: str, key: str, value: object, kind: str, allowed: object) -> object:
    def bad(what: str) -> PlannerError:
        return PlannerError(f"{where}: {key}", repr(value), what)

    if kind in ("float", "us", "ms", "mib"):
        low, high = allowed
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise bad(f"a number from {low:g} to {high:g}")
        return float(value) * {"float": 1.0, "us": 1e-6, "ms": 1e-3, "mib": 2.0**20}[kind]
    if kind == "str":
        if value not in allowed:
            raise bad(f"one of {', '.join(allowed)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if not isinstance(value, list) or not value or any(v not in allowed for v in value):
        raise bad(f"a non-empty list of {', '.join(map(str, allowed))}")
    return tuple(value)


def _table_values(data: dict, where: str) -> dict[str, object]:
    """The stack keys of a file's tables (or of ``--set``'s), each checked and in SI units: {attribute: value}."""
    values: dict[str, object] = {}
    for table in _TABLES:
        section = data.get(table, {})
        if not isinstance(section, dict):
            raise PlannerError(where, table, "a table")
        for key, value in section.items():
            if key in ("note", "source"):
                continue
            if key not in _KEYS:
                raise PlannerError(f"{where} [{table}]", key, f"unknown key; allowed: {', '.join(_KEYS)}")
            attr, kind, allowed = _KEYS[key]
            values[attr] = _value(f"{where} [{table}]", key, value, kind, allowed)
    return values


def load_stack_file(path: str | Path, _seen: tuple[str, ...] = ()) -> Stack:
    """A stack from its file. ``base = "NAME"`` (a stack name, alias or file) starts from that
    stack's values: the file then sets only what differs (name, description and source always)."""
    from planner.hardware import read_toml

    path = Path(path)
    data = read_toml(path, "stack")
    for key in data:
        if key not in _TOP:
            raise PlannerError(f"stack {path}", key, f"unknown key; allowed: {', '.join(_TOP)}")
    values: dict[str, object] = {}
    if "base" in data:
        base = data["base"]
        if not isinstance(base, str) or not base.strip():
            raise PlannerError(f"stack {path}", "base", "a stack name, alias or file")
        ref = base  # a file named relative to this one
        if _names_file(base) and not Path(base).is_absolute():
            ref = str(path.parent / base)
        base_path, chain = _stack_path(ref), (*_seen, str(path.resolve()))
        if str(Path(base_path).resolve()) in chain:
            raise PlannerError(f"stack {path}", "base", f"{base!r} leads back to this file; a base may not loop")
        parent = load_stack_file(base_path, chain)
        values = {f.name: getattr(parent, f.name) for f in dataclasses.fields(Stack)
                  if f.name not in ("name", "description", "source", "path", "not_modelled", "overrides", "base")}
        values["base"] = parent.name
    values.update(_table_values(data, f"stack {path}"))
    defaults = {f.name: f.default for f in dataclasses.fields(Stack)}
    values = {**{_KEYS[k][0]: defaults[_KEYS[k][0]] for k in OPTIONAL_KEYS}, **values}
    missing = [k for k, (attr, _, _) in _KEYS.items() if attr not in values]
    if missing:
        raise PlannerError(f"stack {path}", "missing", f"needs key(s): {', '.join(missing)}")
    for key in ("name", "description", "source"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise PlannerError(f"stack {path}", key, "a non-empty string")
    if not isinstance(data.get("not_modelled", ""), str):
        raise PlannerError(f"stack {path}", "not_modelled", "a string: what the stack does that the planner "
                                                              "does not model")
    values["not_modelled"] = " ".join(data.get("not_modelled", "").split())
    return Stack(name=data["name"], description=data["description"], source=data["source"], path=str(path),
                 **values)


def _stack_dir() -> Path:
    root = Path(__file__).resolve().parent.parent / "software_stacks"
    if not root.is_dir():  # installed without the source tree: the package copy
        import software_stacks

        root = Path(software_stacks.__file__).resolve().parent
    return root


def is_builtin(stack: Stack) -> bool:
    """A stack of the project's own folder (not a user's file, whatever its name)."""
    return _in_stack_dir(stack.path)


@functools.lru_cache(maxsize=64)
def _in_stack_dir(path: str) -> bool:
    return Path(path).resolve().parent == _stack_dir()


@functools.cache
def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for path in sorted(_stack_dir().glob("*.toml"), key=lambda p: p.stem):  # fsdp2-2024 before its variants
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        for key in [data.get("name", path.stem), *data.get("aliases", [])]:
            index.setdefault(str(key).lower(), str(path))
    return index


def stack_names() -> list[str]:
    return [Path(p).stem for p in dict.fromkeys(_index().values())]


def _names_file(name: str) -> bool:
    return name.endswith(".toml") or "/" in name


def _stack_path(name: str) -> str:
    """The file of a stack named by name, alias or path."""
    if _names_file(name):
        if not Path(name).is_file():
            raise PlannerError("stack", name, "no such stack file")
        return name
    key = name.strip().lower()
    if key not in _index():
        hint = closest_names(key, list(_index()))
        raise PlannerError("stack", name, f"unknown software stack; {hint + ' ' if hint else ''}"
                                          f"known: {', '.join(stack_names())}")
    return _index()[key]


@functools.cache
def get_stack(name: str) -> Stack:
    """A stack by name or alias, or by the path of a TOML file."""
    return load_stack_file(_stack_path(name))


def parse_override(item: str) -> tuple[str, str, object]:
    """``TABLE.KEY=VALUE`` (or ``KEY=VALUE``) of ``--set``: (the key as written, the file key, the
    value). VALUE is read as a TOML value, as a stack file holds it (``2``, ``0.5``, ``true``,
    ``["1f1b", "gpipe"]``, ``"fused"``); a bare word that is no TOML value is text (``standard``)."""
    if not isinstance(item, str) or "=" not in item:
        raise PlannerError("--set", item, "TABLE.KEY=VALUE, e.g. sharding.grad_reduce_bytes=2 "
                                        "(`planner stacks --keys` lists the keys)")
    name, raw = (x.strip() for x in item.split("=", 1))
    table, _, key = name.rpartition(".")
    if table and table not in _TABLES:
        raise PlannerError("--set", name, f"a table of a stack file before the dot: {', '.join(_TABLES)}")
    if key not in _KEYS:
        hint = closest_names(key, list(_KEYS))
        raise PlannerError("--set", name, f"unknown stack key; {hint + ' ' if hint else ''}allowed: {', '.join(_KEYS)}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return name, key, value


def with_overrides(stack: Stack, items: tuple[str, ...]) -> Stack:
    """``stack`` with ``--set`` items applied, each checked by the stack files' own per-key check
    (``_value``): a bad key or value is one error naming it, its value and what is allowed."""
    if not items:
        return stack
    changes: dict[str, object] = {}
    given: dict[str, object] = {}
    for item in items:
        name, key, value = parse_override(item)
        attr, kind, allowed = _KEYS[key]
        try:
            changes[attr] = _value("--set", name, value, kind, allowed)
        except PlannerError as exc:
            raise PlannerError(f"--set {name}", value, exc.allowed) from None
        given[name] = tuple(value) if isinstance(value, list) else value  # hashable: the Stack is a cache key
    return dataclasses.replace(stack, **changes, overrides=tuple(given.items()))


def overrides_text(stack: Stack) -> str:
    """'' or '; set for this plan: sharding.grad_reduce_bytes=2, kernels.attention="standard"'."""
    if not stack.overrides:
        return ""
    return "; set for this plan: " + ", ".join(f"{k}={_toml(v)}" for k, v in stack.overrides)


def _toml(value: object) -> str:
    """A --set value as a stack file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


@functools.cache
def _stack_with(name: str, items: tuple[str, ...]) -> Stack:
    return with_overrides(get_stack(name), items)


def job_stack(job) -> Stack:
    """The job's stack (``job.stack``) with its ``--set`` overrides (``job.stack_set``)."""
    return _stack_with(job.stack, tuple(job.stack_set)) if job.stack_set else get_stack(job.stack)


def stack_keys() -> list[tuple[str, str]]:
    """Every key a stack file (and ``--set``) takes, with what it allows."""
    out = []
    for key, (_, kind, allowed) in _KEYS.items():
        if kind in ("float", "us", "ms", "mib"):
            unit = {"us": " (us)", "ms": " (ms)", "mib": " (MiB)"}.get(kind, "")
            out.append((key, f"a number from {allowed[0]:g} to {allowed[1]:g}{unit}"))
        elif kind == "str":
            out.append((key, f"one of {', '.join(allowed)}"))
        elif kind == "bool":
            out.append((key, "true or false"))
        else:
            out.append((key, f"a non-empty list of {', '.join(map(str, allowed))}"))
    return out


# Software factors a stack sets and a hardware profile may also set (a calibrated profile, fitted
# on runs of one stack, keeps its own): the hardware profile wins only where its file names them.
SHARED_FACTORS = ("dp_overlap", "zero3_overlap", "tp_overlap", "layer_overhead_s", "step_overhead_s",
                  "tp_collective_overhead_s", "optimizer_tensor_overhead_s")


def effective(hw, stack: Stack, async_tp: bool = False):
    """The hardware profile with the stack's software factors in its efficiency (those its own
    file does not set)."""
    return _effective(hw, stack, async_tp)


@by_identity  # a search or estimate asks for the same pair each time (15 us a call)
def _effective(hw, stack: Stack, async_tp: bool):
    given = _profile_sets(hw, stack)
    changes = {f: getattr(stack, f) for f in SHARED_FACTORS if f not in given}
    if async_tp and "tp_overlap" not in given:
        changes["tp_overlap"] = stack.tp_overlap_async
    return hw.with_factors(changes)


def _profile_sets(hw, stack: Stack) -> frozenset[str]:
    """The efficiency factors the profile's own file sets and this stack keeps (a key set for
    this plan, --set, wins over a calibrated profile's own value)."""
    given = getattr(hw, "efficiency_keys", frozenset())
    if not stack.overrides or not given:
        return given
    return given - {_KEYS[key.rpartition(".")[2]][0] for key, _ in stack.overrides}


def async_tp_overlaps_more(hw, stack: Stack) -> bool:
    """Whether ``effective(hw, stack, True)`` hides more of TP's collectives than
    ``effective(hw, stack, False)``: the stack overlaps more with async TP, and the profile does
    not set the overlap itself."""
    return "tp_overlap" not in _profile_sets(hw, stack) and stack.tp_overlap_async > stack.tp_overlap


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Software:
    """What a job's stack does for this job (its options applied): what the formulas read."""

    stack: Stack
    elementwise: str  # fused | eager
    attention: str  # flash2 | fused | standard
    fp8: bool  # linear layers' GEMMs in fp8 (attention and element-wise work stay in 16-bit)
    fp8_cast_bytes: float
    logit_bytes: float
    logit_bytes_tp: float

    @property
    def eager(self) -> bool:
        return self.elementwise == "eager"


@by_identity  # an estimate reads the job's Software in its memory, step time, checkpoint and JSON
def software(job) -> Software:
    """The job's stack with its options (--kernels, --attention, --compile, --precision) applied."""
    stack = job_stack(job)
    elementwise = stack.elementwise_for(job.compile) if job.kernels == "stack" else job.kernels
    attention = "standard" if job.attention == "standard" else stack.attention_kernel
    if attention == "standard" and job.attention == "flash":
        attention = "flash2"  # a stack without flash attention of its own runs FlashAttention-2 when asked
    fp8 = job.precision == "fp8"
    if fp8 and stack.fp8_recipe == "none":
        with_fp8 = [n for n in stack_names() if get_stack(n).fp8_recipe != "none"]
        raise PlannerError("precision", "fp8", f"the {stack.name} stack has no fp8 recipe; use bf16, or a stack "
                                              f"that has one: {', '.join(with_fp8)}")
    return Software(stack=stack, elementwise=elementwise, attention=attention, fp8=fp8,
                    fp8_cast_bytes=stack.cast_bytes_for(job.compile) if fp8 else 0.0,
                    logit_bytes=stack.logit_bytes_for(job.compile), logit_bytes_tp=stack.logit_bytes_tp)
