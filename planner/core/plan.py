"""The answer to 'how should I train this, will it fit, how long': the best layout and its runners-up.

``plan`` evaluates one table (every layout of the free search plus the pinned values) and selects
from it the layouts with the user's pins; when those do not fit, it also finds the nearest layout
that does (fewest pinned fields changed, then fastest) and two alternatives changing other fields.
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
from planner.memo import by_identity, fast_init
from planner.schema import MAX_GPUS


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    best: Estimate
    runners_up: tuple[Estimate, ...]
    result: SearchResult
    nearest_fit: Estimate | None = None  # when ``best`` does not fit
    alternatives: tuple[Estimate, ...] = ()  # two more fitting layouts that change other pinned fields
    pinned: tuple[str, ...] = ()
    # When ``best`` fits above the plan's memory line (``MemoryParts.safe_line_bytes``: the stricter
    # of ROOMY_SHARE and the fit verdict's line by default, ROOMY_SHARE with --memory-headroom):
    # the best layout with these pins at or under it, if one fits.
    roomier: Estimate | None = None
    # When ``best`` is under that line: the layouts above it (fitting or tight) that the objective
    # ranks better, best first (at most FASTER_SHOWN): what keeping room costs.
    faster: tuple[Estimate, ...] = ()

    @property
    def fits(self) -> bool:
        return self.best.fits

    def to_json(self, model_note: str = "") -> dict:
        """`planner estimate --format json`: the best estimate, how the model was chosen, the nearest fit."""
        return plan_json(self.best, model_note, self.nearest_fit, self.alternatives, self.roomier, self.faster)


def plan_json(best: Estimate, model_note: str, nearest_fit: Estimate | None,
              alternatives: tuple[Estimate, ...] = (), roomier: Estimate | None = None,
              faster: tuple[Estimate, ...] = ()) -> dict:
    return {**best.to_json(), "model_note": model_note,
            "nearest_fit": nearest_fit.to_json() if nearest_fit is not None else None,
            "nearest_fit_alternatives": [a.to_json() for a in alternatives],
            # Nothing fits, whatever the layout: the changes that would, each checked (the report's last lines).
            "what_would_fit": list(fit_hints(best)) if not best.fits and nearest_fit is None else [],
            "roomier": roomier.to_json() if roomier is not None else None,
            "faster_above_safe_line": [{**f.to_json(), "faster_by": best.train.seconds / f.train.seconds - 1}
                                       for f in faster]}


@by_identity  # an estimate's, once: the report, the explorer and the JSON each show them
def fit_hints(e: Estimate) -> tuple[str, ...]:
    """Changes that would let some layout fit, each checked with a search: more GPUs (doubling,
    up to the planner's largest count), CPU offload, a shorter sequence (halving), else a larger
    GPU or a smaller model."""
    hints = []
    for k in (2, 4, 8, 16, 32, 64):
        if e.gpus * k > MAX_GPUS:
            break
        if search(e.model, e.hardware, e.job, e.gpus * k).feasible:
            hints.append(f"more GPUs: {e.gpus * k:,} ({k}x; --gpus) is the first doubling where a layout fits")
            break
    if e.job.mode == "pretrain" and e.layout.offload == "none":  # fine-tuning already searches offload
        for where in ("optimizer", "params"):
            try:
                fits = search(e.model, e.hardware, e.job, e.gpus, Pins(offload=where)).feasible
            except PlannerError:  # the stack does not offload this
                continue
            if fits:
                hints.append(f"CPU offload: --offload {where} fits on {e.gpus:,} GPU{'s' if e.gpus > 1 else ''} "
                             "(slower: states cross PCIe every step)")
                break
    seq = e.model.seq_len
    for k in (2, 4, 8):
        if seq // k >= 128 and search(e.model.replace(seq_len=seq // k), e.hardware, e.job, e.gpus).feasible:
            hints.append(f"a shorter sequence: --seq-len {seq // k} fits on {e.gpus:,} GPU{'s' if e.gpus > 1 else ''}")
            break
    hints.append("a GPU with more memory (--gpu; `planner profiles`), or a smaller model")
    return tuple(hints)


def plan(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
         objective: str = "time", top: int = 5, ops: Operations = Operations()) -> Plan:
    """The best layout with these pins, its runners-up and, when it does not fit, the nearest
    layout that does (from the table of ``evaluate_table``): ``plan_of_pins`` when that answers,
    else from the table, whose path also says why pins are refused."""
    quick = plan_of_pins(model, hw, job, gpus, pins, objective, top, ops)
    if quick is not None:
        return quick
    return plan_from_table(evaluate_table(model, hw, job, gpus, pins, objective), model, hw, job, gpus, pins,
                           top, ops)


def plan_of_pins(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
                 objective: str = "time", top: int = 5, ops: Operations = Operations()) -> Plan | None:
    """``plan``, from the pins' own search alone, when there are pins and their best layout fits;
    else None. Its layouts are the table's rows with these pins, in the same order
    (``enumerate_layouts``), so the plan is the same without evaluating the table (a pinned
    estimate evaluates one layout); the table is needed for the nearest fit and for the reasons."""
    if not pins.pinned():
        return None
    try:
        result = search(model, hw, job, gpus, pins, objective)
    except PlannerError:
        return None
    return _plan(result, None, model, hw, job, pins, top, ops) if result.feasible else None  # fitting rank first


def evaluate_table(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
                   objective: str = "time") -> SearchResult:
    """Every layout the free search tries plus the pinned values, evaluated once and ranked: the
    layouts of the pins, of the pins with one freed, and of no pins are all selections of it."""
    return search(model, hw, job, gpus, pins, objective, widen=True)


def plan_from_table(table: SearchResult, model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int,
                    pins: Pins = Pins(), top: int = 5, ops: Operations = Operations()) -> Plan:
    """``plan`` from an evaluated table; raises PlannerError when no layout has these pins."""
    rows = np.flatnonzero(table.in_rank_order(matches(table.candidates, pins)))
    if rows.size == 0 or pins.pinned():
        # The pins' own checks, and the reason when no layout has them (enumeration only, no evaluation).
        pinned, why = enumerate_layouts(model, gpus, job, pins)
        if rows.size == 0 and len(pinned) == 0:
            raise PlannerError("layout", pins.pinned() or "search", why)
    # Should the widened table lack a layout the pins allow, the pins' own search decides.
    result = select(table, rows) if rows.size else search(model, hw, job, gpus, pins, table.objective)
    return _plan(result, table, model, hw, job, pins, top, ops)


def _plan(result: SearchResult, table: SearchResult | None, model: ModelSpec, hw: HardwareProfile, job: Job,
          pins: Pins, top: int, ops: Operations) -> Plan:
    """The plan from the layouts with these pins (``result``, in rank order); ``table`` (the
    widened one) is needed only when the best does not fit, for the nearest fitting layouts."""
    rows = [0, *_runner_rows(result, pins, top)] if result.feasible else [0]
    # Only these rows: the rest of the table is never put in rank order (one layout: its scalars).
    ev = result.one if result.one is not None else result.ranked(rows)
    best = estimate_at(ev, 0, model, hw, job, ops, searched=searched_fields(pins))
    runners = tuple(estimate_at(ev, k, model, hw, job, ops) for k in range(1, len(rows)))
    near = () if best.fits else nearest_in_table(table, model, hw, job, pins, ops, count=3)
    room = _roomier_row(result, pins) if crowded(best) else None
    faster = _faster_rows(result, pins) if best.fits and not crowded(best) else []
    ev = result.ranked(faster) if faster else None
    return Plan(best=best, runners_up=runners, result=result, nearest_fit=near[0] if near else None,
                alternatives=tuple(near[1:]), pinned=tuple(pins.pinned()),
                roomier=estimate_at(result.ranked([room]), 0, model, hw, job, ops) if room is not None else None,
                faster=tuple(estimate_at(ev, k, model, hw, job, ops) for k in range(len(faster))))


_SEARCHED = frozenset(Pins.__dataclass_fields__)  # the layout fields a search chooses unless pinned


def searched_fields(pins: Pins) -> frozenset[str]:
    """The layout fields a search with these pins chooses: its best's warnings know every other
    value of them ranked behind it (``estimate_at``'s ``searched``)."""
    return _SEARCHED - set(pins.pinned())


FASTER_SHOWN = 3  # layouts above the memory line that a plan lists as faster


def crowded(e: Estimate) -> bool:
    """Fits (or is tight), above the plan's memory line (``MemoryParts.safe_line_bytes``): where a
    plan names a roomier layout."""
    return e.fits and e.memory.total_bytes > e.memory.safe_line_bytes


def _faster_rows(result: SearchResult, pins: Pins) -> list[int]:
    """The rank positions of the listed layouts above the plan's memory line that the objective
    ranks better than the best (position 0), best first: at most FASTER_SHOWN."""
    if result.evaluated == 1 or result.objective == "memory":
        return []
    ev = result.partial_table
    above = _listed(result, pins) & (ev.memory.total > ev.room_share * ev.capacity_bytes)
    rows = np.flatnonzero(result.in_rank_order(above))
    if rows.size == 0:
        return []
    primary = result.in_rank_order(ev.train_seconds if result.objective == "time" else ev.cost_usd)
    best = primary[0]
    better = rows[primary[rows] < best * (1 - 1e-3)]  # a tie (within 0.1%) is no gain: rank_order's own bucket
    return [int(i) for i in better[np.argsort(primary[better], kind="stable")][:FASTER_SHOWN]]


def _listed(result: SearchResult, pins: Pins) -> np.ndarray:
    """The fitting layouts a plan lists, in table order: not ZeRO stages above 0 with nothing to
    shard over (one data-parallel rank, nothing offloaded: the same layout as ZeRO-0, listed again)
    unless pinned."""
    c = result.candidates
    useless = ((c.zero_stage > 0) & (c.dp * c.cp == 1) & (c.offload == 0)
               if pins.pinned().get("zero_stage") is None else False)
    return result.fits & ~useless


def _runner_rows(result: SearchResult, pins: Pins, top: int) -> list[int]:
    """The rank positions of the next ``top`` listed layouts after the best."""
    if result.evaluated == 1:  # one layout (every field pinned): none after it
        return []
    rows = np.flatnonzero(result.in_rank_order(_listed(result, pins)))
    return [int(i) for i in rows[rows > 0][:top]]


def _roomier_row(result: SearchResult, pins: Pins) -> int | None:
    """The rank position of the best listed layout at or under the plan's memory line, or None."""
    if result.evaluated == 1:  # the one layout is the best, above the line: none
        return None
    m = result.memory
    ev = result.partial_table
    roomy = _listed(result, pins) & (m.total <= ev.room_share * ev.capacity_bytes)
    rows = np.flatnonzero(result.in_rank_order(roomy))
    return int(rows[0]) if rows.size else None


def nearest_fitting(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins,
                    objective: str, ops: Operations = Operations()) -> Estimate | None:
    """The nearest fitting layout to these pins (see ``nearest_in_table``), from a fresh table."""
    table = evaluate_table(model, hw, job, gpus, pins, objective)
    near = nearest_in_table(table, model, hw, job, pins, ops)
    return near[0] if near else None


def nearest_in_table(table: SearchResult, model: ModelSpec, hw: HardwareProfile, job: Job, pins: Pins,
                     ops: Operations = Operations(), count: int = 1) -> tuple[Estimate, ...]:
    """Fitting layouts of the free search near the pins: first the best by the objective (the
    fastest, by default) among those that change the fewest pinned fields, then the best of each
    other set of changed fields, fewest changes first: ``count`` of them, each changing a
    different set of pinned fields (full recompute, or ZeRO-3, or two more GPUs per stage...)."""
    c = table.candidates
    fits = np.flatnonzero(table.in_rank_order(table.fits & searched_by_default(c, job, model)))  # rank positions
    if fits.size == 0:
        return ()
    names = list(pins.pinned())
    differs = np.zeros((len(fits), len(names)), dtype=bool)
    rows = table.order[fits]  # their rows in the table
    for k, (name, value) in enumerate(pins.pinned().items()):
        differs[:, k] = getattr(c, name)[rows] != DIMS[name].encode([value])[0]
    changed = differs.sum(axis=1)
    # The table is in rank order: stable-sorting by the number of changes keeps the objective's
    # order within each count, so the first row of each changed-field set is that set's best.
    order = np.argsort(changed, kind="stable")
    picked: list[int] = []
    seen: set[bytes] = set()
    for j in order:
        key = differs[j].tobytes()
        if key not in seen:
            seen.add(key)
            picked.append(int(fits[j]))
            if len(picked) == count:
                break
    ev = table.ranked(picked)
    return tuple(estimate_at(ev, k, model, hw, job, ops) for k in range(len(picked)))
