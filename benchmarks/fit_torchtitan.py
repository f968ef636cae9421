"""Fit the factors that torchtitan's published rows inform, and show leave-one-out
(planner/calibration/torchtitan.py): the 500 W H100's clock and the fsdp2 per-block overhead.

    python benchmarks/fit_torchtitan.py [--csv PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibration.published import load_torchtitan  # noqa: E402
from planner.calibration.torchtitan import fit, leave_one_out, residuals  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "data" / "torchtitan_performance.csv"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(DEFAULT_CSV))
    a = p.parse_args()
    runs = load_torchtitan(a.csv)
    x = fit(runs)
    err = np.abs(np.exp(residuals(x, runs)) - 1)
    print(f"fit on {len(runs)} rows: h100-96g-hbm2e clock {x[0]:.3f} of the H100 SXM's; "
          f"fsdp2 per-block overhead {x[1]:.0f} us")
    print(f"in sample: mean |error| {err.mean():.1%}, worst {err.max():.1%}")
    loo = np.abs(leave_one_out(runs))
    print(f"leave-one-out: mean |error| {loo.mean():.1%}, worst {loo.max():.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
