"""From plans to decisions: compare hardware options, and recommend the GPU count that meets a deadline.

Pure functions returning frozen dataclasses; ``planner/cli/decide.py`` parses and formats.

A *probe* is the best layout of one (profile, GPU count): a full search (milliseconds). ``compare``
probes the counts the user lists. ``recommend`` walks a ladder of counts (powers of two below one
node, then whole nodes doubling up to a cap), then bisects in whole nodes between the last count
that failed and the first that passed. The bisection keeps "lo fails, hi passes", so the count it
returns passes and one node fewer fails, even where time is not monotone in the GPU count (it is
nearly so: divisibility of heads, layers and batch by the count makes small ripples).

A deadline is wall-clock time: the expected time with failures, checkpoints and restarts
(planner/core/resilience.py, Daly 2006) where the estimate has a reliability plan, else the ideal time.
The budget is held against the cost of that same wall-clock time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from planner.core.layout import Job
from planner.core.model import ModelSpec
from planner.core.options import fit_job_to_gpu
from planner.core.resilience import Operations
from planner.core.results import Estimate
from planner.core.search import Pins
from planner.errors import PlannerError
from planner.hardware import HardwareProfile
from planner.units import GIB, fmt_days

DEFAULT_MAX_GPUS = 16384


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One hardware choice and the job as it runs there (the precision may differ per GPU)."""

    hardware: HardwareProfile
    job: Job
    ops: Operations = Operations()
    note: str = ""  # e.g. why the precision differs from the one asked for


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """The best layout of one option at one GPU count, or why there is none."""

    gpu: str
    gpus: int
    best: Estimate | None  # None: no layout fits (or none is valid)
    capacity_bytes: float
    why: str = ""  # set when ``best`` is None
    min_bytes: float | None = None  # the least memory per GPU of any layout, when none fits
    error: PlannerError | None = None  # when no layout is valid at this count (a pin, the precision)

    @property
    def fits(self) -> bool:
        return self.best is not None

    @property
    def days(self) -> float:
        """Expected wall-clock days (with failures), infinite when nothing fits."""
        return wall_seconds(self.best) / 86400 if self.best else float("inf")

    @property
    def cost_usd(self) -> float:
        return wall_cost_usd(self.best) if self.best else float("inf")


def wall_seconds(e: Estimate) -> float:
    """Expected wall-clock seconds: with failures and checkpoints when the estimate has a reliability
    plan, else the ideal (failure-free) time."""
    return e.reliability.expected_seconds if e.reliability is not None else e.train.seconds


def wall_cost_usd(e: Estimate) -> float:
    """The GPUs are paid for the wall-clock time: the ideal cost scaled by wall / ideal time."""
    return e.train.cost_usd * wall_seconds(e) / e.train.seconds


def options_for(profiles: list[HardwareProfile], job: Job, given: Collection[str] = (),
                ops: list[Operations] | None = None) -> tuple[Option, ...]:
    """Each profile with the job as it runs there (and operations, one per profile): the job goes
    through planner.core.options.fit_job_to_gpu, as `planner estimate`'s does, so a profile gets
    the precision and attention kernel estimate would give it (``given``: the fields of
    GPU_DEFAULTED the user chose, kept as they are); the note says what changed."""
    out = []
    for i, hw in enumerate(profiles):
        fitted, note = fit_job_to_gpu(job, hw, given)
        out.append(Option(hardware=hw, job=fitted, ops=ops[i] if ops else Operations(),
                          note=f"{hw.name}: {note}" if note else ""))
    return tuple(out)


def probe(model: ModelSpec, option: Option, gpus: int, pins: Pins = Pins(), objective: str = "time") -> Probe:
    """The best fitting layout at ``gpus``; a count where no layout is valid or fits is a Probe
    without an estimate and with the reason (a pin that does not divide this count, say)."""
    from planner.core.evaluate import usable_memory

    from planner.core.plan import plan

    hw = option.hardware
    cap = usable_memory(hw, option.job)
    try:  # `planner estimate`'s own choice (planner.core.plan.plan), so a row is its plan
        p = plan(model, hw, option.job, gpus, pins, objective, top=0, ops=option.ops)
    except PlannerError as exc:  # a pin that does not divide this count; an MTBF too short for it
        return Probe(gpu=hw.name, gpus=gpus, best=None, capacity_bytes=cap, why=str(exc), error=exc)
    if p.fits:
        return Probe(gpu=hw.name, gpus=gpus, best=p.best, capacity_bytes=cap)
    result = p.result
    need = float(result.memory.total.min())
    return Probe(gpu=hw.name, gpus=gpus, best=None, capacity_bytes=cap, min_bytes=need,
                 why=f"does not fit: the leanest of {result.evaluated} layouts needs {need / GIB:.1f} GiB per GPU, "
                     f"{hw.name} has {cap / GIB:.0f} GiB"
                     + (f" after the {option.job.memory_headroom:.0%} headroom" if option.job.memory_headroom else ""))


