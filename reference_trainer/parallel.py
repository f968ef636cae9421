"""Parallelism, applied from outside the model in torchtitan's order, on the meta device (shapes
only; each rank then allocates and initialises its own shard, see ``materialize``):

  1. split into pipeline stages with the planner's ``stage_layer_ranges`` (each rank builds only
     its own stages: ``GPT(layer_ids=...)``),
  2. tensor parallel (+ sequence parallel) with DTensor ``parallelize_module``,
  3. activation checkpointing (none / selective: attention core / full: whole layer),
  4. data parallel: DDP for ZeRO 0, FSDP2 ``fully_shard`` for ZeRO 1-3,
  5. the pipeline schedule (GPipe, 1F1B, interleaved 1F1B) over the stages.

Rank order is the planner's (planner/core/layout.py): tensor parallel innermost, then context
parallel, then data parallel, then pipeline parallel outermost; the DeviceMesh is
("pp", "dp", "cp", "shard", "tp") (torchtitan's order: cp inside the data-parallel replicas).
Context parallel (reference_trainer/context.py) is applied after tensor parallel, before
checkpointing; data parallel then reduces gradients over dp*cp ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from planner.core.layout import RECOMPUTE_EVERY, Layout
from planner.core.model import ModelSpec
from planner.core.pipeline import stage_layer_ranges, stage_of
from reference_trainer.model import GPT, is_dtensor
from reference_trainer.moe import ExpertGroups, expert_groups, expert_param_names, set_ep_group


@dataclass(kw_only=True)
class Parts:
    """This rank's share of the model: one module per (virtual) pipeline stage it runs."""

    modules: list[nn.Module]  # after TP, checkpointing and DP wrapping
    stage_ids: list[int]  # global (virtual) stage index of each module
    num_stages: int
    mesh: DeviceMesh
    tied_group: dist.ProcessGroup | None  # first and last stage ranks of one (dp, tp) coordinate
    schedule: object | None = None  # a torch.distributed.pipelining schedule when pp > 1
    cp_positions: torch.Tensor | None = None  # context parallel: global positions of this rank's tokens
    experts: ExpertGroups | None = None  # expert parallel: this rank's ep and expert-data-parallel groups

    @property
    def first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """("pp", "dp", "cp", "shard", "tp"); "shard" has size 1 and serves ZeRO 0 with tensor parallel
    (see ``apply_dp``). With context parallel, "dp" and "cp" are also flattened into "dp_cp", the
    group gradients are reduced over."""
    mesh = init_device_mesh(device_type, (layout.pp, layout.dp, layout.cp, 1, layout.tp),
                            mesh_dim_names=("pp", "dp", "cp", "shard", "tp"))
    if layout.cp > 1:
        mesh["dp", "cp"]._flatten("dp_cp")
    return mesh


def _dp_name(mesh: DeviceMesh) -> str:
    """The mesh dimension gradients are reduced over: "dp", or "dp_cp" with context parallel."""
    return "dp_cp" if mesh.size(mesh.mesh_dim_names.index("cp")) > 1 else "dp"


def grad_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that hold replicas of one stage's weights and average their gradients."""
    return mesh[_dp_name(mesh)]


def build_stages(spec: ModelSpec, layout: Layout, pp_rank: int, *, seed: int, attention: str,
                 meta: bool = False, ep_rank: int = 0) -> tuple[list[GPT], list[int]]:
    """The GPT stage modules of pipeline rank ``pp_rank`` (holding expert-parallel rank
    ``ep_rank``'s experts): initialised on the CPU in fp32, or (``meta``) shapes only, on the meta
    device, for ``materialize`` after parallelising."""
    num_stages = layout.pp * layout.vpp
    modules, ids = [], []
    mine = [k for k in range(num_stages) if stage_of(k, layout.pp, layout.schedule) == pp_rank]
    ranges = stage_layer_ranges(spec.layers, layout.pp, layout.vpp, layout.schedule)[pp_rank]
    for stage, (start, end) in zip(mine, ranges, strict=True):  # k % pp, or DualPipeV's V
        with torch.device("meta" if meta else "cpu"):
            module = GPT(spec, layer_ids=range(start, end), first=stage == 0, last=stage == num_stages - 1,
                         attention=attention, ep_rank=ep_rank, ep=layout.ep)
        if not meta:
            module.init_weights(seed)
        modules.append(module)
        ids.append(stage)
    return modules, ids


