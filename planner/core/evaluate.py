"""One vectorised pass over candidate layouts: memory, step time and everything derived from them.

A single estimate is an evaluation of one candidate, through the same formulas with the layout's
columns as Python scalars (``evaluate_one``); there is no scalar copy of the model.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from planner.core.checks import ROOMY_SHARE
from planner.core.columns import as_float, minimum
from planner.core.flops import hardware_flops_per_token, model_flops_per_token
from planner.core.layout import Candidates, Job, is_one_row
from planner.core.memory import Memory, hardware_read, memory
from planner.core.model import ModelSpec
from planner.core.steptime import StepTime, reference_peak, step_time
from planner.evidence import memory_band
from planner.hardware import HardwareProfile
from planner.memo import by_identity, fast_init
from planner.stacks import effective, software


@fast_init
@dataclass(frozen=True, slots=True)
class Evaluation:
    """Columns aligned with the candidates. Seconds, bytes, FLOP/s, joules: SI units."""

    candidates: Candidates
    memory: Memory  # the peak stage
    time: StepTime
    capacity_bytes: float
    tokens_per_step: np.ndarray
    model_flops_per_step: np.ndarray
    hardware_flops_per_step: np.ndarray
    peak_flops: float
    train_tokens: float
    gpus: int
    power_watts: float
    pue: float
    price_usd_per_gpu_hour: float
    packing_efficiency: float
    host_capacity_bytes: float = float("inf")  # host memory of a node (offload)
    gpus_per_host: int = 8  # GPUs sharing one host's memory (offload)
    stage_memory: tuple[Memory, ...] = ()  # first, fullest and last pipeline stage
    # The fit verdict's lines, shares of ``capacity_bytes`` (planner.evidence.MemoryBand, ``fit_lines``):
    # fits up to ``fits_share``, tight up to ``tight_share``, does not fit above; the ranking puts the
    # layouts under ``safe_share`` first (the plan's memory line: it keeps room unless --memory-headroom).
    fits_share: float = 1.0
    tight_share: float = 1.0
    safe_share: float = 1.0
    eval_tokens: float = 0.0  # real tokens each evaluation reads (0: none)
    eval_every_tokens: float = 0.0  # evaluate each time this many real tokens are trained
    eval_every_steps: int = 0  # or each time this many steps are
    room_share: float = 1.0  # the plan's memory line: a best layout above it names a roomier one, below it faster ones

    @property
    def fits(self) -> np.ndarray:
        """Not "does not fit": in GPU memory up to the tight line (the stack's measured memory error
        above capacity), and what is offloaded in the host memory of its node."""
        return _fits(self.memory, self.candidates, self.capacity_bytes * self.tight_share, self.host_capacity_bytes,
                     self.gpus_per_host)

    @property
    def tight(self) -> np.ndarray:
        """Listed, but within the stack's measured memory error of capacity (or above it by less)."""
        return self.fits & (self.memory.total > self.capacity_bytes * self.fits_share)

    @property
    def tier(self) -> np.ndarray:
        """The ranking's memory tier of each layout that fits: 0 under the safe line, then fitting
        above it, then tight under capacity, then tight above it (``planner.core.search.rank_order``)."""
        return memory_tier(self.memory.total, self.capacity_bytes, self.fits_share, self.safe_share)

    @property
    def host_bytes_per_host(self) -> np.ndarray:
        return _host_bytes_per_host(self.memory, self.candidates, self.gpus_per_host)

    @property
    def step_s(self) -> np.ndarray:
        return self.time.step

    @property
    def bubble_fraction(self) -> np.ndarray:
        return self.time.bubble / self.step_s

    @property
    def comm_fraction(self) -> np.ndarray:
        t = self.time
        return (t.tp_comm + t.cp_comm + t.ep_comm + t.pp_comm + t.dp_comm) / self.step_s

    @property
    def tokens_per_s(self) -> np.ndarray:
        return self.tokens_per_step / self.step_s

    @property
    def model_flops_per_gpu(self) -> np.ndarray:
        return self.model_flops_per_step / self.step_s / self.gpus

    @property
    def mfu(self) -> np.ndarray:
        return self.model_flops_per_gpu / self.peak_flops

    @property
    def hfu(self) -> np.ndarray:
        return self.hardware_flops_per_step / self.step_s / self.gpus / self.peak_flops

    @property
    def train_seconds(self) -> np.ndarray:
        """Ideal (failure-free) time: the planned real tokens over the real-token rate, plus the
        evaluations (``eval_seconds``)."""
        steps_s = self.train_tokens / (self.tokens_per_s * self.packing_efficiency)
        return steps_s + self.eval_seconds if self.eval_tokens else steps_s

    @property
    def evaluations(self) -> np.ndarray | float:
        """How many evaluations the run makes: one each time eval_every real tokens (or
        eval_every_steps steps) have been trained, the last at or before the end."""
        if not self.eval_tokens:
            return 0.0
        if self.eval_every_steps:
            steps = self.train_tokens / (self.tokens_per_step * self.packing_efficiency)
            return np.floor(steps / self.eval_every_steps * (1 + 1e-12))  # 1e-12: an exact multiple counts
        return np.floor(self.train_tokens / self.eval_every_tokens * (1 + 1e-12))

    @property
    def eval_seconds(self) -> np.ndarray | float:
        """Forward-only passes over eval_tokens real tokens each evaluation, a global batch at a time
        (``StepTime.eval_batch``; a last, partial batch costs its share)."""
        if not self.eval_tokens:
            return 0.0
        return self.evaluations * self.eval_tokens / (self.tokens_per_step * self.packing_efficiency) * self.time.eval_batch

    @property
    def gpu_hours(self) -> np.ndarray:
        return self.totals(self.train_seconds)[0]

    @property
    def energy_kwh(self) -> np.ndarray:
        """GPU power x time x PUE (GPUs only: hosts and network are left out, as in the Llama 2
        paper's accounting, which uses the GPUs' TDP)."""
        return self.totals(self.train_seconds)[1]

    @property
    def cost_usd(self) -> np.ndarray:
        return self.totals(self.train_seconds)[2]

    def totals(self, seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(GPU-hours, energy in kWh, cost in USD) of a run of ``seconds`` (``train_seconds``, read
        once by a caller that wants all three)."""
        gpu_hours = seconds * self.gpus / 3600.0
        return (gpu_hours, self.gpus * self.power_watts * seconds * self.pue / 3.6e6,
                gpu_hours * self.price_usd_per_gpu_hour)


def take(ev: Evaluation, index: np.ndarray) -> Evaluation:
    """The evaluation restricted (and reordered) to ``index``."""
    names = list(ev.candidates.columns())
    taken = _take_columns([*ev.candidates.columns().values(), *_columns(ev)], index)
    return _with_columns(ev, Candidates(**dict(zip(names, taken))), taken[len(names):])


def row_of(ev: Evaluation, i: int) -> Evaluation:
    """Row ``i`` of the evaluation alone, every column a Python scalar (its candidates
    ``Candidates.one_row``): the derived figures (MFU, days, cost) read from it are the table's at
    that row (the same float64 operations), at a scalar's cost rather than a column's."""
    if is_one_row(ev.candidates):  # already one layout's scalars (``evaluate_one``)
        return ev
    return _with_columns(ev, ev.candidates.one_row(i), [col.item(i) for col in _columns(ev)])


def evaluate_one(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, gpus: int) -> Evaluation:
    """``evaluate`` of a table of one layout, with every column a Python scalar (its candidates
    ``c.one_row()``): the numbers of that layout's row in any table (the same operations, as
    scalars), without a table's arrays (``as_table`` builds them)."""
    sw, hw = _effective(hw, job)
    one = c.one_row()
    mem, stages = memory(model, hw, job, one, sw)
    return _evaluation(model, hw, job, one, gpus, sw, mem, stages, step_time(model, hw, job, one, sw))


