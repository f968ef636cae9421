"""What an estimate's numbers have been checked against: the measured runs docs/validation.md
compares (published rows, and the reference trainer's own held-out runs), summarised for the
estimate's software stack and GPU.

``planner/evidence.json`` holds one record per run and quantity: where the run was published, the
stack it ran as (``software_stacks/``), its GPU profile, and the planner's current error on its
time (step time or tokens/s, predicted / measured - 1) and, where reported, its memory. `python
docs/validation.py` writes it with the page, from the same comparisons; tests/test_validation_page.py
fails when either is stale. Reading it costs well under a millisecond, once per process.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from planner.stacks import get_stack, is_builtin

EVIDENCE_FILE = Path(__file__).with_name("evidence.json")
PAGE = "docs/validation.md"

# Stacks that are one framework at different dates: a run of one checks the others' shared factors.
FAMILIES = (("fsdp2", "fsdp2-2024", "fsdp2-2024-triton-norm", "fsdp2-2025"),)
# What a plan may share with a run beyond its stack, each a test on a record: the subset of runs
# "like this plan" (every feature the plan has) is summarised on its own.
FEATURES = {"moe": ("mixture-of-experts", lambda r: bool(r.get("moe"))),
            "cp": ("context parallel", lambda r: (r.get("cp") or 1) > 1),
            "pp": ("pipeline parallel", lambda r: (r.get("pp") or 1) > 1)}


def family(stack: str) -> tuple[str, ...]:
    """The stacks whose runs check ``stack``: its family, or itself alone."""
    return next((f for f in FAMILIES if stack in f), (stack,))


@functools.lru_cache(maxsize=1)
def records() -> tuple[dict, ...] | None:
    """The committed records; None when the file is missing or unreadable (an estimate still runs,
    and its line says the records are missing rather than claiming anything)."""
    try:
        runs = json.loads(EVIDENCE_FILE.read_text())["runs"]
        return tuple(r for r in runs if isinstance(r, dict) and {"source", "stack", "gpu"} <= set(r)
                     and _number(r.get("time_error")) and (r.get("memory_error") is None
                                                           or _number(r["memory_error"]))
                     and (r.get("speed_error") is None or _number(r["speed_error"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    stack: str
    gpu: str
    runs: int  # runs of this stack's family with a time comparison
    sources: tuple[str, ...]
    gpus: tuple[str, ...]
    time_mean_abs_error: float | None
    time_worst_abs_error: float | None
    memory_runs: int
    memory_mean_abs_error: float | None
    memory_worst_abs_error: float | None
    own_file: bool = False  # a stack file of the user's: no run of ours checks it, whatever its name
    per_gpu: tuple[tuple[str, int], ...] = ()  # runs with a time comparison on each GPU
    per_gpu_error: tuple[tuple[str, float], ...] = ()  # their mean |time error| on each GPU
    unavailable: bool = False  # the records could not be read
    fitted: int = 0  # of ``runs``, those factors were fitted to (in sample)
    like: tuple[str, ...] = ()  # the plan's FEATURES
    like_runs: int = 0  # runs with every one of them
    like_mean_abs_error: float | None = None
    like_worst_abs_error: float | None = None
    # The worst run's speed error, signed (> 0: predicted faster than measured; None: not recorded).
    worst_speed_error: float | None = None
    like_worst_speed_error: float | None = None
    worst_memory_error: float | None = None  # signed (< 0: predicted below measured)
    like_memory_runs: int = 0  # of the runs like this plan, those with a memory comparison
    like_memory_mean_abs_error: float | None = None
    like_memory_worst_abs_error: float | None = None
    like_worst_memory_error: float | None = None  # signed, as ``worst_memory_error``

    def sample(self) -> str:
        """Whether the factors were fitted to these runs: in sample, out of sample, or some of each."""
        if self.fitted == self.runs:
            return "in sample"
        return "out of sample" if not self.fitted else f"{self.fitted} of {self.runs} in sample"

    @property
    def on_gpu(self) -> int:
        """Of ``runs``, those on this estimate's GPU profile."""
        return self.count_on(self.gpu)

    def count_on(self, gpu: str) -> int:
        return dict(self.per_gpu).get(gpu, 0)

    def to_json(self) -> dict:
        return {"runs": self.runs, "on_this_gpu": self.on_gpu, "sources": list(self.sources),
                "gpus": list(self.gpus), "time_mean_abs_error": self.time_mean_abs_error,
                "time_worst_abs_error": self.time_worst_abs_error, "worst_speed_error": self.worst_speed_error,
                "memory_runs": self.memory_runs,
                "memory_mean_abs_error": self.memory_mean_abs_error,
                "memory_worst_abs_error": self.memory_worst_abs_error, "worst_memory_error": self.worst_memory_error, "in_sample": self.fitted, "page": PAGE,
                "like_this_plan": {"features": list(self.like), "runs": self.like_runs,
                                   "time_mean_abs_error": self.like_mean_abs_error,
                                   "time_worst_abs_error": self.like_worst_abs_error,
                                   "worst_speed_error": self.like_worst_speed_error,
                                   "memory_runs": self.like_memory_runs,
                                   "memory_mean_abs_error": self.like_memory_mean_abs_error,
                                   "memory_worst_abs_error": self.like_memory_worst_abs_error,
                                   "worst_memory_error": self.like_worst_memory_error} if self.like else None,
                "summary": self.line()}

    def line(self, on: tuple[str, ...] | None = None) -> str:
        """One line for the report: how many measured runs check this stack, on which GPUs, how well;
        ``on``: the GPUs to count runs on (the estimate's own by default)."""
        return "; ".join(self.clauses(on))

    def clauses(self, on: tuple[str, ...] | None = None) -> list[str]:
        """``line``'s clauses, in order (the report prints one per line): the runs and their time
        error, their memory error, the runs like this plan; the last names the page that has them all."""
        if self.unavailable:
            return [f"the records of measured runs ({EVIDENCE_FILE.name}) are missing from this install"]
        if self.own_file:
            return [f"no measured run checks your stack file ({self.stack})",
                    "`planner calibrate` fits its factors to your runs"]
        if not self.runs:
            return [f"no measured run checks {self.stack}: its factors are the public figures its file cites",
                    "`planner calibrate` fits them to your runs"]
        on = on or (self.gpu,)
        if len(on) == 1 and set(self.gpus) == set(on):
            where = f"all on {on[0]}"
        else:
            errors = dict(self.per_gpu_error)
            have = ", ".join(f"{self.count_on(g)} on {g} ({errors[g]:.1%} mean)" for g in on if self.count_on(g))
            lack = [g for g in on if not self.count_on(g)]
            none = ("" if not lack else f"none on {', '.join(lack)}" if len(lack) <= 2
                    else f"none on the other {len(lack)}" if have else f"none on these {len(lack)}")
            where = f"{', '.join(self.gpus)}; " + ", ".join(x for x in (have, none) if x)
        runs = (f"{self.runs} {' and '.join(self.sources)} run{'' if self.runs == 1 else 's'} ({where}): "
                f"time {self.time_mean_abs_error:.1%} mean error, worst {self.time_worst_abs_error:.0%}"
                f"{_direction(self.worst_speed_error)} ({self.sample()})")
        out = [runs]
        if self.memory_runs:
            out.append(_memory_text(self.memory_runs, self.memory_mean_abs_error, self.memory_worst_abs_error,
                                    self.worst_memory_error))
        if self.like:
            names = " + ".join(FEATURES[f][0] for f in self.like)
            like = (f"like this plan ({names}): " + (
                f"{self.like_runs} run{'' if self.like_runs == 1 else 's'}, time {self.like_mean_abs_error:.1%} "
                f"mean error, worst "
                f"{self.like_worst_abs_error:.0%}{_direction(self.like_worst_speed_error)}"
                if self.like_runs else "none"))
            if self.like_memory_runs:
                like += ", " + _memory_text(self.like_memory_runs, self.like_memory_mean_abs_error,
                                            self.like_memory_worst_abs_error, self.like_worst_memory_error)
            out.append(like)
        out[-1] += f"; {PAGE}"
        return out


