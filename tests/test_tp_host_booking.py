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


# 4 per layer (Narayanan et al. 2021, Sec. 3.2), 2 more recomputed: the host work around them is all redone,
# even where the recompute stops before the last collective is sent (below).
@pytest.mark.parametrize("recompute, calls", [("none", 4), ("full", 6)])
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


# Full recompute's TP collectives, counted in benchmarks/calibration_cpu.py --mechanism (gloo,
# 4-layer GPT, no SP): backward all-reduces 9 with recompute none, 13 with full, 17 with torch's
# checkpoint early stop turned off. The stop comes before the layer's last collective (the MLP
# output's all-reduce; with SP its reduce-scatter, half of one). Megatron's checkpoint re-runs all.
@pytest.mark.parametrize("stack, sp, calls_full", [("reference", False, 5), ("reference", True, 5.5),
                                                   ("megatron-2021", False, 6), ("megatron-2021", True, 6)])
def test_full_recompute_issues_the_collectives_the_stack_recomputes(stack, sp, calls_full):
    model = ModelSpec(name="t", arch="gpt", layers=8, hidden=1024, heads=16, vocab=32000, seq_len=1024)
    job = Job(precision="fp16", global_batch=8, stack=stack)
    hw = get_profile("a100-80g")
    hw = hw.with_efficiency(dataclasses.replace(hw.efficiency, tp_collective_overhead_s=0.0, tp_overlap=0.0))

    def tp_s(recompute: str) -> float:
        lay = Layout(dp=1, tp=2, pp=1, micro_batch=2, global_batch=8, recompute=recompute, sequence_parallel=sp)
        return float(step_time(model, hw, job, Candidates.from_layouts([lay])).tp_comm[0])

    assert tp_s("full") / tp_s("none") == pytest.approx(calls_full / 4, rel=1e-12)
