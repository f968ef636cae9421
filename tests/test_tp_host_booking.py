"""Where a tensor-parallel collective's fixed software cost goes: it is host work on the training
thread (DTensor's redistribute and dispatch, the enqueue), which the reference trainer's trace
books as compute, so the planner books it as compute too; TP communication keeps the link time.
The step is unchanged. Hand-derived: layers x collectives per layer x cost x micro-batches."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.core.steptime import step_time
from planner.hardware import get_profile

COST_S = 1e-3  # per collective


@pytest.mark.parametrize("recompute, calls", [("none", 4), ("full", 6)])  # Narayanan et al. 2021, Sec. 3.2
def test_collective_host_cost_is_compute_not_tp_communication(recompute, calls):
    model = ModelSpec(name="t", arch="gpt", layers=8, hidden=1024, heads=16, vocab=32000, seq_len=1024)
    job = Job(precision="bf16", global_batch=8, stack="reference")
    c = Candidates.from_layouts([Layout(dp=1, tp=2, pp=1, micro_batch=2, global_batch=8, recompute=recompute)])
    hw = get_profile("h100-80g")  # a GPU: no shared cores, so no time-slicing factor
    zero = hw.with_efficiency(dataclasses.replace(hw.efficiency, tp_collective_overhead_s=0.0, tp_overlap=0.0))
    some = hw.with_efficiency(dataclasses.replace(zero.efficiency, tp_collective_overhead_s=COST_S))
    a, b = step_time(model, zero, job, c), step_time(model, some, job, c)
    micro_batches = 8 // 2
    host = model.layers * calls * COST_S * micro_batches
    assert float(b.tp_comm[0]) == pytest.approx(float(a.tp_comm[0]), rel=1e-12)
    assert float(b.compute[0] - a.compute[0]) == pytest.approx(host, rel=1e-9)
    # The step grows by the same, times the stragglers' factor (1 + jitter * sqrt(2 ln N), N = 2 GPUs).
    stragglers = 1 + hw.efficiency.step_jitter * math.sqrt(2 * math.log(2))
    assert float(b.step[0] - a.step[0]) == pytest.approx(host * stragglers, rel=1e-9)
