"""Each layout dimension and job option is declared once; everything that names them is derived.

So a new dimension (context parallel, say) shows up everywhere by being declared: these tests list
every place a dimension's name must appear and fail where one is missing or spelled differently.
"""

from __future__ import annotations

import dataclasses

import pytest

from planner.app import state as explore_state
from planner.calibration.record import SCHEMA
from planner.cli.main import build_parser
from planner.core.layout import JOB_OPTIONS, LAYOUT_DIMS, PIN_DIMS, Candidates, Job, Layout
from planner.core.options import GPU_DEFAULTED, OPS_OPTIONS, build_inputs
from planner.core.presets import get_preset
from planner.core.report import CSV_COLUMNS
from planner.core.search import Pins, enumerate_layouts

NAMES = [d.name for d in LAYOUT_DIMS]


def estimate_args(argv: list[str]) -> dict:
    return vars(build_parser().parse_args(["estimate", "--params", "7B", *argv]))


def test_every_dimension_is_a_layout_field_a_column_a_json_key_a_csv_column_and_a_record_key():
    assert NAMES == [f.name for f in dataclasses.fields(Layout)]
    assert set(NAMES) == set(Candidates.__slots__)
    lay = Layout(dp=2, global_batch=8)
    assert list(lay.to_json()) == [*NAMES, "grad_accum"]
    assert set(NAMES) <= set(CSV_COLUMNS)
    assert set(SCHEMA["layout"]) == {*NAMES, "grad_accum"}
    assert [f.name for f in dataclasses.fields(Pins)] == [d.name for d in PIN_DIMS]
    assert set(NAMES) - {d.name for d in PIN_DIMS} == {"global_batch"}  # a job option (--global-batch)


def test_every_pinnable_dimension_is_a_flag_an_explorer_field_and_a_url_key():
    dests = estimate_args([])
    fields = explore_state.field_map()
    for d in PIN_DIMS:
        assert d.name in dests and dests[d.name] is None  # not given: searched
        if d.name != "dp":  # dp follows from GPUs / (tp x pp) in the explorer
            assert d.name in fields and d.name in explore_state.LAYOUT_PINS
            query = explore_state.query_from_state({**explore_state.defaults(),
                                                    **dict([explore_state.pin_value(d.name, d.choices[-1]
                                                                                    if d.choices else 2)])})
            assert list(query) == [d.name]


@pytest.mark.parametrize("argv, pins", [
    (["--tp", "2", "--pp", "2", "--vpp", "2", "--micro-batch", "1"], {"tp": 2, "pp": 2, "vpp": 2, "micro_batch": 1}),
    (["--zero-stage", "3", "--recompute", "full"], {"zero_stage": 3, "recompute": "full"}),
    (["--zero", "1", "--no-sequence-parallel", "--schedule", "gpipe"],
     {"zero_stage": 1, "sequence_parallel": False, "schedule": "gpipe"}),
])
def test_flags_pin_the_same_fields_as_the_explorer(argv, pins):
    from_flags = build_inputs(estimate_args(argv)).pins
    state = {**explore_state.defaults(), **dict(explore_state.pin_value(k, v) for k, v in pins.items())}
    from_page = build_inputs(explore_state.mapping_from_state(state)).pins
    assert from_flags.pinned() == pins == from_page.pinned()


def test_every_job_and_operations_option_is_a_flag_with_its_declared_default():
    dests = estimate_args([])
    for o in (*JOB_OPTIONS, *OPS_OPTIONS):
        given = dests[o.name]
        if o.name in GPU_DEFAULTED:  # None: the GPU's default (bf16 and flash on an A100, the default GPU)
            assert given is None, o.name
            continue
        if o.repeat:  # one item per flag (--set A --set B): none given is None
            assert given is None and o.default == (), o.name
            continue
        assert given == (",".join(o.default) if isinstance(o.default, tuple) else o.default), o.name
    assert build_inputs(dests).job == Job()  # no flag: the declared defaults, nothing else


def test_a_pinned_value_is_the_only_value_of_its_column():
    from planner.core.model import ModelSpec

    dense = get_preset("llama-7b")
    moe = ModelSpec(arch="llama", layers=8, hidden=1024, heads=8, experts=8, top_k=2)  # expert parallel needs experts
    for d in PIN_DIMS:
        if d.searched is None:
            continue
        value = d.choices[-1] if d.choices else 2
        model = moe if d.name == "ep" else dense
        c, _ = enumerate_layouts(model, 16, Job(attention="standard"), Pins(**{d.name: value}))
        assert len(c) and {d.decode(v) for v in set(getattr(c, d.name).tolist())} == {value}, d.name


@pytest.mark.parametrize("name, gpus, pins, job", [
    ("llama-33b", 128, {}, {}), ("llama-33b", 128, {"tp": 2}, {}), ("llama-7b", 8, {"recompute": "selective"}, {}),
    ("llama-13b", 32, {"zero_stage": 3, "micro_batch": 2}, {"attention": "standard"}),
    ("llama-65b", 64, {"pp": 4, "vpp": 2}, {}), ("llama-7b", 16, {"sequence_parallel": True}, {"mode": "lora"}),
    ("llama-33b", 32, {"tp": 1, "pp": 1, "zero_stage": 0}, {}),
    ("llama-65b", 256, {"pp": 4, "schedule": "gpipe"}, {"global_batch": 1024}),
])
def test_the_plan_selected_from_one_table_is_the_pinned_search(name, gpus, pins, job):
    """plan() evaluates one widened table and selects the pinned rows: the same layouts, in the same
    rank order, with the same figures as searching the pins alone."""
    import numpy as np

    from planner.core.plan import plan
    from planner.core.search import search
    from planner.hardware import get_profile

    model, hw, job, pins = get_preset(name), get_profile("a100-80g"), Job(**job), Pins(**pins)
    alone, p = search(model, hw, job, gpus, pins), plan(model, hw, job, gpus, pins)
    assert (alone.evaluated, alone.feasible) == (p.result.evaluated, p.result.feasible)
    assert np.array_equal(alone.evaluation.step_s, p.result.evaluation.step_s)
    assert alone.evaluation.candidates.layout(0) == p.best.layout


def test_candidates_survive_pickling():
    """Candidates travel through st.cache_data and process pools by value."""
    import pickle

    c = Candidates.from_layouts([Layout(dp=2, global_batch=8), Layout(dp=1, tp=2, global_batch=8, recompute="full")])
    again = pickle.loads(pickle.dumps(c))
    assert [again.layout(i) for i in range(2)] == [c.layout(i) for i in range(2)]
