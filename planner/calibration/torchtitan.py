"""Fitting the factors torchtitan's published rows inform, with leave-one-out.

Two factors from the rows without context parallelism: the clock a 500 W H100 (Grand Teton,
``h100-96g-hbm2e``) sustains relative to the H100 SXM (scaling its GEMM, attention and fp8
efficiencies together), and the fsdp2 stack's per-block overhead. Least squares on
log(predicted / measured tokens/s per GPU). One more from the rows with context parallelism:
the stack's ``cp_overlap`` (how much of one step's attention hides each K/V exchange), on a grid.
scipy is imported only here (the test extra), never on the CLI's start-up path.
"""

from __future__ import annotations

import dataclasses
import datetime
import tempfile
from pathlib import Path

import numpy as np

from planner.calibration.published import TorchtitanRun, predict_torchtitan
from planner.hardware import HardwareProfile, efficiency_to_table, get_profile

CLOCKED = "h100-96g-hbm2e"  # the profile whose clock is fitted
REFERENCE = "h100-80g"  # the H100 SXM at full power, whose efficiencies the clock scales
START, LOW, HIGH = (0.8, 0.0), (0.3, 0.0), (1.0, 5000.0)  # clock; overhead in microseconds
CP_OVERLAP_GRID = np.linspace(0.0, 1.0, 11)


def profile_for(run: TorchtitanRun, x) -> HardwareProfile:
    """The row's profile with the factors under fit. A profile's own factors override the
    stack's (planner.stacks.effective), so the stack's per-block overhead is fitted through it."""
    hw = get_profile(run.gpu)
    eff = dataclasses.replace(hw.efficiency, layer_overhead_s=x[1] * 1e-6)
    if run.gpu == CLOCKED:
        ref, c = get_profile(REFERENCE).efficiency, x[0]
        eff = dataclasses.replace(eff, matmul=ref.matmul * c, flash_attention=ref.flash_attention * c,
                                  fused_attention=ref.fused_attention * c, fp8_matmul=ref.fp8_matmul * c)
    return dataclasses.replace(hw, efficiency=eff, efficiency_keys=hw.efficiency_keys | {"layer_overhead_s"})


def residuals(x, runs: list[TorchtitanRun]) -> np.ndarray:
    return np.array([np.log(predict_torchtitan(r, profile_for(r, x)).tokens_per_s_per_gpu
                            / r.measured_tokens_per_s_per_gpu) for r in runs])


def fit(runs: list[TorchtitanRun]) -> np.ndarray:
    """(clock, per-block overhead in microseconds)."""
    from scipy.optimize import least_squares

    return least_squares(residuals, x0=START, bounds=(LOW, HIGH), args=(runs,)).x


def leave_one_out(runs: list[TorchtitanRun]) -> np.ndarray:
    """Each row's error when the factors are fitted on the other rows."""
    return np.array([np.exp(residuals(fit(runs[:i] + runs[i + 1:]), [runs[i]])[0]) - 1 for i in range(len(runs))])


def _stack_file(name: str, folder: Path, **changes: float) -> str:
    """A copy of stack ``name`` with some [overlap] factors changed (the stack loader reads files)."""
    import tomli_w

    from planner.stacks import get_stack
    import tomllib

    data = tomllib.loads(Path(get_stack(name).path).read_text())
    data.pop("aliases", None)
    data["overlap"] = {**data["overlap"], **changes}
    path = folder / f"{name}-{'-'.join(f'{k}{v:.3f}' for k, v in changes.items())}.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


def cp_errors(runs: list[TorchtitanRun], cp_overlap: float, folder: Path) -> np.ndarray:
    """Relative tokens/s error of each row with the stack's cp_overlap set to ``cp_overlap``."""
    out = []
    for r in runs:
        job = dataclasses.replace(r.job, stack=_stack_file(r.job.stack, folder, cp_overlap=float(cp_overlap)))
        out.append(predict_torchtitan(dataclasses.replace(r, job=job)).tokens_per_s_per_gpu
                   / r.measured_tokens_per_s_per_gpu - 1)
    return np.array(out)


def fit_cp_overlap(runs: list[TorchtitanRun]) -> tuple[float, np.ndarray, np.ndarray]:
    """(cp_overlap minimising the squared log error over ``runs`` on a grid, in-sample errors,
    leave-one-out errors) for the rows with context parallelism."""
    with tempfile.TemporaryDirectory() as tmp:
        grid = np.array([cp_errors(runs, v, Path(tmp)) for v in CP_OVERLAP_GRID])  # (values, rows)
    loss = np.log1p(grid) ** 2
    best = int(np.argmin(loss.sum(axis=1)))
    loo = np.array([grid[int(np.argmin(loss.sum(axis=1) - loss[:, i])), i] for i in range(len(runs))])
    return float(CP_OVERLAP_GRID[best]), grid[best], loo


def calibrated_profile_toml(x, runs: list[TorchtitanRun], errors: np.ndarray, loo: np.ndarray, name: str) -> str:
    """The 500 W H100 profile with the fitted clock's efficiencies and the fitted per-block overhead
    (a profile's own factor, which wins over the stack's), plus [provenance]."""
    import tomli_w
    import tomllib

    base = get_profile(CLOCKED)
    data = tomllib.loads(Path(base.path).read_text())
    data.pop("provenance", None)
    data.update(name=name, aliases=[], description=f"{data.get('description', base.description)} (calibrated)")
    data["efficiency"] = efficiency_to_table(profile_for(dataclasses.replace(runs[0], gpu=CLOCKED), x).efficiency)
    date = datetime.datetime.now().isoformat(timespec="seconds")
    data["provenance"] = {"kind": "calibration from published rows", "base": base.name, "date": date,
                          "source": "torchtitan_performance.csv (rows without context parallelism)",
                          "factors": ["clock", "layer_overhead_s"], "clock": float(x[0]),
                          "layer_overhead_us": float(x[1]), "rows": [r.label for r in runs],
                          "fit_mean_abs_error": float(np.mean(np.abs(errors))),
                          "fit_worst_abs_error": float(np.max(np.abs(errors))),
                          "loo_mean_abs_error": float(np.mean(np.abs(loo)))}
    head = f"# Calibrated by `planner calibrate --published torchtitan` from {len(runs)} published rows on {date}.\n"
    return head + tomli_w.dumps(data)
