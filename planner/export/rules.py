"""What each export format can express of a layout: the checks of the formats' registry entries
(planner/export/formats.py), each a list of errors naming the field.

`planner export --format megatron` must never write a ZeRO-3 layout Megatron-LM cannot run:
``formats.layout_problems`` lists every field a format cannot express, and
``plan.choose`` walks a search's fitting layouts in rank order to the first one without problems.
"""

from __future__ import annotations

from planner.core.layout import PARTIAL_RECOMPUTE
from planner.core.pipeline import schedule_name
from planner.errors import PlannerError
from planner.export.megatron import linear_freq, skip_freq

TRAINER_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # reference_trainer/config.py: no fp8 path
# The formats themselves (render, checks, language, stack) are one registry: planner/export/formats.py.


def node_split(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node): torchrun, Slurm and Kubernetes start the same number on every node."""
    nodes = -(-gpus // gpus_per_node)
    if gpus % nodes:
        raise PlannerError("gpus", gpus, f"cannot be spread evenly over nodes of {gpus_per_node} GPUs "
                                         f"({nodes} nodes); choose a multiple of {gpus_per_node} or fewer GPUs")
    return nodes, gpus // nodes


def hybrid_group(lay, hw) -> int:
    """Ranks ZeRO shards over under hybrid sharding (HSDP): the shard group's (dp x cp) ranks inside
    one node, tp apart (planner.core.layout.Candidates.zero_group); 0 when sharding is full."""
    if getattr(lay, "sharding", "full") != "hybrid":
        return 0
    return min(lay.dp * lay.cp, max(1, hw.network.gpus_per_node // lay.tp))


def common_problems(fmt: str, lay, job, hw, gpus: int) -> list[PlannerError]:
    """What no format here expresses (LoRA adapters), and what the per-node launchers need (an even
    split over nodes); each format's own rules are its registry entry's ``checks``."""
    out: list[PlannerError] = []
    if job.mode == "lora":
        out.append(PlannerError("mode", "lora", f"a {fmt} export trains every parameter; LoRA adapters are set in "
                                                "the training code (e.g. PEFT), so export the layout of --mode "
                                                "full-finetune or pretrain instead"))
    if fmt != "deepspeed":
        try:
            node_split(gpus, hw.network.host_gpus)
        except PlannerError as exc:
            out.append(exc)
    return out


def trainer_checks(lay, m, job, hw=None) -> list[PlannerError]:
    """The reference trainer's rules (reference_trainer/config.py): torchrun, Slurm, Kubernetes."""
    out = []
    if job.precision not in TRAINER_PRECISIONS:
        out.append(PlannerError("precision", job.precision, f"the reference trainer runs {', '.join(TRAINER_PRECISIONS)}; "
                                "use --precision bf16, or --format megatron for FP8 with Transformer Engine"))
    for name in ("ffn_hidden", "vocab"):
        if getattr(m, name) % lay.tp:
            out.append(PlannerError("tp", lay.tp, f"the reference trainer needs tp to divide {name}={getattr(m, name)}"))
    if lay.sequence_parallel and m.seq_len % lay.tp:
        out.append(PlannerError("sequence_parallel", True,
                                f"the reference trainer needs tp={lay.tp} to divide seq_len={m.seq_len}"))
    if lay.pp > 1 and lay.vpp == 1 and lay.schedule == "1f1b" and lay.grad_accum < lay.pp:
        out.append(PlannerError("grad_accum", lay.grad_accum, f"the reference trainer's 1F1B needs micro-batches per "
                                f"step >= pp={lay.pp}; raise --global-batch or use --schedule gpipe"))
    cp = getattr(lay, "cp", 1)
    if cp > 1 and lay.sequence_parallel and (m.seq_len // cp) % lay.tp:
        out.append(PlannerError("sequence_parallel", True, f"the reference trainer needs tp={lay.tp} to divide the "
                                f"tokens per context-parallel rank, seq_len/cp={m.seq_len // cp}"))
    if getattr(lay, "offload", "none") == "params":
        out.append(PlannerError("offload", "params", "the reference trainer offloads the optimizer (states and fp32 "
                                "masters) only; pin --offload optimizer or none, or use --format deepspeed"))
    return out + _trainer_model_checks(lay, m)


# Model variants the reference trainer does not build (reference_trainer/config.py UNBUILT_SPEC, kept
# equal by tests/test_export_dims.py), with their defaults.
TRAINER_UNBUILT = {"router_bias": False, "kv_lora_rank": 0, "q_lora_rank": 0, "window": 0, "post_norms": False,
                   "out_bias": False, "attention_sinks": False, "expert_bias": False, "chunked": False, "moe_every": 1,
                   "linear_layers": 0, "output_gate": False, "global_head_dim": 0, "global_kv_heads": 0,
                   "global_k_eq_v": False, "router_scale": False, "moe_norms": 0, "index_topk": 0,
                   "parallel_block": False}


def _trainer_model_checks(lay, m) -> list[PlannerError]:
    """The reference trainer's model rules: no latent attention or routing bias; QK-norm and MoE
    (reference_trainer/moe.py) with tp = 1."""
    other = ("--format megatron" if getattr(m, "linear_layers", 0) or getattr(m, "index_topk", 0)
             else "--format megatron or torchtitan")
    if _unexported_field(m):
        other = "--format deepspeed (no other export writes these layers)"
    out = [PlannerError(name, getattr(m, name), f"the reference trainer does not build this variant; use {other}")
           for name, default in TRAINER_UNBUILT.items() if getattr(m, name, default) != default]
    if getattr(m, "qk_norm", "none") != "none" and lay.tp > 1:
        out.append(PlannerError("tp", lay.tp, f"the reference trainer runs qk_norm={m.qk_norm!r} with tp = 1; "
                                "pin --tp 1"))
    if _experts(m) and lay.tp > 1:
        out.append(PlannerError("tp", lay.tp, "the reference trainer runs MoE models with tp = 1 (no expert-tensor "
                                "parallel); pin --tp 1"))
    return out


# Variants neither Megatron-LM nor torchtitan builds (planner.core.model): Gemma 4's full-attention
# layers of their own shape and its MoE layer's router scales and norms, Cohere's parallel block.
_UNEXPORTED_FIELDS = ("global_head_dim", "global_kv_heads", "global_k_eq_v", "router_scale", "moe_norms",
                  "parallel_block")


def _unexported_field(m) -> str | None:
    """The first of those variant fields set on ``m`` (None: none)."""
    return next((f for f in _UNEXPORTED_FIELDS if getattr(m, f, 0)), None)


def _unexported_refusal(m, who: str) -> list[PlannerError]:
    field = _unexported_field(m)
    if field is None:
        return []
    return [PlannerError(field, getattr(m, field), f"unset for this export: {who}; --format deepspeed writes a "
                         "model-independent config")]


def _experts(m) -> int:
    """Routed experts per MoE layer (0: a dense model, or a ModelSpec without MoE fields)."""
    return getattr(m, "experts", 0) or 0


def megatron_checks(lay, m, job, hw=None) -> list[PlannerError]:
    out = []
    if getattr(lay, "offload", "none") == "params":
        out.append(PlannerError("offload", "params", "Megatron-LM offloads optimizer states only "
                                "(--optimizer-cpu-offload); pin --offload optimizer or none, or use --format deepspeed"))
    if lay.zero_stage > 1:
        out.append(PlannerError("zero_stage", lay.zero_stage, "Megatron-LM expresses ZeRO-0 (DDP) and ZeRO-1 "
                                "(--use-distributed-optimizer) only; pin --zero 0 or 1, or use --format deepspeed"))
    if lay.pp > 1 and lay.schedule in ("gpipe", "dualpipev"):
        out.append(PlannerError("schedule", lay.schedule, "Megatron-LM runs 1F1B (interleaved when vpp > 1), not "
                                + schedule_name(lay.schedule, lay.vpp)
                                + ("; use --format torchtitan" if lay.schedule == "dualpipev" else "")))
    if job.precision == "tf32":
        out.append(PlannerError("precision", "tf32", "Megatron-LM has no TF32 switch; use fp32, bf16, fp16 or fp8"))
    if getattr(lay, "offload", "none") == "optimizer" and lay.zero_stage != 1:
        out.append(PlannerError("offload", "optimizer", "Megatron-LM's --optimizer-cpu-offload runs inside the "
                                "distributed optimizer; pin --zero 1"))
    group = hybrid_group(lay, hw) if hw is not None else 0
    if group and (lay.zero_stage != 1 or (lay.dp * lay.cp) % group):
        out.append(PlannerError("sharding", "hybrid", f"Megatron-LM shards hybrid only as distributed-optimizer "
                                f"instances (ZeRO-1) of equal size: dp x cp = {lay.dp * lay.cp} into groups of {group}; "
                                "pin --sharding full"))
    if getattr(m, "qk_norm", "none") == "full":
        out.append(PlannerError("qk_norm", "full", "Megatron-Core's --qk-layernorm normalizes each head; a norm over "
                                "all of q and k (OLMoE) has no flag; use --format torchtitan with a registered model"))
    windowed = getattr(m, "window_layers", 0) or 0
    if getattr(m, "chunked", False):
        out.append(PlannerError("chunked", True, "the Megatron export writes sliding windows (--window-size) only, not "
                                "Llama 4's chunked attention; use --format torchtitan"))
    elif windowed and windowed < m.layers and not skip_freq(m.layers, windowed):
        out.append(PlannerError("window_layers", windowed, f"Megatron's --window-attn-skip-freq N makes every N-th "
                                f"layer full; {m.layers - windowed} full of {m.layers} layers is no such pattern"))
    linear = getattr(m, "linear_layers", 0)
    if linear and not linear_freq(m.layers, linear):
        out.append(PlannerError("linear_layers", linear, f"Megatron's --linear-attention-freq N makes every N-th layer "
                                f"softmax attention; {m.layers - linear} of {m.layers} layers is no such pattern"))
    if _experts(m) and lay.tp > 1 and not lay.sequence_parallel:
        out.append(PlannerError("sequence_parallel", False, "Megatron-Core needs --sequence-parallel with expert and "
                                "tensor parallelism together; pin --sequence-parallel"))
    out += _unexported_refusal(m, "Megatron-LM gives every layer one attention shape (--kv-channels, "
                              "--num-query-groups) and has no flag for Gemma 4's full-attention layers or MoE block, "
                              "nor for a parallel attention and MLP block")
    return out


def deepspeed_checks(lay, m, job, hw=None) -> list[PlannerError]:
    out = []
    if lay.tp > 1:
        out.append(PlannerError("tp", lay.tp, "a DeepSpeed config cannot express tensor parallelism "
                                "(Megatron-DeepSpeed sets it with --tensor-model-parallel-size); pin --tp 1 or use "
                                "--format megatron"))
    if lay.pp > 1:
        out.append(PlannerError("pp", lay.pp, "a DeepSpeed config has no pipeline degree (DeepSpeed's "
                                "PipelineModule takes num_stages in code); pin --pp 1 or use --format megatron"))
    if lay.recompute == "selective" or lay.recompute in PARTIAL_RECOMPUTE:
        out.append(PlannerError("recompute", lay.recompute, "a DeepSpeed config checkpoints every layer the model "
                                "code wraps (full); pin --recompute full or none"))
    if job.precision in ("tf32", "fp8"):
        out.append(PlannerError("precision", job.precision, "a DeepSpeed config enables fp16 or bf16 (else fp32); "
                                "use fp32, bf16 or fp16"))
    if getattr(lay, "cp", 1) > 1:
        out.append(PlannerError("cp", lay.cp, "a DeepSpeed config has no context-parallel degree; pin --cp 1"))
    if getattr(lay, "ep", 1) > 1:
        out.append(PlannerError("ep", lay.ep, "a DeepSpeed config has no expert-parallel degree (DeepSpeed-MoE takes "
                                "ep_size in the model code); pin --ep 1 or use --format megatron"))
    if getattr(lay, "sharding", "full") == "hybrid" and lay.zero_stage != 3:
        out.append(PlannerError("sharding", "hybrid", "DeepSpeed shards hybrid (MiCS, mics_shard_size) at ZeRO stage 3 "
                                "only; pin --zero 3 or --sharding full"))
    offload = getattr(lay, "offload", "none")
    need = {"none": 0, "optimizer": 1, "params": 3}[offload]
    if lay.zero_stage < need:  # ZeRO-Offload: stages 1-3; parameter offload (ZeRO-Infinity): stage 3
        out.append(PlannerError("offload", offload, f"DeepSpeed offloads {'parameters' if need == 3 else 'optimizer states'} "
                                f"from ZeRO stage {need} up; pin --zero {need} or higher"))
    return out


def torchtitan_checks(lay, m, job, hw=None) -> list[PlannerError]:
    """torchtitan's job config (planner/export/torchtitan.py): FSDP2 shards all or nothing, its TP
    always runs sequence parallel, its models are LLaMA-style, torch's pipelining schedules."""
    out = []
    if m.arch != "llama":
        out.append(PlannerError("arch", m.arch, "torchtitan's models (llama3, deepseek_v3) are RMSNorm/SwiGLU/RoPE "
                                "decoders; use --arch llama, or --format megatron or torchrun for gpt"))
    if getattr(m, "linear_layers", 0):
        out.append(PlannerError("linear_layers", m.linear_layers, "0 for this export: torchtitan's Gated DeltaNet "
                                "model (torchtitan/models/qwen3_5, June 2026) is configured in its Python config "
                                "registry, not the TOML job config written here (e347b1e5); use --format megatron"))
    out += _unexported_refusal(m, "torchtitan has no Gemma or Cohere model")
    if getattr(m, "index_topk", 0):
        out.append(PlannerError("index_topk", m.index_topk, "0 for this export: torchtitan's deepseek_v3 model has "
                                "no DeepSeek sparse attention (indexer and top-k); use --format megatron"))
    if lay.zero_stage in (1, 2):
        out.append(PlannerError("zero_stage", lay.zero_stage, "torchtitan runs DDP (ZeRO-0) or FSDP2 fully_shard "
                                "(ZeRO-3), no ZeRO-1/2 without FSDP; pin --zero 0 or 3, or use --format deepspeed"))
    cp, ep = getattr(lay, "cp", 1), getattr(lay, "ep", 1)
    if lay.zero_stage == 0 and (cp > 1 or ep > 1):
        which = "cp" if cp > 1 else "ep"
        out.append(PlannerError("zero_stage", 0, f"torchtitan shards parameters over the data-parallel shard x cp "
                                f"ranks whenever {which} > 1 (fully_shard: ZeRO-3); pin --zero 3"))
    group = hybrid_group(lay, hw) if hw is not None else 0
    if group and (group % cp or lay.dp % (group // cp)):
        out.append(PlannerError("sharding", "hybrid", f"torchtitan's HSDP shards over data_parallel_shard x cp ranks: "
                                f"the {group} ranks in a node must be cp={cp} times a divisor of dp={lay.dp}; "
                                "pin --sharding full"))
    if lay.tp > 1 and not lay.sequence_parallel:
        out.append(PlannerError("sequence_parallel", False, "torchtitan's tensor parallel always shards norms along "
                                "the sequence (sequence parallel); pin --sequence-parallel"))
    if job.precision in ("fp16", "tf32"):
        out.append(PlannerError("precision", job.precision, "torchtitan trains in bfloat16 or float32 mixed "
                                "precision (float8 via torchao); use bf16, fp32 or fp8"))
    if getattr(lay, "offload", "none") == "optimizer":
        out.append(PlannerError("offload", "optimizer", "torchtitan's enable_cpu_offload moves parameters, gradients "
                                "and optimizer states together (FSDP2 CPUOffloadPolicy); pin --offload params or none"))
    if job.async_tp and lay.tp > 1 and not job.compile:
        out.append(PlannerError("async_tp", True, "torchtitan's async tensor parallel takes effect only compiled; "
                                "add --compile"))
    if getattr(m, "capacity_factor", 0):
        out.append(PlannerError("capacity_factor", m.capacity_factor, "torchtitan's MoE is dropless (token choice, "
                                "grouped GEMM over every routed token); use capacity factor 0 or --format megatron"))
    if getattr(m, "shared_expert_gate", False):
        out.append(PlannerError("shared_expert_gate", True, "torchtitan's MoE has no gate on the shared experts "
                                "(MoEArgs); use --format megatron (--moe-shared-expert-gate)"))
    out += _torch_pipeline_checks(lay)
    return out


def _torch_pipeline_checks(lay) -> list[PlannerError]:
    """torch.distributed.pipelining's own rules (schedules.py, torch 2.13): GPipe has no interleaved
    form in torchtitan's names, 1F1B needs n_microbatches >= stages, Interleaved1F1B a whole number of rounds."""
    if lay.pp == 1:
        return []
    m = lay.grad_accum
    if lay.schedule == "gpipe" and lay.vpp > 1:
        return [PlannerError("schedule", "gpipe", "torchtitan's GPipe runs one stage per rank; pin --vpp 1, or "
                             "--schedule 1f1b for Interleaved1F1B")]
    if lay.schedule == "dualpipev":  # the planner's rules already hold vpp 2 and m >= 2 pp
        return []
    if lay.schedule == "1f1b" and lay.vpp == 1 and m < lay.pp:
        return [PlannerError("grad_accum", m, f"torch's Schedule1F1B needs micro-batches per step >= pp={lay.pp}; "
                             "raise --global-batch or use --schedule gpipe")]
    rounds = max(1, m // lay.pp)
    if lay.vpp > 1 and m % rounds:
        return [PlannerError("grad_accum", m, f"torch's ScheduleInterleaved1F1B needs micro-batches per step "
                             f"({m}) to be a multiple of max(1, m // pp) = {rounds}; choose a global batch giving "
                             f"a multiple of pp={lay.pp}")]
    return []
