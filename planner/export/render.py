"""A plan as something that starts: the reference trainer's torchrun command and run config,
Megatron-LM arguments, a DeepSpeed config, a torchtitan job config, a Slurm batch script, a
Kubernetes PyTorchJob.

Pure functions from an ``Estimate`` to text; what each format can express is in export_rules.py.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass

from planner.core.layout import LAYOUT_DIMS, PARTIAL_RECOMPUTE, RECOMPUTE_EVERY
from planner.core.report import layout_line
from planner.core.results import Estimate
from planner.export.hyper import Hyper, hyperparameters
from planner.export.megatron import (
    block_recompute_note,
    block_recomputed_layers,
    megatron_model_args,
    megatron_pipeline_layout,
)
from planner.export.rules import hybrid_group, node_split
from planner.export.yamltext import comment_lines
from planner.export.yamltext import dump as yaml_dump
from planner.units import GIB, fmt_count, fmt_days

MASTER_PORT = 29500
# The ModelSpec fields of a mixture of experts, written into the trainer's run config for an MoE model.
MOE_FIELDS = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "capacity_factor",
              "shared_expert_gate", "expert_groups", "groups_per_token")
# AdamW settings by training mode, cited in planner/export/hyper.py; the checkpoint policy is the seed's.
DEFAULT_CHECKPOINT_INTERVAL = 1000  # steps, when no failure model sets one (the seed's 1000steps)
INITIAL_LOSS_SCALE_POWER = 16  # fp16 dynamic loss scaling starts at 2**16 (Megatron, DeepSpeed, torch)
LOSS_SCALE_WINDOW = 1000  # steps without overflow before the scale grows (DeepSpeed, Megatron default)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportOptions:
    steps: int | None = None  # None: the plan's tokens / (global batch x sequence length)
    run_name: str | None = None  # None: model-<gpus>x<gpu>
    image: str = "reference-trainer:latest"  # k8s: an image holding this repository and torch
    config_path: str = "run.yaml"  # where the scripts write the reference trainer's run config
    keep_last: int = 3  # checkpoints kept (the seed's keep_last)


# --- shared pieces ------------------------------------------------------------------------------


def train_steps(e: Estimate, opts: ExportOptions) -> int:
    """Optimizer steps for the plan's tokens: tokens / packing / (global batch x sequence length)."""
    if opts.steps is not None:
        return opts.steps
    per_step = e.layout.global_batch * e.model.seq_len * e.job.packing_efficiency
    return max(1, math.ceil(e.train.tokens / per_step))


def run_name(e: Estimate, opts: ExportOptions) -> str:
    name = opts.run_name or f"{e.model.name}-{e.gpus}x{e.hardware.name}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def checkpoint_interval(e: Estimate) -> int:
    """Young/Daly's optimum where the estimate has a failure model, else the seed's 1000 steps."""
    c = e.checkpoint
    return c.interval_steps if c is not None and c.interval_steps else DEFAULT_CHECKPOINT_INTERVAL


def trainer_checkpoint_interval(e: Estimate) -> int:
    """The reference trainer writes no checkpoint with its optimizer offloaded or with expert parallel
    (reference_trainer/config.py): interval 0 there, else checkpoint_interval."""
    return 0 if e.layout.offload == "optimizer" or e.layout.ep > 1 else checkpoint_interval(e)


def hyper(e: Estimate, opts: ExportOptions) -> Hyper:
    return hyperparameters(e.job.mode, e.model.params, train_steps(e, opts))


