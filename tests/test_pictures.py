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


def test_every_part_of_the_step_has_a_colour_in_the_pictures():
    """The explorer's step bars and the CLI's --plot stack the parts by TIME_COLOURS: a part without
    one broke the explorer (a KeyError) and went missing from the plot's bars for any plan with
    expert parallel."""
    assert list(pic.TIME_COLOURS) == [label for _, label in TIME_PARTS]
    assert len(set(pic.TIME_COLOURS.values())) == len(pic.TIME_COLOURS)


def test_the_step_bar_of_an_expert_parallel_plan_adds_up_to_its_step():
    """DeepSeek-V3 on 2,048 H800s with ep 64 pinned: the explorer's step bar has an EP all-to-all
    segment, and the segments add up to the step time."""
    from planner.app import charts

    x = build_inputs(explore_state.mapping_from_state({**explore_state.defaults(), "model": "preset",
                                                        "preset": "deepseek-v3", "gpu": "h800", "gpus": 2048,
                                                        "ep": 64}))
    best = plan(x.model, x.hardware, x.job, x.gpus, x.pins, ops=x.ops, top=0).best
    rows = [{"part": label, "seconds": getattr(best.time, key)} for key, label in TIME_PARTS]
    values = charts.step_bar(rows)["layer"][0]["data"]["values"]
    assert "EP all-to-all" in {v["part"] for v in values}
    assert sum(v["seconds"] for v in values) == pytest.approx(best.time.step_s, rel=1e-9)
