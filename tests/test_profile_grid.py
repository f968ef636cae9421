"""`planner profile`'s runs: OpenMP waits passively, and a SIGTERM to the grid takes its run in
flight down with it (the run's whole process group: torchrun and its ranks), leaving no orphan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for the trainer's launcher: a child of its own (as torchrun's ranks) and a long sleep.
RUN = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {child.pid} {os.environ.get('OMP_WAIT_POLICY')}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""
GRID = """
import sys
from pathlib import Path
from planner.calibration.profile_grid import GridRun, run_grid
run_grid([GridRun(name="r", argv=(sys.argv[1],))], Path(sys.argv[2]), 600, launcher=("-c", sys.argv[3]))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be read


def test_sigterm_to_the_grid_stops_its_run_and_the_runs_children(tmp_path):
    pids = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"PYTHONPATH": str(ROOT)}
    log = tmp_path / "grid.log"
    with log.open("w") as err:
        grid = subprocess.Popen([sys.executable, "-c", GRID, str(pids), str(tmp_path / "runs"), RUN], env=env,
                                stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not pids.exists() and time.monotonic() < deadline and grid.poll() is None:
            time.sleep(0.1)
        assert pids.exists(), log.read_text() or "the run did not start in 120 s"
        run, child, policy = pids.read_text().split()
        assert policy == "PASSIVE"  # set for the run when the caller left it unset
        grid.send_signal(signal.SIGTERM)
        assert grid.wait(timeout=60) == 143
        deadline = time.monotonic() + 30
        while (_alive(int(run)) or _alive(int(child))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(int(run)) and not _alive(int(child)), "an orphan outlived the grid"
    finally:
        if grid.poll() is None:
            grid.kill()


def test_the_ci_grid_names_its_minimum_run_count_before_running(tmp_path):
    # cpu-ci's calibrating half is 5 runs, and they exercise 7 factors: one line, before any probe or run.
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibration_cpu.py"), "--grid", "cpu-ci",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "calibrates on 5 runs" in proc.stderr and "--factors with at most 5" in proc.stderr
    assert "--grid cpu" in proc.stderr and not out.exists()