def as_table(one: Evaluation) -> Evaluation:
    """A one-layout evaluation of scalars (``evaluate_one``, ``row_of``) as a table of one row."""
    return _with_columns(one, one.candidates.table(), [_one(x) for x in _columns(one)])


def _columns(ev: Evaluation) -> list[np.ndarray]:
    """The evaluation's columns besides its candidates', in the order ``_with_columns`` reads them."""
    parts = (ev.memory, ev.time, *ev.stage_memory)
    return [*(getattr(part, f) for part in parts for f in part.__slots__),
            ev.tokens_per_step, ev.model_flops_per_step, ev.hardware_flops_per_step]


def _with_columns(ev: Evaluation, candidates: Candidates, columns: list) -> Evaluation:
    """``ev`` with these candidates and ``columns`` (``_columns``' order) in place of its own."""
    out, k = [], 0
    for part in (ev.memory, ev.time, *ev.stage_memory):
        out.append(type(part)(*columns[k:k + len(part.__slots__)]))
        k += len(part.__slots__)
    return dataclasses.replace(ev, candidates=candidates, memory=out[0], time=out[1], stage_memory=tuple(out[2:]),
                               tokens_per_step=columns[k], model_flops_per_step=columns[k + 1],
                               hardware_flops_per_step=columns[k + 2])


