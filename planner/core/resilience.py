"""The whole job, not only the step: checkpoints, failures, goodput, and the data feed.

Failures follow an exponential law with the job's MTBF (per-GPU MTBF / GPUs). The checkpoint
interval is Young/Daly's optimum and the expected wall-clock time Daly's (2006) model, which
counts checkpoint saves, work lost at each failure, and restarts (reschedule + reload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.core.layout import Job, Layout
from planner.core.memory import OPTIMIZER_BYTES, WEIGHT_BYTES, state_bytes
from planner.core.model import ModelSpec
from planner.errors import PlannerError, require
from planner.memo import fast_init
from planner.stacks import software

# Llama 3 (Llama Team 2024, Sec. 3.3.4): 419 unexpected interruptions in a 54-day snapshot on
# 16,384 H100 GPUs -> 16384 * 54 * 24 / 419 = 50,677 GPU-hours between failures.
LLAMA3_MTBF_GPU_HOURS = 16384 * 54 * 24 / 419
# A job whose expected wall-clock time exceeds this multiple of its failure-free time (goodput
# under 0.1%) never finishes in practice: it is refused with the reason, not printed as "1e30 days".
MAX_SLOWDOWN = 1e3
_LOG_MAX_FLOAT = math.log(1.7e308)


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Operations:
    """How the job lives on a real cluster: failures, restarts, storage and checkpoints."""

    mtbf_gpu_hours: float = LLAMA3_MTBF_GPU_HOURS  # math.inf: no failures
    restart_s: float = 600.0  # detect, reschedule, re-initialise (before the checkpoint load); an assumption
    storage_write_bytes_per_s: float = 20e9  # aggregate, to the checkpoint file system; an assumption
    storage_read_bytes_per_s: float = 20e9  # aggregate, for checkpoint loads and the training data
    keep_last: int = 3  # checkpoints kept: the newest and two to fall back on if it is bad (an assumption)
    checkpoint_interval_steps: int | None = None  # None: the Young/Daly optimum
    epochs: float = 1.0  # passes over the dataset
    token_bytes: int | None = None  # None: 2 (uint16) when the vocabulary fits, else 4 (uint32)
    # samples in flight per loader worker = micro-batch x 4 (an assumption, twice torch.utils.data.DataLoader's
    # default prefetch_factor of 2 batches)
    prefetch_factor: int = 4

    def __post_init__(self) -> None:
        # The flags' ranges (planner/core/limits.py FLAGS), in base units: every product below stays finite.
        require(self.mtbf_gpu_hours > 0, "mtbf", self.mtbf_gpu_hours, "greater than zero hours (inf: no failures)")
        require(0 <= self.restart_s <= 1e5 * 60, "restart", self.restart_s, "from 0 to 6e6 seconds")
        for name in ("storage_write_bytes_per_s", "storage_read_bytes_per_s"):
            value = getattr(self, name)
            require(1e3 <= value <= 1e15, name, value, "from 1e3 to 1e15 bytes/s (1e-6 to 1e6 GB/s)")
        require(1 <= self.keep_last <= 10**4, "keep_last", self.keep_last, "from 1 to 10,000")
        require(self.checkpoint_interval_steps is None or 1 <= self.checkpoint_interval_steps <= 10**9,
                "checkpoint_interval", self.checkpoint_interval_steps, "from 1 to 1e9 steps")
        require(1e-3 <= self.epochs <= 1e6, "epochs", self.epochs, "in [0.001, 1e6]")
        require(self.token_bytes in (None, 1, 2, 4, 8), "token_bytes", self.token_bytes, "1, 2, 4 or 8")
        require(self.prefetch_factor >= 1, "prefetch_factor", self.prefetch_factor, "at least 1")


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointPlan:
    bytes_total: float  # one checkpoint, all ranks
    bytes_per_gpu: float  # the largest shard a rank writes
    storage_bytes: float  # keep_last checkpoints
    save_s: float
    load_s: float
    interval_steps: int | None  # None: no failures, nothing to checkpoint against
    interval_s: float | None


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class ReliabilityPlan:
    mtbf_job_hours: float
    expected_interruptions: float
    ideal_seconds: float
    expected_seconds: float
    checkpoint_overhead_s: float  # time spent saving
    failure_overhead_s: float  # lost work and restarts
    goodput: float  # ideal / expected, in (0, 1]


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class DataFeedPlan:
    token_bytes: int
    bytes_per_s: float  # what the cluster consumes from storage
    dataset_bytes: float  # unique tokens on disk: planned tokens / epochs
    prefetch_samples_per_rank: int
    prefetch_bytes_per_rank: float
    storage_read_bytes_per_s: float
    keeps_up: bool


def checkpoint_bytes(model: ModelSpec, job: Job, layout: Layout, trainable: int) -> tuple[float, float]:
    """(total, largest per-GPU shard): 16-bit weights plus fp32 master and AdamW states of what
    trains (14 bytes per trained parameter in mixed precision, 12 in fp32); where the fp32
    parameters are the master (FSDP2: planner.core.memory.param_master), those and the AdamW
    moments (12). Under LoRA only the adapters and their states are saved; the frozen base model
    is already on disk."""
    weights, _, states = state_bytes(job, software(job))
    if job.lora or layout.offload != "none":  # the separate count (planner.core.memory.memory alike)
        weights, states = WEIGHT_BYTES[job.precision], OPTIMIZER_BYTES[job.precision]
    weights = min(weights, 4)
    saved = trainable
    total = saved * (weights + states)
    model_parallel = layout.tp * layout.pp
    per_gpu = (saved * weights / (model_parallel * (layout.dp if layout.zero_stage >= 3 else 1))
               + saved * states / (model_parallel * (layout.dp if layout.zero_stage >= 1 else 1)))
    return float(total), float(per_gpu)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Optimal compute time between checkpoints (Daly 2006, eq. 37): for save time d < 2M,
    sqrt(2dM) * (1 + sqrt(d/(2M))/3 + (d/(2M))/9) - d; else M. Young (1974): sqrt(2dM)."""
    if math.isinf(mtbf_s):
        return math.inf
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def expected_wall_seconds(ideal_s: float, interval_s: float, save_s: float, restart_s: float,
                          mtbf_s: float) -> float:
    """Daly 2006, eq. 20: T = M e^{R/M} (e^{(tau+d)/M} - 1) T_s / tau, exponential failures.
    No failures: T_s (1 + d/tau); no failures and no checkpoints: T_s exactly."""
    if ideal_s <= 0:
        return 0.0
    if math.isinf(mtbf_s):
        return ideal_s if math.isinf(interval_s) else ideal_s * (1 + save_s / interval_s)
    # In logarithms, so that a short MTBF gives a huge but exact figure instead of an
    # OverflowError: log(e^x - 1) = x + log(1 - e^-x), exact for every x > 0.
    x = (interval_s + save_s) / mtbf_s
    log_t = (math.log(mtbf_s) + restart_s / mtbf_s + x + math.log(-math.expm1(-x))
             + math.log(ideal_s) - math.log(interval_s))
    return math.exp(log_t) if log_t < _LOG_MAX_FLOAT else math.inf


