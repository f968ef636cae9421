"""Validation: predicted vs measured, run by run, with the error of each quantity.

Step time, tokens/s, MFU and peak memory are compared as relative errors; the bubble fraction and
the communication share (fractions of the step) as differences in percentage points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.calibration.measured import Measurement
from planner.core.evaluate import evaluate
from planner.core.layout import Candidates
from planner.errors import PlannerError
from planner.hardware import HardwareProfile, get_profile, profile_names

# name: (unit, relative?)
QUANTITIES = {"step_s": ("s", True), "tokens_per_s": ("tokens/s", True), "mfu": ("", True),
              "peak_memory_bytes": ("bytes", True), "bubble_fraction": ("", False), "comm_fraction": ("", False)}
COMPARABLE_MEMORY = ("cuda_allocated", "cuda")  # a CPU process's RSS is not what the planner predicts


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    run: str
    quantity: str
    predicted: float
    measured: float
    error: float  # relative (pred/meas - 1), or absolute difference for fractions


def profile_for(run: Measurement, override: HardwareProfile | None) -> HardwareProfile:
    if override is not None:
        return override
    if run.hardware_profile:
        return get_profile(run.hardware_profile)
    for name in profile_names():
        if get_profile(name).gpu.model.lower() == run.device_name.lower():
            return get_profile(name)
    raise PlannerError("gpu", run.device_name, f"no profile matches run {run.label}; pass --gpu PROFILE "
                                               "(a probed or calibrated one for CPU runs)")


def compare(runs: list[Measurement], override: HardwareProfile | None = None) -> list[Point]:
    points: list[Point] = []
    for r in runs:
        hw = profile_for(r, override)
        ev = evaluate(r.model, hw, r.job, Candidates.from_layouts([r.layout]), r.gpus)
        m = ev.memory
        # torch.cuda.max_memory_allocated counts tensors only: not the CUDA context, the
        # communication buffers or the allocator's fragmentation, which the planner's total adds.
        allocated = float(m.weights[0] + m.gradients[0] + m.optimizer[0] + m.activations[0])
        predicted = {"step_s": float(ev.step_s[0]), "tokens_per_s": float(ev.tokens_per_s[0]),
                     "mfu": float(ev.mfu[0]), "peak_memory_bytes": allocated,
                     "bubble_fraction": float(ev.bubble_fraction[0]), "comm_fraction": float(ev.comm_fraction[0])}
        for q, (_, relative) in QUANTITIES.items():
            measured = getattr(r, q)
            if q == "mfu" and measured is not None and r.device_kind == "cpu":
                measured = None  # a CPU's "peak" is the probe's, not the run's (set per record)
            if q == "peak_memory_bytes" and r.memory_kind not in COMPARABLE_MEMORY:
                measured = None
            if measured is None or (relative and measured <= 0):
                continue
            err = predicted[q] / measured - 1 if relative else predicted[q] - measured
            points.append(Point(run=r.label, quantity=q, predicted=predicted[q], measured=float(measured), error=err))
    return points


def summary(points: list[Point]) -> dict[str, dict[str, float]]:
    out = {}
    for q in QUANTITIES:
        errs = np.abs([p.error for p in points if p.quantity == q])
        if errs.size:
            out[q] = {"runs": int(errs.size), "mean_abs_error": float(errs.mean()),
                      "worst_abs_error": float(errs.max())}
    return out


def table(points: list[Point]) -> str:
    rows = [f"{'run':<30} {'quantity':<18} {'predicted':>11} {'measured':>11} {'error':>8}"]
    for p in points:
        relative = QUANTITIES[p.quantity][1]
        err = f"{p.error:+8.1%}" if relative else f"{p.error * 100:+6.1f}pp"
        rows.append(f"{p.run[:30]:<30} {p.quantity:<18} {p.predicted:11.4g} {p.measured:11.4g} {err}")
    rows.append("")
    for q, s in summary(points).items():
        relative = QUANTITIES[q][1]
        fmt = (lambda x: f"{x:.1%}") if relative else (lambda x: f"{x * 100:.1f}pp")
        rows.append(f"{q:<18} {s['runs']:>3} runs: mean |error| {fmt(s['mean_abs_error'])}, "
                    f"worst {fmt(s['worst_abs_error'])}")
    return "\n".join(rows)


def plot(points: list[Point], path: str, title: str = "planner: predicted vs measured") -> None:
    """One panel per quantity (its own colour): predicted against measured, the y = x line and a
    +/-10% band. Written aside and renamed: no half-written file."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.files import write_atomic

    present = [q for q in QUANTITIES if any(p.quantity == q for p in points)] or ["step_s"]
    cols = min(3, len(present))
    rows = -(-len(present) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.0 * rows), dpi=110, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, q in zip(axes.flat, present):
        sel = [p for p in points if p.quantity == q]
        unit, relative = QUANTITIES[q]
        vals = [v for p in sel for v in (p.predicted, p.measured)] or [0.0, 1.0]
        lo, hi = min(vals), max(vals)
        pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
        lo, hi = (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad
        xs = np.linspace(lo, hi, 50)
        ax.plot(xs, xs, color="black", lw=1, label="y = x")
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.25, label="+/-10%")
        ax.scatter([p.measured for p in sel], [p.predicted for p in sel], s=24,
                   color=colours[list(QUANTITIES).index(q) % len(colours)], label=q, zorder=3)
        errs = np.abs([p.error for p in sel])
        if errs.size:
            stat = f"mean |err| {errs.mean():.1%}" if relative else f"mean |err| {errs.mean() * 100:.1f}pp"
            ax.set_title(f"{q} ({len(sel)} runs, {stat})", fontsize=9)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {unit}".strip(), fontsize=8)
        ax.set_ylabel(f"predicted {unit}".strip(), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(present):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_atomic(path, buf.getvalue())
