"""Calibration: fit a profile's named efficiency factors to measured step times.

scipy.optimize.least_squares on the relative step-time error, each factor within physical bounds
(searched in a unit box; log-scaled for factors that span decades). With ``parts`` the fit also
matches each measured part of the step (planner.core.step_parts: compute, exposed TP / DP
communication, bubble, optimizer) as a share of the step, so that it cannot fit the total by
moving time between terms; a run with more processes than its host has cores (a CPU profile's
``compute_slots``) gives its step time only, since its trace books a rank's wait for a core as
communication or bubble. The formulas never change:
only the factors of ``planner.hardware.Efficiency`` do. The fit reports its in-sample error and
the leave-one-out error (each run predicted by factors fitted without it).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

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


def default_factors(runs: list[Measurement], base: HardwareProfile) -> tuple[str, ...]:
    """The factors these runs can inform: the always-present ones, plus link bandwidth when any
    run communicates, the TP collective overhead when any uses tensor parallel, flash attention's
    efficiency when any uses it, and thread scaling on a CPU host when a process had cores to
    spare. A factor no run exercises cannot be fitted. ``optimizer_tensor_overhead_s`` is fitted only
    when named (--factors): it is 1-3% of a small model's step, which the step times cannot tell
    from the other per-step costs (benchmarks/calibration_cpu.py --mechanism measures it)."""
    factors = ["matmul", "memory", "layer_overhead_s"]
    if any(r.gpus > 1 for r in runs):
        factors.append("intra_node_bw")
    if any(r.layout.tp > 1 for r in runs):
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


# The shares a parts fit matches (validate's quantity names); their differences, in fractions of
# the step, weigh as much as a relative step-time error of the same size.
FIT_SHARES = ("compute_share", "tp_comm_share", "dp_comm_share", "bubble_fraction", "optimizer_share")


def predict_step_s(runs: list[Measurement], hw: HardwareProfile) -> np.ndarray:
    return np.array([float(evaluate(r.model, hw, r.job, Candidates.from_layouts([r.layout]), r.gpus).step_s[0])
                     for r in runs])


def residuals(runs: list[Measurement], hw: HardwareProfile, parts: bool) -> np.ndarray:
    """Relative step-time error per run; with ``parts``, then each measured share's difference."""
    steps, shares = [], []
    for r in runs:
        c = Candidates.from_layouts([r.layout])
        ev = evaluate(r.model, hw, r.job, c, r.gpus)
        steps.append(float(ev.step_s[0]) / r.step_s - 1)
        if parts and not np.any(time_shared(hw, c)):  # a time-shared run: its step time only
            got = part_shares(r, ev, hw)
            shares += [got[q][0] - got[q][1] for q in FIT_SHARES if q in got]
    return np.array(steps + shares)


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
        raise PlannerError("runs", runs, f"fitting {len(factors)} factors needs at least {len(factors)} runs "
                                         f"(better {2 * len(factors)}); profile more, or fit fewer with --factors")


def fit_factors(runs: list[Measurement], base: HardwareProfile, factors: tuple[str, ...],
                parts: bool = False) -> tuple[Efficiency, bool, str]:
    from scipy.optimize import least_squares

    check_factors(factors, len(runs))

    def efficiency(u: np.ndarray) -> Efficiency:
        return base.efficiency.replace(**{f: _from_unit(f, float(x)) for f, x in zip(factors, u)})

    def residual(u: np.ndarray) -> np.ndarray:
        return residuals(runs, base.with_efficiency(efficiency(u)), parts)

    u0 = np.clip([_to_unit(f, getattr(base.efficiency, f)) for f in factors], 0.02, 0.98)
    try:
        res = least_squares(residual, u0, bounds=(0.0, 1.0), diff_step=1e-3, max_nfev=200 * len(factors))
    except (ValueError, FloatingPointError) as exc:
        return base.efficiency, False, f"the fit failed ({exc})"
    if not res.success or not np.all(np.isfinite(res.fun)):
        return base.efficiency, False, f"the fit did not converge ({res.message})"
    return efficiency(res.x), True, str(res.message)


