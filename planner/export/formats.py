"""The export formats, one registry entry each: how it renders, what it cannot express, the file's
language, the software stack it runs (the plan is made for that stack unless --stack is given).

A new format is one entry here (plus its renderer and checks); `planner export --format`, the
explorer's Export tab and ``export_plan`` (planner/export/plan.py) all read this registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.errors import PlannerError


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportFormat:
    name: str
    help: str
    render: Callable  # (Estimate, ExportOptions, note) -> text
    checks: Callable  # (layout, model, job, hardware) -> [PlannerError]: what this format cannot express
    language: str  # of the file written (for highlighting): bash, json, toml, yaml
    stack: str  # software_stacks/<stack>.toml: what this format runs


def _registry() -> dict[str, ExportFormat]:
    from planner.export import render as r
    from planner.export import rules

    entries = (
        ExportFormat(name="torchrun", help="the reference trainer under torchrun, with its run config",
                     render=r.torchrun_script, checks=rules.trainer_checks, language="bash", stack="reference"),
        ExportFormat(name="megatron", help="Megatron-LM pretrain_gpt.py arguments (Megatron-Core)",
                     render=r.megatron_script, checks=rules.megatron_checks, language="bash", stack="megatron-core"),
        ExportFormat(name="deepspeed", help="a DeepSpeed JSON config (ZeRO stage, batch, precision, optimizer)",
                     render=r.deepspeed_json, checks=rules.deepspeed_checks, language="json",
                     stack="deepspeed-zero"),
        ExportFormat(name="torchtitan", help="a torchtitan TOML job config (FSDP2, TP, PP, CP, EP, float8, compile)",
                     render=r.torchtitan_toml, checks=rules.torchtitan_checks, language="toml", stack="fsdp2"),
        ExportFormat(name="slurm", help="an sbatch script starting the reference trainer on every node",
                     render=r.slurm_script, checks=rules.trainer_checks, language="bash", stack="reference"),
        ExportFormat(name="k8s", help="a Kubeflow PyTorchJob manifest for the reference trainer",
                     render=r.k8s_manifest, checks=rules.trainer_checks, language="yaml", stack="reference"),
    )
    return {e.name: e for e in entries}


FORMATS: tuple[str, ...] = ("torchrun", "megatron", "deepspeed", "torchtitan", "slurm", "k8s")  # the registry's names, in order


def formats() -> dict[str, ExportFormat]:
    """The registry (built on first use: the renderers are imported only when something exports)."""
    global _FORMATS
    if _FORMATS is None:
        _FORMATS = _registry()
        assert tuple(_FORMATS) == FORMATS
    return _FORMATS


_FORMATS: dict[str, ExportFormat] | None = None


def get_format(name: str) -> ExportFormat:
    table = formats()
    if name not in table:
        raise PlannerError("format", name, f"one of {', '.join(table)}")
    return table[name]


def layout_problems(fmt: str, lay, m, job, hw, gpus: int) -> list:
    """Every field of a layout that ``fmt`` cannot express (errors naming the field; empty: it can)."""
    from planner.export.rules import common_problems

    return common_problems(fmt, lay, job, hw, gpus) + get_format(fmt).checks(lay, m, job, hw)


def problems(fmt: str, e) -> list:
    """Every field of an Estimate that ``fmt`` cannot express."""
    return layout_problems(fmt, e.layout, e.model, e.job, e.hardware, e.gpus)


def render(fmt: str, e, opts=None, note: str = "") -> str:
    """``e`` in format ``fmt``. Raises the first thing the format cannot express."""
    from planner.export.render import ExportOptions

    bad = problems(fmt, e)
    if bad:
        raise bad[0]
    return get_format(fmt).render(e, opts or ExportOptions(), note)