def _take_columns(columns: list[np.ndarray], index: np.ndarray) -> list[np.ndarray]:
    """Each column at ``index``. The columns of one dtype (float64, int64) and of the table's length
    are stacked and taken in one pass: the same values as one gather per column, in a third less
    time on 50K rows."""
    index = np.asarray(index)
    if index.dtype == bool:
        index = np.flatnonzero(index)
    if len(index) <= 16:  # a few rows: stacking would copy every column whole
        return [col[index] for col in columns]
    n = len(columns[0])
    out = [None] * len(columns)
    for dtype in (np.float64, np.int64):
        same = [i for i, col in enumerate(columns) if col.dtype == dtype and col.shape == (n,)]
        if same:
            for i, row in zip(same, np.take(np.stack([columns[i] for i in same]), index, axis=1)):
                out[i] = row
    return [col[index] if got is None else got for col, got in zip(columns, out)]


def _host_bytes_per_host(mem: Memory, c: Candidates, gpus_per_host: int) -> np.ndarray:
    return mem.host * minimum(c.gpus, gpus_per_host)


def _fits(mem: Memory, c: Candidates, capacity: float, host_capacity: float, gpus_per_host: int) -> np.ndarray:
    return (mem.total <= capacity) & (_host_bytes_per_host(mem, c, gpus_per_host) <= host_capacity)


def usable_memory(hw: HardwareProfile, job: Job) -> float:
    """The memory per GPU a plan may fill: the profile's capacity less the job's headroom."""
    return hw.gpu.memory_bytes * (1.0 - (job.memory_headroom or 0.0))


def memory_tier(total: np.ndarray, capacity: float, fits_share: float, safe_share: float) -> np.ndarray:
    """0 under the safe line, 1 fitting above it, 2 tight under capacity, 3 tight above (``fit_lines``)."""
    return (np.asarray(total > capacity * safe_share, dtype=np.int64) + (total > capacity * max(safe_share, fits_share))
            + (total > capacity * max(safe_share, 1.0)))


@by_identity  # one job and stack: every layout's
def fit_lines(job: Job, stack) -> tuple[float, float, float, float]:
    """(fits, tight, safe, room) shares of the memory a plan may fill: fits up to 1 - under, tight up to
    1 + over (the stack's measured memory band: planner.evidence.memory_band), and the line the
    ranking keeps the best plan under: the stricter of ROOMY_SHARE and the fits line by default,
    the capacity itself when --memory-headroom is given (0: plan up to capacity, as before); and the
    line a plan's note compares with (the safe line by default, ROOMY_SHARE with a headroom given)."""
    band = memory_band(stack)
    fits = 1.0 - band.under
    room = min(ROOMY_SHARE, fits) if job.memory_headroom is None else ROOMY_SHARE
    return fits, 1.0 + band.over, room if job.memory_headroom is None else 1.0, room


def _effective(hw: HardwareProfile, job: Job):
    """The job's software and the profile with the stack's factors (and, with a memory headroom,
    the memory a plan may fill as its capacity: what fits and what reports compare with)."""
    sw = software(job)
    hw_eff = effective(hw, sw.stack, job.async_tp)
    if not job.overlap_grad_reduce:
        hw_eff = hw_eff.with_factors({"dp_overlap": 0.0})
    if job.memory_headroom:
        hw_eff = dataclasses.replace(hw_eff, gpu=dataclasses.replace(hw_eff.gpu, memory_bytes=usable_memory(hw, job)))
    return sw, hw_eff


