"""The shortcuts of the search give what the long way gives (no timing is asserted here).

- the enumeration, grown a dimension at a time and pruned as it grows, equals the full product of
  the mesh and every dimension's values (itertools.product, lexicographic) filtered afterwards;
- a plan with pins (the pins' own layouts only) equals the plan selected from the widened table;
- a fully pinned layout (built as its columns) is its row of the product, or refused, as the rules decide;
- ``take`` (stacked gathers) equals indexing every column on its own;
- a search's rows taken by rank position (``ranked``, the rest left unordered) are the rows of the
  whole table put in rank order, and that order is the one the ranking rule gives row by row;
- the step times a search leaves for later (layouts that do not fit), whenever computed, equal one
  ``evaluate`` pass over the whole table;
- one layout evaluated alone (its columns numpy scalars: a pinned estimate) equals its row of the
  table, every part to the bit;
- an estimate read from its row alone (``take``) has the whole table's figures at that row.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.core import search as S
from planner.core.layout import LAYOUT_DIMS, Candidates, Job, default_global_batch
from planner.core.plan import evaluate_table, plan, plan_from_table
from planner.core.presets import get_preset
from planner.core.search import Pins, enumerate_layouts, take
from planner.errors import PlannerError
from planner.hardware import get_profile

CASES = [("llama2-7b", 64, Job()), ("llama2-7b", 8, Job(attention="standard", global_batch=256)),
         ("mixtral-8x7b", 128, Job()), ("llama2-7b", 1, Job(mode="full-finetune"))]


def full_product(model, gpus: int, job: Job) -> dict[str, np.ndarray]:
    """Every (mesh row, value of each searched dimension), in order, then the rules: the long way."""
    c, keep = product_and_verdicts(model, gpus, job)
    return c.take(np.flatnonzero(keep)).columns()


def product_and_verdicts(model, gpus: int, job: Job) -> tuple[Candidates, np.ndarray]:
    """The full product, unfiltered, and whether the rules keep each row."""
    stack = S.get_stack(job.stack)
    mesh = S._mesh(model, gpus, Pins(), stack.uneven_interleave)
    free = [d for d in LAYOUT_DIMS if d.searched is not None]
    names = ["dp", "tp", "pp", "vpp", "cp"] + [d.name for d in free]
    rows = [(*m, *v) for m in mesh for v in itertools.product(*(d.encode(list(d.searched(job, model))) for d in free))]
    cols = {name: np.array([r[i] for r in rows]) for i, name in enumerate(names)}
    dp, mb = cols["dp"], cols["micro_batch"]
    if job.global_batch is not None:
        gb = np.full_like(dp, job.global_batch)
        keep = gb % (dp * mb) == 0
    else:
        target = job.batch_tokens_target(gpus)
        gb = default_global_batch(model, dp * mb, target)
        near = gb * model.seq_len <= 1.5 * target
        keep = near if near.any() else (gb == dp * mb) & (mb == 1)
    c = Candidates(**cols, global_batch=gb)
    keep &= ~(c.sequence_parallel & (c.tp == 1))
    keep &= (c.vpp == 1) | (c.m % c.pp == 0)
    keep &= ~((c.schedule == 1) & (c.vpp > 1))
    keep &= S.runs_on_stack(c, stack) & S.expert_parallel_ok(model, c)
    keep &= np.asarray(S.moe_sequence_parallel_ok(model, c))
    keep &= (c.sharding == 0) | ((c.zero_stage >= 1) & (c.shard_group > 1) & (c.ep == 1))
    return c, keep


@pytest.mark.parametrize("name,gpus,job", CASES)
def test_enumeration_is_the_filtered_full_product(name, gpus, job):
    model = get_preset(name)
    got = enumerate_layouts(model, gpus, job)[0].columns()
    want = full_product(model, gpus, job)
    assert len(got["dp"]) == len(want["dp"]) > 0
    for key in want:
        assert np.array_equal(got[key], want[key]), key


@pytest.mark.parametrize("name,gpus,job", CASES)
def test_enumeration_for_a_node_size_leaves_out_hybrid_that_is_full(name, gpus, job):
    """Given the GPUs per node, the enumeration also drops hybrid sharding whose shard group fits in
    one node's ranks (gpus_per_node // tp of them): there it is full sharding. The same rows as the
    filtered full product, in the same order."""
    model = get_preset(name)
    c, keep = product_and_verdicts(model, gpus, job)
    for per_node in (4, 8):
        spans_nodes = np.minimum(c.shard_group, np.maximum(1, per_node // c.tp)) < c.shard_group
        want = c.take(np.flatnonzero(keep & ((c.sharding == 0) | spans_nodes))).columns()
        got = enumerate_layouts(model, gpus, job, gpus_per_node=per_node)[0].columns()
        for key in want:
            assert np.array_equal(got[key], want[key]), key


def pinned_verdict(model, gpus: int, job: Job, row: Candidates) -> bool:
    """Whether the rules keep a one-row table when every field is pinned: the free search's rules,
    except that the batch rule sees only the pinned (dp, micro-batch); SP with tp 1 is refused even
    when pinned (the pins' own check)."""
    stack = S.get_stack(job.stack)
    dp_mb = row.dp * row.micro_batch
    if job.global_batch is not None:
        keep = job.global_batch % dp_mb == 0
    else:
        target = job.batch_tokens_target(gpus)
        near = default_global_batch(model, dp_mb, target) * model.seq_len <= 1.5 * target
        keep = near if near.any() else (row.global_batch == dp_mb) & (row.micro_batch == 1)
    keep &= (row.vpp == 1) | (row.m % row.pp == 0)
    keep &= ~(row.sequence_parallel & (row.tp == 1))
    keep &= ~((row.schedule == 1) & (row.vpp > 1))
    keep &= S.runs_on_stack(row, stack) & S.expert_parallel_ok(model, row)
    keep &= np.asarray(S.moe_sequence_parallel_ok(model, row))
    keep &= (row.sharding == 0) | ((row.zero_stage >= 1) & (row.shard_group > 1) & (row.ep == 1))
    return bool(keep.all())


def pinned_rows_as_the_long_way_decides(name, gpus, job) -> int:
    """Every field pinned (the shortcut builds the one layout as its columns): each row of the full
    product gives that row (same columns, same dtypes) where the rules keep it, or is refused: by
    the pins' own checks (an error naming the field) or with no layout and the reason. Returns how
    many the rules refused."""
    model = get_preset(name)
    c, _ = product_and_verdicts(model, gpus, job)
    refused = 0
    for i in np.random.default_rng(1).permutation(len(c))[:120]:
        row = c.take(np.array([i]))
        lay = c.layout(int(i))
        try:
            got, why = enumerate_layouts(model, gpus, job, Pins(**{n: getattr(lay, n) for n in Pins.__slots__}))
        except PlannerError:
            assert not pinned_verdict(model, gpus, job, row)
            continue
        if pinned_verdict(model, gpus, job, row):
            assert why == "" and len(got) == 1
            for key, column in row.columns().items():
                assert np.array_equal(getattr(got, key), column) and getattr(got, key).dtype == column.dtype, key
        else:
            assert len(got) == 0 and why.startswith("no layout splits global_batch")
            assert all(col.dtype == getattr(c, k).dtype for k, col in got.columns().items())
            refused += 1
    return refused


@pytest.mark.parametrize("name,gpus,job", CASES)
def test_a_fully_pinned_layout_is_its_row_of_the_product_or_refused(name, gpus, job):
    pinned_rows_as_the_long_way_decides(name, gpus, job)


def test_the_shortcut_refuses_some_layouts_its_pin_checks_let_through():
    """Some of those refusals come from the rules themselves, not from the pins' own checks."""
    assert sum(pinned_rows_as_the_long_way_decides(*case) for case in CASES) > 0


@pytest.mark.parametrize("pins", [Pins(tp=2), Pins(pp=2, micro_batch=2), Pins(zero_stage=3, recompute="full"),
                                  Pins(tp=8, pp=8, micro_batch=64)])
def test_a_plan_with_pins_is_the_tables_selection(pins):
    model, hw, job = get_preset("llama2-13b"), get_profile("a100-40g"), Job()
    quick = plan(model, hw, job, 64, pins, top=3)
    slow = plan_from_table(evaluate_table(model, hw, job, 64, pins), model, hw, job, 64, pins, top=3)
    assert quick.to_json() == slow.to_json()
    assert [e.to_json() for e in quick.runners_up] == [e.to_json() for e in slow.runners_up]


def test_take_is_indexing_each_column():
    model, hw, job = get_preset("llama2-7b"), get_profile("a100-80g"), Job()
    ev = S.search(model, hw, job, 64).evaluation
    index = np.random.default_rng(0).permutation(len(ev.candidates))[: len(ev.candidates) // 2]
    got = take(ev, index)
    for name, column in ev.candidates.columns().items():
        assert np.array_equal(getattr(got.candidates, name), column[index])
    for part, taken in ((ev.memory, got.memory), (ev.time, got.time)):
        for f in part.__slots__:
            assert np.array_equal(getattr(taken, f), getattr(part, f)[index]), f
    assert np.array_equal(got.tokens_per_step, ev.tokens_per_step[index])


def test_when_nothing_fits_the_order_is_by_memory_then_row():
    r = S.search(get_preset("llama3-405b"), get_profile("a100-40g"), Job(), 8)
    assert r.feasible == 0 and r.evaluated > 10
    mem = r.memory.total.tolist()
    assert r.order.tolist() == sorted(range(len(mem)), key=lambda i: (mem[i], i))


@pytest.mark.parametrize("objective", ["time", "memory", "cost"])
def test_ranked_rows_are_the_rows_of_the_table_in_rank_order(objective):
    model, hw, job = get_preset("mixtral-8x7b"), get_profile("h100-80g"), Job()
    r = S.search(model, hw, job, 128, objective=objective)
    t = r.table
    # The ranking rule row by row (the long way): fitting first; then the memory tier, the objective in 0.1% buckets
    # of its logarithm, the step time (fitting) or memory (not fitting), the memory, the row's place.
    # Before the objective, the memory tier: under the plan's safe line (the stricter of 95% and the
    # stack's measured band below capacity), fitting above it, tight under capacity, tight above.
    from planner.core.checks import ROOMY_SHARE
    from planner.evidence import memory_band
    from planner.stacks import get_stack

    band, cap = memory_band(get_stack(job.stack)), t.capacity_bytes
    safe = min(ROOMY_SHARE, 1 - band.under)
    primary = {"time": t.train_seconds, "memory": t.memory.total, "cost": t.cost_usd}[objective].tolist()
    fits, step, mem = t.fits.tolist(), t.step_s.tolist(), t.memory.total.tolist()
    assert fits == [m <= cap * (1 + band.over) for m in mem]

    def key(i):
        tier = (mem[i] > cap * safe) + (mem[i] > cap * (1 - band.under)) + (mem[i] > cap)
        bucket = round(np.log(primary[i]) / 1e-3) if fits[i] else float("inf")
        return (tier if fits[i] else 4, bucket, step[i] if fits[i] else mem[i], mem[i], i)

    expected = sorted(range(len(fits)), key=key)
    assert r.order.tolist() == expected
    whole = r.evaluation
    assert whole.fits.tolist() == sorted(fits, reverse=True)
    positions = [0, 1, 7, len(expected) // 2, len(expected) - 1]
    some = r.ranked(positions)
    for part, got in ((whole.memory, some.memory), (whole.time, some.time)):
        for f in part.__slots__:
            assert np.array_equal(getattr(got, f), getattr(part, f)[positions]), f
    for name, column in whole.candidates.columns().items():
        assert np.array_equal(getattr(some.candidates, name), column[positions]), name
    # A selection keeps the table and narrows the order: its whole evaluation is those rows.
    chosen = np.flatnonzero(whole.candidates.tp == 2)
    sel = S.select(r, chosen)
    assert sel.evaluated == len(chosen) and sel.feasible == int(whole.fits[chosen].sum())
    assert np.array_equal(sel.evaluation.step_s, whole.step_s[chosen])


def test_a_plan_is_the_first_rows_of_the_whole_ranked_table():
    from planner.core.results import estimate_at

    model, hw, job = get_preset("llama2-13b"), get_profile("a100-40g"), Job()
    p = plan(model, hw, job, 64, Pins(tp=2), top=4)
    ev = p.result.evaluation  # the pins' layouts, every one put in rank order
    c = ev.candidates
    listed = [i for i in range(len(c)) if ev.fits[i] and not (c.zero_stage[i] > 0 and c.dp[i] * c.cp[i] == 1)]
    assert p.best.to_json() == estimate_at(ev, 0, model, hw, job).to_json()
    assert [e.to_json() for e in p.runners_up] == [estimate_at(ev, i, model, hw, job).to_json()
                                                  for i in [i for i in listed if i > 0][:4]]


def _columns(ev) -> dict[str, np.ndarray]:
    """Every column of an evaluation: the layout, memory, stages and step-time parts."""
    out = {f"layout.{k}": v for k, v in ev.candidates.columns().items()}
    for part, name in ((ev.memory, "memory"), (ev.time, "time"), *((m, f"stage{i}") for i, m in enumerate(ev.stage_memory))):
        out.update({f"{name}.{f}": getattr(part, f) for f in part.__slots__})
    return out


@pytest.mark.parametrize("name, gpu, gpus", [("llama3-70b", "a100-80g", 16), ("mixtral-8x7b", "h100-80g", 32)])
def test_step_times_left_for_later_are_those_one_pass_gives(name, gpu, gpus):
    """Where most layouts do not fit, the search computes the step time of the fitting ones only;
    the others' are computed when read. Every row, whenever computed, equals one ``evaluate`` pass
    over the whole table, and the ranking is the one the complete table gives."""
    from planner.core.evaluate import evaluate

    model, hw, job = get_preset(name), get_profile(gpu), Job()
    r = S.search(model, hw, job, gpus)
    assert r._deferred is not None and 0 < r.feasible < r.evaluated / 2  # the case: most do not fit
    whole = evaluate(model, hw, job, r.candidates, gpus)
    step = r.partial_table.time.step
    assert np.array_equal(np.isnan(step), ~whole.fits)  # left out: exactly the layouts that do not fit
    assert np.array_equal(step[whole.fits], whole.time.step[whole.fits])
    # Rows read by rank position, fitting or not, come with their step time (a select shares the fill).
    last = r.evaluated - 1  # the layout furthest from fitting
    picked = S.select(r, np.arange(r.evaluated))
    ev = picked.ranked([0, last])
    row = r.order[last]
    assert not whole.fits[row] and ev.time.step[1] == whole.time.step[row]
    assert not np.isnan(r.partial_table.time.step[row])  # filled in the shared table
    assert np.isnan(r.partial_table.time.step).sum() == (~whole.fits).sum() - 1
    # A selection's rows in rank order (more than a plan's few: filled by a mask of the rows).
    third = S.select(r, np.arange(0, r.evaluated, 3)).evaluation
    rows = r.order[np.arange(0, r.evaluated, 3)]
    assert np.array_equal(third.time.step, whole.time.step[rows]) and np.array_equal(third.mfu, whole.mfu[rows])
    # The whole table: every column equals the one-pass evaluation's, and so does the rank order.
    got, want = _columns(r.table), _columns(whole)
    assert got.keys() == want.keys()
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    assert np.array_equal(r.order, S.rank_order(whole, "time"))


# A spread of what the formulas branch on: GPT with dropout and learned positions, LLaMA, MoE with
# MLA and shared experts; flash and standard attention; bf16, fp8, fp16 (V100); pretraining, LoRA
# and full fine-tuning (offload searched); every stack; eager and compiled kernels; pinned values
# the search does not try (gpipe, dualpipev, hybrid sharding, offloaded parameters) widened in.
ONE_ROW_CASES = [
    ("gpt3-1.3b", "a100-80g", 16, Job(attention="standard", stack="megatron-2021"), Pins(schedule="gpipe")),
    ("llama2-7b", "h100-80g", 64, Job(precision="fp8"), Pins(sharding="hybrid")),
    ("llama3-8b", "h100-80g", 16, Job(stack="fsdp2", compile=True), Pins(schedule="dualpipev")),
    ("llama3-70b", "a100-80g", 64, Job(stack="deepspeed-zero", global_batch=512), Pins()),
    ("llama2-13b", "a100-80g", 8, Job(stack="reference", kernels="eager"), Pins()),
    ("llama2-7b", "a6000", 2, Job(mode="full-finetune"), Pins(offload="params")),
    ("llama2-7b", "a100-80g", 4, Job(mode="lora", lora_targets=("q_proj", "o_proj", "down_proj")), Pins()),
    ("gpt3-2.7b", "v100-32g", 8, Job(precision="fp16", attention="standard"), Pins()),
    ("mixtral-8x7b", "h100-80g", 64, Job(stack="megatron-core", precision="fp8"), Pins()),
    ("deepseek-v2-lite", "h100-80g", 32, Job(attention="standard", global_batch=256), Pins(schedule="dualpipev")),
    ("qwen3-30b-a3b", "b200", 32, Job(stack="fsdp2", async_tp=True), Pins()),
    # the optimizer offloaded as DeepSpeed (one bucket of gradients kept) and Megatron-Core (the buffer) do it
    ("llama2-7b", "a100-80g", 8, Job(stack="deepspeed-zero", mode="full-finetune"), Pins(offload="optimizer")),
    ("llama2-7b", "h100-80g", 8, Job(stack="megatron-core", mode="full-finetune"), Pins(offload="optimizer")),
    # processes sharing a CPU host's cores (the reference trainer's CPU runs)
    ("llama2-7b", "cpu-2core", 4, Job(stack="reference", precision="fp32"), Pins()),
    # configs of their own (tests/data): Gemma 4's MoE (its layers' two shapes, its MoE norms) and
    # Qwen3.5's linear layers over context parallel
    ("gemma-4-26B-A4B.config.json", "h100-80g", 16, Job(), Pins()),
    ("Qwen3.5-27B.config.json", "h100-80g", 64, Job(stack="megatron-core"), Pins(cp=4)),
    # multi-token-prediction modules on the last stage (with DualPipeV, the first rank's), the split
    # balanced for the head (megatron-core) or even (DualPipeV)
    ("deepseek-v2-lite+mtp1", "h100-80g", 32, Job(stack="megatron-core"), Pins()),
    ("llama2-7b+mtp2", "h100-80g", 16, Job(stack="hai-llm"), Pins(schedule="dualpipev")),
]


def _model(name: str):
    """A preset by name (``+mtpN``: with N multi-token-prediction modules), or a Hugging Face config
    of tests/data."""
    if "+mtp" in name:
        preset, n = name.split("+mtp")
        return get_preset(preset).replace(mtp_layers=int(n))
    if not name.endswith(".json"):
        return get_preset(name)
    from planner.core.options import model_from_hf_config
    from tests.test_hf_configs import DATA

    return model_from_hf_config(DATA / name)[0]


@pytest.mark.parametrize("name, gpu, gpus, job, pins", ONE_ROW_CASES)
def test_one_layout_evaluated_alone_is_its_row_of_the_table(name, gpu, gpus, job, pins):
    """One layout (a pinned estimate) is evaluated with its columns as numpy scalars
    (``Candidates.one_row``, planner.core.columns), a table as arrays, through the same formulas:
    each part of each layout, evaluated alone, equals its row of the table's one pass to the bit."""
    from planner.core.evaluate import evaluate

    model, hw = _model(name), get_profile(gpu)
    c, _ = enumerate_layouts(model, gpus, job, pins, widen=True)
    whole = _columns(evaluate(model, hw, job, c, gpus))
    rows = np.unique(np.linspace(0, len(c) - 1, min(len(c), 120)).astype(int))
    for i in rows:
        alone = _columns(evaluate(model, hw, job, c.take(np.array([i])), gpus))
        for k, column in whole.items():
            assert alone[k].shape == (1,) and alone[k].dtype == column.dtype, (k, alone[k])
            assert np.array_equal(alone[k], column[i:i + 1], equal_nan=True), (i, c.layout(i), k, alone[k], column[i])


@pytest.mark.parametrize("name, gpu, gpus, job, pins", ONE_ROW_CASES[::2])
def test_a_search_of_one_pinned_layout_is_its_row_of_the_table(name, gpu, gpus, job, pins):
    """Every field pinned, ``search`` enumerates the one layout as Python scalars
    (``enumerate_layouts(as_row=True)``), evaluates it alone (``evaluate_one``) and builds its
    table only when read: each column equals the layout's row of the whole table's one pass (to the
    bit, same dtypes), and the estimate a plan makes of it is the one read from that row."""
    from planner.core.evaluate import as_table, evaluate
    from planner.core.results import estimate_at

    model, hw = _model(name), get_profile(gpu)
    c, _ = enumerate_layouts(model, gpus, job, pins, widen=True)
    whole = evaluate(model, hw, job, c, gpus)
    columns = _columns(whole)
    checked = 0
    for i in np.unique(np.linspace(0, len(c) - 1, min(len(c), 40)).astype(int)):
        lay = c.layout(int(i))
        one_pins = Pins(**{n: getattr(lay, n) for n in Pins.__slots__})
        try:
            result = S.search(model, hw, job, gpus, one_pins)
        except PlannerError:  # the pins' own checks refuse it (the widened table holds such rows)
            continue
        assert result.one is not None and result.evaluated == 1
        assert result.feasible == int(whole.fits[i])
        for table in (as_table(result.one), result.table):
            alone = _columns(table)
            for k, column in columns.items():
                assert alone[k].shape == (1,) and alone[k].dtype == column.dtype, (k, alone[k])
                assert np.array_equal(alone[k], column[i:i + 1], equal_nan=True), (i, lay, k, alone[k], column[i])
        got = estimate_at(result.one, 0, model, hw, job).to_json()
        assert got == estimate_at(whole, int(i), model, hw, job).to_json()
        checked += 1
    assert checked > 0


def test_an_estimate_read_from_its_row_is_the_tables_figures_at_that_row():
    """``estimate_at`` reads a layout's derived figures from its row alone (``take``), so
    that listing every layout of a table (`planner search --all`) stays linear in its size: each
    figure equals the whole table's property at that row."""
    from planner.core.results import estimate_at

    model, hw, job = get_preset("mixtral-8x7b"), get_profile("h100-80g"), Job()
    ev = S.search(model, hw, job, 48).evaluation  # 48 GPUs: global batches of 3.1M-6.3M tokens
    assert len(ev.candidates) > 1000
    other = int(np.flatnonzero(ev.tokens_per_step != ev.tokens_per_step[0])[0])  # another batch than row 0's
    for i in (0, 1, other, len(ev.candidates) // 2, len(ev.candidates) - 1):
        e = estimate_at(ev, i, model, hw, job)
        assert e.layout == ev.candidates.layout(i)
        assert (e.fits, e.memory.total_bytes, e.time.step_s) == (ev.fits[i], ev.memory.total[i], ev.time.step[i])
        assert (e.mfu, e.hfu, e.tokens_per_s) == (ev.mfu[i], ev.hfu[i], ev.tokens_per_s[i])
        assert (e.bubble_fraction, e.comm_fraction) == (ev.bubble_fraction[i], ev.comm_fraction[i])
        assert (e.train.seconds, e.train.gpu_hours, e.train.cost_usd) == (ev.train_seconds[i], ev.gpu_hours[i],
                                                                          ev.cost_usd[i])
        stages = {int(m.stage[i]): float(m.total[i]) for m in ev.stage_memory}
        assert [(s.stage, s.total_bytes) for s in e.stage_memory] == sorted(stages.items())


def test_a_pinned_interleaving_degree_is_kept_exactly_when_the_list_holds_it():
    """``_vpps`` with a pinned degree tests it directly: kept exactly when the unpinned list (with the
    pinned degree among those tried unevenly, as the enumeration tries it) holds it."""
    from planner.core.model import ModelSpec

    for layers in (1, 2, 7, 12, 30, 32, 60, 61, 80, 126):
        model = ModelSpec(layers=layers, hidden=64, heads=4)
        for pp in range(1, min(layers, 16) + 1):
            for uneven in (False, True):
                for vpp in range(1, 20):
                    listed = [1] + [v for v in S._divisors(layers // pp) if pp > 1 and v > 1
                                    and layers % (pp * v) == 0]
                    if uneven and pp > 1:
                        listed += [v for v in sorted(set(S.UNEVEN_VPP) | {vpp}) if v > 1 and pp * v <= layers
                                   and v not in listed]
                    assert S._vpps(model, pp, uneven, vpp, None) == [vpp] * (vpp in listed), (layers, pp, uneven, vpp)


def test_divisors_by_hand_either_way_they_are_found():
    """Small and large counts (on both sides of 4,225 = 65 x 65, and a million): every divisor
    once, ascending, as Python ints."""
    assert S._divisors(1) == (1,)
    assert S._divisors(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert S._divisors(4224) == (1, 2, 3, 4, 6, 8, 11, 12, 16, 22, 24, 32, 33, 44, 48, 64, 66, 88, 96, 128, 132,
                                 176, 192, 264, 352, 384, 528, 704, 1056, 1408, 2112, 4224)  # 2^7 x 3 x 11
    assert S._divisors(4225) == (1, 5, 13, 25, 65, 169, 325, 845, 4225)  # 5^2 x 13^2
    big = S._divisors(1_000_000)  # 2^6 x 5^6: 7 x 7 divisors
    assert len(big) == 49 and big[:4] == (1, 2, 4, 5) and big[-1] == 1_000_000
    assert all(type(d) is int for d in (*S._divisors(4224), *big))
    S._divisors.cache_clear()  # a numpy count asked first is kept for the equal Python int: Python ints still
    assert all(type(d) is int for d in S._divisors(np.int64(96))) and S._divisors(96)[-1] == 96
