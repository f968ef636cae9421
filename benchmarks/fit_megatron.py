"""Fit the default A100 efficiency factors to Megatron-LM 2021 Table 1, and report the fit.

Run: python benchmarks/fit_megatron.py
Prints the fitted factors, the per-row error in sample, and the leave-one-out error (each row
predicted by factors fitted on the other nine). The fitted values are the defaults of
planner.hardware.Efficiency; this script is how they were obtained.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from planner.calibration.published import load_published
from planner.core.evaluate import evaluate
from planner.core.layout import Candidates
from planner.hardware import get_profile

DATA = Path(__file__).parent / "data" / "megatron2021_table1.csv"
# name: (lower bound, upper bound) -- physical bounds
FACTORS = {"matmul": (0.5, 0.95), "memory": (0.4, 0.95), "intra_node_bw": (0.5, 0.95)}


def predict(runs, eff):
    hw = get_profile("a100-80g").with_efficiency(eff)
    out = []
    for r in runs:
        ev = evaluate(r.model, hw, r.job, Candidates.from_layouts([r.layout]), r.gpus)
        out.append(float(ev.step_s[0]))
    return np.array(out)


def fit(runs, base):
    names = list(FACTORS)
    lo, hi = zip(*FACTORS.values())
    measured = np.array([r.measured_step_s for r in runs])

    def residual(x):
        return predict(runs, base.replace(**dict(zip(names, x)))) / measured - 1

    x0 = [min(max(getattr(base, n), lo[i] + 1e-3), hi[i] - 1e-3) for i, n in enumerate(names)]
    res = least_squares(residual, x0, bounds=(lo, hi), diff_step=1e-3)
    return base.replace(**dict(zip(names, res.x)))


def main() -> None:
    runs = load_published(DATA)
    base = get_profile("a100-80g").efficiency
    eff = fit(runs, base)
    print("fitted:", ", ".join(f"{n} = {getattr(eff, n):.4f}" for n in FACTORS))
    measured = np.array([r.measured_step_s for r in runs])
    pred = predict(runs, eff)
    loo = []
    for i in range(len(runs)):
        rest = runs[:i] + runs[i + 1:]
        loo.append(predict([runs[i]], fit(rest, base))[0])
    loo = np.array(loo)
    print(f"{'model':>8} {'measured s':>10} {'fit s':>8} {'err':>7} {'LOO s':>8} {'LOO err':>8}")
    for r, m, p, q in zip(runs, measured, pred, loo):
        print(f"{r.label:>8} {m:10.2f} {p:8.2f} {p / m - 1:+7.1%} {q:8.2f} {q / m - 1:+8.1%}")
    e, el = np.abs(pred / measured - 1), np.abs(loo / measured - 1)
    print(f"in sample: mean |err| {e.mean():.1%}, worst {e.max():.1%}; leave-one-out: mean {el.mean():.1%}, "
          f"worst {el.max():.1%}")


if __name__ == "__main__":
    main()
