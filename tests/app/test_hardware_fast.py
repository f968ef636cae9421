"""The Hardware tab's shortcuts give what the long way gives, to the last bit (no timing is asserted).

The long way is computed here, independently of the shortcut: a free ``planner.core.search.search``
per (profile, GPU count), its first row when it fits (what `planner compare` and `planner estimate`
report), and ``planner.decisions.decide.probe`` for the comparison table.

- ``step_time_floor`` is under every layout's step time (so pruning by it never drops the best);
- ``fastest_fitting_bounded`` picks each count's first row of the search, with the same numbers,
  for dense, MoE, long-sequence (context parallel), fine-tuning, fp8 and other-stack jobs, and
  when the floor is wrong or missing (it then evaluates everything);
- the explorer's sweep, in one go or a few steps at a time, and its comparison table equal the
  search per (profile, count).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from planner.app import explore
from planner.app import state as explore_state
from planner.core import bounded as B
from planner.core import search as S
from planner.core.evaluate import _effective
from planner.core.layout import Job
from planner.core.presets import get_preset
from planner.core.results import estimate_at
from planner.core.steptime import step_time
from planner.decisions.decide import options_for, probe
from planner.hardware import get_profile
from tests.helpers import assert_same, columns


def table_of(model, job, counts, hw):
    return S.counts_table({n: S.enumerate_layouts(model, n, job)[0] for n in counts}, hw.network.gpus_per_node)


CASES = [  # (preset, job, GPU counts, profiles)
    ("llama2-7b", Job(), (8, 64, 512), ("a100-40g", "h100-pcie", "a6000")),
    ("mixtral-8x7b", Job(), (16, 128), ("h100-80g", "a100-80g")),  # experts; 32K sequence: context parallel
    ("llama3-8b", Job(mode="lora"), (1, 8, 32), ("a6000", "l40s")),
    ("llama3-8b", Job(mode="full-finetune"), (1, 8), ("a6000", "h100-80g")),  # offload searched
    ("llama2-7b", Job(precision="fp8", stack="megatron-core"), (16, 256), ("h100-80g", "a100-80g", "b200")),
    ("deepseek-v2-lite", Job(stack="fsdp2"), (8, 64), ("gb200-nvl72", "mi300x")),
    ("gpt3-1.3b", Job(attention="standard", stack="megatron-2021"), (8, 32), ("v100-32g",)),
]


def fallback_precision_job(job: Job, hw) -> Job:
    return options_for([hw], job)[0].job


def each_profile(name: str, job: Job, profiles):
    """(model, profile, the job as each profile runs it: fp16 where it has no bf16)."""
    model = get_preset(name)
    for gpu in profiles:
        hw = get_profile(gpu)
        yield model, hw, fallback_precision_job(job, hw)


@pytest.mark.parametrize("name, job, counts, profiles", CASES)
def test_floor_is_under_every_step_time(name, job, counts, profiles):
    for model, hw, j in each_profile(name, job, profiles):
        _, c, _, shared = table_of(model, j, counts, hw)
        sw, eff = _effective(hw, j)
        floor = B.step_time_floor(model, eff, j, c, sw, shared)
        step = step_time(model, eff, j, c, sw).step
        assert floor is not None and floor.shape == step.shape
        assert np.all(floor <= step), (hw.name, float(np.max(floor / step)))
        assert np.all(floor > 0)


@pytest.mark.parametrize("name, job, counts, profiles", CASES)
def test_bounded_is_each_searchs_first(name, job, counts, profiles):
    for model, hw, j in each_profile(name, job, profiles):
        best = B.fastest_fitting_bounded(model, hw, j, table_of(model, j, counts, hw))
        for n in counts:
            r = S.search(model, hw, j, n)
            if not r.feasible:
                assert n not in best, (hw.name, n)
                continue
            got = best[n]
            assert got.gpus == n
            assert_same(columns(S.take(r.evaluation, np.array([0]))), columns(got))


def test_a_wrong_floor_is_caught_and_everything_evaluated(monkeypatch):
    model, hw, job = get_preset("llama2-7b"), get_profile("h100-80g"), Job()
    counts = (8, 64)
    want = B.fastest_fitting_bounded(model, hw, job, table_of(model, job, counts, hw))
    real = B.step_time_floor
    monkeypatch.setattr(B, "step_time_floor", lambda *a: real(*a) * 3)  # over some step times
    calls = []
    monkeypatch.setattr(B, "fastest_fitting", lambda *a: calls.append(1) or real_fastest(*a))
    got = B.fastest_fitting_bounded(model, hw, job, table_of(model, job, counts, hw))
    assert calls and got.keys() == want.keys()
    for n in want:
        assert_same(columns(want[n]), columns(got[n]))


real_fastest = S.fastest_fitting


def test_a_cpu_host_has_no_floor_and_is_searched_whole():
    model, hw, job = get_preset("gpt3-1.3b"), get_profile("cpu-2core"), Job(precision="fp32")
    _, c, _, shared = table_of(model, job, (1, 2), hw)
    sw, eff = _effective(hw, job)
    assert B.step_time_floor(model, eff, job, c, sw, shared) is None
    best = B.fastest_fitting_bounded(model, hw, job, table_of(model, job, (1, 2), hw))
    for n in (1, 2):
        r = S.search(model, hw, job, n)
        assert (n in best) == bool(r.feasible)
        if r.feasible:
            assert_same(columns(S.take(r.evaluation, np.array([0]))), columns(best[n]))


def search_seconds_per_token(model, option, n) -> float:
    """The long way: a free search at this count, its first row when it fits, as an Estimate."""
    r = S.search(model, option.hardware, option.job, n)
    if not r.feasible:
        return math.nan
    e = estimate_at(r.evaluation, 0, model, option.hardware, option.job, option.ops)
    return e.train.seconds / e.train.tokens


@pytest.mark.parametrize("params", [13.0, 70.0])
def test_sweep_is_the_search_per_profile_and_count(params):
    values = explore_state.sweep_mapping({**explore_state.defaults(), "params": params})
    counts, profiles = (8, 128, 4096), ("a100-40g", "h100-pcie", "a6000", "gb200-nvl72", "v100-16g")
    x, options = explore._options(values, profiles)
    want = [(o.hardware.name, o.job.precision, n, search_seconds_per_token(x.model, o, n))
            for o in options for n in counts]
    got = [(p.profile, p.precision, p.gpus, p.seconds_per_token) for p in explore.sweep(values, counts, profiles)]
    assert len(got) == len(want) and any(math.isfinite(w[3]) for w in want)
    for g, w in zip(got, want):
        assert g[:3] == w[:3]
        assert g[3] == w[3] or (math.isnan(g[3]) and math.isnan(w[3])), (g, w)


def test_the_sweep_a_step_at_a_time_is_the_sweep(monkeypatch):
    values = explore_state.sweep_mapping({**explore_state.defaults(), "params": 7.0})
    profiles = ("a100-80g", "v100-32g", "a6000")
    whole = explore.sweep(values, explore.SWEEP_GPUS, profiles)
    # A clock that moves one second each time it is read: a deadline 1.5 s ahead lets ``advance``
    # run exactly one step, however fast or loaded the machine is.
    ticks = iter(range(10**9))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    explore._SWEPT.clear()  # computed again, in steps (not read off what the whole sweep kept)
    steps = explore.sweep_in_progress(values, explore.SWEEP_GPUS, profiles)
    steps.advance(0.0)  # a deadline already passed: no step
    assert steps.items == () and not steps.done
    runs = 0
    while not steps.done and runs < 1000:
        steps.advance(time.perf_counter() + 1.5)  # one step each
        runs += 1
        assert steps.items == whole[:len(steps.items)]
    assert steps.items == whole and steps.profiles_done == 3 and runs > 3
    values = explore_state.comparison_mapping({**explore_state.defaults(), "params": 7.0})
    explore._SWEPT.clear()
    table = explore.comparison_in_progress(values, 64, profiles)
    while not table.done:
        table.advance(time.perf_counter() + 1.5)
    assert table.items == explore.compare_hardware(values, 64, profiles) and len(table.items) == 3


def test_comparison_is_decides_probe_per_profile():
    values = explore_state.comparison_mapping({**explore_state.defaults(), "params": 70.0})
    profiles = ("a100-40g", "v100-16g", "h100-80g", "a6000", "gb200-nvl72")
    for gpus in (8, 128):
        x, options = explore._options(values, profiles)
        got = explore.probes(values, (gpus,), profiles)
        assert [o.hardware.name for o, _ in got] == list(profiles)
        for (_, fast), o in zip(got, options):
            slow = probe(x.model, o, gpus)  # planner.core.search.search, then estimate_at
            assert (fast.gpu, fast.gpus, fast.capacity_bytes, fast.why, fast.min_bytes) == \
                   (slow.gpu, slow.gpus, slow.capacity_bytes, slow.why, slow.min_bytes)
            assert (fast.best is None) == (slow.best is None)
            if slow.best is not None:
                assert fast.best.to_json() == slow.best.to_json()
    rows = explore.compare_hardware(values, 8, profiles)
    assert any(not r.fits and r.note == "no layout fits" for r in rows)  # 70B on 8 small GPUs


def same_row(a, b) -> bool:
    """Two HardwareRows equal field by field (nan where both have none)."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b)))


