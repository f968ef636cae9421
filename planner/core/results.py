"""An estimate: frozen dataclasses with named parts, and their JSON form (a stable contract)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from planner.core.checks import COMM_PARTS, warnings_for
from planner.core.evaluate import Evaluation, row_of
from planner.core.finetune import trainable_params
from planner.core.layout import Job, Layout
from planner.core.memory import allocated_bytes, outside_allocator
from planner.core.model import ModelSpec
from planner.core.resilience import CheckpointPlan, DataFeedPlan, Operations, ReliabilityPlan, plan_operations
from planner.core.step_parts import STEPTIME_FIELDS
from planner.evidence import FEATURES, FIT_VERDICTS, Evidence, calibration_json, for_stack, memory_band, plan_features
from planner.hardware import HardwareProfile
from planner.memo import by_identity, dict_of_slots, fast_init
from planner.stacks import async_tp_overlaps_more, software


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryParts:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    total_bytes: float
    capacity_bytes: float
    fits: bool
    peak_stage: int
    host_bytes: float = 0.0  # offloaded to host memory, per GPU
    # What torch would report at the peak: torch.cuda.max_memory_reserved (the total less what lies
    # outside its caching allocator: the CUDA context, NCCL's buffers) and max_memory_allocated
    # (the tensors alone, without the allocator's fragmentation).
    torch_reserved_bytes: float = 0.0
    torch_allocated_bytes: float = 0.0
    # The verdict (planner.evidence.fit_verdict): fits up to fits_below_bytes, tight up to
    # tight_below_bytes (``fits`` above is true for both), does not fit above; the plan's memory line.
    fit: str = "fits"
    fits_below_bytes: float = 0.0
    tight_below_bytes: float = 0.0
    safe_line_bytes: float = 0.0


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class StageMemory:
    """Memory of one pipeline stage (the first, the fullest and the last are reported)."""

    stage: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    total_bytes: float


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class TimeParts:
    step_s: float
    compute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    bubble_s: float
    optimizer_s: float
    other_s: float


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class TrainTotals:
    tokens: float
    seconds: float
    days: float
    gpu_hours: float
    energy_kwh: float
    cost_usd: float
    price_usd_per_gpu_hour: float
    pue: float
    # Periodic evaluation, in ``seconds`` and what follows from it (--eval-every, --eval-tokens)
    evaluations: int = 0
    eval_seconds: float = 0.0


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    model: ModelSpec
    hardware: HardwareProfile
    gpus: int
    layout: Layout
    job: Job
    memory: MemoryParts
    time: TimeParts
    bubble_fraction: float
    comm_fraction: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    train: TrainTotals
    warnings: tuple[str, ...]
    stage_memory: tuple[StageMemory, ...] = ()
    trainable_params: int = 0
    checkpoint: CheckpointPlan | None = None
    reliability: ReliabilityPlan | None = None
    data_feed: DataFeedPlan | None = None

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_json(self) -> dict:
        m = self.model
        return {
            "model": dict(_model_json(m)),
            "cluster": {"gpu": self.hardware.name, "gpus": self.gpus,
                        "gpus_per_node": self.hardware.network.gpus_per_node,
                        "gpus_per_host": self.hardware.network.host_gpus},
            "layout": {**self.layout.to_json(), "precision": self.job.precision, "attention": self.job.attention},
            "fit": self.memory.fit,
            "fit_band": self.fit_band_json(),
            "memory": {**flat_fields(self.memory), "memory_headroom": self.job.memory_headroom},
            "memory_by_stage": [flat_fields(s) for s in self.stage_memory],
            "time": flat_fields(self.time),
            "bubble_fraction": self.bubble_fraction,
            "comm_fraction": self.comm_fraction,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "train": flat_fields(self.train),
            "warnings": list(self.warnings),
            "mode": self.job.mode,
            "trainable_params": self.trainable_params,
            "checkpoint": flat_fields(self.checkpoint) if self.checkpoint else None,
            "reliability": _finite(flat_fields(self.reliability)) if self.reliability else None,
            "data_feed": flat_fields(self.data_feed) if self.data_feed else None,
            "stack": self.stack_json(),
            "conventions": {"attention_flops": ("causal (half of the s x s square) in MFU; time and HFU count the whole "
                                               "square where the kernel computes it (standard attention, or the "
                                               "stack's attention_square = full)"),
                            "mfu_peak": ("the bf16 dense peak (fp8 GEMMs run at the fp8 rate)"
                                         if self.job.precision == "fp8" else f"the {self.job.precision} dense peak")},
        }

    def band(self):
        """The stack's measured memory band the verdict uses (planner.evidence.memory_band)."""
        return memory_band(software(self.job).stack)

    def fit_band_json(self) -> dict:
        m = self.memory
        return {**_band_json(software(self.job).stack), "fits_below_bytes": m.fits_below_bytes,
                "tight_below_bytes": m.tight_below_bytes, "safe_line_bytes": m.safe_line_bytes,
                "least_certain": [name for name, _ in least_certain(m)]}

    def stack_json(self) -> dict:
        """The software stack the figures assume, what it ran with, and where its factors come from."""
        return _copied(*_stack_json(self.job, self.hardware, plan_features(self.model, self.layout)))

    def evidence(self) -> Evidence:
        """The measured runs that check this estimate's stack (planner.evidence)."""
        return for_stack(software(self.job).stack, self.hardware.name, plan_features(self.model, self.layout))


