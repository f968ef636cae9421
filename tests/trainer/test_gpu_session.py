"""The GPU session script (issue 13) rehearsed on a CPU: `--dry-run` runs the same steps with a
tiny model and leaves every record and figure under the output folder."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planner.calibration.record import load_record  # noqa: E402
from tests.trainer.helpers import trainer_env  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_session.sh"


@pytest.mark.slow
def test_gpu_session_dry_run_writes_everything_under_its_folder(tmp_path):
    out = tmp_path / "session"
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, env=trainer_env(), cwd=SCRIPT.parents[1], check=False)
    log = (out / "session.log").read_text()
    assert proc.returncode == 0 and "done in" in log, log[-3000:]
    names = {"350m-mb4", "350m-mb8-selective", "760m-mb4", "760m-mb8", "760m-mb8-selective", "760m-mb16-full",
             "tp2", "pp2"}
    records = {p.parent.name: load_record(p) for p in (out / "runs").glob("*/record.json")}  # validated on load
    assert set(records) == names
    assert {r["layout"]["recompute"] for r in records.values()} == {"none", "selective", "full"}
    assert records["tp2"]["layout"]["tp"] == 2 and records["pp2"]["layout"]["pp"] == 2
    assert (out / "runs" / "760m-mb4" / "tensorboard").is_dir()
    summary = json.loads((out / "runs" / "summary.json").read_text())
    assert len(summary["runs"]) == 6
    for profile in ("probed", "calibrated"):
        assert (out / f"{profile}.toml").exists() and (out / f"validate-{profile}.png").stat().st_size > 0
        points = json.loads((out / f"validate-{profile}.json").read_text())["points"]
        assert {p["run"] for p in points if p["quantity"] == "step_s"} == names
    # The memory-ceiling reruns of 760m-mb8 (no cap on a CPU: the same path, uncapped), kept out of runs/.
    capped = {p.parent.name: load_record(p) for p in (out / "ceiling").glob("*/record.json")}
    assert set(capped) == {"760m-mb8-cap-reserved", "760m-mb8-cap-tight"}
    assert all(r["config"]["profile"]["memory_fraction"] is None for r in capped.values())
    assert "step" in log.split("ceiling (limit")[1] and "x the uncapped run's" in log
    assert "skip" not in log  # everything fitted in the budget
    # The raw read of a traced step booked it as prof.events() does, on the session's device.
    assert "the same booking: yes" in (out / "trace_read.txt").read_text()


def test_a_ceiling_rerun_of_no_finished_run_is_one_line(tmp_path):
    script = SCRIPT.parent / "trainer_gpu.py"
    for run_dir in (tmp_path / "760m-mb8", tmp_path / "not-a-setting"):  # no record; not a run of the script
        proc = subprocess.run(["python", str(script), "--out", str(tmp_path / "c"), "--tiny", "--ceiling", str(run_dir)],
                              capture_output=True, text=True, timeout=120, env=trainer_env(), check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--ceiling" in proc.stderr, proc.stderr
        assert not (tmp_path / "c").exists()  # nothing written
