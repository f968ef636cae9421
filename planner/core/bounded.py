"""The sweep's shortcut (the explorer's Hardware tab): the fastest fitting layout per GPU count and
profile without the step time of every layout, from a floor under each layout's step time.
Same answers as ``planner.core.search.fastest_fitting``, checked at run time and in
tests/app/test_hardware_fast.py.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from planner.core.evaluate import Evaluation
from planner.core.layout import DIMS, Candidates, Job
from planner.core.model import ModelSpec
from planner.core.search import _rank_keys, fastest_fitting, first_per_segment, take
from planner.hardware import HardwareProfile

# --- the sweep's shortcut: a floor under each layout's step time ------------------------------------
# Only layouts that could rank first need a step time. A layout's step is at least its pipeline's
# compute (steptime.step_time: m micro-batches of the fullest stage's layers, each at
# ``layer_times``' forward + backward + recompute plus the per-layer overhead; the bubble (p-1)/v
# of that; the stragglers' share step_jitter * sqrt(2 ln N) on top; the step overhead): every
# other part (communication, head, optimizer) is added to it and is never negative. A layout
# whose floor already puts it in a later 0.1% rank bucket than a layout known to fit cannot be
# ranked first; the rest are evaluated exactly. The floor is checked against every step time
# computed; a profile where it ever exceeds one is evaluated whole (``fastest_fitting``).
FLOOR_MARGIN = 1e-9  # relative: a floor this much under, so rounding cannot lift it past a bucket


class _Reads:
    """Candidates as ``f`` reads them: the columns it touches are recorded (properties and
    methods read through to the columns they use)."""

    def __init__(self, c: Candidates) -> None:
        self._c, self.names = c, set()

    def __len__(self) -> int:
        return len(self._c)

    def __getattr__(self, name: str):
        if name in DIMS:
            self.names.add(name)
            return getattr(self._c, name)
        attr = getattr(Candidates, name)
        if isinstance(attr, property):
            return attr.fget(self)
        if name in ("take", "columns", "layout"):  # reads every column
            self.names.update(DIMS)
            return getattr(self._c, name)
        return functools.partial(attr, self)


def _distinct_rows(c: Candidates, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(one row for each distinct combination of the columns ``names``, each row's combination
    as an index into those)."""
    key, size = np.zeros(len(c), dtype=np.int64), 1
    for name in names:
        col = getattr(c, name).astype(np.int64)
        low, span = (int(col.min()), int(col.max()) - int(col.min()) + 1) if len(col) else (0, 1)
        key, size = key * span + (col - low), size * span
    if size > 1 << 22:
        _, rows, inverse = np.unique(key, return_index=True, return_inverse=True)
        return rows, inverse.reshape(-1)
    slot = np.full(size, -1, dtype=np.int64)
    slot[key] = np.arange(len(c))  # some row of each combination
    used = np.flatnonzero(slot >= 0)
    index = np.empty(size, dtype=np.int64)
    index[used] = np.arange(len(used))
    return slot[used], index[key]


def on_distinct_rows(f, c: Candidates, shared: dict, start: tuple[str, ...] = ()) -> np.ndarray:
    """``f(c)`` for a row-wise ``f`` returning one column, computed once per distinct combination
    of the columns it reads (found by reading them: a column read beyond ``start`` widens the
    combination and ``f`` runs again) and spread to every row. ``shared``: kept for one ``c``."""
    names = tuple(sorted(start))
    while True:
        if ("distinct", names) not in shared:
            shared["distinct", names] = _distinct_rows(c, names)
        rows, inverse = shared["distinct", names]
        reads = _Reads(c.take(rows))
        out = np.broadcast_to(f(reads), (len(rows),))
        if reads.names <= set(names):
            return out[inverse]
        names = tuple(sorted(reads.names | set(names)))