@by_identity
def _band_json(stack) -> dict:
    """The JSON of the stack's memory band (``Estimate.band``), for ``fit_band_json`` to copy."""
    return memory_band(stack).to_json()


@by_identity
def _model_json(m: ModelSpec) -> dict:
    """``Estimate.to_json``'s model: its shape (each call gets a copy)."""
    return {"name": m.name, "arch": m.arch, "params": m.params, "active_params": m.active_params,
            "layers": m.layers, "hidden": m.hidden,
            "heads": m.heads, "kv_heads": m.kv_heads, "ffn_hidden": m.ffn_hidden, "vocab": m.vocab,
            "seq_len": m.seq_len, "tied_embeddings": m.tied_embeddings,
            **({"experts": m.experts, "top_k": m.top_k, "expert_ffn": m.expert_ffn,
                "shared_experts": m.shared_experts, "dense_layers": m.dense_layers,
                "capacity_factor": m.capacity_factor, "expert_groups": m.expert_groups,
                "groups_per_token": m.groups_per_token} if m.moe else {}),
            **({"moe_every": m.moe_every} if m.moe_every > 1 else {}),
            **({"window": m.window, "window_layers": m.window_layers} if m.window_layers else {}),
            **({"chunked": True} if m.chunked else {}),
            **({"linear_layers": m.linear_layers, "linear_key_heads": m.linear_key_heads,
                "linear_value_heads": m.linear_value_heads, "linear_key_dim": m.linear_key_dim,
                "linear_value_dim": m.linear_value_dim, "linear_conv": m.linear_conv} if m.linear_layers else {}),
            **({"output_gate": True} if m.output_gate else {}),
            **({"global_head_dim": m.global_head_dim or m.head_dim, "global_kv_heads": m.global_kv_heads or m.kv_heads,
                "global_k_eq_v": m.global_k_eq_v} if m.global_layers else {}),
            **({"router_scale": True} if m.router_scale else {}),
            **({"parallel_block": True} if m.parallel_block else {}),
            **({"moe_norms": m.moe_norms} if m.moe_norms else {}),
            **({"index_heads": m.index_heads, "index_head_dim": m.index_head_dim, "index_topk": m.index_topk}
               if m.index_topk else {}),
            **({"mtp_layers": m.mtp_layers, "mtp_params": m.mtp_params} if m.mtp_layers else {})}


@by_identity  # ``plan_features`` gives one tuple object per combination
def _stack_json(job: Job, hw: HardwareProfile, like: tuple[str, ...]) -> dict:
    """``Estimate.stack_json`` of a job on a profile (what it reads of it: its name, the factors it
    calibrates and its calibration's figures), for plans with the features ``like``: built once for
    an estimate in a loop (each call gets a copy: ``_copied``), with where its containers are."""
    sw = software(job)
    value = {"name": sw.stack.name, "description": sw.stack.description, "source": sw.stack.source,
             "not_modelled": sw.stack.not_modelled, "file": sw.stack.path, "compile": job.compile,
             "async_tp": job.async_tp, "elementwise_kernels": sw.elementwise, "attention_kernel": sw.attention,
             "overrides": dict(sw.stack.overrides),
             "calibrated_factors_from_profile": sorted(hw.efficiency_keys),
             "checked_against": {**for_stack(sw.stack, hw.name, like).to_json(),
                                 "profile_calibration": calibration_json(hw.calibration)}}
    return value, _copy_plan(value)


def _copy_plan(value) -> tuple:
    """The keys (indices) of a JSON dict (list) that hold dicts or lists, each with its own plan."""
    plan = []
    for k, v in (value.items() if type(value) is dict else enumerate(value)):
        if type(v) is dict or type(v) is list:
            plan.append((k, _copy_plan(v)))
    return tuple(plan)


