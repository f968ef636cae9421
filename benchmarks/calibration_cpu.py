"""End to end on this machine: probe, profile a grid of runs, calibrate on half, validate on the rest.

Run: python benchmarks/calibration_cpu.py [--grid cpu] [--out runs/calibration-cpu] [--reuse]
         [--factors matmul,layer_overhead_s,...]
Prints, for the held-out runs: the step-time error with the probed profile (before) and with the
calibrated one (after), for a fit on the step time alone and for a fit on the parts of the step
(``planner calibrate --parts``); and each part's share error in percentage points (compute,
exposed TP / DP communication, bubble, optimizer; planner.core.step_parts). Targets (issue 13):
step time <= 10% mean after calibration; compute, TP communication and bubble each within 10
points of the measured share. The figures move with machine load: run it on a quiet machine.
``--reuse`` keeps an existing probe and grid under --out and only refits.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from planner.calibration.calibrate import calibrate, describe_fit, predict_step_s
from planner.calibration.measured import load_measurements
from planner.calibration.validate import compare
from planner.hardware import load_profile_file

SHARES = ("compute_share", "tp_comm_share", "dp_comm_share", "bubble_fraction", "comm_fraction", "optimizer_share")


def planner(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "planner", *args], check=True)


def split(runs):
    """Even grid index: calibrate on it; odd: held out (the grid is ordered in pairs of like runs)."""
    index = lambda r: int(r.label.split("-", 1)[0])  # noqa: E731
    return [r for r in runs if index(r) % 2 == 0], [r for r in runs if index(r) % 2 == 1]


def share_errors(runs, profile) -> dict[str, list[float]]:
    """Share -> the held-out runs' errors in fractions of the step (predicted - measured)."""
    out: dict[str, list[float]] = {q: [] for q in SHARES}
    for p in compare(runs, profile):
        if p.quantity in out:
            out[p.quantity].append(p.error)
    return out


def report(name, test, base, calibrated) -> None:
    measured = np.array([r.step_s for r in test])
    before = predict_step_s(test, base) / measured - 1
    after = predict_step_s(test, calibrated) / measured - 1
    print(f"\n{name}: held out ({len(test)} runs)    before    after")
    for r, b, c in zip(test, before, after):
        print(f"{r.label[:32]:<32} {b:+8.1%} {c:+8.1%}")
    print(f"held-out step-time error: mean {np.mean(np.abs(before)):.1%} before calibration, "
          f"{np.mean(np.abs(after)):.1%} after (worst {np.max(np.abs(after)):.1%}); target <= 10%")
    shares_before, shares_after = share_errors(test, base), share_errors(test, calibrated)
    for q in SHARES:
        b, a = np.abs(shares_before[q]), np.abs(shares_after[q])
        if a.size:
            print(f"  {q:<16} {a.size:>2} runs: |error| mean {a.mean() * 100:5.1f}pp, worst {a.max() * 100:5.1f}pp "
                  f"after (before: mean {b.mean() * 100:5.1f}pp, worst {b.max() * 100:5.1f}pp)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="cpu")
    ap.add_argument("--out", default="runs/calibration-cpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--factors", help="comma-separated factors (default: those the runs exercise)")
    ap.add_argument("--reuse", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    probe, grid = out / "probed.toml", out / "grid"
    start = time.perf_counter()
    if not (a.reuse and probe.exists()):
        planner("probe", "--out", str(probe), "--nprocs", "2")
    if not (a.reuse and grid.exists()):
        planner("profile", "--grid", a.grid, "--out", str(grid), "--gpu", str(probe), "--steps", str(a.steps))
    base = load_profile_file(probe)
    runs, skipped = load_measurements([str(grid)])
    for line in skipped:
        print("skipped", line)
    train, test = split(runs)
    factors = tuple(a.factors.split(",")) if a.factors else None
    for name, parts in (("fit on step time", False), ("fit on the parts of the step", True)):
        fit = calibrate(train, base, factors, parts=parts)
        print(f"\n== {name}: calibrated on {len(train)} runs")
        print(describe_fit(fit, train))
        report(name, test, base, base.with_efficiency(fit.efficiency))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