def step_time_floor(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw,
                    shared: dict) -> np.ndarray | None:
    """A lower bound on ``steptime.step_time(model, hw, job, c, sw).step`` per row (``hw`` with the
    stack's factors: planner.stacks.effective); None on a CPU host (its shared cores scale compute
    by a factor that may be under one). ``shared``: kept for one ``c`` across profiles."""
    from planner.core import comm
    from planner.core.layout import DUALPIPEV
    from planner.core.pipeline import head_layers, stage_layers
    from planner.core.steptime import layer_times

    if hw.network.compute_slots:
        return None
    e, links = hw.efficiency, comm.Links.of(hw)

    def per_layer(r) -> np.ndarray:
        lt = layer_times(model, hw, job, r, links, sw)
        return lt.forward + lt.backward + lt.recompute

    layer = on_distinct_rows(per_layer, c, shared, ("micro_batch", "tp", "cp", "recompute", "sequence_parallel"))
    key = ("floor pace", model.layers, head_layers(model, sw))
    if key not in shared:  # micro-batches plus the bubble's share, times the fullest stage's layers
        fullest = stage_layers(model, c, sw)[1]
        bubble = np.where(c.schedule == DUALPIPEV, 0.0, (c.pp - 1) / c.vpp.astype(float))  # DualPipeV's is less: none
        shared[key] = (c.m.astype(float) + bubble) * fullest
    if "floor stragglers" not in shared:
        shared["floor stragglers"] = np.sqrt(2 * np.log(c.gpus.astype(float)))
    busy = shared[key] * (layer + (3 + (c.recompute == 2)) * e.layer_overhead_s)
    return busy * (1 + e.step_jitter * shared["floor stragglers"]) + e.step_overhead_s


def _table_memory(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw,
                  shared: dict) -> tuple[np.ndarray, np.ndarray]:
    """(peak bytes, host bytes) per GPU of every row, a block at a time, kept in ``shared`` for the
    profiles that read the same of the hardware (memory.hardware_read)."""
    for _ in _table_memory_steps(model, hw, job, c, sw, shared):
        pass
    return shared[_table_memory_key(model, hw, job)]


def _table_memory_key(model: ModelSpec, hw: HardwareProfile, job: Job) -> tuple:
    from planner.core.memory import hardware_read

    return "table memory", model, job, hardware_read(hw)


def _table_memory_steps(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw, shared: dict):
    """``_table_memory``'s work, yielding after each block (a few milliseconds); the whole is kept
    in ``shared`` once the last block is done."""
    from planner.core.evaluate import BLOCK_ROWS
    from planner.core.memory import memory

    key = _table_memory_key(model, hw, job)
    if key in shared:
        return
    parts = []
    for i in range(0, len(c), BLOCK_ROWS):
        parts.append(memory(model, hw, job, c.take(slice(i, i + BLOCK_ROWS)), sw)[0])
        yield
    shared[key] = tuple(np.concatenate([np.broadcast_to(getattr(m, f), (min(BLOCK_ROWS, len(c) - i),))
                                        for m, i in zip(parts, range(0, len(c), BLOCK_ROWS))])
                        for f in ("total", "host"))


def least_memory(model: ModelSpec, hw: HardwareProfile, job: Job,
                 table: tuple[list[int], Candidates, np.ndarray, dict]) -> dict[int, float]:
    """The least peak memory per GPU of each count's layouts (``counts_table``'s table)."""
    from planner.core.evaluate import _effective

    counts, together, segment, shared = table
    if not counts:
        return {}
    sw, hw = _effective(hw, job)
    total = _table_memory(model, hw, job, together, sw, shared)[0]
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    return {counts[k]: float(v) for k, v in zip(segment[starts], np.minimum.reduceat(total, starts))}


def least_memory_steps(model: ModelSpec, hw: HardwareProfile, job: Job,
                       table: tuple[list[int], Candidates, np.ndarray, dict]):
    """``least_memory``'s work a block of layouts at a time (yields between blocks), for a caller
    that must come back to its page within milliseconds; ``least_memory`` then reads it."""
    from planner.core.evaluate import _effective

    counts, together, _, shared = table
    if counts:
        sw, hw = _effective(hw, job)
        yield from _table_memory_steps(model, hw, job, together, sw, shared)


def _evaluate_rows(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, rows: np.ndarray, sw) -> Evaluation:
    """``evaluate``'s numbers for ``rows`` of ``c`` (``hw`` effective; every formula works row by row)."""
    from planner.core.evaluate import _evaluation
    from planner.core.memory import memory
    from planner.core.steptime import step_time

    b = c.take(rows)
    mem, stages = memory(model, hw, job, b, sw)
    return _evaluation(model, hw, job, b, 0, sw, mem, stages, step_time(model, hw, job, b, sw))