# Layouts evaluated at once. Each formula works row by row, so a large table is evaluated in blocks
# of this many rows, with the same numbers: a block's temporaries (128 KiB a column) stay in the
# caches and their memory is reused by the next block, where a whole 70K-row table's temporaries
# are fresh pages from the kernel each time (measured at 8,192 rows: memory 31 -> 12 ms, step time
# 45 -> 22 ms on 69K layouts). Twice that since the parts a layer or a stage's model states read are
# computed once per distinct combination (``per_distinct``). A pass's fixed cost (a thousand numpy
# calls) is paid per block, so a table of up to ONE_BLOCK_ROWS is one block, not two and a join
# (DeepSeek-V3 on 2,048 GPUs with recompute half searched, 17,052 layouts: its whole table
# evaluated and ranked in 0.66 of the time of two blocks, interleaved in one process; 22,736 with
# quarter too); larger tables keep blocks of BLOCK_ROWS.
BLOCK_ROWS = 16384
ONE_BLOCK_ROWS = 24576


def block_rows(n: int) -> int:
    """The rows per block of a table of ``n`` rows: all of them up to ONE_BLOCK_ROWS, else BLOCK_ROWS."""
    return max(n, 1) if n <= ONE_BLOCK_ROWS else BLOCK_ROWS


# glibc's cap on its dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): a block freed
# above it leaves the thresholds as they are.
_MMAP_THRESHOLD_MAX = 32 << 20
# The block ``_keep_freed_heap`` makes and frees: 64 KiB under that cap, so that its mapping (its
# bytes and malloc's 16-byte header, rounded up to whole pages) stays within it.
_FREED_BLOCK_BYTES = _MMAP_THRESHOLD_MAX - (1 << 16)


@functools.cache
def _keep_freed_heap() -> None:
    """Once per process: one array of about 32 MiB allocated and freed, never touched. glibc's
    malloc gives the top of its heap back to the kernel whenever more than its trim threshold is
    free there (128 KiB in a new process), so each pass over a table (megabytes of temporaries,
    freed at its end) found its memory as fresh pages again, each zero-filled by the kernel on
    first touch: about half the time of memory and step time on 5-10K layouts (DeepSeek-V3 on
    2,048 GPUs: 1,000-1,500 page faults a pass). Freeing a block that malloc mapped on its own
    raises its thresholds to that block's size (mmap) and twice it (trim): glibc's dynamic mmap
    threshold, what any process that once held a large array gets. The block is as large as that
    rule allows, so the trim threshold is about 64 MiB: with an 8 MiB block (16 MiB trim), a
    search of 69,471 layouts (Mixtral 8x22B on 4,096 GPUs, 40-50 MB of temporaries) still mapped
    9,000-12,000 fresh pages each time, 40-50% of its time (tests/test_speed_paths.py counts them).
    64 MiB is not enough either for the largest searches (115,785 layouts, Mixtral 8x22B on 4,096
    GPUs with recompute half and quarter searched: ~80 MB at the peak, 20,000 fresh pages a search
    in four of eight, each such search twice as long), so the trim threshold is then set to
    _KEPT_FREE_BYTES itself (glibc's mallopt; the mmap threshold stays the 32 MiB the block raised
    it to). Other allocators: an array made and freed, nothing set."""
    np.empty(_FREED_BLOCK_BYTES // 8)
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): its own policy
        return
    if hasattr(libc, "mallopt"):
        libc.mallopt(_M_TRIM_THRESHOLD, _KEPT_FREE_BYTES)


_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_KEPT_FREE_BYTES = 128 << 20  # freed heap a process keeps mapped: above the largest search's peak


def _in_blocks(f, c: Candidates):
    """``f(c)`` (a dataclass of columns, or a tuple of them), computed a block of rows at a time;
    one layout with its columns as scalars (``Candidates.one_row``), its parts made columns of one row."""
    if len(c) == 1:
        return _as_rows(f(c.one_row()))
    _keep_freed_heap()
    block = block_rows(len(c))
    if len(c) <= block:
        return f(c)
    return _join([_checked(f(b), len(b)) for b in (c.take(slice(i, i + block)) for i in range(0, len(c), block))])


def _as_rows(value):
    """Each field of a one-layout result (scalars) as a column of one row."""
    if isinstance(value, tuple):
        return tuple(_as_rows(v) for v in value)
    values = [getattr(value, f) for f in type(value).__slots__]
    # The floats (most fields) stacked into one (n, 1) array, whose rows are the columns:
    # 0.24 us a field where one array each costs 0.4-0.6 us.
    rows = iter(np.array([x for x in values if type(x) in _FLOATS], dtype=np.float64).reshape(-1, 1))
    return type(value)(*(next(rows) if type(x) in _FLOATS else _one(x) for x in values))


_FLOATS = (float, np.float64)