def _direction(speed_error: float | None) -> str:
    """Which way the worst run was off, for the report (nothing when not recorded)."""
    if speed_error is None or speed_error == 0:
        return ""
    return f", predicted {'faster' if speed_error > 0 else 'slower'} than measured"


def _memory_text(runs: int, mean: float, worst: float, signed: float | None) -> str:
    """The memory clause: how many runs, the mean and worst |error|, and which way the worst was off."""
    below = signed is not None and signed < 0
    return (f"memory ({runs} run{'' if runs == 1 else 's'}) {mean:.1%}, worst {worst:.0%}, "
            f"predicted {'below' if below else 'above'} measured")


def _worst_speed(runs: list[dict]) -> float | None:
    """The signed speed error of the run with the largest time error (None if it has none)."""
    if not runs:
        return None
    worst = max(runs, key=lambda r: abs(r["time_error"]))
    return worst.get("speed_error")


def calibration_line(hw) -> str:
    """What a calibrated profile's own fit says (its [provenance]), or "" for a datasheet profile."""
    if not hw.calibration:
        return ""
    n, fit, loo = hw.calibration
    errors = [f"{x:.1%}{label}" for label, x in ((" mean error in sample", fit), (" leave-one-out", loo))
              if x is not None]
    return f"profile {hw.name} calibrated on {n} runs" + (f": {', '.join(errors)}" if errors else "")


