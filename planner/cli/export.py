"""`planner export`: plan (the same flags as estimate), then write the chosen layout as a launch
config: torchrun + run config, Megatron-LM arguments, DeepSpeed JSON, torchtitan TOML, Slurm
script, PyTorchJob.
The work is planner.export.plan.export_plan, which the explorer's Export tab calls too."""

from __future__ import annotations

import argparse
import sys

from planner.cli import inputs
from planner.errors import PlannerError

EXIT_DOES_NOT_FIT = 3


def add_parser(sub) -> None:
    from planner.export.formats import FORMATS

    p = sub.add_parser("export", help="plan, then write the layout as torchrun/Megatron/DeepSpeed/torchtitan/Slurm/k8s config")
    inputs.add_plan_args(p)
    p.add_argument("--format", choices=FORMATS, required=True,
                   help="what to write (to standard output): torchrun (reference trainer + run config), megatron "
                        "(pretrain_gpt.py arguments, incl. --context-parallel-size, --expert-model-parallel-size, "
                        "--num-experts, --optimizer-cpu-offload), deepspeed (JSON, incl. offload_optimizer/"
                        "offload_param), torchtitan (TOML job config: FSDP2/TP/PP/CP/EP, float8, compile), slurm, k8s")
    p.add_argument("--sort", choices=("time", "cost", "memory"), default="time", help="ranking objective")
    p.add_argument("--steps", type=int, help="optimizer steps (default: the plan's tokens / tokens per step)")
    p.add_argument("--run-name", help="run and job name (default: <model>-<gpus>x<gpu>)")
    p.add_argument("--image", default="reference-trainer:latest", help="k8s: container image with this repository")
    p.add_argument("--config-path", default="run.yaml", help="torchrun/slurm: where the script writes the run config")
    p.add_argument("--force", action="store_true",
                   help="write a layout above 95%% of GPU memory anyway (refused otherwise, exit 3)")
    p.set_defaults(func=run, stack=None)  # None: the stack the format runs (planner/export/formats.py)


def run(a: argparse.Namespace) -> int:
    from planner.export.plan import ExportRefused, export_plan
    from planner.export.render import ExportOptions

    if a.steps is not None and a.steps < 1:
        raise PlannerError("steps", a.steps, "a positive integer")
    opts = ExportOptions(steps=a.steps, run_name=a.run_name, image=a.image, config_path=a.config_path,
                         keep_last=a.keep_last)
    try:
        out = export_plan(vars(a), a.format, opts, force=a.force)
    except ExportRefused as exc:
        print(f"planner export: {exc}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    if out.note:
        print(f"planner export: note: {out.note}", file=sys.stderr)
    sys.stdout.write(out.text)
    return 0