def _one(x) -> np.ndarray:
    """A scalar (or a one-element array) as a column of one row, of its dtype."""
    return x.reshape(1) if type(x) is np.ndarray else np.array([x])


def _join(parts: list):
    """The blocks' parts as one (each field a column of its block's rows: ``_checked``)."""
    if isinstance(parts[0], tuple):
        return tuple(_join([p[k] for p in parts]) for k in range(len(parts[0])))
    cls = type(parts[0])
    return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__slots__))


def _columns_ok(value, n: int) -> bool:
    """Every field a column of ``n`` rows (then blocks join into what one pass gives)."""
    if isinstance(value, tuple):
        return all(_columns_ok(v, n) for v in value)
    return all(np.shape(getattr(value, f)) == (n,) for f in type(value).__slots__)


def _memory(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw) -> tuple[Memory, tuple[Memory, ...]]:
    return _in_blocks(lambda b: memory(model, hw, job, b, sw), c)


def _step_time(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, sw) -> StepTime:
    return _in_blocks(lambda b: step_time(model, hw, job, b, sw), c)


def _checked(value, n: int):
    if not _columns_ok(value, n):  # a part that is no column would not join as one pass gives it
        raise AssertionError("evaluate: a memory or step-time part is not one value per layout")
    return value


def evaluate(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, gpus: int) -> Evaluation:
    """``hw`` is the hardware profile; the job's software stack adds its factors here."""
    sw, hw = _effective(hw, job)
    mem, stages = _memory(model, hw, job, c, sw)
    return _evaluation(model, hw, job, c, gpus, sw, mem, stages, _step_time(model, hw, job, c, sw))


DEFER_MIN_ROWS = 4096  # ``evaluate_deferred`` leaves out the step time of at least this many layouts, or none


class DeferredStepTime:
    """The step times ``evaluate_deferred`` left out: ``fill(rows)`` computes those of ``rows``
    (all, with None) still missing and writes them into the table's step-time columns."""

    __slots__ = ("_compute", "missing")

    def __init__(self, missing: np.ndarray, compute) -> None:
        self.missing = missing  # bool per row: its step time is not computed yet
        self._compute = compute

    def fill(self, rows: np.ndarray | None = None) -> None:
        if rows is None:
            idx = np.flatnonzero(self.missing)
        else:  # the rows by a mask, not a sort: a selection may be the whole table
            want = np.zeros_like(self.missing)
            want[rows] = True
            idx = np.flatnonzero(want & self.missing)
        if idx.size:
            self._compute(idx)
            self.missing[idx] = False


def evaluate_deferred(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates,
                      gpus: int) -> tuple[Evaluation, DeferredStepTime | None]:
    """``evaluate``, with the step time computed now only for the layouts that fit (all a ranking
    reads: fitting layouts by the objective, the others by memory); the others' step-time columns
    hold NaN until the returned ``DeferredStepTime`` fills them (None: nothing was left out). Every
    formula works row by row, so a row's numbers are those ``evaluate`` gives it, whenever computed.
    On a large table most layouts do not fit (Mixtral 8x22B on 4,096 GPUs: 7%), and the step time
    is half the evaluation."""
    sw, hw = _effective(hw, job)
    mem, stages = _memory(model, hw, job, c, sw)
    fit = _fits(mem, c, hw.gpu.memory_bytes * fit_lines(job, sw.stack)[1], hw.network.host_memory_bytes,
                hw.network.host_gpus)
    n, rows = len(c), np.flatnonzero(fit)
    # More than a third fit, or too few are left out: one pass. A pass has a fixed cost (its ~1,000
    # numpy calls: 0.5-0.6 ms) beside its rows' (0.05-0.1 us each, the parts of distinct rows
    # computed once), which a caller reading the whole table pays again for the rows left out:
    # leaving out 6,366 of 11,368 (DeepSeek-V3 on 2,048 GPUs) saved the search 0.35 ms and cost
    # the whole table 0.65 ms.
    if 3 * len(rows) > n or n - len(rows) < DEFER_MIN_ROWS:
        return _evaluation(model, hw, job, c, gpus, sw, mem, stages, _step_time(model, hw, job, c, sw)), None
    columns = [np.full(n, np.nan) for _ in StepTime.__slots__]
    st = StepTime(*columns)

    def compute(idx: np.ndarray) -> None:
        # Only the rows missing, gathered, unless that is every row: filling the 2,514 of 4,550 rows
        # left (33B on 128 GPUs) took 3.7 ms where a pass over the whole table took 5.4 ms (DeepSeek-V3
        # on 2,048: 10.0 vs 16.5 ms CPU, interleaved); a gather costs far less than a row's step time.
        if len(idx) == n:
            whole = _step_time(model, hw, job, c, sw)  # the rows already there come out the same (row by row)
            for column, name in zip(columns, StepTime.__slots__):
                column[:] = getattr(whole, name)
            return
        part = _step_time(model, hw, job, c.take(idx), sw)
        for column, name in zip(columns, StepTime.__slots__):
            column[idx] = getattr(part, name)

    if rows.size:
        compute(rows)
    return _evaluation(model, hw, job, c, gpus, sw, mem, stages, st), DeferredStepTime(~fit, compute)


