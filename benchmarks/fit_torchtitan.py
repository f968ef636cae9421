"""Fit the factors that torchtitan's published rows inform, and show leave-one-out.

The factors: the clock a 500 W H100 (Grand Teton, h100-96g-hbm2e) sustains relative to the H100
SXM (scaling its GEMM, attention and fp8 efficiencies together), and the fsdp2 stack's per-layer
overhead. Least squares on the log of predicted / measured tokens/s per GPU over the rows without
context parallelism. Prints the fit, the in-sample and leave-one-out errors.

    python benchmarks/fit_torchtitan.py [--csv PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibration.published import load_torchtitan, predict_torchtitan  # noqa: E402
from planner.hardware import get_profile  # noqa: E402

DEFAULT_CSV = ROOT.parent / "shared" / "data" / "torchtitan_performance.csv"
SXM = get_profile("h100-80g").efficiency


def profile_for(run, x):
    """The row's profile with the factors under fit: a calibrated profile's factors override the
    stack's (planner.stacks.effective), so the stack's layer overhead is fitted through it."""
    hw = get_profile(run.gpu)
    eff = dataclasses.replace(hw.efficiency, layer_overhead_s=x[1] * 1e-6)
    if run.gpu == "h100-96g-hbm2e":
        c = x[0]
        eff = dataclasses.replace(eff, matmul=SXM.matmul * c, flash_attention=SXM.flash_attention * c,
                                  fused_attention=SXM.fused_attention * c, fp8_matmul=SXM.fp8_matmul * c)
    return dataclasses.replace(hw, efficiency=eff, efficiency_keys=hw.efficiency_keys | {"layer_overhead_s"})


def residuals(x, runs):
    return np.array([np.log(predict_torchtitan(r, profile_for(r, x)).tokens_per_s_per_gpu
                            / r.measured_tokens_per_s_per_gpu) for r in runs])


def fit(runs):
    res = least_squares(residuals, x0=[0.8, 0.0], bounds=([0.3, 0.0], [1.0, 5000.0]), args=(runs,))
    return res.x


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(DEFAULT_CSV))
    a = p.parse_args()
    runs = load_torchtitan(a.csv)
    x = fit(runs)
    err = np.exp(residuals(x, runs)) - 1
    print(f"fit on {len(runs)} rows: h100-96g-hbm2e clock {x[0]:.3f} of the H100 SXM's; "
          f"fsdp2 layer overhead {x[1]:.0f} us")
    print(f"in sample: mean |error| {np.abs(err).mean():.1%}, worst {np.abs(err).max():.1%}")
    loo = []
    for i in range(len(runs)):
        xi = fit(runs[:i] + runs[i + 1:])
        loo.append(np.exp(residuals(xi, [runs[i]])[0]) - 1)
    loo = np.abs(loo)
    print(f"leave-one-out: mean |error| {loo.mean():.1%}, worst {loo.max():.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