def _copied(value, plan: tuple):
    """A JSON value's dicts and lists copied, all the way down (its numbers and strings are
    immutable), visiting only the containers ``plan`` (``_copy_plan``) names."""
    out = value.copy()
    for k, sub in plan:
        out[k] = _copied(value[k], sub)
    return out


# Memory parts by how the planner gets them: weights, gradients and optimizer states are bytes per
# parameter counted from the shape and the stack's dtypes; activations (which tensors each kernel
# keeps) and other (workspace, buffers, fragmentation, the CUDA context) are modelled, and it is
# they that differ between a prediction and a measured peak (docs/validation.md).
MODELLED_PARTS = (("activations_bytes", "activations"), ("other_bytes", "other"))


def least_certain(m: MemoryParts) -> list[tuple[str, float]]:
    """The modelled memory parts, largest first: (name, bytes)."""
    return sorted(((label, getattr(m, key)) for key, label in MODELLED_PARTS), key=lambda x: -x[1])


def flat_fields(obj) -> dict:
    """A dataclass of plain values (numbers, strings, None) as a dict: ``dataclasses.asdict``
    without its recursion and deep copies (a fifth of a CSV row's time)."""
    return _as_dict(type(obj))(obj)


_as_dict = functools.cache(dict_of_slots)  # one written-out reader per class


def _finite(d: dict) -> dict:
    """JSON has no infinity: an infinite MTBF (no failures) is written as null."""
    return {k: (None if isinstance(v, float) and v == float("inf") else v) for k, v in d.items()}


def _measured_memory_under(model: ModelSpec, layout: Layout, job: Job, hw: HardwareProfile) -> tuple[float, str]:
    """How far below the memory they used the measured runs like this plan (its pipeline, context
    parallel or MoE: planner.evidence) were predicted at worst, a fraction of what they used (the
    share of the GPU a plan must leave free to cover them), and what they were; (0, "") when none
    was predicted low, or the plan has none of those features."""
    return _measured_under(software(job).stack, hw, plan_features(model, layout))


@by_identity
def _measured_under(stack, hw: HardwareProfile, like: tuple[str, ...]) -> tuple[float, str]:
    if not like:
        return 0.0, ""
    e = for_stack(stack, hw.name, like)
    worst = e.like_worst_memory_error
    if worst is None or worst >= 0:
        return 0.0, ""
    runs = f"{e.like_memory_runs} {' and '.join(e.sources)} run{'' if e.like_memory_runs == 1 else 's'}"
    return -worst, f"{' + '.join(FEATURES[f][0] for f in like)}: {runs}"


def operations_at(row: Evaluation, model: ModelSpec, job: Job, ops: Operations, layout: Layout | None = None,
                  trainable: int | None = None) -> tuple[CheckpointPlan, ReliabilityPlan, DataFeedPlan]:
    """The checkpoint, reliability and data-feed plans of one layout's evaluation (``row_of``):
    ``estimate_at``'s, and its one refusal (PlannerError: an MTBF too short for the GPU count)."""
    return plan_operations(model, job, row.candidates.layout() if layout is None else layout, row.gpus,
                           float(row.time.step), float(row.train_seconds), float(row.tokens_per_s),
                           trainable_params(model, job) if trainable is None else trainable, ops)


def _comm_parts(t: TimeParts) -> dict[str, float]:
    """The exposed communication of a step by part, each a share of it (``warnings_for``)."""
    if not t.step_s > 0:
        return {}
    return {part: getattr(t, f"{part}_comm_s") / t.step_s for part in COMM_PARTS}


@by_identity  # a profile's and job's, once
def _async_tp_helps(hw: HardwareProfile, job: Job) -> bool:
    """Whether --async-tp would hide more of TP's collectives than this job does (its stack overlaps
    more with it, and the profile does not set the overlap itself)."""
    if job.async_tp:
        return False
    return async_tp_overlaps_more(hw, software(job).stack)


