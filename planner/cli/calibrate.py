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

    p = sub.add_parser("profile", help="run a grid of short reference-trainer runs, one run record each")
    p.add_argument("--grid", default="cpu", help="cpu (14 runs), cpu-ci (10 runs) or gpu (8 runs on one GPU)")
    p.add_argument("--out", default="runs/grid", help="folder for the runs (default runs/grid)")
    p.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    p.add_argument("--gpu", help="the profile the runs are predicted with (e.g. one from `planner probe`)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it counts as failed")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("calibrate", help="fit a profile's efficiency factors to run records")
    p.add_argument("runs", nargs="+", help="run folders, record.json files, or folders of runs")
    p.add_argument("--base", required=True, help="the profile the runs ran on (a probed one for CPU runs)")
    p.add_argument("--out", required=True, help="calibrated profile file to write (TOML)")
    p.add_argument("--name", help="profile name (default: the file's stem)")
    p.add_argument("--factors", help="comma-separated factors to fit (default: those the runs exercise: "
                   "matmul, memory, layer_overhead_s, and intra_node_bw, tp_collective_overhead_s, "
                   "thread_scaling, flash_attention when the runs use them)")
    p.add_argument("--parts", action="store_true", help="also fit each measured part of the step (compute, "
                   "exposed TP / DP communication, bubble, optimizer) as a share of the step, not only the total")
    p.add_argument("--strict", action="store_true", help="fail on a bad run record instead of skipping it")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("validate", help="predicted vs measured, per run, with the error")
    p.add_argument("runs", nargs="*", help="run folders, record.json files, or folders of runs")
    p.add_argument("--published", help="a published-results CSV (columns of megatron2021_table1.csv)")
    p.add_argument("--gpu", help="profile to predict with (default: the one each run names or matches)")
    p.add_argument("--plot", help="write predicted-vs-measured to this PNG")
    p.add_argument("--format", choices=("text", "json", "csv"), default="text")
    p.add_argument("--strict", action="store_true", help="fail on a bad run record instead of skipping it")
    p.set_defaults(func=cmd_validate)


def cmd_probe(a: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.calibration.probe import profile_toml, run_probe
    from planner.files import check_target, write_atomic
    from planner.hardware import get_profile

    if a.nprocs < 1:
        raise PlannerError("nprocs", a.nprocs, "a positive integer")
    check_target(a.out)  # before minutes of probing
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


def cmd_calibrate(a: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.calibration.calibrate import (
        calibrate,
        calibrated_profile_toml,
        check_factors,
        default_factors,
        describe_fit,
    )
    from planner.calibration.measured import load_measurements
    from planner.files import check_target, write_atomic
    from planner.hardware import get_profile

    check_target(a.out)  # a folder or a device: refused before the fit
    base = get_profile(a.base)
    runs, skipped = load_measurements(a.runs, strict=a.strict)
    factors = (tuple(f.strip() for f in a.factors.split(",") if f.strip()) if a.factors
               else default_factors(runs, base))
    try:
        check_factors(factors, len(runs))
    except PlannerError as exc:  # one line: the first skipped record says why there are too few
        raise _with_skipped(exc, skipped) from None
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    fit = calibrate(runs, base, factors, parts=a.parts)
    print(describe_fit(fit, runs))
    if not fit.converged:
        print(f"planner calibrate: {fit.message}; kept the base profile {base.name}, wrote nothing",
              file=sys.stderr)
        return 1
    name = a.name or Path(a.out).stem
    write_atomic(a.out, calibrated_profile_toml(base, fit, runs, name))
    print(f"wrote {a.out} (profile {name}; use --gpu {a.out})")
    return 0


def _with_skipped(exc: PlannerError, skipped: list[str]) -> PlannerError:
    """The error, with how many records were skipped and the first reason: still one line."""
    if not skipped:
        return exc
    more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
    return PlannerError(exc.field, exc.value, f"{exc.allowed} (skipped {skipped[0]}{more})")


def cmd_validate(a: argparse.Namespace) -> int:
    import json

    from planner.calibration.measured import load_measurements, published_measurements
    from planner.calibration.validate import compare, plot, summary, table
    from planner.hardware import get_profile

    if not a.runs and not a.published:
        raise PlannerError("runs", "none", "give run folders/records, or --published FILE.csv")
    if a.plot:
        from planner.files import check_target

        check_target(a.plot, "plot")  # before the work and the printed table
    runs, skipped = load_measurements(a.runs, strict=a.strict) if a.runs else ([], [])
    if a.published:
        runs += published_measurements(a.published)
    if not runs:
        raise _with_skipped(PlannerError("runs", len(a.runs), "no usable run record"), skipped)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    points = compare(runs, get_profile(a.gpu) if a.gpu else None)
    if a.format == "json":
        print(json.dumps({"points": [{k: getattr(p, k) for k in p.__slots__} for p in points],
                          "summary": summary(points), "skipped": skipped}, indent=1, allow_nan=False))
    elif a.format == "csv":
        print("run,quantity,predicted,measured,error")
        for p in points:
            print(f"{p.run},{p.quantity},{p.predicted!r},{p.measured!r},{p.error!r}")
    else:
        print(table(points))
    if a.plot:
        plot(points, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.calibration.profile_grid import grid_runs, run_grid
    from planner.hardware import get_profile

    if a.gpu:
        get_profile(a.gpu)  # a bad name fails here, not in every run
    runs = grid_runs(a.grid, a.steps, Path(a.out), a.gpu)
    summary = run_grid(runs, Path(a.out), a.timeout)
    ok = sum(e["status"] == "ok" for e in summary)
    print(f"{ok} of {len(summary)} runs completed; records under {a.out} (summary: {a.out}/grid.json)")
    return 0 if ok else 1
