"""The speed round's shortcuts give what the long way gives, to the last bit (no timing is asserted):

- ``evaluate`` in blocks of rows equals one pass over the whole table;
- ``fastest_fitting`` (every count's layouts evaluated together, step time only where memory fits)
  picks, per GPU count, the row a free ``search`` ranks first, with the same numbers;
- the explorer's sweep equals `planner compare`'s best layout per (profile, count);
- a fully pinned search equals the row of the free search with those values;
- the parts computed once per distinct combination of the columns they read (``per_distinct``)
  equal those computed on every row;
- a second search of 69,471 layouts finds its temporaries' memory still mapped (glibc: page
  faults counted, not time).
"""

from __future__ import annotations

import math
import platform
import subprocess
import sys

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
    monkeypatch.setattr(E, "ONE_BLOCK_ROWS", 96)
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


@pytest.mark.parametrize("name, gpu, gpus, job", [
    ("mixtral-8x7b", "h100-80g", 512, Job(attention="standard")),  # MoE, expert parallel, selective recompute
    ("llama3-70b", "h100-80g", 64, Job(attention="standard", stack="megatron-core")),  # context parallel
    ("llama2-7b", "a100-80g", 8, Job(mode="full-finetune")),  # offload searched
    ("llama2-7b", "h100-80g", 16, Job(mode="lora", precision="fp8", kernels="eager")),
    ("deepseek-v3", "h100-80g", 2048, Job()),
])
def test_parts_per_distinct_rows_equal_every_row(monkeypatch, name, gpu, gpus, job):
    from planner.core import memory, steptime

    model, hw = get_preset(name), get_profile(gpu)
    c, _ = enumerate_layouts(model, gpus, job)
    fast = E.evaluate(model, hw, job, c, gpus)
    for module in (memory, steptime):  # every part computed on every row: the long way
        monkeypatch.setattr(module, "per_distinct", lambda c, dims, f: f(c))
    long = E.evaluate(model, hw, job, c.take(np.arange(len(c))), gpus)
    same(columns(long), columns(fast))


def test_distinct_rows_index_every_row_and_hide_the_other_columns():
    from planner.core.layout import DIMS, LAYER_DIMS, Candidates, per_distinct

    rng = np.random.default_rng(0)
    n = 20000
    cols = {d: rng.integers(0, 3, n) for d in DIMS}
    cols["sequence_parallel"] = rng.integers(0, 2, n).astype(bool)
    # Values a lookup table indexes; values past it (sorted per column); combinations too many for a
    # table of every key (the keys sorted); so many distinct values in every column that no int64
    # key holds their combinations (the rows compared column by column).
    for kind in ("small", "large", "spread", "many"):
        for d in ("tp", "cp", "ep", "micro_batch"):
            cols[d] = (rng.choice([1, 2, 4, 64], n) if kind == "small" else rng.choice([1, 2, 7, 2**20 - 1], n)
                       if kind == "large" else rng.choice(np.arange(0, 4000, 37), n) if kind == "spread"
                       else rng.integers(0, 2**40, n))
        cols["recompute"] = rng.integers(0, 2**40, n) if kind == "many" else rng.integers(0, 3, n)
        c = Candidates(**cols)
        part, inverse = c.distinct(LAYER_DIMS)
        rows = np.unique(np.stack([getattr(c, d) for d in LAYER_DIMS], axis=1), axis=0)  # ascending, as the key's order
        assert len(part) == len(rows) == len({tuple(row) for row in zip(*(getattr(c, d).tolist() for d in LAYER_DIMS))})
        assert np.array_equal(np.stack([getattr(part, d) for d in LAYER_DIMS], axis=1), rows)
        for d in LAYER_DIMS:
            got = getattr(part, d)
            assert got.dtype == getattr(c, d).dtype and np.array_equal(got[inverse], getattr(c, d))
        if 2 * len(part) <= n:  # (where most rows are distinct, per_distinct computes on the table itself)
            with pytest.raises(TypeError):  # a column the dimensions leave out is not there to read
                per_distinct(c, LAYER_DIMS, lambda p: p.dp + 1)
        twice = per_distinct(c, LAYER_DIMS, lambda p: (2 * p.tp + p.micro_batch, 0.5))
        assert np.array_equal(twice[0], 2 * c.tp + c.micro_batch) and twice[1] == 0.5
        some = c.take(np.arange(0, n, 3))  # a selection reads the table's distinct rows
        sub, index = some.distinct(LAYER_DIMS)
        assert sub is part and all(np.array_equal(getattr(sub, d)[index], getattr(some, d)) for d in LAYER_DIMS)


@pytest.mark.parametrize("rows", [0, 1, 5, 3000])
def test_distinct_rows_of_constant_columns_and_short_tables(rows):
    """Columns of one value (left out of the key), a table of one row and one of none: the
    distinct rows are np.unique's, of every column's dtype, indexing every row."""
    from planner.core.layout import DIMS, LAYER_DIMS, Candidates

    rng = np.random.default_rng(rows)
    cols = {d: np.full(rows, 2, dtype=np.int64) for d in DIMS}
    cols["sequence_parallel"] = np.ones(rows, dtype=bool)
    cols["micro_batch"] = rng.choice([1, 8], rows)
    c = Candidates(**cols)
    part, inverse = c.distinct(LAYER_DIMS)
    expect = np.unique(np.stack([getattr(c, d) for d in LAYER_DIMS], axis=1), axis=0)
    assert len(part) == len(expect) and inverse.shape == (rows,)
    for j, d in enumerate(LAYER_DIMS):
        got = getattr(part, d)
        assert got.dtype == getattr(c, d).dtype
        assert np.array_equal(got, expect[:, j].astype(got.dtype)) and np.array_equal(got[inverse], getattr(c, d))


# A process that has searched once searches again in the memory it had: the 40-50 MB of a 69,471-row
# search's temporaries (Mixtral 8x22B on 4,096 GPUs), freed at its end, stay mapped for the next.
LARGE_AGAIN = """
import resource
from planner.core.layout import Job
from planner.core.presets import get_preset
from planner.core.search import search
from planner.hardware import get_profile
hw, model, job = get_profile("h100-80g"), get_preset("mixtral-8x22b"), Job(attention="standard", global_batch=8192)
search(model, hw, job, 4096)
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    search(model, hw, job, 4096)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(max(faults))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc thresholds (planner.core.evaluate._keep_freed_heap)")
def test_a_second_large_search_reuses_the_memory_of_the_first():
    """Each of three searches after the first maps fewer than 1,000 fresh pages (4 MB); with the
    thresholds an 8 MiB block gave (16 MiB trim), each mapped about 12,000 again (47 MB), every
    page zero-filled by the kernel: 40% of the search's time. A fresh process: the count is of
    this code alone."""
    out = subprocess.run([sys.executable, "-c", LARGE_AGAIN], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.split()[-1]) < 1000, out.stdout