def summary(e: Estimate, fmt: str, steps: int, note: str = "") -> list[str]:
    nodes, per_node = node_split(e.gpus, e.hardware.network.host_gpus) if fmt != "deepspeed" else (0, 0)
    where = f" ({nodes} node{'s' if nodes > 1 else ''} x {per_node} GPUs)" if nodes else ""
    lines = [f"planner export --format {fmt}: {e.model.name} on {e.gpus} x {e.hardware.name}{where}",
             f"layout: {layout_line(e)}; {e.job.precision}, {e.job.attention} attention",
             (f"predicted: step {e.time.step_s:.3g} s, MFU {e.mfu:.1%}, {fmt_days(e.train.days)} for "
              f"{fmt_count(e.train.tokens)} tokens ({steps:,} steps); "
              f"{e.memory.total_bytes / GIB:.1f} of {e.memory.capacity_bytes / GIB:.0f} GiB per GPU")]
    if e.job.stack_set:  # the stack keys the prediction assumed: set the framework's own options to match
        from planner.stacks import overrides_text, software

        lines.append(f"stack: {software(e.job).stack.name}{overrides_text(software(e.job).stack)} "
                     "(set the matching options of the framework)")
    h = hyperparameters(e.job.mode, e.model.params, steps)
    lines.append(f"optimizer: AdamW lr {h.lr:g} (cosine to {h.min_lr_ratio:g}x, {h.warmup_steps} warm-up steps), "
                 f"betas {h.betas[0]:g}/{h.betas[1]:g}, eps {h.eps:g}, weight decay {h.weight_decay:g}, clip "
                 f"{h.grad_clip:g}; {h.source}")
    if fmt in ("torchrun", "slurm", "k8s") and (e.layout.offload == "optimizer" or e.layout.ep > 1):
        lines.append("checkpoints: off (the reference trainer writes none with its optimizer offloaded or ep > 1)")
    return lines + ([note] if note else []) + [f"warning: {w}" for w in e.warnings]


def run_config(e: Estimate, opts: ExportOptions) -> dict:
    """The reference trainer's run config (the keys of reference_trainer/config.py)."""
    from planner.hardware import profile_names

    m, lay, prec = e.model, e.layout, e.job.precision
    h = hyper(e, opts)
    training: dict = {"steps": train_steps(e, opts), "precision": prec, "lr": h.lr, "betas": list(h.betas),
                      "eps": h.eps, "weight_decay": h.weight_decay, "warmup_steps": h.warmup_steps,
                      "min_lr_ratio": h.min_lr_ratio, "grad_clip": h.grad_clip}
    if prec == "fp16":
        training |= {"init_loss_scale": float(2**INITIAL_LOSS_SCALE_POWER),
                     "loss_scale_growth_interval": LOSS_SCALE_WINDOW}
    config = {
        "run_name": run_name(e, opts),
        "model": {"arch": m.arch, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                  "ffn_hidden": m.ffn_hidden, "vocab": m.vocab, "seq_len": m.seq_len,
                  "tied_embeddings": m.tied_embeddings, "attention": e.job.attention,
                  **({k: getattr(m, k) for k in MOE_FIELDS} if m.moe else {})},
        # every declared dimension: the trainer reads them all (and refuses one it does not run unless at its default)
        "layout": {d.name: getattr(lay, d.name) for d in LAYOUT_DIMS},
        "training": training,
        "checkpoint": {"interval": trainer_checkpoint_interval(e), "keep_last": opts.keep_last, "auto_resume": True},
    }
    if e.hardware.name in profile_names():
        config["profile"] = {"hardware_profile": e.hardware.name}
    return config


def planner_run_line(e: Estimate, steps: int) -> str:
    """The same run with `planner run` (the reference trainer's launcher flags)."""
    from planner.core.presets import presets

    m, lay = e.model, e.layout
    if presets().get(m.name) == m:
        argv = ["--preset", m.name]
    elif m.moe:  # `planner run` takes an MoE shape by preset only
        return "(an MoE shape that is no preset: run the config above)"
    else:
        argv = ["--arch", m.arch, "--layers", m.layers, "--hidden", m.hidden, "--heads", m.heads, "--kv-heads",
                m.kv_heads, "--ffn-hidden", m.ffn_hidden, "--vocab", m.vocab, "--seq-len", m.seq_len]
    argv += ["--dp", lay.dp, "--tp", lay.tp, "--pp", lay.pp, "--vpp", lay.vpp, "--micro-batch", lay.micro_batch,
             "--global-batch", lay.global_batch, "--steps", steps, "--recompute", lay.recompute,
             "--zero", lay.zero_stage, "--precision", e.job.precision]
    if lay.sequence_parallel:
        argv.append("--sequence-parallel")
    if lay.schedule != "1f1b":
        argv += ["--schedule", lay.schedule]
    if lay.cp > 1:
        argv += ["--cp", lay.cp]
    if lay.ep > 1:
        argv += ["--ep", lay.ep]
    if lay.offload != "none":
        argv += ["--offload", lay.offload]
    if lay.sharding != "full":
        argv += ["--sharding", lay.sharding]
    return shlex.join(["planner", "run", *map(str, argv)])


