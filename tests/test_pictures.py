"""The step-time-parts-vs-GPUs picture (planner.decisions.pictures.breakdown_vs_gpus) searches its
GPU counts together with the bounded shortcut; each count's layout must be the one a plan of
that count alone picks (planner.core.plan.plan, the free search by time)."""

import pytest

from planner.app import state as explore_state
from planner.core.options import build_inputs
from planner.core.plan import plan
from planner.core.report import TIME_PARTS
from planner.decisions import pictures as pic
from planner.errors import PlannerError


def _per_count(x) -> list[dict]:
    g = x.gpus
    rows = []
    for n in sorted({max(1, g // 4), max(1, g // 2), g, g * 2, g * 4}):
        try:
            best = plan(x.model, x.hardware, x.job, n, ops=x.ops, top=0).best
        except PlannerError:
            continue
        if best.fits:
            rows += [{"GPUs": n, "part": label, "seconds": getattr(best.time, key)} for key, label in TIME_PARTS
                     if getattr(best.time, key, 0) > 0]
    return rows


@pytest.mark.parametrize("inputs", [
    {},  # 33B on 128 A100s
    {"params": 70.0},
    {"params": 7.0, "gpus": 8},
    {"gpu": "h100-80g", "precision": "fp8"},
    {"params": 405.0, "gpus": 1024},
    {"preset": "mixtral-8x7b"},
    {"params": 175.0, "gpus": 8},  # fits at none of the counts: no rows
])
def test_each_count_has_the_layout_its_own_plan_picks(inputs):
    x = build_inputs(explore_state.mapping_from_state({**explore_state.defaults(), **inputs}))
    expected = _per_count(x)
    assert pic.breakdown_vs_gpus(x) == expected
    # A caller's known best for the plan's own count is used as given.
    known = plan(x.model, x.hardware, x.job, x.gpus, ops=x.ops, top=0).best
    assert pic.breakdown_vs_gpus(x, known={x.gpus: known}) == expected
