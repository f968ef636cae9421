"""Predicted vs measured on torchtitan's published benchmarks (../shared/data/torchtitan_performance.csv):
tokens/s per GPU and memory (torch's max reserved, where reported), per row, with the fsdp2 stack.

    python benchmarks/accuracy_torchtitan.py [--csv PATH] [--cp]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibration.published import load_torchtitan, predict_torchtitan  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "data" / "torchtitan_performance.csv"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(DEFAULT_CSV))
    p.add_argument("--cp", action="store_true", help="include the context-parallel rows")
    a = p.parse_args()
    runs = load_torchtitan(a.csv, with_cp=a.cp)
    tok_err, mem_err = [], []
    print(f"{'row':<82} {'tok/s meas':>10} {'pred':>7} {'err':>7} {'MFU':>6} | {'GiB meas':>8} {'pred':>6} {'err':>6}")
    for r in runs:
        pr = predict_torchtitan(r)
        e = pr.tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1
        tok_err.append(e)
        line = (f"{r.label:<82} {r.measured_tokens_per_s_per_gpu:>10.0f} {pr.tokens_per_s_per_gpu:>7.0f} "
                f"{e:>+7.1%} {pr.mfu:>6.1%}")
        if r.measured_memory_bytes:
            m = pr.memory_bytes / r.measured_memory_bytes - 1
            mem_err.append(m)
            line += f" | {r.measured_memory_bytes / 2**30:>8.1f} {pr.memory_bytes / 2**30:>6.1f} {m:>+6.1%}"
        print(line + ("" if pr.fits else "  DOES NOT FIT"))
    t, m = np.abs(tok_err), np.abs(mem_err)
    print(f"\ntokens/s per GPU: {len(t)} rows, mean |error| {t.mean():.1%}, worst {t.max():.1%}")
    if len(m):
        print(f"memory: {len(m)} rows, mean |error| {m.mean():.1%}, worst {m.max():.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
