"""`planner export`: plan (the same flags as estimate), then write the chosen layout as a launch
config: torchrun + run config, Megatron-LM arguments, DeepSpeed JSON, Slurm script, PyTorchJob."""

from __future__ import annotations

import argparse
import sys

from planner.cli import inputs
from planner.errors import PlannerError

EXIT_DOES_NOT_FIT = 3


def add_parser(sub) -> None:
    from planner.export.rules import FORMATS

    p = sub.add_parser("export", help="plan, then write the layout as torchrun/Megatron/DeepSpeed/Slurm/k8s config")
    inputs.add_plan_args(p)
    p.add_argument("--format", choices=FORMATS, required=True, help="what to write (to standard output)")
    p.add_argument("--sort", choices=("time", "cost", "memory"), default="time", help="ranking objective")
    p.add_argument("--steps", type=int, help="optimizer steps (default: the plan's tokens / tokens per step)")
    p.add_argument("--run-name", help="run and job name (default: <model>-<gpus>x<gpu>)")
    p.add_argument("--image", default="reference-trainer:latest", help="k8s: container image with this repository")
    p.add_argument("--config-path", default="run.yaml", help="torchrun/slurm: where the script writes the run config")
    p.set_defaults(func=run, stack=None)  # None: the stack the format runs (FORMAT_STACKS)


def run(a: argparse.Namespace) -> int:
    from planner.core.plan import nearest_fitting
    from planner.core.report import layout_line
    from planner.core.search import search
    from planner.export.render import ExportOptions, render
    from planner.export.rules import choose

    if a.steps is not None and a.steps < 1:
        raise PlannerError("steps", a.steps, "a positive integer")
    if a.stack is None:
        from planner.export.rules import FORMAT_STACKS

        a.stack = FORMAT_STACKS[a.format]
    x = inputs.inputs_from_args(a)
    result = search(x.model, x.hardware, x.job, x.gpus, x.pins, a.sort)
    if not result.feasible:
        pinned = ", ".join(x.pins.pinned())
        near = nearest_fitting(x.model, x.hardware, x.job, x.gpus, x.pins, a.sort, x.ops) if pinned else None
        if near is not None:
            why = f"with the fields pinned ({pinned}); nearest that fits: {layout_line(near)}"
        else:
            need = float(result.evaluation.memory.total.min()) / 2**30
            why = (f"the leanest layout needs {need:.1f} GiB per GPU of {x.hardware.gpu.memory_bytes / 2**30:.0f}; "
                   "more GPUs, a GPU with more memory, or a smaller model")
        print(f"planner export: no layout fits on {x.gpus} x {x.hardware.name}: {why}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    chosen, best = choose(a.format, result, x.model, x.hardware, x.job, x.ops)
    note = ""
    if chosen is not best:
        slower = chosen.train.seconds / best.train.seconds - 1
        note = (f"the fastest layout ({layout_line(best)}) cannot be written as {a.format}: "
                f"{best_problem(a.format, best)}; this one is {slower:.1%} slower")
        print(f"planner export: note: {note}", file=sys.stderr)
    opts = ExportOptions(steps=a.steps, run_name=a.run_name, image=a.image, config_path=a.config_path,
                         keep_last=a.keep_last)
    sys.stdout.write(render(a.format, chosen, opts, note))
    return 0


def best_problem(fmt: str, e) -> str:
    from planner.export.rules import problems

    p = problems(fmt, e)[0]
    return f"{p.field}={p.value!r}"
