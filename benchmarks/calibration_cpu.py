"""End to end on this machine: probe, profile a grid of runs, calibrate on half, validate on the rest.

Run: python benchmarks/calibration_cpu.py [--grid cpu] [--out runs/calibration-cpu] [--reuse]
Prints the held-out step-time error with the probed profile (before) and the calibrated one
(after). Target (issue 4): <= 15% mean after, and clearly lower than before. ``--reuse`` keeps an
existing probe and grid under --out and only refits.
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
from planner.hardware import load_profile_file


def planner(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "planner", *args], check=True)


def split(runs):
    """Even grid index: calibrate on it; odd: held out (the grid is ordered in pairs of like runs)."""
    index = lambda r: int(r.label.split("-", 1)[0])  # noqa: E731
    return [r for r in runs if index(r) % 2 == 0], [r for r in runs if index(r) % 2 == 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="cpu")
    ap.add_argument("--out", default="runs/calibration-cpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reuse", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
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
    fit = calibrate(train, base)
    print(f"calibrated on {len(train)} runs:")
    print(describe_fit(fit, train))
    measured = np.array([r.step_s for r in test])
    before = predict_step_s(test, base) / measured - 1
    after = predict_step_s(test, base.with_efficiency(fit.efficiency)) / measured - 1
    print(f"\nheld out ({len(test)} runs)            before    after")
    for r, b, c in zip(test, before, after):
        print(f"{r.label[:32]:<32} {b:+8.1%} {c:+8.1%}")
    print(f"held-out step-time error: mean {np.mean(np.abs(before)):.1%} before calibration, "
          f"{np.mean(np.abs(after)):.1%} after (worst {np.max(np.abs(after)):.1%}); target <= 15%")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
