"""Validation: predicted vs measured, run by run, with the error of each quantity.

Step time, tokens/s, MFU and peak memory are compared as relative errors; every part of the step
(planner.core.step_parts: compute, exposed TP / DP communication, bubble with pipeline transfers,
optimizer, data wait, other) as its share of the step, the error in percentage points.
``bubble_fraction`` and ``comm_fraction`` are the bubble's and the communication's shares.

A run whose processes outnumber its CPU host's cores (the profile's ``compute_slots``;
planner.core.steptime.time_shared) has its shares shown but not judged: its trace books a rank's
wait for a core, and its peers' uneven turns on the cores, as bubble or communication, which the
operating system's scheduler decides from run to run. Its step time, which the scheduler does not
change while the cores stay busy, is judged. ``planner calibrate --parts`` applies the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.calibration.measured import Measurement, profile_for, profile_with_precision
from planner.core.evaluate import evaluate
from planner.core.layout import Candidates
from planner.core.memory import allocated_bytes
from planner.core.step_parts import COMPARED, compared, predicted_parts
from planner.core.steptime import time_shared
from planner.errors import PlannerError
from planner.hardware import HardwareProfile, get_profile
from planner.tables import WIDTH, wrap_lines

# name: (unit, relative?)
QUANTITIES = {"step_s": ("s", True), "tokens_per_s": ("tokens/s", True), "mfu": ("", True),
              "peak_memory_bytes": ("bytes", True), "bubble_fraction": ("", False), "comm_fraction": ("", False)}
# step_parts.COMPARED label -> quantity name (shares of the step); bubble and comm as above.
SHARES = {label: {"bubble": "bubble_fraction", "comm": "comm_fraction"}.get(label, f"{label}_share")
          for label in COMPARED}
QUANTITIES.update({q: ("", False) for q in SHARES.values()})
COMPARABLE_MEMORY = ("cuda_allocated", "cuda")  # a CPU process's RSS is not what the planner predicts


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    run: str
    quantity: str
    predicted: float
    measured: float
    error: float  # relative (pred/meas - 1), or absolute difference for fractions
    judged: bool = True  # False: shown, left out of the summary (a time-shared run's shares)


def part_shares(run: Measurement, ev, hw: HardwareProfile) -> dict[str, tuple[float, float]]:
    """Quantity name -> (predicted, measured) share of the step for each part the run measured."""
    if not run.parts or not run.parts_step_s:
        return {}
    pred = predicted_parts(ev.time, 0, hw.efficiency.step_overhead_s)
    step = float(ev.step_s[0])
    return {SHARES[label]: (p / step, m / run.parts_step_s) for label, (p, m) in compared(pred, run.parts).items()}


def compare(runs: list[Measurement], override: HardwareProfile | None = None) -> list[Point]:
    points: list[Point] = []
    for r in runs:
        hw = profile_with_precision(r, override)
        c = Candidates.from_layouts([r.layout])
        ev = evaluate(r.model, hw, r.job, c, r.gpus)
        m = ev.memory
        # torch.cuda.max_memory_allocated counts tensors only (the ZeRO-3 gather buffers among them):
        # not the CUDA context, the communication buffers or the allocator's fragmentation.
        allocated = float(allocated_bytes(m)[0])
        pairs = {"step_s": (float(ev.step_s[0]), r.step_s), "tokens_per_s": (float(ev.tokens_per_s[0]), r.tokens_per_s),
                 "mfu": (float(ev.mfu[0]), r.mfu), "peak_memory_bytes": (allocated, r.peak_memory_bytes)}
        if r.device_kind == "cpu":
            pairs["mfu"] = (pairs["mfu"][0], None)  # a CPU's "peak" is the probe's, not the run's (set per record)
        if r.memory_kind not in COMPARABLE_MEMORY:
            pairs["peak_memory_bytes"] = (allocated, None)  # a CPU process's RSS is not what the planner predicts
        shares = part_shares(r, ev, hw)
        shared_host = bool(shares) and bool(np.any(time_shared(hw, c)))
        if not shares:  # a record without traces, or a published row: its fractions as reported
            t = ev.time
            pred_bubble = float((t.bubble[0] + t.pp_comm[0]) / ev.step_s[0])
            pred_comm = float((t.tp_comm[0] + t.cp_comm[0] + t.ep_comm[0] + t.dp_comm[0]) / ev.step_s[0])
            shares = {"bubble_fraction": (pred_bubble, r.bubble_fraction),
                      "comm_fraction": (pred_comm, r.comm_fraction)}
        pairs.update(shares)
        for q, (predicted, measured) in pairs.items():
            relative = QUANTITIES[q][1]
            if measured is None or (relative and measured <= 0):
                continue
            err = predicted / measured - 1 if relative else predicted - measured
            points.append(Point(run=r.label, quantity=q, predicted=predicted, measured=float(measured), error=err,
                                judged=not (shared_host and not relative)))
    return points


def summary(points: list[Point]) -> dict[str, dict[str, float]]:
    """Quantity -> runs, mean and worst |error| over the judged points (``not_judged``: how many
    time-shared runs' shares were left out, where any were)."""
    out = {}
    for q in QUANTITIES:
        errs = np.abs([p.error for p in points if p.quantity == q and p.judged])
        left = sum(1 for p in points if p.quantity == q and not p.judged)
        if errs.size:
            out[q] = {"runs": int(errs.size), "mean_abs_error": float(errs.mean()),
                      "worst_abs_error": float(errs.max())}
        if left:
            out.setdefault(q, {"runs": 0})["not_judged"] = left
    return out


TIME_SHARED_NOTE = ("* time-shared host (more processes than cores): the share is shown, not judged; the scheduler "
                    "decides which waits the trace books as bubble or communication")


def table(points: list[Point], width: int | None = WIDTH) -> str:
    """Predicted against measured, a row per run and quantity; whole run names (they tell runs
    apart): beside their figures where they fit ``width``, else each on a line above its rows."""
    w = max([3, *(len(p.run) for p in points)])
    beside = width is None or w + 1 + 18 + 1 + 11 + 1 + 11 + 1 + 10 <= width
    run_head = f"{'run':<{w}} " if beside else "  "
    rows = [f"{run_head}{'quantity':<18} {'predicted':>11} {'measured':>11} {'error':>8}"]
    last = None
    for p in points:
        relative = QUANTITIES[p.quantity][1]
        err = f"{p.error:+8.1%}" if relative else f"{p.error * 100:+6.1f}pp"
        if not beside and p.run != last:
            rows.append(p.run)
        last = p.run
        lead = f"{p.run:<{w}} " if beside else "  "
        rows.append(f"{lead}{p.quantity:<18} {p.predicted:11.4g} {p.measured:11.4g} {err}"
                    + ("" if p.judged else " *"))
    rows.append("")
    for q, s in summary(points).items():
        relative = QUANTITIES[q][1]
        fmt = (lambda x: f"{x:.1%}") if relative else (lambda x: f"{x * 100:.1f}pp")
        line = f"{q:<18} {s['runs']:>3} runs"
        if s["runs"]:
            line += f": mean |error| {fmt(s['mean_abs_error'])}, worst {fmt(s['worst_abs_error'])}"
        if s.get("not_judged"):
            line += f" ({s['not_judged']} time-shared not judged *)"
        rows.append(line)
    if any(not p.judged for p in points):
        rows += ["", TIME_SHARED_NOTE]
    return wrap_lines("\n".join(rows), width)


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
        wide = relative and lo > 0 and hi / lo > 100  # values over decades (jobs of 8 to 512 GPUs): log axes
        if wide:
            lo, hi = lo / 1.3, hi * 1.3
            xs = np.geomspace(lo, hi, 50)
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
            lo, hi = (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad
            xs = np.linspace(lo, hi, 50)
        ax.plot(xs, xs, color="black", lw=1, label="y = x")
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.25, label="+/-10%")
        colour = colours[list(QUANTITIES).index(q) % len(colours)]
        judged, left = [p for p in sel if p.judged], [p for p in sel if not p.judged]
        ax.scatter([p.measured for p in judged], [p.predicted for p in judged], s=24, color=colour, label=q, zorder=3)
        if left:  # a time-shared run's shares: hollow, out of the title's mean
            ax.scatter([p.measured for p in left], [p.predicted for p in left], s=24, facecolors="none",
                       edgecolors=colour, label="time-shared, not judged", zorder=3)
        errs = np.abs([p.error for p in judged])
        if errs.size:
            stat = f"mean |err| {errs.mean():.1%}" if relative else f"mean |err| {errs.mean() * 100:.1f}pp"
            ax.set_title(f"{q} ({len(judged)} runs, {stat})", fontsize=9)
        elif left:
            ax.set_title(f"{q} ({len(left)} time-shared, not judged)", fontsize=9)
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


def torchtitan_points(csv: str, override: HardwareProfile | None = None) -> list[Point]:
    """torchtitan's published rows (torchtitan_performance.csv's columns, context parallel rows
    included) as points: tokens/s of the whole job (tokens/s per GPU x GPUs) and, where reported,
    torch's max reserved memory (the planner's total less the CUDA context and NCCL buffers).
    ``override``: a profile to predict the rows of its GPU with (the same ``[gpu] model``: a profile
    calibrated on the 500 W H100's rows predicts those, not the A100's), or every row when none ran
    on it (a file of your own runs on one GPU)."""
    from planner.calibration.published import load_torchtitan, predict_torchtitan

    runs = load_torchtitan(csv, with_cp=True)
    mine = {r.gpu for r in runs if override is not None and get_profile(r.gpu).gpu.model == override.gpu.model}
    points = []
    for r in runs:
        p = predict_torchtitan(r, override if override is not None and (not mine or r.gpu in mine) else None)
        pred, meas = p.tokens_per_s_per_gpu * r.gpus, r.measured_tokens_per_s_per_gpu * r.gpus
        points.append(Point(run=r.label, quantity="tokens_per_s", predicted=pred, measured=meas,
                            error=pred / meas - 1))
        if r.measured_memory_bytes:
            points.append(Point(run=r.label, quantity="peak_memory_bytes", predicted=p.memory_bytes,
                                measured=r.measured_memory_bytes, error=p.memory_bytes / r.measured_memory_bytes - 1))
    return points