@pytest.mark.parametrize("more, counts", [({}, (8, 128, 96)), ({"tokens": 300.0}, (8, 128, 96)),
                                          ({"mtbf_gpu_hours": 2.0}, (128, 96))])
def test_the_table_is_decides_probe_with_or_without_the_sweeps_work(more, counts):
    """The table's rows, read off each best layout's evaluated row (at one of the sweep's counts
    with the sweep's own job, from the sweep's work: before the sweep ran and after), are what
    decide's probe finds (a free search, then estimate_at) and its Estimate says. (Where no layout
    fits and the MTBF is too short for the count, the probe names the MTBF and the table says no
    layout fits: counts where something fits, there.)"""
    state = {**explore_state.defaults(), "params": 70.0, **more}
    values = explore_state.comparison_mapping(state)
    profiles = ("a100-40g", "v100-16g", "h100-80g", "a6000", "gb200-nvl72")
    x, options = explore._options(values, profiles)
    seen = []
    for gpus in counts:  # 96: not one of the sweep's counts
        want = [explore._hardware_row(o, probe(x.model, o, gpus)) for o in options]
        seen += want
        explore._SWEPT.clear()
        first = explore.compare_hardware(values, gpus, profiles)
        explore.sweep(explore_state.sweep_mapping(state), explore.SWEEP_GPUS, profiles)
        again = explore.compare_hardware(values, gpus, profiles)
        for w, f, a in zip(want, first, again, strict=True):
            assert same_row(w, f) and same_row(w, a), (w, f, a)
    if "mtbf_gpu_hours" in more:
        assert all("too short" in r.note for r in seen)
    else:
        assert any(r.fits for r in seen) and any(r.note == "no layout fits" for r in seen)


