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
from planner.core.model import ModelSpec
from planner.errors import PlannerError

REQUIRED = ("params_billion", "attention_heads", "hidden_size", "num_layers", "tensor_parallel",
            "pipeline_parallel", "num_gpus", "global_batch_size_seqs", "seq_len", "vocab_size",
            "micro_batch_size", "virtual_pipeline_stages", "achieved_tflops_per_gpu")


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
    return Job(precision="fp16", attention="standard", overlap_grad_reduce=False)


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
    for row in rows:
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
            job, target = Job(precision="fp16", attention="standard"), zero
        else:
            continue
        step = megatron_eq3_flops(model, batch) / (tflops * 1e12 * gpus)
        target.append(PublishedRun(label=f"{size}B {scheme.split()[0]} {gpus}", model=model, layout=layout, job=job,
                                   gpus=gpus, gpu="a100-80g", measured_step_s=step, measured_tflops_per_gpu=tflops))
    return ptd, zero
