"""`planner probe`: the curve fits by hand, and a quick real probe that yields a usable profile."""

import pytest

from planner.calibration.probe import fit_alpha_beta, fit_half_dim


def test_half_dim_fit_recovers_a_known_curve():
    points = [(n, 100e12 * n / (n + 64)) for n in (64, 128, 256, 1024, 4096)]
    peak, half = fit_half_dim(points)
    assert half == pytest.approx(64) and peak == pytest.approx(100e12)


def test_alpha_beta_fit_recovers_latency_and_bandwidth():
    # all-reduce on 4 ranks: t = 30 us + 2*3/4 * bytes / 10 GB/s
    points = [(b, 30e-6 + 1.5 * b / 10e9) for b in (2**12, 2**16, 2**20, 2**24)]
    alpha, bw = fit_alpha_beta(points, 1.5)
    assert alpha == pytest.approx(30e-6, rel=1e-6) and bw == pytest.approx(10e9, rel=1e-6)


def test_quick_probe_writes_a_profile_the_planner_uses(tmp_path):
    pytest.importorskip("torch")
    from planner.cli.main import main
    from planner.hardware import load_profile_file

    out = tmp_path / "cpu.toml"
    assert main(["probe", "--out", str(out), "--nprocs", "2", "--quick"]) == 0
    hw = load_profile_file(out)
    assert hw.gpu.peak_flops["fp32"] > 1e9 and hw.gpu.hbm_bytes_per_s > 1e8
    assert hw.network.gpus_per_node >= 2 and hw.network.intra_bytes_per_s > 0 and hw.network.compute_slots >= 1
    assert main(["estimate", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "32",
                 "--gpu", str(out), "--gpus", "2", "--precision", "fp32", "--tokens", "1M"]) == 0