def evaluate_fitting(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates,
                     shared: dict | None = None) -> list[tuple[Evaluation, np.ndarray]]:
    """``evaluate`` of the layouts of ``c`` that fit, a block of rows at a time: (the block's
    fitting layouts' Evaluation, their rows in ``c``) for each block where some fit. The memory of
    every layout, the step time only of those that fit (all that the fastest fitting layout
    needs); the blocks are not joined. Each row's numbers are those ``evaluate`` gives it: every
    formula works row by row. The Evaluations' ``gpus`` is 0: set it where a row is used.
    ``shared``: a dict kept for one ``c`` (and model and job) across profiles; a block's memory is
    computed once for the profiles that read the same of the hardware (memory.hardware_read)."""
    sw, hw = _effective(hw, job)
    out = []
    shared = {} if shared is None else shared
    _keep_freed_heap()
    block = block_rows(len(c))
    for i in range(0, len(c), block):
        b = c.take(slice(i, i + block))
        key = (model, job, hardware_read(hw), i)
        if key not in shared:
            shared[key] = _checked(memory(model, hw, job, b, sw), len(b))
        mem, stages = shared[key]
        fit = np.flatnonzero(_fits(mem, b, hw.gpu.memory_bytes * fit_lines(job, sw.stack)[1], hw.network.host_memory_bytes,
                                   hw.network.host_gpus))
        if len(fit) == 0:
            continue
        if len(fit) < len(b):
            b = b.take(fit)
            mem, *stages = [type(m)(*(getattr(m, f)[fit] for f in m.__slots__)) for m in (mem, *stages)]
        st = _checked(step_time(model, hw, job, b, sw), len(b))
        out.append((_evaluation(model, hw, job, b, 0, sw, mem, tuple(stages), st), fit + i))
    return out


def _evaluation(model: ModelSpec, hw: HardwareProfile, job: Job, c: Candidates, gpus: int, sw, mem: Memory,
                stages: tuple[Memory, ...], st: StepTime) -> Evaluation:
    """The Evaluation of memory ``mem`` (peak stage; ``stages``) and step time ``st`` (``hw`` effective)."""
    tokens = c.global_batch * model.seq_len
    per_token = model_flops_per_token(model, job)
    price = job.price_usd_per_gpu_hour if job.price_usd_per_gpu_hour is not None else hw.price_usd_per_gpu_hour
    fits_share, tight_share, safe_share, room_share = fit_lines(job, sw.stack)
    return Evaluation(
        candidates=c, memory=mem, time=st, capacity_bytes=hw.gpu.memory_bytes,
        tokens_per_step=as_float(tokens), model_flops_per_step=per_token * tokens,
        hardware_flops_per_step=hardware_flops_per_token(
            model, job, c.recompute, sw.stack.selective,
            full_square=sw.attention == "standard" or sw.stack.attention_square == "full") * tokens,
        peak_flops=reference_peak(hw, job.precision),
        train_tokens=job.train_tokens(model), gpus=gpus,
        power_watts=hw.gpu.tdp_watts * hw.efficiency.power_fraction, pue=job.pue, price_usd_per_gpu_hour=price,
        packing_efficiency=job.packing_efficiency, host_capacity_bytes=hw.network.host_memory_bytes,
        gpus_per_host=hw.network.host_gpus, stage_memory=stages, fits_share=fits_share, tight_share=tight_share,
        safe_share=safe_share, room_share=room_share, eval_tokens=job.eval_tokens or 0.0,
        eval_every_tokens=job.eval_every or 0.0, eval_every_steps=job.eval_every_steps or 0)
