"""A plan as torchtitan's TOML job config (`torchrun ... -m torchtitan.train --job.config_file FILE`).

The keys are those of torchtitan's ``JobConfig`` dataclasses (torchtitan/config/job_config.py) as of
commit e347b1e5 (2026-02-15), the last release line configured by TOML files: torchtitan #2386
(2026-02-23) replaced the TOML files by a Python config registry, so a newer checkout takes these
values as its registry's fields (same names, same sections). What torchtitan cannot express is
``rules.torchtitan_checks``.

How the layout maps (torchtitan/distributed/parallel_dims.py, train.py, pipeline_parallel.py):
- world = data_parallel_replicate x data_parallel_shard x cp x tp x pp. ZeRO-0 is DDP (replicate =
  dp), ZeRO-3 is FSDP2's fully_shard (shard = dp); with cp > 1 torchtitan shards over shard x cp.
  Hybrid sharding is HSDP: shard x cp = the shard group's ranks inside a node, replicate = the rest.
- expert parallel is carved out of shard x cp (expert_tensor_parallel_degree = tp, as Megatron-Core's
  default); both the planner and torchtitan keep ep out of the GPU count.
- batch: global_batch_size / (local_batch_size x dp) gradient-accumulation steps. With pipeline
  parallelism the micro-batches are the pipeline's: local_batch_size = micro-batch x m and
  pipeline_parallel_microbatch_size = micro-batch (n_microbatches = m, no accumulation).
- pipeline stages: the planner's split (planner.core.pipeline.stage_layer_counts), virtual stage k
  on rank k % pp in both: pipeline_parallel_layers_per_stage when the layers split evenly, else
  module_fqns_per_model_part, each virtual stage's modules.
"""

from __future__ import annotations

from planner.core.layout import PARTIAL_RECOMPUTE, RECOMPUTE_EVERY
from planner.core.pipeline import stage_layer_counts, stage_of
from planner.core.results import Estimate
from planner.export.hyper import hyperparameters
from planner.export.rules import hybrid_group

# torchtitan's pipeline schedule names (torch.distributed.pipelining.schedules.get_schedule_class).
SCHEDULE_NAMES = {("1f1b", False): "1F1B", ("1f1b", True): "Interleaved1F1B", ("gpipe", False): "GPipe",
                  ("dualpipev", True): "DualPipeV"}  # DualPipeV: torch places its 2 pp stages in a V itself
# half, quarter: torchtitan's selective layer checkpointing, every second or fourth block
# (selective_ac_option "2", "4")
AC_MODES = {"none": "none", "selective": "selective", "full": "full", **dict.fromkeys(PARTIAL_RECOMPUTE, "selective")}

# Flavors registered in torchtitan (torchtitan/models/*/__init__.py at e347b1e5), keyed by the shape
# fields the planner knows. llama3: (layers, hidden, heads, kv_heads, ffn_hidden). The MoE models:
# (layers, hidden, experts, top_k, expert_ffn, dense_layers); deepseek_v3 (multi-head latent
# attention; its "16B" is DeepSeek-V2-Lite's shape) and qwen3 (grouped-query attention).
FLAVORS = {
    "llama3": {(32, 4096, 32, 8, 14336): "8B", (80, 8192, 64, 8, 28672): "70B", (126, 16384, 128, 8, 53248): "405B"},
    "deepseek_v3": {(27, 2048, 64, 6, 1408, 1): "16B", (60, 5120, 160, 6, 1536, 1): "236B",
                    (61, 7168, 256, 8, 2048, 3): "671B"},
    "qwen3": {(48, 2048, 128, 8, 768, 0): "30B-A3B", (94, 4096, 128, 8, 1536, 0): "235B-A22B"},
    # torchtitan/models/llama4/__init__.py (at 00f555e1): Scout and Maverick, chunked attention on the RoPE layers
    "llama4": {(48, 5120, 16, 1, 8192, 0): "17bx16e", (48, 5120, 128, 1, 8192, 0): "17bx128e"},
}


def moe(m) -> bool:
    return (getattr(m, "experts", 0) or 0) > 0