# --- compare ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    model: ModelSpec
    options: tuple[Option, ...]
    rows: tuple[Probe, ...]  # options in the order given, GPU counts ascending within each


def compare(model: ModelSpec, options: tuple[Option, ...], gpu_counts: tuple[int, ...], pins: Pins = Pins(),
            objective: str = "time", strict: bool = True) -> Comparison:
    """The best layout of every (option, GPU count). Raises when nothing fits anywhere (``strict``;
    else the rows say why each has no layout)."""
    counts = sorted(set(gpu_counts))
    rows = tuple(probe(model, o, n, pins, objective) for o in options for n in counts)
    if strict and not any(r.fits for r in rows):
        raise _fits_nowhere(model, rows)
    return Comparison(model=model, options=options, rows=rows)


def _fits_nowhere(model: ModelSpec, rows: tuple[Probe, ...] | list[Probe]) -> PlannerError:
    sized = [r for r in rows if r.min_bytes is not None]
    if not sized:  # nothing was even valid anywhere: the first error names the field
        return rows[0].error
    r = min(sized, key=lambda r: r.min_bytes / r.capacity_bytes)
    return PlannerError("model", model.name,
                        f"fits on none of the options: closest is {r.gpus} x {r.gpu} needing {r.min_bytes / GIB:.1f} "
                        f"GiB per GPU of {r.capacity_bytes / GIB:.0f}; more GPUs, a GPU with more memory, "
                        "or a smaller model")


# --- recommend ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """What one option can do against the deadline (and budget)."""

    option: Option
    min_fit: Probe | None  # the fewest GPUs on which the model fits at all
    pick: Probe | None  # the fewest GPUs that meet the deadline and the budget
    fastest: Probe | None  # the fastest run found (for the reason when the deadline is missed)
    why: str  # empty when ``pick`` is set
    probes: tuple[Probe, ...]  # every count evaluated, ascending

    @property
    def name(self) -> str:
        return self.option.hardware.name


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    model: ModelSpec
    deadline_s: float
    budget_usd: float | None
    max_gpus: int
    answers: tuple[Answer, ...]

    @property
    def cheapest(self) -> Answer | None:
        """The option whose pick costs least (ties: fewer days)."""
        ok = [a for a in self.answers if a.pick]
        return min(ok, key=lambda a: (a.pick.cost_usd, a.pick.days)) if ok else None

    @property
    def min_fit(self) -> Answer | None:
        """The option on which the model fits on the fewest GPUs."""
        ok = [a for a in self.answers if a.min_fit]
        return min(ok, key=lambda a: a.min_fit.gpus) if ok else None


def gpu_ladder(gpus_per_node: int, max_gpus: int) -> list[int]:
    """Powers of two below one node, then one node doubling up to ``max_gpus`` (and the cap itself,
    rounded down to whole nodes, when doubling skips it)."""
    ladder = []
    n = 1
    while n < gpus_per_node and n <= max_gpus:
        ladder.append(n)
        n *= 2
    n = gpus_per_node
    while n <= max_gpus:
        ladder.append(n)
        n *= 2
    cap = max_gpus // gpus_per_node * gpus_per_node
    if cap >= gpus_per_node and cap not in ladder:
        ladder.append(cap)
    return ladder


class _Prober:
    """Probes one option, remembering every count it has evaluated."""

    def __init__(self, model: ModelSpec, option: Option, pins: Pins):
        self.model, self.option, self.pins = model, option, pins
        self.seen: dict[int, Probe] = {}

    def __call__(self, gpus: int) -> Probe:
        if gpus not in self.seen:
            self.seen[gpus] = probe(self.model, self.option, gpus, self.pins)
        return self.seen[gpus]

    def first(self, ladder: list[int], passes) -> tuple[int | None, int | None]:
        """The last ladder count that fails before the first that passes, and that first one."""
        below = None
        for n in ladder:
            if passes(self(n)):
                return below, n
            below = n
        return below, None

    def bisect(self, lo: int | None, hi: int, passes) -> int:
        """The smallest passing count between a failing ``lo`` and a passing ``hi``, in whole hosts
        (scheduler nodes: an NVL72 rack's trays of 4; counts below one stay powers of two: the
        ladder already tried them)."""
        host = self.option.hardware.network.host_gpus
        if lo is None or lo < host:
            return hi
        a, b = lo // host, hi // host  # hosts: a fails, b passes
        while b - a > 1:
            mid = (a + b) // 2
            if passes(self(mid * host)):
                b = mid
            else:
                a = mid
        return b * host


