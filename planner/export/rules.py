"""What each export format can express of a layout, and the best layout a format can express.

`planner export --format megatron` must never write a ZeRO-3 layout Megatron-LM cannot run:
``layout_problems`` lists every field a format cannot express (as errors naming the field), and
``choose`` walks a search's fitting layouts in rank order to the first one without problems.
"""

from __future__ import annotations

from planner.core.results import Estimate
from planner.errors import PlannerError

FORMATS = ("torchrun", "megatron", "deepspeed", "slurm", "k8s")
TRAINER_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # reference_trainer/config.py: no fp8 path
# The software stack each format runs (software_stacks/*.toml): the plan is made for it unless --stack is given.
FORMAT_STACKS = {"torchrun": "reference", "slurm": "reference", "k8s": "reference", "megatron": "megatron-core",
                 "deepspeed": "deepspeed-zero"}


def node_split(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node): torchrun, Slurm and Kubernetes start the same number on every node."""
    nodes = -(-gpus // gpus_per_node)
    if gpus % nodes:
        raise PlannerError("gpus", gpus, f"cannot be spread evenly over nodes of {gpus_per_node} GPUs "
                                         f"({nodes} nodes); choose a multiple of {gpus_per_node} or fewer GPUs")
    return nodes, gpus // nodes


def problems(fmt: str, e: Estimate) -> list[PlannerError]:
    """Every field of ``e`` that ``fmt`` cannot express, as errors naming the field (empty: it can)."""
    return layout_problems(fmt, e.layout, e.model, e.job, e.hardware, e.gpus)


def layout_problems(fmt: str, lay, m, job, hw, gpus: int) -> list[PlannerError]:
    prec = job.precision
    out: list[PlannerError] = []

    def no(field: str, value: object, why: str) -> None:
        out.append(PlannerError(field, value, why))

    if job.mode == "lora":
        no("mode", "lora", f"a {fmt} export trains every parameter; LoRA adapters are set in the training code "
                           "(e.g. PEFT), so export the layout of --mode full-finetune or pretrain instead")
    if fmt != "deepspeed":
        try:
            node_split(gpus, hw.network.gpus_per_node)
        except PlannerError as exc:
            out.append(exc)
    if fmt in ("torchrun", "slurm", "k8s"):  # the reference trainer's rules (reference_trainer/config.py)
        if prec not in TRAINER_PRECISIONS:
            no("precision", prec, f"the reference trainer runs {', '.join(TRAINER_PRECISIONS)}; use "
                                  "--precision bf16, or --format megatron for FP8 with Transformer Engine")
        for name in ("ffn_hidden", "vocab"):
            if getattr(m, name) % lay.tp:
                no("tp", lay.tp, f"the reference trainer needs tp to divide {name}={getattr(m, name)}")
        if lay.sequence_parallel and m.seq_len % lay.tp:
            no("sequence_parallel", True, f"the reference trainer needs tp={lay.tp} to divide seq_len={m.seq_len}")
        if lay.pp > 1 and lay.vpp == 1 and lay.schedule == "1f1b" and lay.grad_accum < lay.pp:
            no("grad_accum", lay.grad_accum, f"the reference trainer's 1F1B needs micro-batches per step >= "
                                             f"pp={lay.pp}; raise --global-batch or use --schedule gpipe")
    elif fmt == "megatron":
        if lay.zero_stage > 1:
            no("zero_stage", lay.zero_stage, "Megatron-LM expresses ZeRO-0 (DDP) and ZeRO-1 "
                                             "(--use-distributed-optimizer) only; pin --zero 0 or 1, or use "
                                             "--format deepspeed")
        if lay.pp > 1 and lay.schedule == "gpipe":
            no("schedule", "gpipe", "Megatron-LM runs 1F1B (interleaved when vpp > 1), not GPipe")
        if lay.pp > 1 and m.layers % lay.pp:
            no("pp", lay.pp, f"Megatron-LM splits layers={m.layers} evenly over pipeline stages; the planner "
                             f"gives the {m.layers % lay.pp} extra layers to middle stages, which it cannot express; "
                             f"pin --pp to a divisor of {m.layers}")
        if prec == "tf32":
            no("precision", prec, "Megatron-LM has no TF32 switch; use fp32, bf16, fp16 or fp8")
    elif fmt == "deepspeed":
        if lay.tp > 1:
            no("tp", lay.tp, "a DeepSpeed config cannot express tensor parallelism (Megatron-DeepSpeed sets it "
                             "with --tensor-model-parallel-size); pin --tp 1 or use --format megatron")
        if lay.pp > 1:
            no("pp", lay.pp, "a DeepSpeed config has no pipeline degree (DeepSpeed's PipelineModule takes "
                             "num_stages in code); pin --pp 1 or use --format megatron")
        if lay.recompute == "selective":
            no("recompute", "selective", "DeepSpeed's activation checkpointing is per layer (full); "
                                         "pin --recompute full or none")
        if prec in ("tf32", "fp8"):
            no("precision", prec, "a DeepSpeed config enables fp16 or bf16 (else fp32); use fp32, bf16 or fp16")
    else:
        raise PlannerError("format", fmt, f"one of {', '.join(FORMATS)}")
    return out


def choose(fmt: str, result, model, hw, job, ops=None) -> tuple[Estimate, Estimate]:
    """(the best fitting layout ``fmt`` can express, the best fitting layout overall). When none
    can be expressed, raises the problem every fitting layout shares (a pinned field, typically),
    else the best layout's first problem."""
    from planner.core.resilience import Operations
    from planner.core.results import estimate_at

    ops = ops or Operations()
    ev = result.evaluation
    best = estimate_at(ev, 0, model, hw, job, ops)
    if not problems(fmt, best):
        return best, best
    found: list[list[PlannerError]] = []
    for i in range(result.feasible):  # in rank order; layouts only, estimates just for the winner
        bad = layout_problems(fmt, ev.candidates.layout(i), model, job, hw, result.evaluation.gpus)
        if not bad:
            return estimate_at(ev, i, model, hw, job, ops), best
        found.append(bad)
    shared = set.intersection(*({p.field for p in bad} for bad in found))
    exc = next((p for p in found[0] if p.field in shared), found[0][0])
    raise PlannerError(exc.field, exc.value, f"{exc.allowed} (none of the {result.feasible} fitting layouts "
                                             f"can be expressed as {fmt})")
