"""Command-line flags -> the three inputs (model, hardware, job) and the layout pins.

Shared by every subcommand that plans (estimate, search, compare, recommend, export) and by the
Streamlit app, so a flag means the same thing everywhere.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from planner.core.layout import ATTENTION, KERNELS, LORA_TARGETS, MODES, RECOMPUTE, SCHEDULES, Job
from planner.core.model import ARCHS, ModelSpec
from planner.core.presets import get_preset, resolve_params
from planner.core.resilience import LLAMA3_MTBF_GPU_HOURS, Operations
from planner.core.search import Pins
from planner.errors import PlannerError
from planner.hardware import PRECISIONS, HardwareProfile, get_profile
from planner.units import parse_count

DEFAULT_GPU = "a100-80g"
SHAPE_FLAGS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (one of --preset, --params, or a shape; shape flags override)")
    g.add_argument("--preset", help="a model preset (`planner presets` lists them)")
    g.add_argument("--params", help="parameter count, e.g. 33B, 1T: the nearest preset or a LLaMA-style shape")
    g.add_argument("--arch", choices=ARCHS, help="gpt (LayerNorm, GELU, learned positions, tied) or llama")
    for flag in ("layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab", "seq-len"):
        g.add_argument(f"--{flag}", type=int)


def add_hardware_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    g = p.add_argument_group("hardware")
    if many:
        g.add_argument("--gpu", default=DEFAULT_GPU, help="profile names or files, comma-separated")
        g.add_argument("--gpus", default="8", help="GPU counts, comma-separated, e.g. 64,128,256")
    else:
        g.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU profile name or file (default {DEFAULT_GPU})")
        g.add_argument("--gpus", type=int, default=8, help="number of GPUs (default 8)")
    g.add_argument("--gpus-per-node", type=int, help="override the profile's GPUs per node")


def add_job_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    g.add_argument("--tokens", help="tokens to train, e.g. 1T (default: 20 per parameter, Chinchilla)")
    g.add_argument("--global-batch", type=int, help="sequences per step (default: about 4M tokens)")
    g.add_argument("--precision", choices=PRECISIONS, default="bf16")
    g.add_argument("--attention", choices=ATTENTION, default="flash")
    g.add_argument("--no-overlap", action="store_true", help="DP gradient reduction after backward, not during it")
    g.add_argument("--kernels", choices=KERNELS, default="fused",
                   help="element-wise kernels: fused (Megatron-LM, default) or eager (plain PyTorch, as the "
                        "reference trainer)")
    g.add_argument("--price-per-gpu-hour", type=float, help="USD (default: the profile's indicative rate)")
    g.add_argument("--pue", type=float, default=1.2, help="data-centre power usage effectiveness (default 1.2)")
    g.add_argument("--mode", choices=MODES, default="pretrain",
                   help="pretrain, full-finetune, or lora (frozen model + rank-r adapters)")
    g.add_argument("--lora-r", type=int, default=8, help="LoRA rank (default 8)")
    g.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA alpha (default 16; scales, costs nothing)")
    g.add_argument("--lora-targets", default="q_proj,v_proj",
                   help=f"comma-separated, from {','.join(LORA_TARGETS)} (default q_proj,v_proj)")
    g.add_argument("--packing-efficiency", type=float, default=1.0,
                   help="share of sequence positions holding real tokens (default 1.0: packed)")
    o = p.add_argument_group("operations (failures, checkpoints, storage, data)")
    o.add_argument("--mtbf-gpu-hours", type=float, help="mean time between failures per GPU "
                   f"(default {LLAMA3_MTBF_GPU_HOURS:,.0f}: Llama 3's 419 interruptions in 54 days on 16,384 GPUs; "
                   "inf: none)")
    o.add_argument("--mtbf-node-hours", type=float, help="the same per node (divided among its GPUs)")
    o.add_argument("--restart-minutes", type=float, default=10.0, help="detect + reschedule + re-init (default 10)")
    o.add_argument("--storage-gbps", type=float, help="storage bandwidth in GB/s, read and write (default 20)")
    o.add_argument("--storage-write-gbps", type=float, help="checkpoint write bandwidth, GB/s, aggregate")
    o.add_argument("--storage-read-gbps", type=float, help="read bandwidth (loads, data), GB/s, aggregate")
    o.add_argument("--keep-last", type=int, default=3, help="checkpoints kept (default 3, the seed's keep_last)")
    o.add_argument("--checkpoint-interval", type=int, help="steps between checkpoints (default: Young/Daly optimum)")
    o.add_argument("--epochs", type=float, default=1.0, help="passes over the dataset (sizes it; default 1)")
    o.add_argument("--token-bytes", type=int, help="bytes per stored token (default 2 if vocab <= 65536, else 4)")


def add_layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout (fields not given are searched)")
    for flag in ("dp", "tp", "pp", "vpp", "micro-batch"):
        g.add_argument(f"--{flag}", type=int)
    g.add_argument("--zero", type=int, help="ZeRO stage 0-3")
    g.add_argument("--recompute", choices=RECOMPUTE)
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--schedule", choices=SCHEDULES, help="1f1b (interleaved when --vpp > 1) or gpipe")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_hardware_args(p)
    add_job_args(p)
    add_layout_args(p)


@dataclass(frozen=True, kw_only=True, slots=True)
class Inputs:
    model: ModelSpec
    model_note: str
    hardware: HardwareProfile
    gpus: int
    job: Job
    pins: Pins
    ops: Operations


def model_from_args(a: argparse.Namespace) -> tuple[ModelSpec, str]:
    shape = {f: getattr(a, f, None) for f in SHAPE_FLAGS if getattr(a, f, None) is not None}
    if a.preset and a.params:
        raise PlannerError("params", a.params, "give --preset or --params, not both")
    if a.preset:
        spec, note = get_preset(a.preset), f"preset {a.preset}"
    elif a.params:
        spec, note = resolve_params(parse_count(a.params, "params"))
    elif {"layers", "hidden", "heads"} <= set(shape):
        spec, note = ModelSpec(name="custom", **shape), "shape from flags"
        shape = {}
    else:
        raise PlannerError("model", "none", "give --preset NAME, --params 33B, or --layers, --hidden and --heads")
    if shape:
        if "arch" in shape and shape["arch"] != spec.arch:
            shape.setdefault("ffn_hidden", None)
            shape.setdefault("tied_embeddings", None)
        kv = shape.get("kv_heads")
        if "heads" in shape and kv is None and spec.kv_heads == spec.heads:
            shape["kv_heads"] = None  # keep multi-head attention when only heads changes
        spec = spec.replace(name=f"{spec.name}+custom", **shape)
        note += " with " + ", ".join(f"{k}={v}" for k, v in shape.items() if v is not None)
    return spec, note


def hardware_from_args(name: str, gpus_per_node: int | None) -> HardwareProfile:
    hw = get_profile(name)
    return hw.with_gpus_per_node(gpus_per_node) if gpus_per_node else hw


def job_from_args(a: argparse.Namespace) -> Job:
    tokens = parse_count(a.tokens, "tokens") if a.tokens else None
    targets = tuple(t.strip() for t in a.lora_targets.split(",") if t.strip())
    return Job(tokens=tokens, global_batch=a.global_batch, precision=a.precision, attention=a.attention,
               overlap_grad_reduce=not a.no_overlap, price_usd_per_gpu_hour=a.price_per_gpu_hour, pue=a.pue,
               mode=a.mode, lora_r=a.lora_r, lora_alpha=a.lora_alpha, lora_targets=targets,
               packing_efficiency=a.packing_efficiency, kernels=a.kernels)


def ops_from_args(a: argparse.Namespace, gpus_per_node: int) -> Operations:
    if a.mtbf_gpu_hours is not None and a.mtbf_node_hours is not None:
        raise PlannerError("mtbf_node_hours", a.mtbf_node_hours, "give --mtbf-gpu-hours or --mtbf-node-hours")
    mtbf = LLAMA3_MTBF_GPU_HOURS if a.mtbf_gpu_hours is None else a.mtbf_gpu_hours
    if a.mtbf_node_hours is not None:
        if not a.mtbf_node_hours > 0:
            raise PlannerError("mtbf_node_hours", a.mtbf_node_hours, "greater than zero hours (inf: no failures)")
        mtbf = a.mtbf_node_hours * gpus_per_node  # a node failing stops all its GPUs' work
    write = a.storage_write_gbps or a.storage_gbps or 20.0
    read = a.storage_read_gbps or a.storage_gbps or 20.0
    for name, value in (("storage_write_gbps", write), ("storage_read_gbps", read), ("storage_gbps", a.storage_gbps)):
        if value is not None and not value > 0:
            raise PlannerError(name, value, "greater than zero GB/s")
    return Operations(mtbf_gpu_hours=mtbf, restart_s=a.restart_minutes * 60, storage_write_bytes_per_s=write * 1e9,
                      storage_read_bytes_per_s=read * 1e9, keep_last=a.keep_last,
                      checkpoint_interval_steps=a.checkpoint_interval, epochs=a.epochs, token_bytes=a.token_bytes)


def pins_from_args(a: argparse.Namespace) -> Pins:
    return Pins(dp=a.dp, tp=a.tp, pp=a.pp, vpp=a.vpp, micro_batch=a.micro_batch, zero_stage=a.zero,
                recompute=a.recompute, sequence_parallel=a.sequence_parallel, schedule=a.schedule)


def inputs_from_args(a: argparse.Namespace) -> Inputs:
    from planner.core.finetune import trainable_params

    model, note = model_from_args(a)
    if a.gpus < 1:
        raise PlannerError("gpus", a.gpus, "a positive integer")
    hw = hardware_from_args(a.gpu, a.gpus_per_node)
    job = job_from_args(a)
    trainable_params(model, job)  # validates LoRA targets and rank against this model
    return Inputs(model=model, model_note=note, hardware=hw, gpus=a.gpus, job=job, pins=pins_from_args(a),
                  ops=ops_from_args(a, hw.network.gpus_per_node))
