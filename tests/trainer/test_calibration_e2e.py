"""End to end on this machine (issues 4 and 13): probe the CPU, profile a grid of real trainer runs,
calibrate on half, validate on the other half.

What is asserted does not depend on how loaded the machine is: the runs to calibrate on and the
held-out runs alternate in time (the grid is ordered in pairs of like runs), and calibration is
judged against the uncalibrated profile on the same measurements (it must lower the held-out
error), never against an absolute figure that a busy machine moves; a grid on which these checks
fail is measured again, once (a grid measured while the machine's speed changed under it can leave
the fit unable to match even its own runs). The absolute held-out error
is printed here and measured by benchmarks/calibration_cpu.py (full grid)."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planner.cli.main import main  # noqa: E402

FACTORS = "matmul,layer_overhead_s,tp_collective_overhead_s,thread_scaling"  # 4 factors from 5 runs
SHARES = ("compute_share", "bubble_fraction", "comm_fraction", "optimizer_share")


@pytest.mark.slow
def test_probe_profile_calibrate_validate(tmp_path, capsys, monkeypatch):
    # OpenMP's threads spin while they wait for each other by default. With other jobs on the cores,
    # a run of one process and two threads then crawled: one of the grid's steps took 7.8 s instead
    # of 0.09 s, and that one run decided the mean error (a matmul loop here: 60 s under two busy
    # loops, 0.4 s without). Passive waiting makes them yield: 1.5 s under the same load (0.9 s
    # without). Every run of the grid runs so, and the check below is relative.
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    probed = tmp_path / "probed.toml"
    assert main(["probe", "--out", str(probed), "--nprocs", "2", "--quick"]) == 0
    err = lambda v: v["summary"]["step_s"]["mean_abs_error"]  # noqa: E731

    def validate(profile: Path, runs: list[str]) -> dict:
        assert main(["validate", *runs, "--gpu", str(profile), "--format", "json"]) == 0
        return json.loads(capsys.readouterr().out)

    def grid_and_fit(k: int):
        grid = tmp_path / f"grid{k}"
        assert main(["profile", "--grid", "cpu-ci", "--out", str(grid), "--gpu", str(probed), "--steps", "8"]) == 0
        summary = json.loads((grid / "grid.json").read_text())
        assert len(summary) == 10 and all(e["status"] == "ok" for e in summary), summary
        runs = sorted(p for p in grid.iterdir() if (p / "record.json").exists())
        train = [str(p) for p in runs if int(p.name[:2]) % 2 == 0]
        held = [str(p) for p in runs if int(p.name[:2]) % 2 == 1]
        calibrated = tmp_path / f"calibrated{k}.toml"
        capsys.readouterr()
        assert main(["calibrate", *train, "--base", str(probed), "--out", str(calibrated), "--factors", FACTORS]) == 0
        return train, held, calibrated, capsys.readouterr().out

    # A grid measured while the machine's speed changed under it (seen: one single-process run at 4x
    # its twin's time, the shared host busy) can leave the fit unable to match even its own runs;
    # such a grid says nothing about calibration. Where the checks below fail on the first grid, it
    # is measured again, once, and the checks hold for that second grid.
    for k in range(2):
        train, held, calibrated, fit_table = grid_and_fit(k)
        in_before, in_after = validate(probed, train), validate(calibrated, train)
        before, after = validate(probed, held), validate(calibrated, held)
        if err(in_after) < err(in_before) and err(after) < err(before):
            break
        with capsys.disabled():
            print(f"\n{fit_table}\ngrid {k}: in sample {err(in_before):.1%} -> {err(in_after):.1%}, held out "
                  f"{err(before):.1%} -> {err(after):.1%}: measured again")
    with capsys.disabled():
        print(f"\n{fit_table}\nheld-out step-time error: {err(before):.1%} before calibration, "
              f"{err(after):.1%} after (in sample {err(in_before):.1%} -> {err(in_after):.1%})")
    # The fit lowers the error on the runs it saw and on the runs it did not, measured alike.
    assert err(in_after) < err(in_before)
    assert err(after) < err(before)
    # Every held-out run is compared part by part (planner.core.step_parts), not only in total.
    for share in SHARES:
        assert after["summary"][share]["runs"] == len(held), share
