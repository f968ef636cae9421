"""Live monitoring (issue 13): a CPU run writes TensorBoard event files that TensorBoard's own
reader reads back, with the planner's predicted step time beside the measured one."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboard")


@pytest.mark.slow
def test_tensorboard_events_read_back_with_predicted_and_measured(single_sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from planner.calibration.measured import load_measurements
    from planner.calibration.validate import compare
    from planner.hardware import get_profile
    from tests.trainer.conftest import CPU_PROFILE
    from tests.trainer.helpers import column, explain

    runs, proc = single_sweep
    run = runs / "gpt-tensorboard"
    assert (run / "record.json").exists(), explain(proc)
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/lr", "train/grad_norm", "step_time_s/measured", "step_time_s/predicted",
                "timers_s/fwd_bwd", "breakdown_s/compute", "breakdown_s/comm_exposed",
                "breakdown_s/compute_predicted", "breakdown_s/bubble_predicted"):
        assert tag in tags, tag
    measured = [e.value for e in acc.Scalars("step_time_s/measured")]
    assert [e.step for e in acc.Scalars("step_time_s/measured")] == [1, 2, 3, 4, 5, 6]
    assert measured == pytest.approx(column(run, "step_s"), rel=1e-6)  # the per-step CSV, written apart
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx(column(run, "lr"), rel=1e-6)
    # The live prediction is what `planner validate` predicts for the finished run's record.
    predicted = {e.value for e in acc.Scalars("step_time_s/predicted")}
    (rec,), _ = load_measurements([str(run)])
    validated = next(p for p in compare([rec], get_profile(str(CPU_PROFILE))) if p.quantity == "step_s")
    assert len(predicted) == 1 and predicted.pop() == pytest.approx(validated.predicted, rel=1e-6)
    assert len(acc.Scalars("breakdown_s/compute")) == 1  # one traced step (profile.trace_steps = 1)

    # The Prometheus endpoint (profile.metrics_port: 0, any free port) started beside it and closed.
    assert "/metrics (Prometheus text format)" in proc.stdout + proc.stderr
