"""The sweep's shortcut (the explorer's Hardware tab): the fastest fitting layout per GPU count and
profile without the step time of every layout, from a floor under each layout's step time.
Same answers as ``planner.core.search.fastest_fitting``, checked at run time and in
tests/app/test_hardware_fast.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.core.evaluate import Evaluation
from planner.core.layout import LAYER_DIMS, Candidates, Job
from planner.core.memory import Memory
from planner.core.model import ModelSpec
from planner.core.search import _rank_keys, fastest_fitting, first_per_segment, take
from planner.hardware import HardwareProfile

# --- the sweep's shortcut: a floor under each layout's step time ------------------------------------
# Only layouts that could rank first need a step time. A layout's step is at least its pipeline's
# compute and its layers' exchanges (steptime.step_time: m micro-batches of the fullest stage's
# layers, each at ``layer_times``' forward + backward + recompute plus the per-layer overhead, and
# of the pace's layers (at least the fewer of the fullest stage's and the head's), each with its
# TP, CP and EP exchanges and TP's fixed cost per collective; the bubble (p-1)/v of that; the
# stragglers' share step_jitter * sqrt(2 ln N) on top; the step overhead): every other part (the
# head, pipeline sends, data parallel, optimizer) is added to it and is never negative. A layout
# whose floor already puts it in a later 0.1% rank bucket than a layout known to fit cannot be
# ranked first; the rest are evaluated exactly. The floor is checked against every step time
# computed; a profile where it ever exceeds one is evaluated whole (``fastest_fitting``).
FLOOR_MARGIN = 1e-9  # relative: a floor this much under, so rounding cannot lift it past a bucket


def step_time_floor(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw,
                    shared: dict, rows: np.ndarray | None = None) -> np.ndarray | None:
    """A lower bound on ``steptime.step_time(model, hw, job, c, sw).step`` per row (``hw`` with the
    stack's factors: planner.stacks.effective), of ``rows`` alone when given; None on a CPU host
    (its shared cores scale compute by a factor that may be under one). ``shared``: kept for one
    ``c`` across profiles."""
    from planner.core import comm
    from planner.core.layout import DUALPIPEV, recomputed_layers
    from planner.core.pipeline import head_layers, stage_layers
    from planner.core.steptime import layer_times

    if hw.network.compute_slots:
        return None
    e, links = hw.efficiency, comm.Links.of(hw)

    # A layer's compute and exchanges per micro-batch (``layer_times`` reads LAYER_DIMS alone, as
    # step_time computes it): once per distinct combination of the table (kept on it: its memory's
    # blocks read the same), gathered to the rows.
    part, inverse = c.distinct(LAYER_DIMS)
    lt = layer_times(model, hw, job, part, links, sw)
    index = inverse if rows is None else inverse[rows]
    layer = np.broadcast_to(lt.forward + lt.backward + lt.recompute, (len(part),))[index]
    exchanges = np.broadcast_to(lt.tp_comm + lt.tp_calls * e.tp_collective_overhead_s + lt.cp_comm + lt.ep_comm,
                                (len(part),))[index]
    key = ("floor pace", model.layers, head_layers(model, sw))
    if key not in shared:  # micro-batches and the bubble's share, times the fullest stage's, the pace's least layers
        first, fullest, last = stage_layers(model, c, sw)
        v_shape = c.schedule == DUALPIPEV
        bubble = np.where(v_shape, 0.0, (c.pp - 1) / c.vpp.astype(float))  # DualPipeV's is less: none
        flights = c.m.astype(float) + bubble
        # The pace's stage: the fullest or the one with the head (the last; DualPipeV's first).
        shared[key] = flights * fullest, flights * np.minimum(fullest, np.where(v_shape, first, last))
    if "floor stragglers" not in shared:
        shared["floor stragglers"] = np.sqrt(2 * np.log(c.gpus.astype(float)))
    if "floor overheads" not in shared:  # per layer: once forward, twice backward, once more recomputed
        shared["floor overheads"] = 3 + recomputed_layers(c.recompute)
    (pace, pace_least), stragglers, overheads = shared[key], shared["floor stragglers"], shared["floor overheads"]
    if rows is not None:
        pace, pace_least, stragglers, overheads = pace[rows], pace_least[rows], stragglers[rows], overheads[rows]
    # The pace's layers each take the fullest stage's compute at least, and their TP, CP and EP
    # exchanges (steptime.step_time: tp_mb, tp_host, cp_mb, ep_mb) with the fewer of its layers.
    busy = pace * (layer + overheads * e.layer_overhead_s) + pace_least * exchanges
    return busy * (1 + e.step_jitter * stragglers) + e.step_overhead_s


def _table_memory(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw, shared: dict) -> _TableMemory:
    """The peak stage's memory (``memory``'s first answer) of every row, a block at a time, kept
    in ``shared`` for the profiles that read the same of the hardware (memory.hardware_read)."""
    for _ in _table_memory_steps(model, hw, job, c, sw, shared):
        pass
    return shared[_table_memory_key(model, hw, job)]


class _TableMemory:
    """A table's peak memory as ``memory`` gives it a block at a time: ``total`` and ``host`` (what
    fits reads) of every row joined; every part of some rows on demand (``rows``)."""

    def __init__(self, parts: list[Memory], block: int, n: int) -> None:
        self.parts, self.block = parts, block
        self.sizes = [min(block, n - i) for i in range(0, n, block)]
        self.total, self.host = (np.concatenate([np.broadcast_to(getattr(m, f), (k,))
                                                 for m, k in zip(parts, self.sizes)]) for f in ("total", "host"))

    def rows(self, rows: np.ndarray) -> Memory:
        """Every part of ``rows`` (ascending) as one Memory of their columns."""
        ends = np.searchsorted(rows, np.arange(1, len(self.parts) + 1) * self.block)
        pieces = [(m, k, rows[a:b] - i * self.block)
                  for i, (m, k, a, b) in enumerate(zip(self.parts, self.sizes, np.r_[0, ends[:-1]], ends)) if b > a]
        columns = ([np.broadcast_to(getattr(m, f), (k,))[local] for m, k, local in pieces] for f in Memory.__slots__)
        return Memory(*(got[0] if len(got) == 1 else np.concatenate(got) for got in columns))


def _table_memory_key(model: ModelSpec, hw: HardwareProfile, job: Job) -> tuple:
    from planner.core.memory import hardware_read

    return "table memory", model, job, hardware_read(hw)


def _table_memory_steps(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw, shared: dict):
    """``_table_memory``'s work, yielding after each block (a few milliseconds); the whole is kept
    in ``shared`` once the last block is done."""
    from planner.core.evaluate import block_rows
    from planner.core.memory import memory

    key = _table_memory_key(model, hw, job)
    if key in shared:
        return
    parts = []
    c.distinct(LAYER_DIMS)  # kept on the table for its blocks (a layer's parts) and step_time_floor
    block = block_rows(len(c))
    for i in range(0, len(c), block):
        parts.append(memory(model, hw, job, c.take(slice(i, i + block)), sw)[0])
        yield
    shared[key] = _TableMemory(parts, block, len(c))


def least_memory(model: ModelSpec, hw: HardwareProfile, job: Job,
                 table: tuple[list[int], Candidates, np.ndarray, dict]) -> dict[int, float]:
    """The least peak memory per GPU of each count's layouts (``counts_table``'s table)."""
    from planner.core.evaluate import _effective

    counts, together, segment, shared = table
    if not counts:
        return {}
    sw, hw = _effective(hw, job)
    total = _table_memory(model, hw, job, together, sw, shared).total
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


def _time_rows(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, rows: np.ndarray, sw,
               mem: _TableMemory) -> Evaluation:
    """``evaluate``'s numbers for ``rows`` of ``c`` (ascending) but the stages' memory (its
    ``stage_memory`` left empty), the peak's read from ``mem`` (``_table_memory``): only the step
    time computed."""
    from planner.core.evaluate import _evaluation
    from planner.core.steptime import step_time

    b = c.take(rows)
    peak = mem.rows(rows)
    return _evaluation(model, hw, job, b, 0, sw, peak, (), step_time(model, hw, job, b, sw))


def fastest_fitting_bounded(model: ModelSpec, hw: HardwareProfile, job: Job,
                            table: tuple[list[int], Candidates, np.ndarray, dict]) -> dict[int, Evaluation]:
    """``fastest_fitting``'s answer (each count's first layout in a free search by time, when it
    fits: a one-row Evaluation whose ``gpus`` is the count) from ``fastest_fitting_rows``, each
    count's layout evaluated whole (its stages' memory too)."""
    found = _fastest(model, hw, job, table)
    if not isinstance(found, tuple):  # evaluated whole already (``fastest_fitting``)
        return found
    counts, together, _, _ = table
    sw, hw_eff, best = found
    if not best:
        return {}
    ks = sorted(best)
    ev = _evaluate_rows(model, hw_eff, job, together, np.array([best[k][3] for k in ks]), sw)
    if len(ks) == 1:
        return {counts[ks[0]]: dataclasses.replace(ev, gpus=counts[ks[0]])}
    return {counts[k]: dataclasses.replace(take(ev, np.array([j])), gpus=counts[k]) for j, k in enumerate(ks)}


def fastest_fitting_rows(model: ModelSpec, hw: HardwareProfile, job: Job,
                         table: tuple[list[int], Candidates, np.ndarray, dict]) -> dict[int, tuple[Evaluation, int]]:
    """``fastest_fitting``'s layouts as (an evaluation, the layout's row in it) per count, its
    ``gpus`` the count; the evaluation may leave out its stages' memory (``stage_memory`` empty):
    every other figure of the row (step time, peak memory, days, MFU, cost) is the search's.
    For a caller that reads a few figures of each count's best (``evaluate.row_of``)."""
    found = _fastest(model, hw, job, table)
    if not isinstance(found, tuple):
        return {n: (ev, 0) for n, ev in found.items()}
    counts = table[0]
    return {counts[k]: (dataclasses.replace(ev, gpus=counts[k]), i) for k, (_, ev, i, _) in sorted(found[2].items())}


