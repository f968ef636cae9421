"""The speed round's shortcuts give what the long way gives, to the last bit (no timing is asserted):

- ``evaluate`` in blocks of rows equals one pass over the whole table;
- ``fastest_fitting`` (every count's layouts evaluated together, step time only where memory fits)
  picks, per GPU count, the row a free ``search`` ranks first, with the same numbers;
- the explorer's sweep equals `planner compare`'s best layout per (profile, count);
- a fully pinned search equals the row of the free search with those values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.app import explore
from planner.app import state as explore_state
from planner.core import evaluate as E
from planner.core.layout import Job
from planner.core.presets import get_preset
from planner.core.search import Pins, counts_table, enumerate_layouts, fastest_fitting, search, take
from planner.hardware import get_profile
from tests.helpers import assert_same as same
from tests.helpers import columns


@pytest.mark.parametrize("name, gpus, job", [("mixtral-8x7b", 512, Job(attention="standard")),
                                             ("llama2-7b", 64, Job())])
def test_blocks_equal_one_pass(monkeypatch, name, gpus, job):
    model, hw = get_preset(name), get_profile("h100-80g")
    c, _ = enumerate_layouts(model, gpus, job)
    one = E.evaluate(model, hw, job, c, gpus)
    monkeypatch.setattr(E, "BLOCK_ROWS", 97)  # blocks of an odd size, the last one short
    assert len(c) > 3 * 97
    same(columns(one), columns(E.evaluate(model, hw, job, c, gpus)))


def test_fastest_fitting_is_each_searchs_first():
    model, job = get_preset("mixtral-8x7b"), Job()
    counts = (8, 16, 64, 256)
    for gpu in ("a100-40g", "h100-80g"):
        hw = get_profile(gpu)
        table = counts_table({n: enumerate_layouts(model, n, job)[0] for n in counts}, hw.network.gpus_per_node)
        best = fastest_fitting(model, hw, job, table)
        for n in counts:
            r = search(model, hw, job, n)
            if not r.feasible:
                assert n not in best
                continue
            first = take(r.evaluation, np.array([0]))
            got = best[n]
            assert got.gpus == n
            same(columns(first), columns(got))


def test_sweep_equals_compare():
    values = explore_state.sweep_mapping({**explore_state.defaults(), "params": 13.0})
    counts, profiles = (8, 64, 512), ("a100-40g", "h100-80g", "v100-16g", "a6000")
    c = explore._comparison(values, counts, profiles)
    precision = {o.hardware.name: o.job.precision for o in c.options}
    want = [(p.gpu, precision[p.gpu], p.gpus, p.best.train.seconds / p.best.train.tokens if p.best else math.nan)
            for p in c.rows]
    got = [(p.profile, p.precision, p.gpus, p.seconds_per_token) for p in explore.sweep(values, counts, profiles)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:3] == w[:3]
        assert g[3] == w[3] or (math.isnan(g[3]) and math.isnan(w[3]))


def test_fully_pinned_search_is_the_free_searchs_row():
    model, hw, job = get_preset("deepseek-v2-lite"), get_profile("h100-80g"), Job()
    ev = search(model, hw, job, 64).evaluation
    for row in (0, 3, len(ev.candidates) - 1):
        lay = ev.candidates.layout(row)
        pinned = search(model, hw, job, 64, Pins(**{n: getattr(lay, n) for n in Pins.__slots__})).evaluation
        assert len(pinned.candidates) == 1
        same(columns(take(ev, np.array([row]))), columns(pinned))
