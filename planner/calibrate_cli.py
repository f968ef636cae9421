"""`planner probe`, `planner profile`, `planner calibrate`, `planner validate`: the loop from
real runs back to the cost model's efficiency factors."""

from __future__ import annotations

import argparse
import sys

from planner.errors import PlannerError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="micro-benchmark this machine and write a hardware profile")
    p.add_argument("--out", required=True, help="profile file to write (TOML)")
    p.add_argument("--name", help="profile name (default: the file's stem)")
    p.add_argument("--nprocs", type=int, default=2, help="local processes for the collectives (default 2)")
    p.add_argument("--base", help="datasheet profile of this GPU: keep its peaks, measure efficiencies")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings")
    p.set_defaults(func=cmd_probe)


def cmd_probe(a: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.files import write_atomic
    from planner.hardware import get_profile
    from planner.probe import profile_toml, run_probe

    if a.nprocs < 1:
        raise PlannerError("nprocs", a.nprocs, "a positive integer")
    base = get_profile(a.base) if a.base else None
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PlannerError("probe", "torch", "needs torch: pip install torch==2.13.0") from None
    print(f"probing ({a.nprocs} processes)...", file=sys.stderr)
    result = run_probe(a.nprocs, quick=a.quick, device=a.device)
    name = a.name or Path(a.out).stem
    text = profile_toml(result, name, base)
    write_atomic(a.out, text)
    for dtype, points in result.matmul.items():
        curve = ", ".join(f"{n}: {f / 1e9:.1f}" for n, f in points)
        print(f"matmul {dtype} GFLOP/s by size: {curve}")
    print(f"memory copy bandwidth: {result.memory_bytes_per_s / 1e9:.2f} GB/s")
    for op, points in result.collectives.items():
        print(f"{op}: " + ", ".join(f"{b // 1024} KiB {t * 1e3:.2f} ms" for b, t in points))
    print(f"wrote {a.out}")
    return 0
