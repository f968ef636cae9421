"""Command-line flags -> the three inputs (model, hardware, job), the layout pins and operations.

The job, operations and layout flags are derived from their declarations (``Job``'s options,
``OPS_OPTIONS``, ``PIN_DIMS``): each flag's destination is the declared name, so the parsed
arguments are already the mapping that ``planner.core.options.build_inputs`` reads, the same
builder the explorer calls. Shared by every subcommand that plans (estimate, search, compare,
recommend, export).
"""

from __future__ import annotations

import argparse

from planner.core.layout import JOB_OPTIONS, PIN_DIMS, Job, Option
from planner.core.model import ARCHS, ModelSpec
from planner.core.options import (
    DEFAULT_GPU,
    DEFAULT_GPUS,
    GPU_DEFAULTED,
    HF_MODEL_TYPES,
    HF_TEXT_CONFIG,
    HW_OVERRIDES,
    OPS_OPTIONS,
    SHAPE_HELP,
    SHAPE_KEYS,
    Inputs,
    build_inputs,
    hardware_from,
    job_from,
    model_from,
    ops_from,
    pins_from,
)
from planner.core.resilience import Operations
from planner.core.search import Pins
from planner.hardware import HardwareProfile

__all__ = ["DEFAULT_GPU", "Inputs", "add_plan_args", "inputs_from_args"]
_NUMBERS = {"int": int, "float": float}


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (one of --preset, --params, --hf-config, or a shape; shape flags override)")
    g.add_argument("--preset", help="a model preset (`planner presets` lists them)")
    g.add_argument("--params", help="parameter count, e.g. 33B, 1T: the nearest preset or a LLaMA-style shape")
    g.add_argument("--hf-config", metavar="PATH",
                   help=f"a Hugging Face config.json, the model's folder holding it, or a Hub id (org/name) in the "
                   f"local Hugging Face cache (model_type {', '.join(HF_MODEL_TYPES)}; the text_config of "
                   f"{', '.join(HF_TEXT_CONFIG)})")
    g.add_argument("--arch", choices=ARCHS, help="gpt (LayerNorm, GELU, learned positions, tied) or llama")
    for key in SHAPE_KEYS[1:]:
        g.add_argument("--" + key.replace("_", "-"), type=int, help=SHAPE_HELP.get(key))


def add_hardware_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    g = p.add_argument_group("hardware")
    if many:
        g.add_argument("--gpu", default=DEFAULT_GPU, help="profile names or files, comma-separated")
        g.add_argument("--gpus", default=str(DEFAULT_GPUS), help="GPU counts, comma-separated, e.g. 64,128,256")
    else:
        g.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU profile name or file (default {DEFAULT_GPU})")
        g.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help=f"number of GPUs (default {DEFAULT_GPUS})")
    g.add_argument("--gpus-per-node", type=int, help="override the profile's GPUs per node")
    if not many:  # custom hardware without editing a file: any profile's figures, overridden
        for name, what in HW_OVERRIDES.items():
            g.add_argument("--" + name.replace("_", "-"), type=float, help=f"override: {what}")


def add_option(g, o: Option) -> None:
    """One declared option as a flag whose destination is the option's name. A boolean that is on
    by default is a --no-... flag; text stays text (the builder parses counts and lists)."""
    kw: dict = {"dest": o.name, "help": o.help}
    if o.repeat:
        kw["action"], kw["default"], kw["metavar"] = "append", None, "KEY=VALUE"
    elif o.base_type == "bool":
        kw["action"] = "store_false" if o.default else "store_true"
        kw["default"] = o.default
    else:
        if o.base_type in _NUMBERS and not o.count:
            kw["type"] = _NUMBERS[o.base_type]
        if o.choices:
            kw["choices"] = o.choices
        kw["default"] = o.default if not isinstance(o.default, tuple) else ",".join(o.default)
        if o.name in GPU_DEFAULTED:  # None: left alone, the GPU's default (planner.core.options.fit_job_to_gpu)
            kw["default"] = None
    g.add_argument(o.cli_flag, **kw)


def add_job_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    for o in JOB_OPTIONS:
        add_option(g, o)
    g = p.add_argument_group("operations (failures, checkpoints, storage, data)")
    for o in OPS_OPTIONS:
        add_option(g, o)


def add_layout_args(p: argparse.ArgumentParser) -> None:
    """One flag per pinnable layout dimension (``PIN_DIMS``); not given: searched."""
    g = p.add_argument_group("layout (fields not given are searched)")
    for d in PIN_DIMS:
        flags, kwargs = d.argparse_spec()
        g.add_argument(*flags, **kwargs)


def add_plan_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_hardware_args(p)
    add_job_args(p)
    add_layout_args(p)


def model_from_args(a: argparse.Namespace) -> tuple[ModelSpec, str]:
    return model_from(vars(a))


def hardware_from_args(name: str, gpus_per_node: int | None) -> HardwareProfile:
    return hardware_from(name, gpus_per_node)[0]


def job_from_args(a: argparse.Namespace) -> Job:
    return job_from(vars(a))


def ops_from_args(a: argparse.Namespace, gpus_per_host: int) -> Operations:
    return ops_from(vars(a), gpus_per_host)


def pins_from_args(a: argparse.Namespace) -> Pins:
    return pins_from(vars(a))


def inputs_from_args(a: argparse.Namespace) -> Inputs:
    """The parsed flags are the mapping of declared names: the same builder as the explorer's."""
    return build_inputs(vars(a))
