"""`planner probe`, `planner profile`, `planner calibrate`, `planner validate`: the loop from
real runs back to the cost model's efficiency factors."""

from __future__ import annotations

import argparse
import sys

from planner.errors import PlannerError
from planner.tables import WIDE_HELP, WIDTH


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="micro-benchmark this machine and write a hardware profile")
    p.add_argument("--out", required=True, help="profile file to write (TOML)")
    p.add_argument("--name", help="profile name (default: the file's stem)")
    p.add_argument("--nprocs", type=int, default=2, help="local processes for the collectives (default 2)")
    p.add_argument("--base", help="datasheet profile of this GPU: keep its peaks and memory, measure efficiencies "
                   "(default on a GPU: the profile whose [gpu] model is the device's name; one whose memory is "
                   "not the device's is refused)")
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

    p = sub.add_parser("calibrate", help="fit a profile's efficiency factors to run records or published rows")
    p.add_argument("runs", nargs="*", help="run folders, record.json files, or folders of runs")
    p.add_argument("--published", help="fit from published rows instead: 'torchtitan' (its benchmark rows, "
                   "benchmarks/data/torchtitan_performance.csv), a CSV with those columns, or a CSV with the "
                   "columns of megatron2021_table1.csv (then --base names the GPU they ran on)")
    p.add_argument("--base", help="the profile the runs ran on (a probed one for CPU runs); required with run "
                   "records and Megatron-style rows")
    p.add_argument("--out", required=True, help="calibrated profile file to write (TOML)")
    p.add_argument("--name", help="profile name (default: the file's stem)")
    p.add_argument("--factors", help="comma-separated factors to fit (default: those the runs exercise: "
                   "matmul, memory, layer_overhead_s, and intra_node_bw (DP/PP links), tp_intra_node_bw (TP "
                   "links), tp_collective_overhead_s, thread_scaling, flash_attention when the runs use them)")
    p.add_argument("--total-only", action="store_true", help="fit the step time alone (default: the step time "
                   "and each measured part of it: compute, exposed TP / DP communication, bubble, optimizer, as "
                   "shares of the step)")
    p.add_argument("--parts", action="store_true", help=argparse.SUPPRESS)  # the default since issue 40
    p.add_argument("--strict", action="store_true", help="fail on a bad run record instead of skipping it")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("validate", help="predicted vs measured, per run, with the error")
    p.add_argument("runs", nargs="*", help="run folders, record.json files, or folders of runs")
    p.add_argument("--published", help="published rows: 'torchtitan' (its benchmark rows, "
                   "benchmarks/data/torchtitan_performance.csv: tokens/s and memory), a CSV with those columns, "
                   "or a CSV with the columns of megatron2021_table1.csv")
    p.add_argument("--gpu", help="profile to predict with (default: the one each run names or matches)")
    p.add_argument("--plot", help="write predicted-vs-measured to this PNG")
    p.add_argument("--format", choices=("text", "json", "csv"), default="text")
    p.add_argument("--wide", action="store_true", help=WIDE_HELP)
    p.add_argument("--strict", action="store_true", help="fail on a bad run record instead of skipping it")
    p.set_defaults(func=cmd_validate)


