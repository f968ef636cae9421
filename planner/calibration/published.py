"""Published measurements as planner inputs: Megatron-LM 2021 Table 1 (and rows like it).

A row gives the model shape, the layout, the GPU count and the achieved TFLOP/s per GPU; the
measured iteration time is eq. 3 FLOPs / (achieved FLOP/s x GPUs), as in the CSV.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from planner.core.flops import megatron_eq3_flops
from planner.core.layout import Job, Layout
from planner.core.limits import FLAGS
from planner.core.model import ModelSpec
from planner.errors import PlannerError
from planner.schema import Key, check_csv_row

REQUIRED = ("params_billion", "attention_heads", "hidden_size", "num_layers", "tensor_parallel",
            "pipeline_parallel", "num_gpus", "global_batch_size_seqs", "seq_len", "vocab_size",
            "micro_batch_size", "virtual_pipeline_stages", "achieved_tflops_per_gpu")
# Each number of a row, checked before use (planner/core/limits.py; the model and layout then check
# their own rules): integers in the flags' ranges, the achieved rate in (0, 1e6] TFLOP/s.
ROW_SPEC = {"params_billion": Key(float, 0, 1e6, lo_open=True),
            **{k: FLAGS[f] for k, f in (("attention_heads", "heads"), ("hidden_size", "hidden"),
                                        ("num_layers", "layers"), ("tensor_parallel", "tp"),
                                        ("pipeline_parallel", "pp"), ("num_gpus", "gpus"),
                                        ("global_batch_size_seqs", "global_batch"), ("seq_len", "seq_len"),
                                        ("vocab_size", "vocab"), ("micro_batch_size", "micro_batch"),
                                        ("virtual_pipeline_stages", "vpp"))},
            "achieved_tflops_per_gpu": Key(float, 1e-3, 1e6, unit="TFLOP/s")}


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRun:
    label: str
    model: ModelSpec
    layout: Layout
    job: Job
    gpus: int
    gpu: str
    measured_step_s: float
    measured_tflops_per_gpu: float


def megatron_job() -> Job:
    """How Megatron-LM ran in 2021: fp16 mixed precision, standard (unfused-softmax) attention
    without flash, gradient all-reduce after the backward pass (no overlap)."""
    return Job(precision="fp16", attention="standard", stack="megatron-2021")


def load_published(path: str | Path) -> list[PublishedRun]:
    path = Path(path)
    try:
        rows = list(csv.DictReader(path.read_text().splitlines()))
    except OSError as exc:
        raise PlannerError("published", str(path), f"cannot read ({exc.strerror})") from None
    if not rows:
        raise PlannerError("published", str(path), "no rows")
    missing = [k for k in REQUIRED if k not in rows[0]]
    if missing:
        raise PlannerError("published", str(path), f"missing columns: {', '.join(missing)}")
    runs = []
    for i, row in enumerate(rows, start=2):  # row 1 is the header
        row = {**row, **check_csv_row(row, ROW_SPEC, f"{path} row {i}"), "params_billion": row["params_billion"]}
        model = ModelSpec(name=f"gpt-{row['params_billion']}b", arch="gpt", layers=int(row["num_layers"]),
                          hidden=int(row["hidden_size"]), heads=int(row["attention_heads"]),
                          vocab=int(row["vocab_size"]), seq_len=int(row["seq_len"]))
        gpus, tp, pp = int(row["num_gpus"]), int(row["tensor_parallel"]), int(row["pipeline_parallel"])
        batch = int(row["global_batch_size_seqs"])
        layout = Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, vpp=int(row["virtual_pipeline_stages"]),
                        micro_batch=int(row["micro_batch_size"]), global_batch=batch, recompute="full")
        tflops = float(row["achieved_tflops_per_gpu"])
        step = megatron_eq3_flops(model, batch) / (tflops * 1e12 * gpus)
        runs.append(PublishedRun(label=f"{row['params_billion']}B", model=model, layout=layout, job=megatron_job(),
                                 gpus=gpus, gpu="a100-80g", measured_step_s=step, measured_tflops_per_gpu=tflops))
    return runs


# Narayanan et al. 2021 do not state (t, p) for the 175B PTD rows of Table 2 (model-parallel size
# 96); t = 8 inside a DGX node and p = 12 is the split their Table 1 uses for models of this size.
TABLE2_175B_SPLIT = (8, 12)


def load_table2(path: str | Path) -> tuple[list[PublishedRun], list[PublishedRun]]:
    """Table 2 of Narayanan et al. 2021 from megatron2021_other.csv: (PTD rows, ZeRO-3 rows).

    PTD rows run as Table 1 does (fp16, full recompute, no DP overlap); the ZeRO-3 rows are
    DeepSpeed ZeRO-3 without model parallelism (fp16, full recompute, reduction overlapped)."""
    shapes = {"174.6": ModelSpec(name="gpt-175b", arch="gpt", layers=96, hidden=12288, heads=96, vocab=51200,
                                 seq_len=2048),
              "529.6": ModelSpec(name="gpt-530b", arch="gpt", layers=105, hidden=20480, heads=128, vocab=51200,
                                 seq_len=2048)}
    ptd, zero = [], []
    for row in csv.DictReader(Path(path).read_text().splitlines()):
        scheme, size = row.get("scheme", ""), row.get("params_billion", "")
        if size not in shapes or not row.get("num_gpus", "").isdigit():
            continue
        model, gpus = shapes[size], int(row["num_gpus"])
        batch, mb, tflops = int(row["global_batch_size_seqs"]), int(row["micro_batch_size"]), \
            float(row["achieved_tflops_per_gpu"])
        if scheme.startswith("PTD"):
            tp, pp = ((int(row["tensor_parallel"]), int(row["pipeline_parallel"])) if row["tensor_parallel"]
                      else TABLE2_175B_SPLIT)
            layout = Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, micro_batch=mb, global_batch=batch, recompute="full")
            job, target = megatron_job(), ptd
        elif scheme.startswith("ZeRO-3"):
            layout = Layout(dp=gpus, micro_batch=mb, global_batch=batch, zero_stage=3, recompute="full")
            job, target = Job(precision="fp16", attention="standard", stack="deepspeed-zero"), zero
        else:
            continue
        step = megatron_eq3_flops(model, batch) / (tflops * 1e12 * gpus)
        target.append(PublishedRun(label=f"{size}B {scheme.split()[0]} {gpus}", model=model, layout=layout, job=job,
                                   gpus=gpus, gpu="a100-80g", measured_step_s=step, measured_tflops_per_gpu=tflops))
    return ptd, zero


# --- torchtitan's published benchmarks (FSDP2, TP, PP, CP; A100, H100, H200; bf16 and fp8) ------
# torchtitan's docs/performance.md names its 405B cards "H100 94GB"; the 2024 benchmark tables
# describe the same Grand Teton servers (96 GB HBM2e at 500 W). Both map to that profile.
TORCHTITAN_GPUS = {"a100-80g": "a100-80g", "h100-94g": "h100-96g-hbm2e", "h100-96g-hbm2e": "h100-96g-hbm2e",
                   "h200": "h200"}
# Activation checkpointing as torchtitan names it -> the layout's recompute. torchtitan's
# "selective" is op-level selective checkpointing by default ("op": the fsdp2 stack's "selective",
# planner/stacks.py), or every other layer fully checkpointed ("layer", selective_ac_option "2":
# the layout's "half").
TORCHTITAN_RECOMPUTE = {"none": "none", "full": "full", "selective": "selective", "selective op": "selective",
                        "selective layer": "half"}
TORCHTITAN_REQUIRED = ("model", "gpu", "num_gpus", "fsdp", "tp", "pp", "cp", "pp_schedule", "local_batch",
                       "global_batch", "seq_len", "activation_checkpointing", "precision", "torch_compile",
                       "async_tp", "tokens_per_s_per_gpu", "memory_gib_reported")


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchtitanRun:
    """One row of torchtitan_performance.csv as planner inputs and measured figures."""

    label: str
    model: ModelSpec
    layout: Layout
    job: Job
    gpus: int
    gpu: str
    cp: int
    measured_tokens_per_s_per_gpu: float
    measured_memory_bytes: float | None  # max over GPUs of torch's reserved memory, where reported
    async_tp: bool


TORCHTITAN_SPEC = {**{k: Key(int, 1, 1_000_000) for k in ("num_gpus", "fsdp", "tp", "pp", "cp", "local_batch",
                                                           "global_batch")},
                   "seq_len": Key(int, 1, 10_000_000),
                   "tokens_per_s_per_gpu": Key(float, 0, 1e9, lo_open=True, unit="tokens/s")}


# The torchtitan of each benchmark (software_stacks/): the December 2024 tables and the 2024 docs
# rows ran torch.compile per block with the loss eager (fsdp2-2024), the April 2024 A100 configs
# of Llama 2 13B and Llama 3 8B with the Triton RMSNorm (norm_type = "fused_rmsnorm"); the June
# 2025 H200 rows compile the loss too and still repeat K/V before SDPA (fsdp2-2025).
TORCHTITAN_TRITON_NORM = ("llama2-13b", "llama3-8b")


def torchtitan_stack(source: str, model: str) -> str:
    if "2025" in source:
        return "fsdp2-2025"
    if "A100" in source and model in TORCHTITAN_TRITON_NORM:
        return "fsdp2-2024-triton-norm"
    return "fsdp2-2024"


def _torchtitan_row(row: dict, where: str) -> TorchtitanRun | None:
    from planner.core.presets import get_preset
    from planner.units import GIB

    check_csv_row(row, TORCHTITAN_SPEC, where)  # every number finite and in range, one line otherwise
    mem = row.get("memory_gib_reported", "").strip()
    if mem:
        check_csv_row({"memory_gib_reported": mem}, {"memory_gib_reported": Key(float, 0, 1e5, lo_open=True)}, where)
    gpus, tp, pp, cp = (int(row[k]) for k in ("num_gpus", "tp", "pp", "cp"))
    seq, local, gbatch = int(row["seq_len"]), int(row["local_batch"]), int(row["global_batch"])
    dp = gpus // (tp * pp * cp)
    if dp * tp * pp * cp != gpus or gbatch != local * dp:
        raise PlannerError("published", where, f"fsdp/tp/pp/cp/local_batch do not multiply out: {row}")
    model = get_preset(row["model"]).replace(seq_len=seq)
    ac = row["activation_checkpointing"].split(" (")[0].strip()
    schedule = row["pp_schedule"].strip().lower()
    # torchtitan without pipelining runs the whole local batch in one forward. With pipelining its
    # interleaved 1F1B puts two stages on each rank (uneven when layers do not divide), and until
    # 2025 it split the local batch into as many micro-batches as there are pipeline ranks
    # (experimental.pipeline_parallel_microbatches defaulted to the pipeline degree).
    vpp = 2 if schedule.startswith("interleaved") else 1
    micro = local if pp == 1 else local // pp
    if pp > 1 and micro * pp != local:
        raise PlannerError("published", where, f"local_batch={local} does not split into pp={pp} micro-batches")
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch=micro, global_batch=gbatch,
                    zero_stage=3, recompute=TORCHTITAN_RECOMPUTE[ac], sequence_parallel=tp > 1)
    stack = torchtitan_stack(row["source"], row["model"])
    job = Job(precision=row["precision"], attention="flash", stack=stack,
              compile=row["torch_compile"].strip() == "yes", async_tp=row["async_tp"].strip() == "yes")
    label = (f"{row['model']} {row['gpu']} x{gpus} fsdp{dp} tp{tp} pp{pp}{' cp' + str(cp) if cp > 1 else ''}"
             f"{' interleaved' if vpp > 1 else ''} b{local} s{seq // 1024}K {ac} {row['precision']}"
             f"{' compile' if job.compile else ''}"
             f"{' async-tp' if row['async_tp'].strip() == 'yes' else ''}")
    return TorchtitanRun(label=label, model=model, layout=layout, job=job, gpus=gpus,
                         gpu=TORCHTITAN_GPUS[row["gpu"]], cp=cp,
                         measured_tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
                         measured_memory_bytes=float(mem) * GIB if mem else None,
                         async_tp=row["async_tp"].strip() == "yes")


def load_torchtitan(path: str | Path, with_cp: bool = False) -> list[TorchtitanRun]:
    """The rows of torchtitan_performance.csv (without context parallelism unless ``with_cp``)."""
    path = Path(path)
    try:
        rows = list(csv.DictReader(path.read_text().splitlines()))
    except OSError as exc:
        raise PlannerError("published", str(path), f"cannot read ({exc.strerror})") from None
    missing = [k for k in TORCHTITAN_REQUIRED if rows and k not in rows[0]]
    if not rows or missing:
        raise PlannerError("published", str(path), f"not torchtitan_performance.csv (missing {missing or 'rows'})")
    runs = [_torchtitan_row(r, f"{path}:{i + 2}") for i, r in enumerate(rows)]
    return [r for r in runs if r is not None and (with_cp or r.cp == 1)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    tokens_per_s_per_gpu: float
    memory_bytes: float
    mfu: float
    fits: bool


def predict_torchtitan(run: TorchtitanRun, hw=None) -> Prediction:
    """The planner's figures for one torchtitan row (``hw``: a profile to use instead of the row's)."""
    from planner.core.evaluate import evaluate
    from planner.core.layout import Candidates
    from planner.hardware import get_profile

    hw = hw or get_profile(run.gpu)
    from planner.core.memory import outside_allocator

    c = Candidates.from_layouts([run.layout])
    ev = evaluate(run.model, hw, run.job, c, run.gpus)
    # torchtitan logs torch's max reserved memory: the planner's total less what lies outside
    # torch's allocator (the CUDA context, NCCL buffers).
    reserved = float(ev.memory.total[0] - outside_allocator(hw, c)[0])
    return Prediction(tokens_per_s_per_gpu=float(ev.tokens_per_s[0]) / run.gpus, memory_bytes=reserved,
                      mfu=float(ev.mfu[0]), fits=bool(ev.fits[0]))