def _fastest(model: ModelSpec, hw: HardwareProfile, job: Job, table: tuple[list[int], Candidates, np.ndarray, dict]):
    """Each count's first layout in a free search by time, when it fits, with the step time computed
    only where ``step_time_floor`` leaves a layout a chance: among each count's fitting layouts of
    its least memory tier (a layout of another tier never ranks first), the FIRST_ROUND_ROWS of
    least floor, whose best rank bucket (a ceiling) then bounds the floor of the others worth
    evaluating: those not past it, in a second round (none when the first held them). (software,
    effective profile, {count's index: (sort key, evaluation, its row there, the table's row)}); or
    ``fastest_fitting``'s answer where there is no floor, or it failed."""
    counts, together, segment, shared = table
    if not counts or not hw.gpu.supports(job.precision):
        return fastest_fitting(model, hw, job, table)
    from planner.core.evaluate import _effective

    sw, hw_eff = _effective(hw, job)
    if hw_eff.network.compute_slots:  # no floor (step_time_floor)
        return fastest_fitting(model, hw, job, table)
    mem = _table_memory(model, hw_eff, job, together, sw, shared)
    rows_c, tier = _ranked_first_candidates(model, hw_eff, job, together, segment, sw, shared)
    floor = step_time_floor(model, hw_eff, job, together, sw, shared, rows_c)
    if floor is None:
        return fastest_fitting(model, hw, job, table)
    # The floor's rank bucket, as _rank_keys buckets train_seconds (by memory tier first).
    floor = np.where(np.isnan(floor), 0.0, floor)  # no floor known: always evaluated
    tokens = (together.global_batch[rows_c] * model.seq_len).astype(float)
    seconds = job.train_tokens(model) / (tokens / (floor * (1 - FLOOR_MARGIN)) * job.packing_efficiency)
    from planner.core.search import TIER_STEP

    bucket = np.round(np.log(seconds) / 1e-3) + TIER_STEP * tier
    seg = segment[rows_c]
    # First round: each count's FIRST_ROUND_ROWS layouts of least floor (and those tied with the
    # last); then every layout whose floor is not past the best bucket found (a ceiling).
    upto = np.full(len(counts), np.inf)
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]]) if len(seg) else np.zeros(0, dtype=np.int64)
    for k, a, b in zip(seg[starts].tolist(), starts.tolist(), np.r_[starts[1:], len(seg)].tolist()):
        part = bucket[a:b]
        upto[k] = part.max() if b - a <= FIRST_ROUND_ROWS else np.partition(part, FIRST_ROUND_ROWS - 1)[
            FIRST_ROUND_ROWS - 1]
    ceiling, done, best = np.full(len(counts), np.inf), np.zeros(len(rows_c), dtype=bool), {}
    for reach in (upto, np.inf):
        pick = np.flatnonzero(~done & (bucket <= np.minimum(ceiling, reach)[seg]))
        if len(pick):
            done[pick] = True
            rows = rows_c[pick]
            ev = _time_rows(model, hw_eff, job, together, rows, sw, mem)
            if not _floor_holds(floor[pick], ev):
                return fastest_fitting(model, hw, job, table)
            for k, key, i in _first_of_each(ev, rows, segment):
                if k not in best or key < best[k][0]:
                    best[k] = (key, ev, i, int(rows[i]))
                    ceiling[k] = key[0]
        if np.all(ceiling <= reach):
            break
    return sw, hw_eff, best