def cmd_probe(a: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.calibration import probe
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
    info = probe.device_info(a.device, a.nprocs)
    if info.kind == "cuda":  # the device's own name picks the datasheet; a base of other memory is refused
        if base is None:
            base = probe.base_for(info)
            print(f"base profile: {base.name} (the device is {info.name}, {info.memory_bytes / 2**30:.1f} GiB)",
                  file=sys.stderr)
        probe.check_base(base, info)
    print(f"probing ({a.nprocs} processes)...", file=sys.stderr)
    result = probe.run_probe(a.nprocs, quick=a.quick, info=info)
    name = a.name or Path(a.out).stem
    text = probe.profile_toml(result, name, base)
    write_atomic(a.out, text)
    for dtype, points in result.matmul.items():
        curve = ", ".join(f"{n}: {f / 1e9:.1f}" for n, f in points)
        print(f"matmul {dtype} GFLOP/s by size: {curve}")
    print(f"memory copy bandwidth: {result.memory_bytes_per_s / 1e9:.2f} GB/s")
    for op, points in result.collectives.items():
        print(f"{op}: " + ", ".join(f"{b // 1024} KiB {t * 1e3:.2f} ms" for b, t in points))
    print(f"device: {info.name}; torch {info.torch}, CUDA {info.cuda or '-'}, driver {info.driver or '-'}")
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
        least_squares_solver,
    )
    from planner.calibration.measured import load_measurements
    from planner.files import check_target, write_atomic
    from planner.hardware import get_profile

    check_target(a.out)  # a folder or a device: refused before the fit
    least_squares_solver()  # scipy: one line naming it, before any record is read
    if a.published and a.runs:
        raise PlannerError("runs", " ".join(a.runs), "give run records or --published, not both")
    if a.published and _torchtitan_csv(a.published):
        return _calibrate_torchtitan(a)
    if not a.runs and not a.published:
        raise PlannerError("runs", "none", "give run folders/records, or --published torchtitan|FILE.csv")
    if not a.base:
        raise PlannerError("base", "none", "name the profile the runs ran on (--base a100-80g, a probed file)")
    base = get_profile(a.base)
    if a.published:
        from planner.calibration.measured import published_measurements

        runs, skipped = published_measurements(a.published), []
    else:
        runs, skipped = load_measurements(a.runs, strict=a.strict)
    if a.parts and a.total_only:
        raise PlannerError("total-only", True, "leave out --parts (the parts are fitted unless --total-only)")
    parts = not a.total_only
    factors = (tuple(f.strip() for f in a.factors.split(",") if f.strip()) if a.factors
               else default_factors(runs, base, parts))
    try:
        check_factors(factors, len(runs))
    except PlannerError as exc:  # one line: the first skipped record says why there are too few
        raise _with_skipped(exc, skipped) from None
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    fit = calibrate(runs, base, factors, parts=parts)
    print(describe_fit(fit, runs))
    if not fit.converged:
        print(f"planner calibrate: {fit.message}; kept the base profile {base.name}, wrote nothing",
              file=sys.stderr)
        return 1
    name = a.name or Path(a.out).stem
    write_atomic(a.out, calibrated_profile_toml(base, fit, runs, name))
    print(f"wrote {a.out} (profile {name}; use --gpu {a.out})")
    return 0


def _torchtitan_csv(name: str) -> str | None:
    """The torchtitan benchmark CSV ``--published`` names ('torchtitan', or a file with its columns)."""
    from pathlib import Path

    if name.strip().lower() == "torchtitan":
        path = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "torchtitan_performance.csv"
        if not path.is_file():
            raise PlannerError("published", name, "the torchtitan rows ship with the source tree; give the CSV's path")
        return str(path)
    path = Path(name)
    if not path.is_file():
        raise PlannerError("published", name, "'torchtitan' or an existing CSV file")
    try:
        header = path.read_text(encoding="utf-8").split("\n", 1)[0]
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError("published", name, f"cannot read ({exc})") from None
    return str(path) if "tokens_per_s_per_gpu" in header.split(",") else None


def _calibrate_torchtitan(a: argparse.Namespace) -> int:
    """Fit the 500 W H100's clock and the fsdp2 per-block overhead on torchtitan's rows without
    context parallelism (planner/calibration/torchtitan.py), print the figures, write the profile."""
    from pathlib import Path

    import numpy as np

    from planner.calibration.published import load_torchtitan
    from planner.calibration.torchtitan import CLOCKED, calibrated_profile_toml, fit, leave_one_out, residuals
    from planner.files import write_atomic

    if a.base and a.base != CLOCKED:
        raise PlannerError("base", a.base, f"the torchtitan rows calibrate {CLOCKED} (leave --base out)")
    runs = load_torchtitan(_torchtitan_csv(a.published))
    if len(runs) < 3:
        raise PlannerError("published", a.published, f"{len(runs)} rows without context parallelism; "
                                                     "fitting 2 factors needs at least 3")
    base_err = np.exp(residuals((_clock_now(), _overhead_now_us()), runs)) - 1
    x = fit(runs)
    errors, loo = np.exp(residuals(x, runs)) - 1, leave_one_out(runs, x)
    print(f"{'row':<84} {'base err':>9} {'fit err':>8} {'LOO err':>8}")
    for r, b, e, lo in zip(runs, base_err, errors, loo):
        print(f"{r.label[:84]:<84} {b:+9.1%} {e:+8.1%} {lo:+8.1%}")
    mean = lambda e: f"{np.mean(np.abs(e)):.1%} mean, {np.max(np.abs(e)):.1%} worst"  # noqa: E731
    print(f"tokens/s per GPU over {len(runs)} rows: base {mean(base_err)}; fitted {mean(errors)}; "
          f"leave-one-out {mean(loo)}")
    print(f"factors: {CLOCKED} clock = {x[0]:.3f} of the H100 SXM's; layer_overhead_s = {x[1] * 1e-6:.4g} "
          f"(the fsdp2 stacks' layer_overhead_us, {x[1]:.0f})")
    name = a.name or Path(a.out).stem
    write_atomic(a.out, calibrated_profile_toml(x, runs, errors, loo, name))
    print(f"wrote {a.out} (profile {name}; use --gpu {a.out})")
    return 0


