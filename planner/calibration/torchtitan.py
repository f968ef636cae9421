"""Fitting the factors torchtitan's published rows inform, with leave-one-out.

Two factors: the clock a 500 W H100 (Grand Teton, ``h100-96g-hbm2e``) sustains relative to the
H100 SXM (scaling its GEMM, attention and fp8 efficiencies together), and the fsdp2 stack's
per-block overhead. Least squares on log(predicted / measured tokens/s per GPU). scipy is
imported only here (the test extra), never on the CLI's path.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.calibration.published import TorchtitanRun, predict_torchtitan
from planner.hardware import HardwareProfile, get_profile

CLOCKED = "h100-96g-hbm2e"  # the profile whose clock is fitted
REFERENCE = "h100-80g"  # the H100 SXM at full power, whose efficiencies the clock scales
START, LOW, HIGH = (0.8, 0.0), (0.3, 0.0), (1.0, 5000.0)  # clock; overhead in microseconds


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