def apply_tp(module: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-LM's split (Shoeybi et al. 2019): QKV, MLP-in column-parallel; output projection,
    MLP-out row-parallel; embedding and head split by vocabulary. With sequence parallel
    (Korthikanti et al. 2022) norms and residuals hold T/tp tokens, and the all-reduces become
    reduce-scatter + all-gather."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    between = Shard(1) if sp else Replicate()  # layout of the residual stream between blocks
    plan: dict[str, object] = {}
    if module.embed is not None:
        # Token embedding split by vocabulary; its output, plus the (replicated) position table's,
        # stays a DTensor until the embedding module hands the residual stream on as ``between``.
        plan["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(),
                                            use_local_output=False)
        plan["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=between)
        if module.embed.pos is not None:
            distribute_module(module.embed.pos, tp_mesh, input_fn=_replicate_inputs)
    for name, block in module.layers.items():
        p = f"layers.{name}"
        mlp_in = ("gate", "up") if block.mlp.gated else ("fc1",)
        mlp_out = "down" if block.mlp.gated else "fc2"
        plan[f"{p}.attn.wqkv"] = ColwiseParallel()
        plan[f"{p}.attn.wo"] = RowwiseParallel(output_layouts=between)
        plan.update({f"{p}.mlp.{n}": ColwiseParallel() for n in mlp_in})
        plan[f"{p}.mlp.{mlp_out}"] = RowwiseParallel(output_layouts=between)
        if not sp and len(mlp_in) > 1:
            # One DTensor input shared by gate and up: their input gradients (each a partial sum)
            # add up before the single all-reduce at the MLP's boundary, as Megatron's one
            # column-parallel region does, instead of one all-reduce per projection.
            plan[f"{p}.mlp"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
        if sp:
            for norm, sub in (("attn_norm", "attn"), ("mlp_norm", "mlp")):
                plan[f"{p}.{norm}"] = SequenceParallel()
                plan[f"{p}.{sub}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    if module.head is not None:
        if sp:
            plan["norm"] = SequenceParallel()
        plan["head"] = ColwiseParallel(input_layouts=between, output_layouts=Replicate())
    parallelize_module(module, tp_mesh, plan)
    if module.embed is not None and module.head is not None and module.spec.tied_embeddings:
        module.head.weight = module.embed.tok.weight  # parallelize_module made two copies: tie again


def _replicate_inputs(module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
    from torch.distributed.tensor import DTensor, Replicate

    return tuple(DTensor.from_local(t, mesh, [Replicate()], run_check=False) for t in inputs)


def settle_grads(modules: list[nn.Module]) -> None:
    """Give every DTensor gradient its parameter's placements. Tensor parallel leaves some in
    another one (sequence-parallel norms: Partial, the vocabulary-split embedding: Replicate);
    the optimizer would otherwise redistribute them inside each of its ops, and the gradient
    norm would count them wrongly. FSDP2 already does this for the parameters it manages."""
    for module in modules:
        for p in module.parameters():
            g = p.grad
            if is_dtensor(p) and is_dtensor(g) and g.placements != p.placements:
                p.grad = g.redistribute(p.device_mesh, p.placements)


def apply_recompute(module: GPT, recompute: str) -> None:
    """Activation checkpointing, non-reentrant. full: each layer; half, quarter: every second,
    fourth layer of this stage's (the second, fourth, ...: torchtitan's selective layer
    checkpointing with selective_ac_option = "2" or "4" counts so); selective: the attention core
    (scores, softmax, dropout), the part Korthikanti et al. 2022 recompute."""
    if recompute == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    every = RECOMPUTE_EVERY.get(recompute)
    for k, (name, block) in enumerate(list(module.layers.items())):
        if every is not None and k % every == every - 1:
            module.layers[name] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        elif every is None:
            block.attn.core = checkpoint_wrapper(block.attn.core, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def hybrid_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh | None:
    """``sharding: hybrid`` (HSDP; the planner's ``Layout.zero_group``): ZeRO shards over this
    rank's dp*cp peers inside its node, min(dp*cp, local_world_size // tp) of them, and replicates
    across nodes (FSDP2 on a 2-D mesh: replicate x shard, gradients reduce-scattered inside the
    node, all-reduced across). None with full sharding. Every rank builds the whole mesh."""
    if layout.sharding != "hybrid":
        return None
    import os

    from reference_trainer.config import ConfigError

    n = layout.dp * layout.cp
    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    group = min(n, max(1, local // layout.tp))
    if n % group:
        raise ConfigError(f"layout.sharding=hybrid: dp*cp={n} ranks do not split into whole nodes of {group} "
                          f"(local world size {local} / tp={layout.tp})")
    ranks = mesh.mesh.reshape(layout.pp, n // group, group, layout.tp)
    full = DeviceMesh(mesh.device_type, ranks, mesh_dim_names=("h_pp", "replicate", "shard_in_node", "h_tp"))
    return full["replicate", "shard_in_node"]


def apply_dp(module: GPT, mesh: DeviceMesh, zero_stage: int, tp: int, compute_dtype: torch.dtype | None,
             ep: int = 1, hybrid: DeviceMesh | None = None) -> nn.Module:
    """ZeRO 0: DDP (everything replicated, gradients all-reduced, overlapped with backward).
    ZeRO 1-3: FSDP2, which always shards parameters, gradients and optimizer states across dp;
    the stages differ in when parameters are gathered and gradients reduced (README.md).

    DDP cannot hold tensor-parallel DTensor parameters (its DTensor bridge swaps parameters at
    every forward, which breaks tied and optimizer-held ones), so ZeRO 0 with tp > 1 is FSDP2 in
    hybrid mode with a shard group of one: replicated over dp, gradients all-reduced, as DDP.
    ``hybrid`` (ZeRO 1-3 with sharding hybrid): the 2-D mesh FSDP2 shards over instead."""
    dp_mesh = hybrid if hybrid is not None and zero_stage >= 1 else grad_mesh(mesh)
    # Expert parallel: each rank's experts are its own; their gradients are reduced over the
    # expert-data-parallel group by the stepper (reference_trainer/moe.py), not over dp*cp.
    names = set(expert_param_names(module)) if ep > 1 else set()
    experts = {p for name, p in module.named_parameters() if name in names}
    if zero_stage == 0 and tp == 1:
        if dp_mesh.size() == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel as DDP

        DDP._set_params_and_buffers_to_ignore_for_model(module, sorted(names))
        return DDP(module, process_group=dp_mesh.get_group(), forward_sync_buffers=False)  # buffers: RoPE tables
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if zero_stage == 0:
        if dp_mesh.size() == 1:
            return module
        # replicate over dp (dp*cp), "shard" over one rank
        dp_mesh = mesh[_dp_name(mesh), "shard"]
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    reshard = zero_stage == 3
    for block in module.layers.values():
        mine = {p for p in block.parameters() if p in experts} or None
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard, ignored_params=mine)
    fully_shard(module, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard, ignored_params=experts or None)
    return module


def tied_embedding_group(mesh: DeviceMesh, layout: Layout) -> dist.ProcessGroup | None:
    """With tied embeddings and pp > 1, the first and last pipeline ranks of each (dp, tp)
    coordinate sum their copies' gradients (Megatron-LM's embedding group). Every rank must
    create every group, in the same order."""
    if layout.pp == 1 or layout.schedule == "dualpipev":  # DualPipeV: rank 0 holds both, summed locally
        return None
    # The mesh is (pp, dp, cp, shard, tp) with shard of size 1: view it as (pp, dp*cp, tp) global ranks.
    ranks = mesh.mesh.reshape(layout.pp, layout.dp * layout.cp, layout.tp)
    mine = None
    for d in range(layout.dp * layout.cp):
        for t in range(layout.tp):
            pair = [int(ranks[0, d, t]), int(ranks[layout.pp - 1, d, t])]
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                mine = group
    return mine


def build_schedule(modules: list[nn.Module], stage_ids: list[int], num_stages: int, mesh: DeviceMesh,
                   layout: Layout, micro_batches: int, loss: object, device: torch.device) -> object:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleDualPipeV,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    group = mesh["pp"].get_group()
    stages = [PipelineStage(m, s, num_stages, device, group=group) for m, s in zip(modules, stage_ids)]
    if layout.schedule == "dualpipev":  # its two stages in the V order it computes itself
        return ScheduleDualPipeV(stages, n_microbatches=micro_batches, loss_fn=loss, scale_grads=False)
    if layout.vpp > 1:
        return ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches, loss_fn=loss, scale_grads=False)
    cls = ScheduleGPipe if layout.schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=micro_batches, loss_fn=loss, scale_grads=False)


def materialize(module: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate a meta-initialised (and possibly sharded) module on ``device`` and fill in its
    values: each rank allocates only its shard (torchtitan's order: meta, parallelise, then
    ``to_empty`` and init)."""
    module.to_empty(device=device)
    gpt = unwrap(module)
    tied = gpt.embed is not None and gpt.head is not None and gpt.spec.tied_embeddings
    if tied and gpt.head.weight is not gpt.embed.tok.weight:  # to_empty gave each module its own tensor
        gpt.head.weight = gpt.embed.tok.weight
    gpt.init_weights(seed)


def parallelize(spec: ModelSpec, layout: Layout, mesh: DeviceMesh, device: torch.device, *, seed: int,
                attention: str, compute_dtype: torch.dtype | None, lora=None, meta: bool | None = None) -> Parts:
    """``lora``: a LoraConfig to freeze the model and add adapters (before TP and DP), or None.

    ``meta`` (default: on, except with LoRA, whose adapters draw from the global RNG as they are
    built): build on the meta device, apply TP, recompute and FSDP2 to shapes, then allocate and
    initialise each rank's shard only, so a layout that fits per the planner also starts. The
    values equal eager initialisation's for the same seed (``GPT.init_weights``). DDP (ZeRO 0
    without TP) needs real parameters to broadcast: materialised just before it wraps."""
    meta = lora is None if meta is None else meta and lora is None
    pp_rank = mesh.get_local_rank("pp")
    experts = expert_groups(mesh, layout)
    hybrid = hybrid_mesh(mesh, layout)
    modules, ids = build_stages(spec, layout, pp_rank, seed=seed, attention=attention, meta=meta,
                                ep_rank=experts.ep_rank)
    wrapped, positions = [], None
    for module in modules:
        if lora is not None:
            from reference_trainer.lora import apply_lora

            apply_lora(module, spec, lora.r, lora.alpha, lora.targets)
        if not meta:
            module.to(device)
        if layout.tp > 1:
            apply_tp(module, mesh["tp"], layout.sequence_parallel)
        if layout.cp > 1:
            from reference_trainer.context import apply_cp

            positions = apply_cp(module, mesh["cp"].get_group(), mesh.get_local_rank("cp"), layout.cp, device)
        set_ep_group(module, experts.ep_group)
        apply_recompute(module, layout.recompute)
        ddp = layout.zero_stage == 0 and layout.tp == 1
        if meta and ddp:
            materialize(module, device, seed)
        wrapped.append(apply_dp(module, mesh, layout.zero_stage, layout.tp, compute_dtype, layout.ep, hybrid))
        if meta and not ddp:
            materialize(wrapped[-1], device, seed)
    group = tied_embedding_group(mesh, layout) if spec.tied_embeddings else None
    return Parts(modules=wrapped, stage_ids=ids, num_stages=layout.pp * layout.vpp, mesh=mesh, tied_group=group,
                 cp_positions=positions, experts=experts)


def unwrap(module: nn.Module) -> GPT:
    """The GPT inside a DDP wrapper (FSDP2 and checkpointing keep the module itself)."""
    return module.module if hasattr(module, "module") and isinstance(module.module, GPT) else module


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if is_dtensor(t) else t


def placements_of(p: torch.Tensor) -> tuple[tuple[object, ...], DeviceMesh] | None:
    """(placements, mesh) of a DTensor parameter, or None for a plain tensor."""
    if is_dtensor(p):
        return tuple(p.placements), p.device_mesh
    return None


def replication(p: torch.Tensor, stage_ranks: int) -> int:
    """How many ranks of this pipeline stage hold the same values as this rank's ``p``
    (``stage_ranks`` = dp * tp ranks run each stage). Used to count each element once."""
    info = placements_of(p)
    if info is None:
        return stage_ranks
    placements, mesh = info
    shards = 1
    for dim, placement in enumerate(placements):
        if placement.is_shard():
            shards *= mesh.size(dim)
    return stage_ranks // shards