def fastest_fitting_bounded(model: ModelSpec, hw: HardwareProfile, job: Job,
                            table: tuple[list[int], Candidates, np.ndarray, dict]) -> dict[int, Evaluation]:
    """``fastest_fitting``'s answer (each count's first layout in a free search by time, when it
    fits) with the step time computed only where ``step_time_floor`` leaves a layout a chance: the
    fitting layouts of each count whose floor is within ``FLOOR_ROUNDS`` buckets of the least
    floor, evaluated round by round, until the best rank bucket found (a ceiling) is within what
    has been evaluated."""
    from planner.core.evaluate import _effective, _fits, fit_lines, memory_tier
    from planner.core.search import TIER_STEP

    counts, together, segment, shared = table
    if not counts or not hw.gpu.supports(job.precision):
        return fastest_fitting(model, hw, job, table)
    sw, hw_eff = _effective(hw, job)
    floor = step_time_floor(model, hw_eff, job, together, sw, shared)
    if floor is None:
        return fastest_fitting(model, hw, job, table)
    total, host = _table_memory(model, hw_eff, job, together, sw, shared)
    fits_share, tight_share, safe_share, _ = fit_lines(job, sw.stack)
    cap = hw_eff.gpu.memory_bytes
    fit = _fits(_MemoryTotals(total, host), together, cap * tight_share, hw_eff.network.host_memory_bytes,
                hw_eff.network.host_gpus)
    # The floor's rank bucket, as _rank_keys buckets train_seconds; none for a layout that does not fit.
    floor = np.where(np.isnan(floor), 0.0, floor)  # no floor known: always evaluated
    tokens = (together.global_batch * model.seq_len).astype(float)
    seconds = job.train_tokens(model) / (tokens / (floor * (1 - FLOOR_MARGIN)) * job.packing_efficiency)
    bucket = np.where(fit, np.round(np.log(seconds) / 1e-3) + TIER_STEP * memory_tier(total, cap, fits_share, safe_share),
                      np.inf)  # by memory tier first, as _rank_keys
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    least = np.full(len(counts), np.inf)
    least[segment[starts]] = np.minimum.reduceat(bucket, starts)
    ceiling, done, best = np.full(len(counts), np.inf), np.zeros(len(together), dtype=bool), {}
    for reach in FLOOR_ROUNDS:
        rows = np.flatnonzero(fit & ~done & (bucket <= np.minimum(ceiling, least + reach)[segment]))
        if len(rows):
            done[rows] = True
            ev = _evaluate_rows(model, hw_eff, job, together, rows, sw)
            if not _floor_holds(floor[rows], ev):
                return fastest_fitting(model, hw, job, table)
            for k, key, i in _first_of_each(ev, rows, segment):
                if k not in best or key < best[k][0]:
                    best[k] = (key, ev, i)
                    ceiling[k] = key[0]
        if np.all(ceiling <= least + reach):
            break
    return {counts[k]: dataclasses.replace(take(ev, np.array([i])), gpus=counts[k])
            for k, (_, ev, i) in sorted(best.items())}


FLOOR_ROUNDS = (10.0, 60.0, 400.0, np.inf)  # rank buckets (0.1%) above the least floor evaluated per round


@dataclass(frozen=True, slots=True)
class _MemoryTotals:
    total: np.ndarray
    host: np.ndarray


def _floor_holds(floor: np.ndarray, ev: Evaluation) -> bool:
    return bool(np.all(floor * (1 - FLOOR_MARGIN) <= ev.step_s))


def _first_of_each(ev: Evaluation, rows: np.ndarray, segment: np.ndarray) -> list[tuple[int, tuple, int]]:
    """For each count among ``rows`` (ascending rows of the counts' table, evaluated as ``ev``;
    ``segment``: each table row's count), its first fitting row in ``rank_order``: (the count's
    index, the row's sort key (rank bucket, step time, memory, table row), its index in ``ev``)."""
    fits = ev.fits
    where = np.flatnonzero(fits)
    if len(where) == 0:
        return []
    keys = [k[where] for k in _rank_keys(ev, "time")]
    found, first = first_per_segment(keys, segment[rows[where]])
    return [(int(k), (float(keys[2][j]), float(keys[1][j]), float(keys[0][j]), int(rows[where[j]])), int(where[j]))
            for k, j in zip(found, first)]