def test_the_floor_leaves_few_layouts_to_evaluate(monkeypatch):
    """Not a timing: the shortcut's point is to evaluate the step time of a few layouts per count."""
    model, hw, job = get_preset("llama2-7b"), get_profile("h100-80g"), Job()
    table = table_of(model, job, (64, 512), hw)
    evaluated = []
    real = B._time_rows
    monkeypatch.setattr(B, "_time_rows", lambda m, h, j, c, rows, sw, mem: evaluated.append(len(rows)) or
                        real(m, h, j, c, rows, sw, mem))
    B.fastest_fitting_bounded(model, hw, job, table)
    assert 0 < sum(evaluated) < len(table[1]) / 4


def test_options_name_every_gpu_profile_once():
    from planner.hardware import gpu_profile_names

    assert explore._gpu_profile_names() == tuple(gpu_profile_names())
    _, options = explore._options(explore_state.comparison_mapping(explore_state.defaults()), None)
    assert [o.hardware.name for o in options] == list(gpu_profile_names())
    assert dataclasses.is_dataclass(options[0])


def test_a_computation_in_steps_that_fails_says_so():
    def steps():
        yield (1,)
        raise ValueError("broken")

    run = explore.InProgress(steps(), 1)
    with pytest.raises(ValueError, match="broken"):
        run.advance(time.perf_counter() + 10)
    assert run.done and run.items == (1,) and isinstance(run.error, ValueError)
    run.advance(time.perf_counter() + 10)  # stays as it was: the error, not a quiet end
    assert run.items == (1,) and isinstance(run.error, ValueError)


def test_a_step_is_begun_only_where_one_as_long_as_the_last_ends_by_the_deadline(monkeypatch):
    """Steps of 10 ms on a clock that only they move: a 25 ms budget runs two (the third would end
    at 30 ms), a 30 ms budget three, a 5 ms budget still one (each call makes progress)."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def steps():
        for i in range(100):
            clock[0] += 0.010
            yield (i,)

    for budget, ran in ((0.025, 2), (0.030, 3), (0.005, 1)):
        work = explore.InProgress(steps(), 1)
        work.advance(clock[0] + budget)
        assert len(work.items) == ran, (budget, work.items)


def test_a_step_is_begun_only_where_one_as_long_as_the_longest_so_far_ends_by_the_deadline(monkeypatch):
    """Steps of 20, 5 and 20 ms with a 40 ms budget: after the 5 ms step (at 25 ms) a 20 ms one
    would end at 45 ms, past the deadline, so it is left for the next call, which begins it."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def steps():
        for i, ms in enumerate((20, 5, 20, 5)):
            clock[0] += ms / 1000
            yield (i,)

    work = explore.InProgress(steps(), 1)
    work.advance(clock[0] + 0.040)
    assert work.items == (0, 1) and clock[0] == pytest.approx(0.025)
    work.advance(clock[0] + 0.040)  # 20 ms (the longest yet) then 5: ends at 50 ms, inside 65
    assert work.items == (0, 1, 2, 3) and clock[0] == pytest.approx(0.050)


def test_a_newer_request_between_steps_stops_the_work_and_keeps_what_is_done():
    """``between_steps`` runs after each step but the last: when it raises (Streamlit stopping the
    run for a newer request), the steps done are kept, the lock is free, and the next call goes on
    from the next step, none lost or repeated."""
    class Newer(Exception):
        pass

    calls = []

    def stop_at_third():
        calls.append(len(work.items))
        if len(calls) == 3:
            raise Newer

    work = explore.InProgress(((i,) for i in range(5)), 1)
    with pytest.raises(Newer):
        work.advance(time.perf_counter() + 3600, stop_at_third)
    assert work.items == (0, 1, 2) and not work.done and calls == [1, 2, 3]
    work.advance(time.perf_counter() + 3600, lambda: calls.append(len(work.items)))  # the lock was released: it works again
    assert work.items == (0, 1, 2, 3, 4) and work.done
    assert calls == [1, 2, 3, 4, 5]  # after steps 3 and 4 as well; not once more at the end
