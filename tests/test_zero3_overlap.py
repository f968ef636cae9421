"""ZeRO-3 / FSDP prefetch hides a pass's collectives behind the compute of the same pass: the
forward's gathers behind the forward, the backward's gathers and reduce-scatters behind the backward
and the forward it recomputes. Compute moved from one pass to the other therefore changes what is
exposed, by ``zero3_overlap`` per second moved, where one pass's collectives outlast its compute and
the other's do not; a single pool of compute for both (what the planner did before) could not tell."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core import comm
from planner.core.layout import Candidates, Job, Layout
from planner.core.presets import get_preset
from planner.core.steptime import _dp_collectives, _dp_exposed
from planner.hardware import get_profile
from planner.stacks import effective, software

MODEL = get_preset("llama3-70b")
JOB = Job(stack="fsdp2")


def exposed(fwd: float, bwd: float, rc: float = 0.0, pp: int = 1) -> float:
    """Exposed data-parallel seconds per step of 70B under FSDP over 64 A100s (8 micro-batches,
    or one stage of 8 under pp 8), with the given per-micro-batch compute of each pass."""
    sw = software(JOB)
    hw = effective(get_profile("a100-80g"), sw.stack)
    lay = Layout(dp=64 // pp, tp=1, pp=pp, micro_batch=1, global_batch=8 * (64 // pp), zero_stage=3)
    c = Candidates.from_layouts([lay])
    params = MODEL.params / pp
    one = np.array([1.0])
    coll = _dp_collectives(hw, JOB, c, sw, comm.Links.of(hw), params * one, params * one, 1.0, 0.0)
    return float(_dp_exposed(hw, sw, c, coll, fwd * one, bwd * one, 80.0 / pp * one, rc * one)[0])


def test_compute_moved_out_of_the_forward_exposes_its_gathers():
    ov = effective(get_profile("a100-80g"), software(JOB).stack).efficiency.zero3_overlap
    # A forward far shorter than its gathers (70B's weights over 64 GPUs: seconds) and a backward
    # long enough to hide its own collectives: moving 10 ms from the forward to the backward exposes
    # ov x 10 ms more per micro-batch, 8 of them.
    a, b = exposed(0.020, 1000.0), exposed(0.010, 1000.010)
    assert b - a == pytest.approx(8 * ov * 0.010, rel=1e-9)
    # The forward a backward recomputes hides the backward's collectives as the backward does.
    short = exposed(1000.0, 0.010)
    assert short - exposed(1000.0, 0.010, rc=0.005) == pytest.approx(8 * ov * 0.005, rel=1e-9)
    assert exposed(1000.0, 0.005, rc=0.005) == pytest.approx(exposed(1000.0, 0.010), rel=1e-12)


def test_a_pipeline_stage_kept_gathered_hides_its_gather_behind_one_micro_batch():
    """FSDP2 under pp keeps a stage's weights gathered: it gathers during the first micro-batch's
    forward and reduce-scatters during the last one's backward, so only one micro-batch's forward
    hides the gathers, however many micro-batches the step runs."""
    ov = effective(get_profile("a100-80g"), software(JOB).stack).efficiency.zero3_overlap
    a, b = exposed(0.020, 1000.0, pp=8), exposed(0.010, 1000.0, pp=8)
    assert b - a == pytest.approx(ov * 0.010, rel=1e-9)  # once per step, not per micro-batch
