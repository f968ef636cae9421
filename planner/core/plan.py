"""The answer to 'how should I train this, will it fit, how long': the best layout and its runners-up.

``plan`` searches the layouts left free by the user's pins; when the pins leave only layouts that
do not fit, it also finds the nearest layout that does (fewest pinned fields changed, then fastest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.layout import RECOMPUTE, SCHEDULES, Job
from planner.core.model import ModelSpec
from planner.core.resilience import Operations
from planner.core.results import Estimate, estimate_at
from planner.core.search import Pins, SearchResult, search
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


def plan(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
         objective: str = "time", top: int = 5, ops: Operations = Operations()) -> Plan:
    result = search(model, hw, job, gpus, pins, objective)
    ev = result.evaluation
    best = estimate_at(ev, 0, model, hw, job, ops)
    count = min(len(ev.candidates), top + 1) if best.fits else 1
    runners = tuple(estimate_at(ev, i, model, hw, job, ops) for i in range(1, count) if bool(ev.fits[i]))
    nearest = None
    if not best.fits:
        nearest = nearest_fitting(model, hw, job, gpus, pins, objective, ops)
    return Plan(best=best, runners_up=runners, result=result, nearest_fit=nearest, pinned=tuple(pins.pinned()))


def nearest_fitting(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins,
                    objective: str, ops: Operations = Operations()) -> Estimate | None:
    """The fitting layout that changes the fewest pinned fields (then the best by objective)."""
    free = search(model, hw, job, gpus, Pins(), objective)
    ev = free.evaluation
    fits = np.flatnonzero(ev.fits)
    if fits.size == 0:
        return None
    c = ev.candidates
    columns = {"dp": c.dp, "tp": c.tp, "pp": c.pp, "vpp": c.vpp, "micro_batch": c.micro_batch, "zero_stage": c.zero_stage,
               "recompute": c.recompute, "sequence_parallel": c.sequence_parallel, "schedule": c.schedule}
    changed = np.zeros(len(c), dtype=int)
    for name, value in pins.pinned().items():
        if name == "recompute":
            value = RECOMPUTE.index(value)
        elif name == "schedule":
            value = SCHEDULES.index(value)
        changed += columns[name] != value
    # The evaluation is already in rank order, so the first fitting row with the fewest changes wins.
    i = fits[np.argmin(changed[fits])]
    return estimate_at(ev, int(i), model, hw, job, ops)