def calibration_json(calibration: tuple | None) -> dict | None:
    """A profile's ``calibration`` (runs, fit and leave-one-out mean errors) as JSON; None: none."""
    if not calibration:
        return None
    n, fit, loo = calibration
    return {"runs": n, "fit_mean_abs_error": fit, "loo_mean_abs_error": loo}


def for_stack(stack, gpu: str, like: tuple[str, ...] = ()) -> Evidence:
    """``evidence_for`` a Stack object: a file of the user's own gets none, whatever its name."""
    return evidence_for(stack.name, gpu, not is_builtin(stack), like)


@functools.lru_cache(maxsize=256)
def evidence_for(stack: str, gpu: str, own_file: bool = False, like: tuple[str, ...] = ()) -> Evidence:
    """The committed runs of ``stack``'s family, summarised (``summarise``)."""
    return summarise(stack, gpu, records(), own_file, like)


def plan_features(model, layout) -> tuple[str, ...]:
    """The FEATURES a plan has, in their order (one tuple object for each combination)."""
    return _FEATURE_SETS[bool(model.moe), layout.cp > 1, layout.pp > 1]


_FEATURE_SETS = {(moe, cp, pp): tuple(f for f in FEATURES if {"moe": moe, "cp": cp, "pp": pp}[f])
                 for moe in (False, True) for cp in (False, True) for pp in (False, True)}


def summarise(stack: str, gpu: str, runs, own_file: bool = False, like: tuple[str, ...] = ()) -> Evidence:
    """The records of ``runs`` that ran ``stack``'s family, summarised for an estimate on ``gpu``,
    with the subset that has every feature in ``like`` on its own; none for a stack file of the
    user's (``own_file``)."""
    mine = [] if own_file or runs is None else [r for r in runs if r["stack"] in family(stack)]
    timed = [r for r in mine if r.get("time_error") is not None]
    n_time, time_mean, time_worst = _abs_errors(mine, "time_error")
    n_memory, memory_mean, memory_worst = _abs_errors(mine, "memory_error")
    return Evidence(stack=stack, gpu=gpu, runs=n_time,
                    sources=tuple(dict.fromkeys(r["source"] for r in mine)),  # first-seen order, no repeats
                    gpus=tuple(dict.fromkeys(r["gpu"] for r in mine)),
                    time_mean_abs_error=time_mean, time_worst_abs_error=time_worst, memory_runs=n_memory,
                    memory_mean_abs_error=memory_mean, memory_worst_abs_error=memory_worst, own_file=own_file,
                    per_gpu=tuple(Counter(r["gpu"] for r in timed).items()), unavailable=runs is None,
                    per_gpu_error=tuple((g, _abs_errors([r for r in timed if r["gpu"] == g], "time_error")[1])
                                        for g in dict.fromkeys(r["gpu"] for r in timed)),
                    fitted=sum(1 for r in timed if r.get("fitted") is True), like=like,
                    worst_speed_error=_worst_speed(timed),
                    worst_memory_error=_worst_memory(mine), **_like(mine, like))


def _abs_errors(runs: list[dict], key: str) -> tuple[int, float | None, float | None]:
    """How many of ``runs`` have ``key`` (an error), and their mean and worst |error| (None: none has it)."""
    errors = [abs(r[key]) for r in runs if r.get(key) is not None]
    return len(errors), (sum(errors) / len(errors) if errors else None), (max(errors) if errors else None)


def _worst_memory(runs: list[dict]) -> float | None:
    """The signed memory error of the run with the largest |memory error| (None: no run has one)."""
    return max((r["memory_error"] for r in runs if r.get("memory_error") is not None), key=abs, default=None)