def estimate_at(ev: Evaluation, i: int, model: ModelSpec, hw: HardwareProfile, job: Job,
                ops: Operations = Operations(), searched: frozenset[str] = frozenset()) -> Estimate:
    """Row ``i`` of an evaluation as an Estimate. ``searched``: for a search's best, the layout
    fields the search chose (its warnings then know every other value of those ranked behind it:
    ``warnings_for``)."""
    layout = ev.candidates.layout(i)
    # The derived figures are computed for the whole table on each read: read from the row alone,
    # its columns scalars, listing a table stays linear and one estimate costs scalars' time.
    ev = row_of(ev, i)
    c, mem, t = ev.candidates, ev.memory, ev.time
    cap = ev.capacity_bytes
    fits = bool(ev.fits)
    tight = fits and bool(mem.total > cap * ev.fits_share)  # ``Evaluation.tight``
    total = float(mem.total)
    memory = MemoryParts(weights_bytes=float(mem.weights), gradients_bytes=float(mem.gradients),
                         optimizer_bytes=float(mem.optimizer), activations_bytes=float(mem.activations),
                         other_bytes=float(mem.other), total_bytes=total, capacity_bytes=cap,
                         fits=fits, peak_stage=int(mem.stage), host_bytes=float(mem.host),
                         torch_reserved_bytes=total - float(outside_allocator(hw, c)),
                         torch_allocated_bytes=float(allocated_bytes(mem)),
                         fit=FIT_VERDICTS[2] if not fits else FIT_VERDICTS[1] if tight else FIT_VERDICTS[0],
                         fits_below_bytes=cap * ev.fits_share, tight_below_bytes=cap * ev.tight_share,
                         safe_line_bytes=cap * ev.room_share)
    step = float(t.step)
    time = TimeParts(step_s=step, compute_s=float(t.compute), tp_comm_s=float(t.tp_comm), cp_comm_s=float(t.cp_comm),
                     ep_comm_s=float(t.ep_comm), pp_comm_s=float(t.pp_comm), dp_comm_s=float(t.dp_comm),
                     bubble_s=float(t.bubble), optimizer_s=float(t.optimizer), other_s=float(t.other))
    train_seconds, tokens_per_s = ev.train_seconds, float(ev.tokens_per_s)
    seconds = float(train_seconds)
    gpu_hours, energy_kwh, cost_usd = ev.totals(train_seconds)
    train = TrainTotals(tokens=ev.train_tokens, seconds=seconds, days=seconds / 86400, gpu_hours=float(gpu_hours),
                        energy_kwh=float(energy_kwh), cost_usd=float(cost_usd),
                        price_usd_per_gpu_hour=ev.price_usd_per_gpu_hour, pue=ev.pue,
                        evaluations=int(ev.evaluations), eval_seconds=float(ev.eval_seconds))
    stages = {}
    for sm in ev.stage_memory:  # first, fullest, last: the same stage may appear twice
        k = int(sm.stage)
        stages[k] = StageMemory(stage=k, weights_bytes=float(sm.weights), gradients_bytes=float(sm.gradients),
                                optimizer_bytes=float(sm.optimizer), activations_bytes=float(sm.activations),
                                other_bytes=float(sm.other), total_bytes=float(sm.total))
    bubble, comm = float(ev.bubble_fraction), float(ev.comm_fraction)
    trainable = trainable_params(model, job)
    # ``operations_at``, on the figures read above
    checkpoint, reliability, feed = plan_operations(model, job, layout, ev.gpus, step, seconds, tokens_per_s,
                                                    trainable, ops)
    warnings = warnings_for(comm_fraction=comm, bubble_fraction=bubble, total_bytes=total, capacity_bytes=cap,
                            pp=layout.pp, vpp=layout.vpp, grad_accum=layout.grad_accum, tp=layout.tp,
                            gpus_per_node=hw.network.gpus_per_node, feed=feed, reliability=reliability,
                            comm_parts=_comm_parts(time), ep=layout.ep,
                            gpu_bytes=hw.gpu.memory_bytes, measured_under=_measured_memory_under(model, layout, job, hw),
                            tight_bytes=memory.tight_below_bytes, searched=searched,
                            overlap_grad_reduce=job.overlap_grad_reduce, async_tp_helps=_async_tp_helps(hw, job))
    return Estimate(model=model, hardware=hw, gpus=ev.gpus, layout=layout, job=job, memory=memory, time=time,
                    bubble_fraction=bubble, comm_fraction=comm, tokens_per_s=tokens_per_s,
                    model_tflops_per_gpu=float(ev.model_flops_per_gpu) / 1e12, mfu=float(ev.mfu), hfu=float(ev.hfu),
                    train=train, warnings=tuple(warnings), stage_memory=tuple(stages[k] for k in sorted(stages)),
                    trainable_params=trainable, checkpoint=checkpoint, reliability=reliability, data_feed=feed)


# TimeParts holds StepTime's parts, each as <part>_s, and the step.
assert [f"{name}_s" for name in STEPTIME_FIELDS] == list(TimeParts.__slots__[1:]), TimeParts.__slots__