def recommend(model: ModelSpec, options: tuple[Option, ...], deadline_s: float, budget_usd: float | None = None,
              max_gpus: int = DEFAULT_MAX_GPUS, pins: Pins = Pins()) -> Recommendation:
    """Per option: the fewest GPUs on which the model fits, the fewest that train it within the
    deadline (and budget), or why no count up to ``max_gpus`` does. Raises when it fits nowhere."""
    answers = tuple(_answer(model, o, deadline_s, budget_usd, max_gpus, pins) for o in options)
    if not any(a.min_fit for a in answers):
        raise _fits_nowhere(model, [p for a in answers for p in a.probes])
    return Recommendation(model=model, deadline_s=deadline_s, budget_usd=budget_usd, max_gpus=max_gpus,
                          answers=answers)


def _answer(model: ModelSpec, option: Option, deadline_s: float, budget_usd: float | None, max_gpus: int,
            pins: Pins) -> Answer:
    prober = _Prober(model, option, pins)
    ladder = gpu_ladder(option.hardware.network.gpus_per_node, max_gpus)

    def fits(p: Probe) -> bool:
        return p.fits

    def in_time(p: Probe) -> bool:
        return p.fits and wall_seconds(p.best) <= deadline_s

    lo, hi = prober.first(ladder, fits)
    min_fit = prober(prober.bisect(lo, hi, fits)) if hi is not None else None
    pick, why = None, ""
    if min_fit is None:
        last = prober(ladder[-1]) if ladder else None
        why = f"does not fit on up to {max_gpus} GPUs" + (f" ({last.why})" if last and last.why else "")
    else:
        lo, hi = prober.first(ladder, in_time)
        if hi is not None:
            pick = prober(prober.bisect(lo, hi, in_time))
    fastest = min((p for p in prober.seen.values() if p.fits), key=lambda p: p.days, default=None)
    if min_fit is not None and pick is None:
        why = (f"misses the deadline: the fastest found is {fmt_days(fastest.days)} on {fastest.gpus:,} GPUs "
               f"(deadline {deadline_s / 86400:g} days; counts up to {max_gpus} tried, --max-gpus to raise)")
    if pick is not None and budget_usd is not None and pick.cost_usd > budget_usd:
        # Cost usually grows with the count; look further up the ladder in case a larger count
        # runs a cheaper layout, then give up with the cheapest run that meets the deadline.
        for n in [n for n in ladder if n > pick.gpus]:
            p = prober(n)
            if in_time(p) and p.cost_usd <= budget_usd:
                pick = p
                break
        else:
            cheapest = min((p for p in prober.seen.values() if in_time(p)), key=lambda p: p.cost_usd)
            why = (f"over budget: the cheapest run that meets the deadline costs ${cheapest.cost_usd:,.0f} "
                   f"({cheapest.gpus:,} GPUs, {fmt_days(cheapest.days)}) > budget ${budget_usd:,.0f}")
            pick = None
    probes = tuple(prober.seen[n] for n in sorted(prober.seen))
    return Answer(option=option, min_fit=min_fit, pick=pick, fastest=fastest, why=why, probes=probes)


def headroom(e: Estimate) -> float:
    """Free memory as a fraction of capacity (negative when it does not fit)."""
    return 1.0 - e.memory.total_bytes / e.memory.capacity_bytes


def summary(e: Estimate) -> dict:
    """The figures a decision turns on, for JSON (SI units, like the estimate's contract)."""
    return {"gpu": e.hardware.name, "gpus": e.gpus, "precision": e.job.precision,
            "layout": dataclasses.asdict(e.layout) | {"grad_accum": e.layout.grad_accum},
            "days": e.train.days, "wall_days": wall_seconds(e) / 86400, "gpu_hours": e.train.gpu_hours,
            "cost_usd": e.train.cost_usd, "wall_cost_usd": wall_cost_usd(e),
            "energy_kwh": e.train.energy_kwh, "mfu": e.mfu, "step_s": e.time.step_s,
            "memory_bytes": e.memory.total_bytes, "capacity_bytes": e.memory.capacity_bytes,
            "headroom_fraction": headroom(e), "fit": e.memory.fit}
