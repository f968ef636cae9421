"""The answer to 'how should I train this, will it fit, how long': the best layout and its runners-up.

``plan`` evaluates one table (every layout of the free search plus the pinned values) and selects
from it the layouts with the user's pins; when those do not fit, it also finds the nearest layout
that does (fewest pinned fields changed, then fastest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.layout import DIMS, Job
from planner.core.model import ModelSpec
from planner.core.resilience import Operations
from planner.core.results import Estimate, estimate_at
from planner.core.search import Pins, SearchResult, enumerate_layouts, matches, search, searched_by_default, select
from planner.errors import PlannerError
from planner.hardware import HardwareProfile


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    best: Estimate
    runners_up: tuple[Estimate, ...]
    result: SearchResult
    nearest_fit: Estimate | None = None  # when ``best`` does not fit
    pinned: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.best.fits

    def to_json(self, model_note: str = "") -> dict:
        """`planner estimate --format json`: the best estimate, how the model was chosen, the nearest fit."""
        return plan_json(self.best, model_note, self.nearest_fit)


def plan_json(best: Estimate, model_note: str, nearest_fit: Estimate | None) -> dict:
    return {**best.to_json(), "model_note": model_note,
            "nearest_fit": nearest_fit.to_json() if nearest_fit is not None else None}


def plan(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
         objective: str = "time", top: int = 5, ops: Operations = Operations()) -> Plan:
    """The best layout with these pins, its runners-up and, when it does not fit, the nearest
    layout that does: all from one evaluated table (``evaluate_table``)."""
    return plan_from_table(evaluate_table(model, hw, job, gpus, pins, objective), model, hw, job, gpus, pins,
                           top, ops)


def evaluate_table(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
                   objective: str = "time") -> SearchResult:
    """Every layout the free search tries plus the pinned values, evaluated once and ranked: the
    layouts of the pins, of the pins with one freed, and of no pins are all selections of it."""
    return search(model, hw, job, gpus, pins, objective, widen=True)


def plan_from_table(table: SearchResult, model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int,
                    pins: Pins = Pins(), top: int = 5, ops: Operations = Operations()) -> Plan:
    """``plan`` from an evaluated table; raises PlannerError when no layout has these pins."""
    c = table.evaluation.candidates
    rows = np.flatnonzero(matches(c, pins))
    if rows.size == 0 or pins.pinned():
        # The pins' own checks, and the reason when no layout has them (enumeration only, no evaluation).
        pinned, why = enumerate_layouts(model, gpus, job, pins)
        if rows.size == 0 and len(pinned) == 0:
            raise PlannerError("layout", pins.pinned() or "search", why)
    # Should the widened table lack a layout the pins allow, the pins' own search decides.
    result = select(table, rows) if rows.size else search(model, hw, job, gpus, pins, table.objective)
    ev = result.evaluation
    best = estimate_at(ev, 0, model, hw, job, ops)
    count = min(len(ev.candidates), top + 1) if best.fits else 1
    runners = tuple(estimate_at(ev, i, model, hw, job, ops) for i in range(1, count) if bool(ev.fits[i]))
    nearest = None if best.fits else nearest_in_table(table, model, hw, job, pins, ops)
    return Plan(best=best, runners_up=runners, result=result, nearest_fit=nearest, pinned=tuple(pins.pinned()))


def nearest_fitting(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins,
                    objective: str, ops: Operations = Operations()) -> Estimate | None:
    """The nearest fitting layout to these pins (see ``nearest_in_table``), from a fresh table."""
    table = evaluate_table(model, hw, job, gpus, pins, objective)
    return nearest_in_table(table, model, hw, job, pins, ops)


def nearest_in_table(table: SearchResult, model: ModelSpec, hw: HardwareProfile, job: Job, pins: Pins,
                     ops: Operations = Operations()) -> Estimate | None:
    """The fitting layout of the free search that changes the fewest pinned fields (then the best
    by the objective)."""
    ev = table.evaluation
    c = ev.candidates
    fits = np.flatnonzero(ev.fits & searched_by_default(c, job))
    if fits.size == 0:
        return None
    changed = np.zeros(len(c), dtype=int)
    for name, value in pins.pinned().items():
        changed += getattr(c, name) != DIMS[name].encode([value])[0]
    # The table is in rank order, so the first fitting row with the fewest changes wins.
    i = fits[np.argmin(changed[fits])]
    return estimate_at(ev, int(i), model, hw, job, ops)
