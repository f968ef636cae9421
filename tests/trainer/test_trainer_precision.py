"""Mixed precision and non-finite losses: an fp16 overflow backs off the loss scale and skips
exactly that step; losses that stay non-finite stop the run with a diagnosis."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from reference_trainer.record import load_record
from tests.trainer.helpers import explain, steps

pytestmark = pytest.mark.slow


def test_fp16_overflow_backs_off_and_skips_that_step(single_sweep):
    runs, proc = single_sweep
    rows = steps(runs / "fp16-overflow")
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5], explain(proc)
    assert [int(r["skipped"]) for r in rows] == [0, 0, 1, 0, 0]
    scales = [r["loss_scale"] for r in rows]
    assert scales[:2] == [65536.0, 65536.0] and scales[2:] == [32768.0] * 3  # halved once, at step 3
    assert math.isinf(rows[2]["loss"]) and all(math.isfinite(r["loss"]) for i, r in enumerate(rows) if i != 2)
    # fp16 autocast trains the same model as fp32 up to the skip (fp32 master weights).
    fp32 = steps(runs / "gpt-1")
    assert [r["loss"] for r in rows[:2]] == pytest.approx([r["loss"] for r in fp32[:2]], rel=2e-3)
    rec = load_record(runs / "fp16-overflow")
    assert rec["steps"]["skipped"] == [3] and rec["loss"]["final_loss_scale"] == 32768.0
    assert rec["status"] == "completed" and rec["loss"]["nonfinite_steps"] == 1
    assert "step 3: non-finite loss or gradients; step skipped, loss scale now 32768" in proc.stdout


def test_repeated_nonfinite_losses_stop_with_a_diagnosis(single_sweep):
    runs, proc = single_sweep
    assert proc.returncode == 3, explain(proc)  # the last run of the sweep stopped
    rows = steps(runs / "stop-nonfinite")
    assert [int(r["step"]) for r in rows] == [1, 2, 3]  # steps 2 and 3 non-finite: max_nonfinite_steps=2
    rec = load_record(runs / "stop-nonfinite")
    assert rec["status"] == "stopped_nonfinite"
    assert "non-finite for 2 steps in a row (steps 2..3)" in rec["message"]
    assert "learning rate too high" in rec["message"]
    assert any(f["check"] == "nonfinite_loss" for f in rec["flags"])
    assert "error: loss or gradients non-finite for 2 steps in a row" in proc.stdout
