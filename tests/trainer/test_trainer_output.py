"""What a run prints and records (issue 37): no Kineto log lines, the record's path once, and
exposed communication never more than all of it (the record said "comm exposed 167.8 ms of 113.0 ms")."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.calibration.record import validate_record
from reference_trainer.profiler import book
from reference_trainer.record import _rank_breakdown
from tests.trainer.helpers import explain, trainer_env

US = 1e-6  # the trace's microseconds, in seconds


def _classified(coll=(), waits=(), exchange=(), busy=((0.0, 100.0),)):
    return {"busy": list(busy), "coll": list(coll), "p2p": [], "waits": list(waits), "exchange": list(exchange)}


def test_a_wait_on_the_training_thread_counts_in_the_total_too():
    # Compute 0-100 us; a DTensor wait 100-130 us on the training thread (no gloo:* event: the
    # collective ran on gloo's thread before it, hidden under compute, 20-60 us). Step 0-150, fwd-bwd 0-140.
    c = _classified(coll=[(20.0, 60.0)], waits=[(100.0, 130.0)])
    booked = book(c, (0.0, 150.0), (0.0, 140.0))
    assert booked["comm_exposed_s"] == pytest.approx(30 * US)  # the wait: nothing computes meanwhile
    assert booked["comm_total_s"] == pytest.approx((40 + 30) * US)  # the hidden collective and the wait
    # Only the wait, and an exchange timer (K/V gather) of 10 us after it: all of it exposed.
    c = _classified(waits=[(100.0, 130.0)], exchange=[(130.0, 140.0)])
    booked = book(c, (0.0, 150.0), (0.0, 140.0))
    assert booked["comm_exposed_s"] == pytest.approx(40 * US) == pytest.approx(booked["comm_total_s"])


def test_the_record_never_books_more_exposed_than_total():
    # One traced step: half the forward-backward window exposed (50 of 100 us), communication 20% of
    # the step window (30 of 150 us): scaled by the timers (fwd-bwd 0.1 s, step 0.12 s), exposed
    # 0.05 s against a total of 0.024 s. All communication is at least its exposed part.
    traced = {"comm_exposed_s": 50 * US, "comm_exposed_tp_s": 0.0, "bubble_s": 0.0, "fwd_bwd_s": 100 * US,
              "comm_total_s": 30 * US, "step_window_s": 150 * US}
    r = {"fwd_bwd_s": 0.1, "step_s": 0.12, "data_wait_s": 0.0, "optimizer_s": 0.01, "traced": [traced]}
    out = _rank_breakdown(r, 0.0, 1)
    assert out["comm_exposed"] == pytest.approx(0.05)
    assert out["comm_total"] == pytest.approx(0.05)


def test_a_record_with_more_exposed_than_total_is_refused():
    from pathlib import Path

    rec = json.loads(next(Path("benchmarks/runs/cpu-2core").rglob("record.json")).read_text())
    rec["breakdown_s"]["comm_exposed"], rec["breakdown_s"]["comm_total"] = 0.1678, 0.1130
    with pytest.raises(ValueError, match="comm_exposed'=0.1678 is more than 'breakdown_s.comm_total'=0.113"):
        validate_record(rec)


@pytest.mark.slow
def test_a_run_prints_its_record_once_and_no_profiler_lines(tmp_path):
    # Two processes, tensor parallel: DTensor's waits on the training thread, traced steps.
    argv = ["planner", "run", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "512", "--seq-len", "64",
            "--tp", "2", "--global-batch", "4", "--steps", "5", "--profile-warmup-steps", "2", "--trace-steps", "2",
            "--workers", "0", "--run-name", "out", "--runs-dir", str(tmp_path)]
    env = {k: v for k, v in trainer_env().items() if k != "KINETO_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "planner", *argv[1:]], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, explain(proc)
    text = proc.stdout + proc.stderr
    record = tmp_path / "out" / "record.json"
    assert text.count(str(record)) == 1, explain(proc)
    assert "USDT" not in text and "profiler_start" not in text, explain(proc)
    b = json.loads(record.read_text())["breakdown_s"]
    assert b["comm_exposed"] is not None and 0 < b["comm_exposed"] <= b["comm_total"]