def torchrun_argv(e: Estimate, nodes: int | str, per_node: int, rank: str, addr: str) -> list[str]:
    if nodes == 1:
        return ["torchrun", "--standalone", "--nproc_per_node", str(per_node)]
    return ["torchrun", "--nnodes", str(nodes), "--nproc_per_node", str(per_node), "--node_rank", rank,
            "--master_addr", addr, "--master_port", str(MASTER_PORT)]


def _shell(argv: list[str]) -> str:
    """argv as a shell line; words holding a "${...}" or "$(...)" expansion are double-quoted so they expand."""
    return " ".join(f'"{a}"' if "$" in a else shlex.quote(a) for a in argv)


def _heredoc(path_var: str, text: str, tag: str) -> list[str]:
    """``text`` written to the file named by $path_var; the quoted tag turns off every expansion,
    and is lengthened until no line of ``text`` equals it."""
    while tag in text.splitlines():
        tag += "_"
    return [f"cat > \"${path_var}\" <<'{tag}'", text.rstrip("\n"), tag]


def _default(var: str, value: str) -> str:
    """``VAR`` from the environment, else ``value``: quoted with shlex.quote, never expanded (a
    value like '$(cmd)' stays that text)."""
    return f'{var}="${{{var}:-}}"; [ -n "${var}" ] || {var}={shlex.quote(value)}'



# --- the formats ----------------------------------------------------------------------------


def torchrun_script(e: Estimate, opts: ExportOptions, note: str = "") -> str:
    steps = train_steps(e, opts)
    nodes, per_node = node_split(e.gpus, e.hardware.network.host_gpus)
    where = ("one node" if nodes == 1 else
             f"every one of the {nodes} nodes, with NODE_RANK=0..{nodes - 1} and MASTER_ADDR = node 0's address")
    config = yaml_dump(run_config(e, opts))
    argv = torchrun_argv(e, nodes, per_node, "${NODE_RANK:?set NODE_RANK}", "${MASTER_ADDR:?set MASTER_ADDR}")
    lines = ["#!/usr/bin/env bash", *comment_lines(summary(e, "torchrun", steps, note)),
             f"# Run from the repository root on {where}.", "set -euo pipefail",
             _default("CONFIG", opts.config_path), *_heredoc("CONFIG", config, "PLANNER_RUN_CONFIG"),
             _shell([*argv, "-m", "reference_trainer", "--config", "$CONFIG"]),
             "# The same run through the planner's launcher:", *comment_lines([planner_run_line(e, steps)], "#  ")]
    return "\n".join(lines) + "\n"


