"""Calibration: fit a profile's named efficiency factors to measured step times and their parts.

scipy.optimize.least_squares on the relative step-time error, each factor within physical bounds
(searched in a unit box; log-scaled for factors that span decades). By default (``parts``) the fit
also matches each measured part of the step (planner.core.step_parts: compute, exposed TP / DP
communication, bubble, optimizer) as a share of the step, so that it cannot fit the total by
moving time between terms; a run with more processes than its host has cores (a CPU profile's
``compute_slots``) gives its step time only, since its trace books a rank's wait for a core as
communication or bubble. The formulas never change:
only the factors of ``planner.hardware.Efficiency`` do. The fit reports its in-sample error and
the leave-one-out error (each run predicted by factors fitted without it), of the step time and of
each part's share, and names the factors that ended at a bound of their range (a limit the runs
pushed against, not a measurement).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field

import numpy as np

from planner.calibration.measured import Measurement
from planner.calibration.validate import part_shares
from planner.core.evaluate import evaluate
from planner.core.layout import Candidates
from planner.core.steptime import time_shared
from planner.errors import PlannerError
from planner.hardware import Efficiency, HardwareProfile, efficiency_to_table

# factor: (lower, upper, log-scaled)
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "matmul": (0.02, 1.0, False),
    "matmul_half_dim": (1.0, 8192.0, True),
    "memory": (0.02, 1.0, False),
    "flash_attention": (0.02, 1.0, False),
    "intra_node_bw": (0.005, 1.0, True),
    "tp_intra_node_bw": (0.005, 1.0, True),
    "inter_node_bw": (0.005, 1.0, True),
    "dp_overlap": (0.0, 1.0, False),
    "zero3_overlap": (0.0, 1.0, False),
    "tp_overlap": (0.0, 1.0, False),
    "layer_overhead_s": (1e-7, 0.05, True),
    "tp_collective_overhead_s": (1e-7, 0.05, True),
    "optimizer_tensor_overhead_s": (1e-7, 0.01, True),
    "thread_scaling": (0.0, 1.0, False),
    "step_overhead_s": (1e-6, 10.0, True),
}


def default_factors(runs: list[Measurement], base: HardwareProfile, parts: bool = True) -> tuple[str, ...]:
    """The factors these runs can inform: the always-present ones, plus link bandwidth when any
    run communicates, the TP collective overhead when any uses tensor parallel, flash attention's
    efficiency when any uses it, and thread scaling on a CPU host when a process had cores to
    spare. A factor no run exercises cannot be fitted. ``optimizer_tensor_overhead_s`` is fitted only
    when named (--factors): it is 1-3% of a small model's step, which the step times cannot tell
    from the other per-step costs (benchmarks/calibration_cpu.py --mechanism measures it).

    Link bandwidth: tensor-parallel collectives (``tp_intra_node_bw``) apart from the data- and
    pipeline-parallel traffic (``intra_node_bw``) where the runs tell them apart: a parts fit sees
    TP and DP communication as shares of their own; a total-only fit needs a run with tensor
    parallel alone and one with the other dimensions alone. Where they cannot be told apart, one
    factor serves both (once an unlucky fit set ``intra_node_bw`` to 0.10 to absorb TP's waits and
    predicted DP at 13-16% of the step against 4-5% measured)."""
    factors = ["matmul", "memory", "layer_overhead_s"]
    tp = any(r.layout.tp > 1 for r in runs)
    other = any(r.gpus > r.layout.tp for r in runs)
    apart = parts or (any(r.layout.tp > 1 and r.gpus == r.layout.tp for r in runs)
                      and any(r.gpus > 1 and r.layout.tp == 1 for r in runs))
    if other or (tp and not apart):
        factors.append("intra_node_bw")
    if tp and (apart or not other):
        factors.append("tp_intra_node_bw")
    if tp:
        factors.append("tp_collective_overhead_s")
    if base.network.compute_slots and any(r.gpus < base.network.compute_slots for r in runs):
        factors.append("thread_scaling")
    if base.network.compute_slots is None and any(r.job.attention == "flash" for r in runs):
        factors.append("flash_attention")
    return tuple(factors)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    efficiency: Efficiency
    factors: tuple[str, ...]
    converged: bool
    message: str
    errors: np.ndarray  # relative step-time error per run, fitted factors, in sample
    base_errors: np.ndarray  # the same with the base profile's factors
    loo_errors: np.ndarray | None  # leave-one-out
    parts: bool = True  # the shares were fitted, not only the step time
    # Share name -> predicted - measured, in fractions of the step, one per run that measured it
    # with a core per process (in sample; leave-one-out: each run by the fit without it).
    share_errors: dict[str, np.ndarray] = field(default_factory=dict)
    loo_share_errors: dict[str, np.ndarray] = field(default_factory=dict)
    at_bound: tuple[str, ...] = ()  # fitted factors that ended at a bound of their range


# The shares a parts fit matches (validate's quantity names); their differences, in fractions of
# the step, weigh as much as a relative step-time error of the same size.
FIT_SHARES = ("compute_share", "tp_comm_share", "dp_comm_share", "bubble_fraction", "optimizer_share")


def predict_step_s(runs: list[Measurement], hw: HardwareProfile) -> np.ndarray:
    return np.array([float(evaluate(r.model, hw, r.job, Candidates.from_layouts([r.layout]), r.gpus).step_s[0])
                     for r in runs])


def _shares(r: Measurement, hw: HardwareProfile, ev, c: Candidates) -> dict[str, float]:
    """Each fitted share's predicted - measured, for a run whose trace can be trusted with them."""
    if np.any(time_shared(hw, c)):  # a time-shared run: its step time only
        return {}
    got = part_shares(r, ev, hw)
    return {q: got[q][0] - got[q][1] for q in FIT_SHARES if q in got}