def calibrate(runs: list[Measurement], base: HardwareProfile, factors: tuple[str, ...] | None = None,
              leave_one_out: bool = True, parts: bool = False) -> Fit:
    factors = factors or default_factors(runs, base)
    eff, ok, message = fit_factors(runs, base, factors, parts)
    measured = np.array([r.step_s for r in runs])
    base_errors = predict_step_s(runs, base) / measured - 1
    errors = predict_step_s(runs, base.with_efficiency(eff)) / measured - 1
    loo = None
    if ok and leave_one_out and len(runs) > len(factors):
        loo = np.array([predict_step_s([r], base.with_efficiency(fit_factors(runs[:i] + runs[i + 1:], base,
                                                                             factors, parts)[0]))[0] / r.step_s - 1
                        for i, r in enumerate(runs)])
    return Fit(efficiency=eff, factors=factors, converged=ok, message=message, errors=errors,
               base_errors=base_errors, loo_errors=loo)


def calibrated_profile_toml(base: HardwareProfile, fit: Fit, runs: list[Measurement], name: str) -> str:
    """The base profile file with its [efficiency] replaced by the fit, plus [provenance]."""
    import tomllib
    from pathlib import Path

    data = tomllib.loads(Path(base.path).read_text())
    data.pop("provenance", None)
    data["name"] = name
    data["aliases"] = []
    data["description"] = f"{data.get('description', base.description)} (calibrated)"
    data["efficiency"] = {k: v for k, v in efficiency_to_table(fit.efficiency).items()}
    mean = lambda e: float(np.mean(np.abs(e))) if e is not None else None  # noqa: E731
    prov = {"kind": "calibration", "base": base.name, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "factors": list(fit.factors), "runs": [r.source for r in runs],
            "fit_mean_abs_error": mean(fit.errors), "fit_worst_abs_error": float(np.max(np.abs(fit.errors))),
            "base_mean_abs_error": mean(fit.base_errors)}
    if fit.loo_errors is not None:
        prov["loo_mean_abs_error"] = mean(fit.loo_errors)
    data["provenance"] = prov
    import tomli_w  # a real TOML writer: names with quotes or newlines stay strings (imported here: CLI start-up)

    prov = {k: v for k, v in prov.items() if v is not None}  # TOML has no null
    data["provenance"] = prov
    base_name = " ".join(str(base.name).split())  # no newline can end the comment line
    head = f"# Calibrated by `planner calibrate` from {len(runs)} runs on {prov['date']}; base: {base_name}.\n"
    return head + tomli_w.dumps(data)


def describe_fit(fit: Fit, runs: list[Measurement]) -> str:
    rows = [f"{'run':<28} {'measured s':>11} {'base err':>9} {'fit err':>8} {'LOO err':>8}"]
    for i, r in enumerate(runs):
        loo = f"{fit.loo_errors[i]:+8.1%}" if fit.loo_errors is not None else f"{'-':>8}"
        rows.append(f"{r.label[:28]:<28} {r.step_s:11.4g} {fit.base_errors[i]:+9.1%} {fit.errors[i]:+8.1%} {loo}")
    mean = lambda e: f"{np.mean(np.abs(e)):.1%} mean, {np.max(np.abs(e)):.1%} worst"  # noqa: E731
    rows.append(f"base profile: {mean(fit.base_errors)}; fitted: {mean(fit.errors)}"
                + (f"; leave-one-out: {mean(fit.loo_errors)}" if fit.loo_errors is not None else ""))
    fitted = ", ".join(f"{f} = {getattr(fit.efficiency, f):.4g}" for f in fit.factors)
    rows.append(f"factors: {fitted}")
    k = len(fit.factors)
    if len(runs) < 2 * k:
        rows.append(f"note: {k} factor{'s' if k > 1 else ''} from {len(runs)} runs: the fit can follow the runs' "
                    f"noise, and each leave-one-out fit has {len(runs) - 1} runs for {k}; {2 * k} or more runs "
                    "(or fewer factors, --factors) give figures that say more")
    return "\n".join(rows)