def model_section(m) -> tuple[dict, list[str]]:
    """[model] (name and flavor) and the comment lines for a shape torchtitan has no flavor for."""
    if moe(m):
        key = (m.layers, m.hidden, m.experts, m.top_k, m.expert_ffn, getattr(m, "dense_layers", 0))
        name = ("deepseek_v3" if getattr(m, "kv_lora_rank", 0) else  # latent attention, chunked attention or GQA
                "llama4" if getattr(m, "chunked", False) else "qwen3")
    else:
        key, name = (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden), "llama3"
    flavor = FLAVORS[name].get(key)
    notes = []
    if flavor is None:
        flavor = m.name
        shape = (f"n_layers={m.layers}, dim={m.hidden}, n_heads={m.heads}, n_kv_heads={m.kv_heads}, "
                 f"ffn hidden {m.ffn_hidden}, vocab_size={m.vocab}")
        if moe(m):
            shape += (f", num_experts={m.experts}, top_k={m.top_k}, moe_inter_dim={m.expert_ffn}, "
                      f"num_shared_experts={getattr(m, 'shared_experts', 0)}, "
                      f"n_dense_layers={getattr(m, 'dense_layers', 0)}")
        extras = {"head_dim": getattr(m, "head_dim", None), "qk_norm": getattr(m, "qk_norm", "none"),
                  "qkv_bias": getattr(m, "qkv_bias", False), "kv_lora_rank": getattr(m, "kv_lora_rank", 0),
                  "sliding_window": getattr(m, "window", 0), "window_layers": getattr(m, "window_layers", 0),
                  "post_norms": getattr(m, "post_norms", False), "out_bias": getattr(m, "out_bias", False),
                  "attention_sinks": getattr(m, "attention_sinks", False),
                  "expert_bias": getattr(m, "expert_bias", False), "chunked": getattr(m, "chunked", False),
                  "moe_every": getattr(m, "moe_every", 1)}
        shape += "".join(f", {k}={v}" for k, v in extras.items() if v not in (None, 0, False, "none")
                         and not (k == "head_dim" and v == m.hidden // m.heads) and not (k == "moe_every" and v == 1))
        notes.append(f"torchtitan has no {name} flavor of this shape: register flavor {m.name!r} in "
                     f"torchtitan/models/{name}/__init__.py with {shape}")
    section = {"name": name, "flavor": flavor, "hf_assets_path": f"./assets/hf/{m.name}"}
    return section, notes


def stage_modules(layers: int, pp: int, vpp: int) -> list[list[str]]:
    """Each virtual stage's module names, in pipeline order (torchtitan's FQNs: tok_embeddings,
    layers.<i>, norm, output), from the planner's split of layers into pp x vpp stages."""
    parts, start = [], 0
    counts = stage_layer_counts(layers, pp * vpp)
    for k, n in enumerate(counts):
        names = [f"layers.{i}" for i in range(start, start + n)]
        start += n
        if k == 0:
            names.insert(0, "tok_embeddings")
        if k == len(counts) - 1:
            names += ["norm", "output"]
        parts.append(names)
    return parts


def parallelism(e: Estimate) -> dict:
    m, lay, job = e.model, e.layout, e.job
    ep = getattr(lay, "ep", 1)
    shard = lay.dp if lay.zero_stage == 3 else 1
    group = hybrid_group(lay, e.hardware)
    if group:  # HSDP: shard over the node's dp x cp ranks (cp inside, as torchtitan's mesh orders them)
        shard = group // lay.cp
    out: dict = {
        "data_parallel_replicate_degree": lay.dp // shard,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": lay.tp,
        "enable_async_tensor_parallel": bool(job.async_tp and lay.tp > 1),
        "pipeline_parallel_degree": lay.pp,
        "context_parallel_degree": getattr(lay, "cp", 1),
        "expert_parallel_degree": ep,
    }
    if ep > 1:
        out["expert_tensor_parallel_degree"] = lay.tp
    if lay.pp > 1:
        out |= {"pipeline_parallel_schedule": SCHEDULE_NAMES[lay.schedule, lay.vpp > 1],
                "pipeline_parallel_microbatch_size": lay.micro_batch}
        stages = lay.pp * lay.vpp
        if m.layers % stages == 0:  # an even split: ceil(layers / per stage) = pp x vpp stages, the
            # embedding and output counted as no layer (torchtitan's generate_llm_fqn_per_model_part)
            out |= {"pipeline_parallel_layers_per_stage": m.layers // stages,
                    "pipeline_parallel_first_stage_less_layers": 0, "pipeline_parallel_last_stage_less_layers": 0}
        else:  # the planner's uneven split, stage by stage
            out["module_fqns_per_model_part"] = stage_modules(m.layers, lay.pp, lay.vpp)
    return out


def job_config(e: Estimate, steps: int, run_name: str, interval: int, keep_last: int) -> tuple[dict, list[str]]:
    """The job config as nested dicts (sections in torchtitan's order), and notes for the header."""
    m, lay, prec = e.model, e.layout, e.job.precision
    h = hyperparameters(e.job.mode, m.params, steps)
    model, notes = model_section(m)
    pipelined = lay.pp > 1
    config: dict = {
        "job": {"dump_folder": f"./outputs/{run_name}", "description": f"{run_name} (planner export)"},
        "model": model,
        "optimizer": {"name": "AdamW", "lr": h.lr, "beta1": h.betas[0], "beta2": h.betas[1], "eps": h.eps,
                      "weight_decay": h.weight_decay},
        # linear warm-up, then cosine decay to min_lr_factor x lr over the remaining steps
        "lr_scheduler": {"warmup_steps": h.warmup_steps, "decay_type": "cosine", "min_lr_factor": h.min_lr_ratio},
        "training": {"local_batch_size": lay.micro_batch * (lay.grad_accum if pipelined else 1),
                     "global_batch_size": lay.global_batch, "seq_len": m.seq_len, "max_norm": h.grad_clip,
                     "steps": steps, "dataset": "c4",
                     "mixed_precision_param": "float32" if prec == "fp32" else "bfloat16",
                     "mixed_precision_reduce": "float32", "enable_cpu_offload": lay.offload == "params"},
        "parallelism": parallelism(e),
        "checkpoint": {"enable": True, "folder": "checkpoint", "interval": interval, "keep_latest_k": keep_last,
                       "async_mode": "disabled"},
        "activation_checkpoint": {"mode": AC_MODES[lay.recompute]},
        "compile": {"enable": bool(e.job.compile), "components": ["model", "loss"]},
    }
    if lay.recompute == "selective":  # op-level selective AC (the fsdp2 stack's "op" policy)
        config["activation_checkpoint"]["selective_ac_option"] = "op"
    elif lay.recompute in PARTIAL_RECOMPUTE:  # layer-level selective AC: every N-th block checkpointed whole
        every = RECOMPUTE_EVERY[lay.recompute]
        config["activation_checkpoint"]["selective_ac_option"] = str(every)
        notes += layer_ac_notes(m.layers, lay.pp, lay.vpp, lay.schedule, every)
    if prec == "fp8":  # torchao float8 with dynamic tensorwise scaling (the fsdp2 stack's fp8 recipe)
        model["converters"] = ["quantize.linear.float8"]
        sharded = lay.zero_stage == 3
        config["quantize"] = {"linear": {"float8": {
            "recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": sharded,
            "precompute_float8_dynamic_scale_for_fsdp": sharded,
            "filter_fqns": ["output", "router.gate"] if moe(m) else ["output"]}}}
    return config, notes


def layer_ac_notes(layers: int, pp: int, vpp: int, schedule: str, every: int) -> list[str]:
    """Where torchtitan's selective layer checkpointing recomputes less than the plan's 1/every of a
    rank's layers: it counts the blocks a rank builds (its chunks together) and checkpoints every
    every-th, floor(n / every) of n, so a rank whose count is no multiple of every keeps more."""
    counts = [0] * pp  # the blocks each rank builds: its virtual stages' together
    for k, n in enumerate(stage_layer_counts(layers, pp * vpp)):
        counts[stage_of(k, pp, schedule)] += n
    short = [n for n in counts if n % every]
    if not short:
        return []
    n = min(short)
    return [(f"selective_ac_option = \"{every}\" checkpoints {n // every} of the {n} blocks of a rank that builds {n}, "
             f"not 1/{every} of them as planned: more activation memory than the estimate on such ranks")]