def residuals(runs: list[Measurement], hw: HardwareProfile, parts: bool) -> np.ndarray:
    """Relative step-time error per run; with ``parts``, then each measured share's difference."""
    steps, shares = [], []
    for r in runs:
        c = Candidates.from_layouts([r.layout])
        ev = evaluate(r.model, hw, r.job, c, r.gpus)
        steps.append(float(ev.step_s[0]) / r.step_s - 1)
        if parts:
            shares += list(_shares(r, hw, ev, c).values())
    return np.array(steps + shares)


def share_errors(runs: list[Measurement], hw: HardwareProfile) -> list[dict[str, float]]:
    """Per run: share name -> predicted - measured (fractions of the step)."""
    out = []
    for r in runs:
        c = Candidates.from_layouts([r.layout])
        out.append(_shares(r, hw, evaluate(r.model, hw, r.job, c, r.gpus), c))
    return out


def _by_share(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    return {q: np.array([row[q] for row in rows if q in row]) for q in FIT_SHARES if any(q in row for row in rows)}


def _to_unit(name: str, x: float) -> float:
    lo, hi, log = BOUNDS[name]
    x = min(max(x, lo), hi)
    return (math.log(x / lo) / math.log(hi / lo)) if log else (x - lo) / (hi - lo)


def _from_unit(name: str, u: float) -> float:
    lo, hi, log = BOUNDS[name]
    return lo * (hi / lo) ** u if log else lo + (hi - lo) * u


def check_factors(factors: tuple[str, ...], runs: int) -> None:
    for f in factors:
        if f not in BOUNDS:
            raise PlannerError("factors", f, f"one of {', '.join(BOUNDS)}")
    if runs < len(factors):
        raise PlannerError("runs", runs, f"fitting {len(factors)} factors ({', '.join(factors)}) needs at least "
                                         f"{len(factors)} runs "
                                         f"(better {2 * len(factors)}); profile more, or fit fewer with --factors")


def least_squares_solver():
    """scipy's least_squares, or one line naming what to install."""
    try:
        from scipy.optimize import least_squares
    except ImportError:
        raise PlannerError("calibrate", "scipy", "needs scipy: pip install scipy (it comes with the project's "
                                                 "[trainer] and [test] extras)") from None
    return least_squares


def _start(base: HardwareProfile, name: str) -> float:
    value = getattr(base.efficiency, name)
    return base.efficiency.intra_node_bw if value is None else value  # tp_intra_node_bw follows intra_node_bw


def fit_factors(runs: list[Measurement], base: HardwareProfile, factors: tuple[str, ...],
                parts: bool = False) -> tuple[Efficiency, bool, str, tuple[str, ...]]:
    """The fitted factors, whether the fit converged, scipy's message, and the factors at a bound."""
    least_squares = least_squares_solver()
    check_factors(factors, len(runs))

    def efficiency(u: np.ndarray) -> Efficiency:
        return base.efficiency.replace(**{f: _from_unit(f, float(x)) for f, x in zip(factors, u)})

    def residual(u: np.ndarray) -> np.ndarray:
        return residuals(runs, base.with_efficiency(efficiency(u)), parts)

    u0 = np.clip([_to_unit(f, _start(base, f)) for f in factors], 0.02, 0.98)
    try:
        res = least_squares(residual, u0, bounds=(0.0, 1.0), diff_step=1e-3, max_nfev=200 * len(factors))
    except (ValueError, FloatingPointError) as exc:
        return base.efficiency, False, f"the fit failed ({exc})", ()
    if not res.success or not np.all(np.isfinite(res.fun)):
        return base.efficiency, False, f"the fit did not converge ({res.message})", ()
    at_bound = tuple(f for f, x in zip(factors, res.x) if x < 1e-3 or x > 1 - 1e-3)
    return efficiency(res.x), True, str(res.message), at_bound


def calibrate(runs: list[Measurement], base: HardwareProfile, factors: tuple[str, ...] | None = None,
              leave_one_out: bool = True, parts: bool = True) -> Fit:
    factors = factors or default_factors(runs, base, parts)
    eff, ok, message, at_bound = fit_factors(runs, base, factors, parts)
    fitted = base.with_efficiency(eff)
    measured = np.array([r.step_s for r in runs])
    base_errors = predict_step_s(runs, base) / measured - 1
    errors = predict_step_s(runs, fitted) / measured - 1
    loo, loo_shares = None, {}
    if ok and leave_one_out and len(runs) > len(factors):
        steps, rows = [], []
        for i, r in enumerate(runs):
            without = base.with_efficiency(fit_factors(runs[:i] + runs[i + 1:], base, factors, parts)[0])
            steps.append(predict_step_s([r], without)[0] / r.step_s - 1)
            rows += share_errors([r], without)
        loo, loo_shares = np.array(steps), _by_share(rows)
    return Fit(efficiency=eff, factors=factors, converged=ok, message=message, errors=errors,
               base_errors=base_errors, loo_errors=loo, parts=parts, share_errors=_by_share(share_errors(runs, fitted)),
               loo_share_errors=loo_shares, at_bound=at_bound)


def calibrated_profile_toml(base: HardwareProfile, fit: Fit, runs: list[Measurement], name: str) -> str:
    """The base profile file with its [efficiency] replaced by the fit, plus [provenance]."""
    import tomllib
    from pathlib import Path

    import planner.toml_text as toml_text

    data = tomllib.loads(Path(base.path).read_text())
    data.pop("provenance", None)
    data["name"] = name
    data["aliases"] = []
    data["description"] = f"{data.get('description', base.description)} (calibrated)"
    data["efficiency"] = efficiency_to_table(fit.efficiency)
    mean = lambda e: float(np.mean(np.abs(e))) if e is not None and len(e) else None  # noqa: E731
    prov = {"kind": "calibration", "base": base.name, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "factors": list(fit.factors), "fitted": "step time and its parts" if fit.parts else "step time only",
            "at_bound": list(fit.at_bound), "runs": [r.source for r in runs],
            "fit_mean_abs_error": mean(fit.errors), "fit_worst_abs_error": float(np.max(np.abs(fit.errors))),
            "base_mean_abs_error": mean(fit.base_errors), "loo_mean_abs_error": mean(fit.loo_errors)}
    for q, e in fit.share_errors.items():  # percentage points as fractions of the step
        prov[f"{q}_mean_abs_error"] = mean(e)
    for q, e in fit.loo_share_errors.items():
        prov[f"{q}_loo_mean_abs_error"] = mean(e)
    data["provenance"] = prov
    return toml_text.dumps(data, head=f"Calibrated by `planner calibrate` from {len(runs)} runs on {prov['date']}; "
                                      f"base: {base.name}.")


def describe_fit(fit: Fit, runs: list[Measurement]) -> str:
    rows = [f"{'run':<28} {'measured s':>11} {'base err':>9} {'fit err':>8} {'LOO err':>8}"]
    for i, r in enumerate(runs):
        loo = f"{fit.loo_errors[i]:+8.1%}" if fit.loo_errors is not None else f"{'-':>8}"
        rows.append(f"{r.label[:28]:<28} {r.step_s:11.4g} {fit.base_errors[i]:+9.1%} {fit.errors[i]:+8.1%} {loo}")
    mean = lambda e: f"{np.mean(np.abs(e)):.1%} mean, {np.max(np.abs(e)):.1%} worst"  # noqa: E731
    rows.append(f"step time: base profile {mean(fit.base_errors)}; fitted {mean(fit.errors)}"
                + (f"; leave-one-out {mean(fit.loo_errors)}" if fit.loo_errors is not None else ""))
    points = lambda e: f"{np.mean(np.abs(e)) * 100:.1f} pp mean, {np.max(np.abs(e)) * 100:.1f} pp worst"  # noqa: E731
    for q, e in fit.share_errors.items():
        loo = fit.loo_share_errors.get(q)
        rows.append(f"{q:<16} {len(e)} runs: fitted {points(e)}" + (f"; leave-one-out {points(loo)}"
                                                                     if loo is not None and len(loo) else ""))
    if not fit.share_errors:
        rows.append("parts: " + ("no run measured its parts with a core per process" if fit.parts else
                                 "not fitted (--total-only); `planner validate` compares them"))
    fitted = ", ".join(f"{f} = {getattr(fit.efficiency, f):.4g}" for f in fit.factors)
    rows.append(f"factors ({'step time and its parts' if fit.parts else 'step time only'}): {fitted}")
    for f in fit.at_bound:
        lo, hi, _ = BOUNDS[f]
        value = getattr(fit.efficiency, f)
        side = "upper" if abs(value - hi) <= abs(value - lo) else "lower"
        rows.append(f"note: {f} = {value:.4g} is at its {side} bound ({hi if side == 'upper' else lo:g}): the runs "
                    "pushed it there, so it is a limit, not a measurement; another term is likely off "
                    "(validate's parts say which), or fit without it (--factors)")
    k, n = len(fit.factors), len(runs)
    if n <= k:
        rows.append(f"note: {k} factor{'s' if k > 1 else ''} from {n} runs: no leave-one-out (each such fit would "
                    f"have {n - 1} runs for {k} factors), and the fit can follow the runs' noise; {2 * k} or more "
                    "runs (or fewer factors, --factors) give figures that say more")
    elif n < 2 * k:
        rows.append(f"note: {k} factor{'s' if k > 1 else ''} from {n} runs: the fit can follow the runs' "
                    f"noise, and each leave-one-out fit has {n - 1} runs for {k}; {2 * k} or more runs "
                    "(or fewer factors, --factors) give figures that say more")
    return "\n".join(rows)