def _clock_now() -> float:
    """The clock the shipped 500 W H100 profile carries (its matmul over the H100 SXM's)."""
    from planner.calibration.torchtitan import CLOCKED, REFERENCE
    from planner.hardware import get_profile

    return get_profile(CLOCKED).efficiency.matmul / get_profile(REFERENCE).efficiency.matmul


def _overhead_now_us() -> float:
    from planner.stacks import get_stack

    return get_stack("fsdp2").layer_overhead_s * 1e6


def _with_skipped(exc: PlannerError, skipped: list[str]) -> PlannerError:
    """The error, with how many records were skipped and the first reason: still one line."""
    if not skipped:
        return exc
    more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
    return PlannerError(exc.field, exc.value, f"{exc.allowed} (skipped {skipped[0]}{more})")


def cmd_validate(a: argparse.Namespace) -> int:
    import json

    from planner.calibration.measured import load_measurements, published_measurements
    from planner.calibration.validate import compare, plot, summary, table, torchtitan_points
    from planner.hardware import get_profile

    if not a.runs and not a.published:
        raise PlannerError("runs", "none", "give run folders/records, or --published torchtitan|FILE.csv")
    if a.plot:
        from planner.files import check_target

        from planner.extras import need

        check_target(a.plot, "plot")  # before the work and the printed table
        need("matplotlib", "plot", a.plot)
    profile = get_profile(a.gpu) if a.gpu else None
    runs, skipped = load_measurements(a.runs, strict=a.strict, resolve_profiles=profile is None) if a.runs else ([], [])
    titan = _torchtitan_csv(a.published) if a.published else None
    if a.published and not titan:
        runs += published_measurements(a.published)
    if not runs and not titan:
        raise _with_skipped(PlannerError("runs", len(a.runs), "no usable run record"), skipped)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    points = (compare(runs, profile) if runs else []) + (torchtitan_points(titan, profile) if titan else [])
    if a.format == "json":
        print(json.dumps({"points": [{k: getattr(p, k) for k in p.__slots__} for p in points],
                          "summary": summary(points), "skipped": skipped}, indent=1, allow_nan=False))
    elif a.format == "csv":
        print("run,quantity,predicted,measured,error,judged")
        for p in points:
            print(f"{p.run},{p.quantity},{p.predicted!r},{p.measured!r},{p.error!r},{str(p.judged).lower()}")
    else:
        print(table(points, None if a.wide else WIDTH))
    if a.plot:
        plot(points, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.calibration.profile_grid import grid_runs, run_grid
    from planner.hardware import get_profile

    from planner.extras import need

    need("torch", "grid", a.grid)  # each run is the reference trainer: fail once, not in every run
    if a.gpu:
        get_profile(a.gpu)  # a bad name fails here, not in every run
    runs = grid_runs(a.grid, a.steps, Path(a.out), a.gpu)
    summary = run_grid(runs, Path(a.out), a.timeout)
    ok = sum(e["status"] == "ok" for e in summary)
    print(f"{ok} of {len(summary)} runs completed; records under {a.out} (summary: {a.out}/grid.json)")
    return 0 if ok else 1