def _ranked_first_candidates(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, segment: np.ndarray,
                             sw, shared: dict) -> tuple[np.ndarray, np.ndarray]:
    """(the rows of ``c`` that can rank first in their count: those that fit, of the least memory
    tier among the count's fitting rows; their tier), kept in ``shared`` for the profiles of the
    same memory (``_table_memory``) and the same lines (capacity, fit lines, host memory)."""
    from planner.core.evaluate import _fits, fit_lines, memory_tier

    fits_share, tight_share, safe_share, _ = fit_lines(job, sw.stack)
    cap = hw.gpu.memory_bytes
    key = ("first candidates", _table_memory_key(model, hw, job), cap, fits_share, tight_share, safe_share,
           hw.network.host_memory_bytes, hw.network.host_gpus)
    if key not in shared:
        mem = _table_memory(model, hw, job, c, sw, shared)
        fit = _fits(mem, c, cap * tight_share, hw.network.host_memory_bytes, hw.network.host_gpus)
        tier = np.where(fit, memory_tier(mem.total, cap, fits_share, safe_share), _NO_TIER)
        starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
        least = np.minimum.reduceat(tier, starts) if len(tier) else tier
        rows = np.flatnonzero((tier == np.repeat(least, np.diff(np.r_[starts, len(tier)]))) & fit)
        shared[key] = rows, tier[rows]
    return shared[key]


_NO_TIER = np.iinfo(np.int64).max  # a row that does not fit: in no tier


FIRST_ROUND_ROWS = 64  # per count: a step-time pass costs mostly its fixed ~1,000 numpy calls, rows little


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
