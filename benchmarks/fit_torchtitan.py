"""Fit the factors that torchtitan's published rows inform, and show leave-one-out
(planner/calibration/torchtitan.py): the 500 W H100's clock and the fsdp2 per-block overhead on
the rows without context parallelism; with --cp also the stack's cp_overlap on the rows with it.

    python benchmarks/fit_torchtitan.py [--csv PATH] [--cp]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibration.published import load_torchtitan  # noqa: E402
from planner.calibration.torchtitan import fit, fit_cp_overlap, leave_one_out, residuals  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "data" / "torchtitan_performance.csv"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(DEFAULT_CSV))
    p.add_argument("--cp", action="store_true", help="also fit cp_overlap on the context-parallel rows")
    a = p.parse_args()
    runs = load_torchtitan(a.csv)
    x = fit(runs)
    err = np.abs(np.exp(residuals(x, runs)) - 1)
    print(f"fit on {len(runs)} rows: h100-96g-hbm2e clock {x[0]:.3f} of the H100 SXM's; "
          f"fsdp2 per-block overhead {x[1]:.0f} us")
    print(f"in sample: mean |error| {err.mean():.1%}, worst {err.max():.1%}")
    loo = np.abs(leave_one_out(runs, x))
    print(f"leave-one-out: mean |error| {loo.mean():.1%}, worst {loo.max():.1%}")
    if a.cp:
        cp_runs = [r for r in load_torchtitan(a.csv, with_cp=True) if r.cp > 1]
        value, errors, cp_loo = fit_cp_overlap(cp_runs)
        print(f"\nfit on {len(cp_runs)} context-parallel rows: cp_overlap {value:.1f}")
        for r, e, lo in zip(cp_runs, errors, cp_loo):
            print(f"  {r.label:<84} {e:+7.1%}  leave-one-out {lo:+7.1%}")
        print(f"in sample: mean |error| {np.mean(np.abs(errors)):.1%}, worst {np.max(np.abs(errors)):.1%}; "
              f"leave-one-out: mean {np.mean(np.abs(cp_loo)):.1%}, worst {np.max(np.abs(cp_loo)):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
