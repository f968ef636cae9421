"""The parts of a step are defined once (planner.core.step_parts): the planner's StepTime maps
onto them field by field, a run record's breakdown maps onto them, and validate compares them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core import step_parts
from planner.core.steptime import StepTime


def test_steptime_fields_and_parts_agree():
    # step: the sum of the parts; eval_batch: one forward-only pass (evaluation), timed next to the
    # step from the same per-layer times but not a part of it
    fields = [f.name for f in dataclasses.fields(StepTime) if f.name not in ("step", "eval_batch")]
    assert sorted(step_parts.STEPTIME_FIELDS) == sorted(fields)  # every field mapped, none invented
    one = {f: np.array([2.0 ** -i]) for i, f in enumerate(fields)}  # 1 + 1/2 + ... + 1/256
    assert StepTime.of(**one).step[0] == pytest.approx(2 - 2.0 ** -8)  # the parts add up to the step
    assert StepTime.of(**one, eval_batch=np.array([7.0])).step[0] == pytest.approx(2 - 2.0 ** -8)  # eval is not in it
    mapped = set(step_parts.STEPTIME_FIELDS.values()) | set(step_parts.NOT_PREDICTED)
    assert mapped == set(step_parts.NAMES)  # every part predicted or declared not predicted
    assert step_parts.COMMUNICATION == ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
    assert all(p.definition and len(p.definition) < 110 for p in step_parts.PARTS)  # one line each
    assert {q for parts in step_parts.COMPARED.values() for q in parts} == set(step_parts.NAMES)


def test_predicted_parts_add_up_to_the_step():
    st = StepTime.of(compute=np.array([1.0, 9.0]), tp_comm=np.array([0.5, 0]), cp_comm=np.array([0.0, 0]), ep_comm=np.array([0.0, 0]),
                  pp_comm=np.array([0.25, 0]),
                  dp_comm=np.array([0.125, 0]), bubble=np.array([2.0, 0]), optimizer=np.array([0.3, 0]),
                  other=np.array([0.7, 0]))
    parts = step_parts.predicted_parts(st, 0)
    assert sum(parts.values()) == pytest.approx(4.875) and parts["data_wait"] == 0.0
    # A per-step overhead of 0.2 s: the other 0.5 s of `other` is per-layer dispatch, booked as compute.
    moved = step_parts.predicted_parts(st, 0, step_overhead_s=0.2)
    assert moved["other"] == pytest.approx(0.2) and moved["compute"] == pytest.approx(1.5)
    assert sum(moved.values()) == pytest.approx(4.875)


BREAKDOWN = {"compute": 0.100, "comm_exposed": 0.040, "comm_exposed_tp": 0.030, "bubble": 0.020,
             "optimizer": 0.005, "data_wait": 0.001, "other": 0.002}


@pytest.mark.parametrize("tp,dp,kind,expected", [
    (1, 1, "cpu", (0.0, 0.0)), (1, 2, "cpu", (0.0, 0.040)), (2, 1, "cpu", (0.040, 0.0)),
    (2, 2, "cpu", (0.030, 0.010)), (2, 2, "cuda", (None, None)),
])
def test_measured_parts_split_communication_by_what_the_trace_can_tell(tp, dp, kind, expected):
    parts = step_parts.measured_parts(BREAKDOWN, tp, dp, kind)
    if expected[0] is None:  # NCCL kernels carry no process group: only the sum is known
        assert parts["tp_comm"] is None and parts["dp_comm"] is None
    else:
        assert (parts["tp_comm"], parts["dp_comm"]) == pytest.approx(expected)
    assert parts["pp_comm"] is None and parts["_comm"] == 0.040
    assert parts["cp_comm"] == 0.0  # the reference trainer runs no context parallel


def test_compared_merges_what_a_trace_cannot_separate():
    pred = {"compute": 1.0, "tp_comm": 0.5, "cp_comm": 0.0, "ep_comm": 0.0, "pp_comm": 0.25, "dp_comm": 0.125, "bubble": 2.0, "optimizer": 0.3,
            "data_wait": 0.0, "other": 0.7}
    meas = step_parts.measured_parts(BREAKDOWN, 2, 2, "cuda")
    got = step_parts.compared(pred, meas)
    assert got["bubble"] == (2.25, 0.020)  # pipeline transfers sit inside the measured receive waits
    assert got["comm"] == (0.625, 0.040)  # TP + DP exposed, the split unknown on a GPU
    assert "tp_comm" not in got and "dp_comm" not in got
    assert got["compute"] == (1.0, 0.100) and got["data_wait"] == (0.0, 0.001)


def test_untraced_records_compare_only_their_timers():
    parts = step_parts.measured_parts({**BREAKDOWN, "comm_exposed": None, "bubble": None}, 2, 1)
    assert parts["compute"] is None and parts["optimizer"] == 0.005
    assert set(step_parts.compared(dict.fromkeys(step_parts.NAMES, 1.0), parts)) == {"optimizer", "data_wait", "other"}


# The optimizer window's first cross-rank synchronisation (reference_trainer/step.py times it):
# hand-made per-rank timers of a pp2 run whose last stage finished backward 140 ms early.
def test_sync_wait_is_the_time_beyond_the_fastest_ranks():
    # Two steps of two ranks. Rank 0 (first stage) arrives last: its 2 and 4 ms are the
    # collectives' own cost; rank 1 waited 140 and 120 ms beyond it.
    assert step_parts.sync_waits([[0.002, 0.004], [0.142, 0.124]]) == pytest.approx([0.0, 0.130])
    # Per step, not per mean: which rank is fastest may change from step to step (pp 1 stragglers).
    assert step_parts.sync_waits([[0.001, 0.011], [0.011, 0.001]]) == pytest.approx([0.005, 0.005])
    assert step_parts.sync_waits([[0.5], [0.5], [0.5]]) == [0.0, 0.0, 0.0]  # nobody waited
    assert step_parts.sync_waits([[0.1, 0.2], []]) == [0.0, 0.0]  # a rank without steps (a rebuilt record)
    assert step_parts.sync_waits([]) == []


def test_the_drain_moves_from_optimizer_to_bubble_and_the_step_keeps_its_sum():
    last_stage = {"compute": 1.392, "comm_exposed": 0.0, "bubble": 0.108, "optimizer": 0.1535, "data_wait": 0.001,
                  "other": 0.0}
    booked = step_parts.book_sync_wait(last_stage, 0.140, pp=2)
    assert booked["optimizer"] == pytest.approx(0.0135) and booked["bubble"] == pytest.approx(0.248)
    assert booked["compute"] == 1.392 and booked["other"] == 0.0
    assert sum(booked.values()) == pytest.approx(sum(last_stage.values()))
    assert last_stage["optimizer"] == 0.1535  # the input is left as it was


def test_without_a_pipeline_the_wait_is_a_straggler():
    rank = {"compute": 0.3, "comm_exposed": 0.01, "bubble": 0.0, "optimizer": 0.025, "data_wait": 0.0, "other": 0.002}
    booked = step_parts.book_sync_wait(rank, 0.005, pp=1)
    assert booked["optimizer"] == pytest.approx(0.020) and booked["other"] == pytest.approx(0.007)
    assert booked["bubble"] == 0.0
    assert step_parts.sync_wait_part(1) == "other" and step_parts.sync_wait_part(4) == "bubble"


def test_an_untraced_bubble_stays_unknown_and_the_wait_never_exceeds_its_window():
    untraced = {"compute": 1.5, "comm_exposed": None, "bubble": None, "optimizer": 0.15, "data_wait": 0.0, "other": 0.0}
    booked = step_parts.book_sync_wait(untraced, 0.14, pp=2)
    assert booked["bubble"] is None and booked["optimizer"] == pytest.approx(0.01)
    # Means over different steps can put the wait past the optimizer window: clipped to it.
    clipped = step_parts.book_sync_wait({**untraced, "bubble": 0.1}, 0.2, pp=2)
    assert clipped["optimizer"] == 0.0 and clipped["bubble"] == pytest.approx(0.25)
