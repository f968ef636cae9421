"""``export_plan``: what `planner export` and the explorer's Export tab both write for one mapping
of declared names (the CLI's parsed flags, or the explorer's state): planned for the stack the
format runs (unless one is given), the best fitting layout the format can express, refused when
it would run above ``MEMORY_LIMIT`` of GPU memory unless forced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.core.checks import ROOMY_SHARE
from planner.errors import PlannerError

if TYPE_CHECKING:
    from planner.core.results import Estimate

# Above this share of GPU memory, allocator retries slow real runs and spikes OOM them (the checks'
# "within 5% of capacity" warning, planner/core/checks.py): an export refuses unless forced.
MEMORY_LIMIT = ROOMY_SHARE


class ExportRefused(PlannerError):
    """The plan exists but is not written (nothing fits, or memory above ``MEMORY_LIMIT``): exit 3."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    text: str  # what `planner export` writes
    chosen: object  # the Estimate written: the best layout the format can express, on its stack
    stack: str
    note: str = ""  # why it is not the fastest layout, when it is not


def export_plan(values: Mapping[str, object], fmt: str, opts, force: bool = False) -> Export:
    """The export of ``fmt`` for these inputs. Raises PlannerError for bad input or a layout the
    format cannot express, ExportRefused when nothing fits or memory is above the limit."""
    from planner.core.evaluate import usable_memory
    from planner.core.options import build_inputs
    from planner.core.plan import nearest_fitting, searched_fields
    from planner.core.report import layout_line
    from planner.core.search import search
    from planner.export.formats import get_format, problems, render

    stack = str(values.get("stack") or get_format(fmt).stack)
    x = build_inputs({**values, "stack": stack})
    sort = str(values.get("sort") or "time")
    result = search(x.model, x.hardware, x.job, x.gpus, x.pins, sort)
    if not result.feasible:
        pinned = ", ".join(x.pins.pinned())
        near = nearest_fitting(x.model, x.hardware, x.job, x.gpus, x.pins, sort, x.ops) if pinned else None
        if near is not None:
            why = f"with the fields pinned ({pinned}); nearest that fits: {layout_line(near)}"
        else:
            need = float(result.memory.total.min()) / 2**30
            why = (f"the leanest layout needs {need:.1f} GiB per GPU of {usable_memory(x.hardware, x.job) / 2**30:.0f}; "
                   "more GPUs, a GPU with more memory, or a smaller model")
        raise ExportRefused("layout", pinned or "search", f"no layout fits on {x.gpus} x {x.hardware.name} on the "
                                                          f"{stack} stack: {why}")
    try:
        chosen, best = choose(fmt, result, x.model, x.hardware, x.job, x.ops, 1.0 if force else MEMORY_LIMIT,
                              searched_fields(x.pins))
    except PlannerError as exc:
        if exc.field == "memory":
            raise ExportRefused(exc.field, exc.value, exc.allowed) from None
        raise
    note = ""
    if chosen is not best:
        bad = problems(fmt, best)
        why = (f"cannot be written as {fmt}: {bad[0].field}={bad[0].value!r}" if bad else
               f"uses {best.memory.total_bytes / best.memory.capacity_bytes:.1%} of GPU memory (above "
               f"{MEMORY_LIMIT:.0%}; --force to write it)")
        note = (f"the fastest layout ({layout_line(best)}) {why}; "
                f"this one is {chosen.train.seconds / best.train.seconds - 1:.1%} slower")
    return Export(text=render(fmt, chosen, opts, note), chosen=chosen, stack=stack, note=note)


def choose(fmt: str, result, model, hw, job, ops=None, max_memory: float = 1.0,
           searched: frozenset[str] = frozenset()) -> tuple[Estimate, Estimate]:
    """(the best fitting layout ``fmt`` can express using at most ``max_memory`` of the GPU's memory,
    the best fitting layout overall). When none can be expressed, raises the problem every fitting
    layout shares (a pinned field, typically), else the best layout's first problem; when some can
    but only above ``max_memory``, raises a PlannerError on the field ``memory``. ``searched``: the
    layout fields the search chose (the best layout's warnings: ``estimate_at``)."""
    from planner.core.resilience import Operations
    from planner.core.results import estimate_at
    from planner.export.formats import layout_problems

    ops = ops or Operations()
    ev, order = result.partial_table, result.order  # rows looked up by rank, no step time read
    share = ev.memory.total / ev.capacity_bytes
    best = estimate_at(result.ranked([0]), 0, model, hw, job, ops, searched=searched)
    found: list[list[PlannerError]] = []
    above = None  # the table row of the best expressible layout above max_memory
    for i in range(result.feasible):  # in rank order; layouts only, estimates just for the winner
        row = int(order[i])
        bad = layout_problems(fmt, ev.candidates.layout(row), model, job, hw, ev.gpus)
        if bad:
            found.append(bad)
        elif share[row] > max_memory:
            above = row if above is None else above
        else:
            return (best if i == 0 else estimate_at(result.ranked([i]), 0, model, hw, job, ops)), best
    if above is not None:
        raise PlannerError("memory", f"{float(share[above]):.1%}",
                           f"at most {max_memory:.0%} of the GPU's memory for an export: every layout {fmt} can "
                           f"express uses more ({float(ev.memory.total[above]) / 2**30:.1f} of "
                           f"{ev.capacity_bytes / 2**30:.0f} GiB at best); pin a smaller --micro-batch, --recompute "
                           "or a higher --zero, or --force to write it anyway")
    shared = set.intersection(*({p.field for p in bad} for bad in found))
    exc = next((p for p in found[0] if p.field in shared), found[0][0])
    raise PlannerError(exc.field, exc.value, f"{exc.allowed} (none of the {result.feasible} fitting layouts "
                                             f"can be expressed as {fmt})")