def plan_operations(model: ModelSpec, job: Job, layout: Layout, gpus: int, step_s: float, ideal_s: float,
                    tokens_per_s: float, trainable: int, ops: Operations) -> tuple[CheckpointPlan, ReliabilityPlan,
                                                                                   DataFeedPlan]:
    total, per_gpu = checkpoint_bytes(model, job, layout, trainable)
    save = total / ops.storage_write_bytes_per_s
    load = total / ops.storage_read_bytes_per_s
    mtbf = ops.mtbf_gpu_hours * 3600 / gpus
    if ops.checkpoint_interval_steps is not None:
        steps: int | None = ops.checkpoint_interval_steps
        interval = steps * step_s
    else:
        interval = daly_interval(save, mtbf)
        steps = None if math.isinf(interval) else max(1, round(interval / step_s))
        interval = math.inf if steps is None else steps * step_s
    expected = expected_wall_seconds(ideal_s, interval, save, ops.restart_s + load, mtbf)
    if not expected <= ideal_s * MAX_SLOWDOWN:
        raise PlannerError("mtbf_gpu_hours", ops.mtbf_gpu_hours,
                           f"too short for {gpus:,} GPUs: a failure every {mtbf:.3g} s job-wide against "
                           f"{ops.restart_s + load:.3g} s to restart and reload and {save:.3g} s to save; the job "
                           f"would take over {MAX_SLOWDOWN:g}x its failure-free time (goodput < "
                           f"{1 / MAX_SLOWDOWN:.1%}): raise it, use fewer GPUs or faster storage")
    ckpt_overhead = 0.0 if math.isinf(interval) else ideal_s * save / interval
    checkpoint = CheckpointPlan(bytes_total=total, bytes_per_gpu=per_gpu, storage_bytes=total * ops.keep_last,
                                save_s=save, load_s=load, interval_steps=steps,
                                interval_s=None if math.isinf(interval) else interval)
    reliability = ReliabilityPlan(mtbf_job_hours=mtbf / 3600, expected_interruptions=expected / mtbf,
                                  ideal_seconds=ideal_s, expected_seconds=expected,
                                  checkpoint_overhead_s=ckpt_overhead,
                                  failure_overhead_s=expected - ideal_s - ckpt_overhead, goodput=ideal_s / expected)
    width = ops.token_bytes or (2 if model.vocab <= 2**16 else 4)
    need = tokens_per_s * width * job.packing_efficiency
    samples = layout.micro_batch * ops.prefetch_factor
    feed = DataFeedPlan(token_bytes=width, bytes_per_s=need,
                        dataset_bytes=job.train_tokens(model) / ops.epochs * width,
                        prefetch_samples_per_rank=samples, prefetch_bytes_per_rank=samples * model.seq_len * width,
                        storage_read_bytes_per_s=ops.storage_read_bytes_per_s,
                        keeps_up=need <= ops.storage_read_bytes_per_s)
    return checkpoint, reliability, feed
