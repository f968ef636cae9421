"""End to end on this machine (issue 4): probe the CPU, profile a grid of real trainer runs,
calibrate on half, validate on the other half. Target: held-out step-time error <= 15% mean after
calibration, and clearly lower than before it. benchmarks/calibration_cpu.py runs the full grid."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planner.cli.main import main  # noqa: E402

FACTORS = "matmul,layer_overhead_s,tp_collective_overhead_s,thread_scaling"  # 4 factors from 5 runs


@pytest.mark.slow
def test_probe_profile_calibrate_validate(tmp_path, capsys):
    probed = tmp_path / "probed.toml"
    assert main(["probe", "--out", str(probed), "--nprocs", "2", "--quick"]) == 0
    grid = tmp_path / "grid"
    assert main(["profile", "--grid", "cpu-ci", "--out", str(grid), "--gpu", str(probed), "--steps", "12"]) == 0
    summary = json.loads((grid / "grid.json").read_text())
    assert len(summary) == 10 and all(e["status"] == "ok" for e in summary), summary
    runs = sorted(p for p in grid.iterdir() if (p / "record.json").exists())
    train = [str(p) for p in runs if int(p.name[:2]) % 2 == 0]
    held = [str(p) for p in runs if int(p.name[:2]) % 2 == 1]
    calibrated = tmp_path / "calibrated.toml"
    capsys.readouterr()
    assert main(["calibrate", *train, "--base", str(probed), "--out", str(calibrated), "--factors", FACTORS]) == 0
    fit_table = capsys.readouterr().out

    def held_out_error(profile: Path) -> float:
        assert main(["validate", *held, "--gpu", str(profile), "--format", "json"]) == 0
        return json.loads(capsys.readouterr().out)["summary"]["step_s"]["mean_abs_error"]

    before, after = held_out_error(probed), held_out_error(calibrated)
    with capsys.disabled():
        print(f"\n{fit_table}\nheld-out step-time error: {before:.1%} before calibration, {after:.1%} after")
    assert after <= 0.15
    assert after < 0.5 * before