def _like(mine: list[dict], like: tuple[str, ...]) -> dict:
    """The runs with every feature of the plan: their time errors and, where measured, memory errors."""
    runs = [r for r in mine if all(FEATURES[f][1](r) for f in like)] if like else []
    n_time, time_mean, time_worst = _abs_errors(runs, "time_error")
    n_memory, memory_mean, memory_worst = _abs_errors(runs, "memory_error")
    return {"like_runs": n_time, "like_mean_abs_error": time_mean, "like_worst_abs_error": time_worst,
            "like_worst_speed_error": _worst_speed([r for r in runs if r.get("time_error") is not None]),
            "like_memory_runs": n_memory, "like_memory_mean_abs_error": memory_mean,
            "like_memory_worst_abs_error": memory_worst, "like_worst_memory_error": _worst_memory(runs)}


# --- the fit verdict's band -------------------------------------------------------------------
MIN_BAND_RUNS = 3  # a stack's own band needs at least this many memory comparisons; else its base's, else all


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBand:
    """How far the planner's peak memory has been from measured peaks: ``under``, the most a
    prediction fell below what the run used, and ``over``, the most it rose above, as fractions of
    the prediction's error on the measured value (``memory_error`` = predicted / measured - 1 of
    each run: under = max(0, -min), over = max(0, max)). A run whose prediction P had error e used
    P / (1 + e): with e in [-under, over], it used between P / (1 + over) and P / (1 - under). The
    verdict (``fit_verdict``): fits when P <= C (1 - under), does not fit when P > C (1 + over),
    tight between (C: the memory a plan may fill)."""

    under: float
    over: float
    runs: int  # the memory comparisons it comes from
    source: str  # whose runs: '20 runs of fsdp2, fsdp2-2024, ...' or the pooled default
    inherited: str = ""  # '' (the stack's own runs), 'base megatron-core', or 'default' (every run pooled)

    def text(self) -> str:
        return f"-{self.under:.1%}/+{self.over:.1%} (worst memory errors of {self.source})"

    def to_json(self) -> dict:
        return {"under": self.under, "over": self.over, "runs": self.runs, "source": self.source,
                "inherited": self.inherited or None}


def _band_of(runs: list[dict]) -> tuple[float, float]:
    errors = [r["memory_error"] for r in runs]
    return max(0.0, -min(errors)), max(0.0, max(errors))


def memory_band(stack) -> MemoryBand:
    """The band of a Stack: its family's memory comparisons when there are MIN_BAND_RUNS of them,
    else its base stack's band (a file with ``base = ...``), else the band of every run with a
    memory comparison, pooled (the documented default: docs/fit-and-overrides.md)."""
    return _memory_band(stack.name, stack.base, is_builtin(stack))


@functools.lru_cache(maxsize=64)
def _memory_band(name: str, base: str, builtin: bool) -> MemoryBand:
    runs = [r for r in (records() or ()) if r.get("memory_error") is not None]
    mine = [r for r in runs if r["stack"] in family(name)] if builtin else []
    if len(mine) >= MIN_BAND_RUNS:
        under, over = _band_of(mine)
        stacks = ", ".join(dict.fromkeys(r["stack"] for r in mine))
        return MemoryBand(under=under, over=over, runs=len(mine), source=f"{len(mine)} measured runs of {stacks}")
    if base:
        b = memory_band(get_stack(base))
        return MemoryBand(under=b.under, over=b.over, runs=b.runs, source=b.source,
                          inherited=f"base {base}" + (f", {b.inherited}" if b.inherited else ""))
    if not runs:  # the records are missing: no band can be claimed
        return MemoryBand(under=0.0, over=0.0, runs=0, source="no measured runs (records missing)", inherited="default")
    under, over = _band_of(runs)
    return MemoryBand(under=under, over=over, runs=len(runs),
                      source=f"all {len(runs)} measured runs of every stack, pooled", inherited="default")


FIT_VERDICTS = ("fits", "tight", "does not fit")


def fit_verdict(total_bytes: float, capacity_bytes: float, band: MemoryBand) -> str:
    """'fits' (P <= C (1 - under)), 'tight' (up to C (1 + over)) or 'does not fit' (above): MemoryBand."""
    if total_bytes <= capacity_bytes * (1 - band.under):
        return FIT_VERDICTS[0]
    return FIT_VERDICTS[1] if total_bytes <= capacity_bytes * (1 + band.over) else FIT_VERDICTS[2]