def megatron_args(e: Estimate, steps: int) -> dict[str, list[str]]:
    """Megatron-LM pretrain_gpt.py arguments (Megatron-Core 0.10 or later), grouped."""
    m, lay, prec = e.model, e.layout, e.job.precision
    model = megatron_model_args(m, e.job.attention)
    parallel = ["--tensor-model-parallel-size", lay.tp, "--pipeline-model-parallel-size", lay.pp]
    if m.layers % (lay.pp * lay.vpp):  # the planner's uneven split, stage by stage
        parallel += ["--pipeline-model-parallel-layout", megatron_pipeline_layout(m.layers, lay.pp, lay.vpp, m.mtp_layers)]
    elif lay.vpp > 1:  # Megatron counts layers per virtual stage: layers / (pp * vpp)
        parallel += ["--num-layers-per-virtual-pipeline-stage", m.layers // (lay.pp * lay.vpp)]
    if lay.sequence_parallel and lay.tp > 1:
        parallel.append("--sequence-parallel")
    if getattr(lay, "cp", 1) > 1:  # Megatron-Core's context parallelism: ring attention (p2p K/V exchange)
        # DSA runs the all-gather kind only (its queries local, the latent keys gathered)
        parallel += ["--context-parallel-size", lay.cp, "--cp-comm-type",
                     "allgather" if getattr(m, "index_topk", 0) else "p2p"]
    if getattr(lay, "ep", 1) > 1:  # carved out of the data-parallel (x cp) ranks; experts keep tp
        parallel += ["--expert-model-parallel-size", lay.ep]
    if lay.zero_stage == 1:
        parallel.append("--use-distributed-optimizer")
    group = hybrid_group(lay, e.hardware)
    if group:  # hybrid: one optimizer shard group per node's ranks, replicated across them
        parallel += ["--num-distributed-optimizer-instances", lay.dp * lay.cp // group]
    if getattr(lay, "offload", "none") == "optimizer":  # HybridDeviceOptimizer: all states and the step on the CPU
        parallel += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", 1.0, "--use-precision-aware-optimizer"]
    if e.job.overlap_grad_reduce and lay.dp > 1:
        parallel.append("--overlap-grad-reduce")
    batch = ["--micro-batch-size", lay.micro_batch, "--global-batch-size", lay.global_batch, "--train-iters", steps]
    memory = {"none": [], "selective": ["--recompute-granularity", "selective"],
              "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                       "--recompute-num-layers", 1]}.get(lay.recompute)
    if memory is None:  # half, quarter: block, the first N layers of each virtual stage recomputed whole
        n = block_recomputed_layers(m.layers, lay.pp, lay.vpp, RECOMPUTE_EVERY[lay.recompute])
        memory = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", n]
    precision = {"fp32": [], "bf16": ["--bf16"], "fp8": ["--bf16", "--fp8-format", "hybrid"],
                 "fp16": ["--fp16", "--initial-loss-scale", 2**INITIAL_LOSS_SCALE_POWER, "--min-loss-scale", 1,
                          "--loss-scale-window", LOSS_SCALE_WINDOW, "--hysteresis", 2]}[prec]
    h = hyperparameters(e.job.mode, e.model.params, steps)
    optimizer = ["--optimizer", "adam", "--lr", h.lr, "--min-lr", h.lr * h.min_lr_ratio, "--lr-decay-style",
                 "cosine", "--lr-warmup-iters", h.warmup_steps, "--weight-decay", h.weight_decay, "--adam-beta1",
                 h.betas[0], "--adam-beta2", h.betas[1], "--adam-eps", h.eps, "--clip-grad", h.grad_clip]
    groups = {"MODEL_ARGS": model, "PARALLEL_ARGS": parallel, "BATCH_ARGS": batch, "MEMORY_ARGS": memory,
              "PRECISION_ARGS": precision, "OPTIMIZER_ARGS": optimizer}
    # Empty groups are left out: "${EMPTY[@]}" is an unbound-variable error under `set -u` in bash < 4.4.
    return {k: [str(x) for x in v] for k, v in groups.items() if v}


def megatron_script(e: Estimate, opts: ExportOptions, note: str = "") -> str:
    steps = train_steps(e, opts)
    nodes, per_node = node_split(e.gpus, e.hardware.network.host_gpus)
    lines = ["#!/usr/bin/env bash", *comment_lines(summary(e, "megatron", steps, note)),
             "# Megatron-LM pretrain_gpt.py (Megatron-Core 0.10 or later): run from a Megatron-LM checkout on "
             + ("one node." if nodes == 1 else f"each of the {nodes} nodes with NODE_RANK and MASTER_ADDR set."),
             (f"# Data parallel size is implied: world {e.gpus} / (tp {e.layout.tp} x pp {e.layout.pp} x cp "
              f"{e.layout.cp}) = {e.layout.dp}. The vocabulary ({e.model.vocab}) comes from your tokenizer."),
             "set -euo pipefail"]
    if e.model.layers % (e.layout.pp * e.layout.vpp):
        lines.insert(-1, "# Uneven pipeline stages: --pipeline-model-parallel-layout needs a Megatron-LM from June 2025 on.")
    if e.layout.recompute in PARTIAL_RECOMPUTE:
        shares = block_recompute_note(e.model.layers, e.layout.pp, e.layout.vpp, RECOMPUTE_EVERY[e.layout.recompute])
        if shares:
            lines[-1:-1] = comment_lines([shares])
    if getattr(e.model, "post_norms", False):
        post = ("The model normalises each block's output too (Gemma 2/3's and GLM-4's post-norms): Megatron-LM has "
                "no flag for it; these flags train the block without them.")
        lines[-1:-1] = comment_lines([post])
    if getattr(e.model, "out_bias", False) and not getattr(e.model, "expert_bias", False):
        bias = ("The model biases its attention output projection too (attention_bias): Megatron-LM biases either "
                "every linear layer (--add-bias-linear) or q, k and v only (--add-qkv-bias); these flags train it "
                "without that bias.")
        lines[-1:-1] = comment_lines([bias])
    for name, args in megatron_args(e, steps).items():
        pairs, i = [], 0
        while i < len(args):  # one flag (with its value) per line
            take = 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            pairs.append(" ".join(shlex.quote(a) for a in args[i:i + take]))
            i += take
        lines += [f"{name}=(", *(f"  {p}" for p in pairs), ")"]
    ckpt = f"checkpoints/{run_name(e, opts)}"
    lines += ["DATA_ARGS=(", '  --data-path "${DATA_PATH:?set DATA_PATH to a Megatron .bin/.idx prefix}"',
              "  --tokenizer-type HuggingFaceTokenizer",
              '  --tokenizer-model "${TOKENIZER_MODEL:?set TOKENIZER_MODEL}"', "  --split 99,1,0", ")",
              _default("CKPT_DIR", ckpt), "CHECKPOINT_ARGS=(", '  --save "$CKPT_DIR"', '  --load "$CKPT_DIR"',
              f"  --save-interval {checkpoint_interval(e)}", "  --log-interval 10", ")"]
    argv = torchrun_argv(e, nodes, per_node, "${NODE_RANK:?set NODE_RANK}", "${MASTER_ADDR:?set MASTER_ADDR}")
    groups = [*megatron_args(e, steps), "DATA_ARGS", "CHECKPOINT_ARGS"]
    lines.append(_shell(argv) + " pretrain_gpt.py " + " ".join(f'"${{{g}[@]}}"' for g in groups))
    return "\n".join(lines) + "\n"


def deepspeed_config(e: Estimate, steps: int) -> dict:
    """A DeepSpeed config: train_batch_size = micro-batch x accumulation x data-parallel ranks."""
    lay, prec = e.layout, e.job.precision
    h = hyperparameters(e.job.mode, e.model.params, steps)
    config: dict = {
        "train_batch_size": lay.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": lay.grad_accum,
        "zero_optimization": {"stage": lay.zero_stage, "overlap_comm": e.job.overlap_grad_reduce,
                              "contiguous_gradients": True},
        "bf16": {"enabled": prec == "bf16"},
        "fp16": {"enabled": prec == "fp16"},
        "optimizer": {"type": "AdamW", "params": {"lr": h.lr, "betas": list(h.betas), "eps": h.eps,
                                                  "weight_decay": h.weight_decay}},
        # DeepSpeed's WarmupCosineLR: linear warm-up, cosine decay to cos_min_ratio x the peak
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": steps, "warmup_num_steps":
                                                           h.warmup_steps, "cos_min_ratio": h.min_lr_ratio}},
        "gradient_clipping": h.grad_clip,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    group = hybrid_group(lay, e.hardware)
    if group:  # MiCS: ZeRO-3 inside groups of this many ranks, replicated across them (model built under MiCS_Init)
        config["zero_optimization"]["mics_shard_size"] = group
    offload = getattr(lay, "offload", "none")
    if offload != "none":  # ZeRO-Offload (optimizer states and step on the CPU); ZeRO-Infinity adds the weights
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload == "params":
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    if prec == "fp16":  # dynamic loss scaling (loss_scale 0), starting at 2**16
        config["fp16"] |= {"loss_scale": 0, "initial_scale_power": INITIAL_LOSS_SCALE_POWER,
                           "loss_scale_window": LOSS_SCALE_WINDOW, "hysteresis": 2, "min_loss_scale": 1}
    if lay.recompute == "full":  # deepspeed.checkpointing.checkpoint around every layer
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False, "number_checkpoints": e.model.layers,
                                              "synchronize_checkpoint_boundary": False, "profile": False}
    return config


def deepspeed_json(e: Estimate, opts: ExportOptions, note: str = "") -> str:
    return json.dumps(deepspeed_config(e, train_steps(e, opts)), indent=2) + "\n"


def torchtitan_toml(e: Estimate, opts: ExportOptions, note: str = "") -> str:
    """torchtitan's TOML job config (planner/export/torchtitan.py), the launch line in its header."""
    import tomli_w  # a real TOML writer (imported here, not at CLI start-up)

    from planner.export.torchtitan import job_config

    steps = train_steps(e, opts)
    nodes, per_node = node_split(e.gpus, e.hardware.network.host_gpus)
    config, notes = job_config(e, steps, run_name(e, opts), checkpoint_interval(e), opts.keep_last)
    launch = torchrun_argv(e, nodes, per_node, "$NODE_RANK", "$MASTER_ADDR")
    head = [*summary(e, "torchtitan", steps, note), *notes,
            "torchtitan (TOML job config, torchtitan/config/job_config.py before #2386): from a torchtitan checkout"
            + ("" if nodes == 1 else f" on each of the {nodes} nodes") + ", with this file as job.toml:",
            "  " + " ".join([*launch, "-m", "torchtitan.train", "--job.config_file", "job.toml"]),
            f"[training] dataset and [model] hf_assets_path are placeholders: your data and tokenizer (vocab {e.model.vocab})."]
    return "\n".join(comment_lines(head)) + "\n\n" + tomli_w.dumps(config)


def slurm_script(e: Estimate, opts: ExportOptions, note: str = "") -> str:
    steps = train_steps(e, opts)
    nodes, per_node = node_split(e.gpus, e.hardware.network.host_gpus)
    name = run_name(e, opts)
    config = yaml_dump(run_config(e, opts))
    launch = ["srun", "--kill-on-bad-exit=1", "torchrun", "--nnodes", str(nodes), "--nproc_per_node", str(per_node),
              "--rdzv_id", "$SLURM_JOB_ID", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"$MASTER_ADDR:{MASTER_PORT}",
              "-m", "reference_trainer", "--config", "$CONFIG"]
    lines = ["#!/bin/bash", f"#SBATCH --job-name={shlex.quote(name)}", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={per_node}", "#SBATCH --exclusive",
             *comment_lines(summary(e, "slurm", steps, note)),
             f"# No --time: the run is predicted to take {fmt_days(e.train.days)}; set your partition's limit and",
             "# resubmit: the run config resumes from the last checkpoint (auto_resume).",
             "set -euo pipefail", 'cd "${SLURM_SUBMIT_DIR:-.}"',
             _default("CONFIG", opts.config_path), *_heredoc("CONFIG", config, "PLANNER_RUN_CONFIG"),
             'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
             _shell(launch)]
    return "\n".join(lines) + "\n"


def k8s_name(e: Estimate, opts: ExportOptions) -> str:
    """A DNS-1035 label: lower-case letters, digits and '-', starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_name(e, opts).lower()).strip("-")
    name = name if name[:1].isalpha() else f"job-{name}"
    return name[:50].rstrip("-")


def k8s_manifest(e: Estimate, opts: ExportOptions, note: str = "") -> str:
    """A Kubeflow PyTorchJob (one pod per node; the operator sets MASTER_ADDR, MASTER_PORT and RANK,
    the pod's index) and the ConfigMap holding the run config."""
    steps = train_steps(e, opts)
    nodes, per_node = node_split(e.gpus, e.hardware.network.host_gpus)
    name = k8s_name(e, opts)
    config_text = yaml_dump(run_config(e, opts))
    mount = "/etc/planner"
    command = ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={per_node}", "--node_rank=$(RANK)",
               "--master_addr=$(MASTER_ADDR)", "--master_port=$(MASTER_PORT)",
               "-m", "reference_trainer", "--config", f"{mount}/run.yaml"]

    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": {
            "containers": [{"name": "pytorch", "image": opts.image, "command": command,
                            "resources": {"limits": {"nvidia.com/gpu": per_node}},
                            "volumeMounts": [{"name": "run-config", "mountPath": mount},
                                             {"name": "dshm", "mountPath": "/dev/shm"}]}],
            "volumes": [{"name": "run-config", "configMap": {"name": f"{name}-config"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}}

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
           "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs}}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"},
                  "data": {"run.yaml": config_text}}
    head = [*summary(e, "k8s", steps, note),
            f"kubectl apply -f this file; image {opts.image} must hold this repository and torch"]
    return yaml_dump(config_map, head) + "---\n" + yaml_dump(job)
