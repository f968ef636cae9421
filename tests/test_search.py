"""Search: every layout valid, ranked, pins respected, the nearest fitting layout found."""

import numpy as np
import pytest

from planner.core.layout import Job
from planner.core.plan import plan
from planner.core.presets import get_preset
from planner.core.search import Pins, search
from planner.errors import PlannerError
from planner.hardware import get_profile

A100 = get_profile("a100-80g")


def test_every_enumerated_layout_is_valid_and_fitting_ones_come_first():
    model = get_preset("llama-33b")
    r = search(model, A100, Job(), 128)
    c, ev = r.evaluation.candidates, r.evaluation
    assert r.evaluated == len(c) > 1000
    assert np.all(c.dp * c.tp * c.pp == 128)
    assert np.all(c.global_batch % (c.dp * c.micro_batch) == 0)
    assert np.all(model.heads % c.tp == 0)
    # fsdp2 splits layers unevenly across virtual stages: each needs one; an even-splitting stack
    # interleaves only where the layers divide pp * vpp.
    assert np.all(c.pp * c.vpp <= model.layers)
    even = search(model, A100, Job(stack="reference"), 128).evaluation.candidates
    assert np.all((even.vpp == 1) | (model.layers % (even.pp * even.vpp) == 0))
    fits = ev.fits
    assert r.feasible == fits.sum() and np.all(fits[: r.feasible]) and not np.any(fits[r.feasible:])
    # Ranked by memory tier (under the plan's safe line, fitting above it, tight: Evaluation.tier,
    # planner.core.evaluate.fit_lines), then by time within each tier (ties within 0.1%).
    tier = ev.tier[: r.feasible]
    assert np.all(np.diff(tier) >= 0)
    t = ev.train_seconds[: r.feasible]
    same = tier[1:] == tier[:-1]
    assert np.all(np.diff(t)[same] >= -1e-3 * t[:-1][same])


def test_pins_are_kept():
    model = get_preset("llama-13b")
    p = plan(model, A100, Job(stack="megatron-core"), 64, Pins(tp=4, pp=2, zero_stage=1, recompute="full"))
    lay = p.best.layout
    assert (lay.tp, lay.pp, lay.zero_stage, lay.recompute, lay.dp) == (4, 2, 1, "full", 8)
    for e in p.runners_up:
        assert (e.layout.tp, e.layout.pp) == (4, 2)


def test_a_fully_pinned_layout_is_a_search_of_one():
    model = get_preset("llama-7b")
    pins = Pins(dp=4, tp=2, pp=1, vpp=1, micro_batch=2, zero_stage=0, recompute="none", sequence_parallel=True,
                schedule="1f1b")
    r = search(model, A100, Job(global_batch=64), 8, pins)
    assert r.evaluated == 1


def test_pinned_layout_that_does_not_fit_reports_the_nearest_that_does():
    model = get_preset("llama-33b")
    p = plan(model, A100, Job(), 128, Pins(tp=1, pp=1, zero_stage=0, recompute="none", micro_batch=8))
    assert not p.fits and p.best.memory.total_bytes > p.best.memory.capacity_bytes
    assert p.nearest_fit is not None and p.nearest_fit.fits
    assert any(w.startswith("does not fit") for w in p.best.warnings)


@pytest.mark.parametrize("preset, stack, pins, gpus, message", [
    # 3 does not divide 52 heads; of 128's divisors 1, 2 and 4 divide 52
    ("llama-33b", "reference", Pins(tp=3), 128, "tp=3: must divide heads=52 and kv_heads=52; valid on 128 GPUs: 1, 2, 4"),
    ("llama-33b", "reference", Pins(dp=4, tp=2, pp=2), 32,
     ("dp*tp*pp=16: must equal gpus=32 (dp=4 tp=2 pp=2; context parallel 2 does not split seq_len=2048 into "
      "chunks of at least 4096 tokens)")),
    ("llama-33b", "reference", Pins(dp=4, tp=2, pp=2, cp=1), 32,
     "dp*tp*pp*cp=16: must equal gpus: dp=4 tp=2 pp=2 cp=1 gpus=32"),
    ("llama-33b", "reference", Pins(pp=7), 128, "pp=7: must divide gpus=128"),
    ("llama-33b", "reference", Pins(pp=64), 128, "pp=64: at most layers=60"),
    # the reference trainer splits evenly: 60 layers in 16 virtual stages do not
    ("llama-33b", "reference", Pins(pp=4, vpp=4), 128,
     "vpp=4: layers=60 must divide by pp*vpp=16 (this stack splits evenly)"),
    ("llama-33b", "fsdp2", Pins(pp=32, vpp=4), 128,
     "vpp=4: pp*vpp=128 virtual stages need at least as many layers (60)"),
    ("llama-33b", "fsdp2", Pins(vpp=2, pp=1), 128, "vpp=2: interleaving (vpp > 1) needs pp > 1"),
    ("llama-33b", "fsdp2", Pins(cp=3), 96, "cp=3: seq_len=2048 must divide into 2*cp=6 load-balanced chunks"),
    ("llama-33b", "fsdp2", Pins(ep=2), 128, "ep=2: 1: llama-33b is a dense model (expert parallel needs experts)"),
    ("mixtral-8x7b", "fsdp2", Pins(ep=16), 128, "ep=16: must divide experts=8"),
    ("mixtral-8x7b", "fsdp2", Pins(ep=8), 12, "ep=8: must divide gpus=12 (it is carved out of dp*cp)"),
    ("mixtral-8x7b", "fsdp2", Pins(ep=8, dp=4, cp=1), 128,
     "ep=8: must divide dp*cp=4 (expert parallel is carved out of those ranks)"),
    ("llama-33b", "fsdp2", Pins(sharding="hybrid", zero_stage=0), 128,
     "sharding='hybrid': hybrid sharding shards ZeRO states: it needs zero_stage >= 1 (pinned 0)"),
    ("mixtral-8x7b", "fsdp2", Pins(sharding="hybrid", ep=2), 128,
     "sharding='hybrid': hybrid sharding is not combined with expert parallel here (pinned ep=2)"),
    ("llama-7b", "fsdp2", Pins(), 0, "gpus=0: an integer from 1 to 1,000,000"),
])
def test_invalid_pins_name_the_constraint(preset, stack, pins, gpus, message):
    """Each rule's message (built only when the rule fails) names the field, the value and what
    is allowed, with the numbers of this model and GPU count."""
    with pytest.raises(PlannerError) as err:
        search(get_preset(preset), A100, Job(stack=stack), gpus, pins)
    assert str(err.value) == message


def test_uneven_interleaving_where_the_stack_splits_unevenly():
    """torchtitan places pipeline split points at any layer: 60 layers in 16 virtual stages run."""
    r = search(get_preset("llama-33b"), A100, Job(stack="fsdp2"), 128, Pins(pp=4, vpp=4))
    assert r.evaluated > 0 and np.all(r.evaluation.candidates.vpp == 4)


def test_global_batch_not_divisible_by_dp_times_micro_batch():
    with pytest.raises(PlannerError) as err:
        search(get_preset("llama-7b"), A100, Job(global_batch=100), 8, Pins(dp=8, micro_batch=4))
    assert err.value.field == "global_batch"


def test_bf16_on_v100_is_refused_with_the_alternatives():
    with pytest.raises(PlannerError) as err:
        search(get_preset("llama-7b"), get_profile("v100-32g"), Job(precision="bf16"), 8)
    assert "fp16" in str(err.value)


def test_fp8_runs_faster_than_bf16_on_h100():
    model = get_preset("llama3-70b")
    h100 = get_profile("h100-80g")
    bf16 = plan(model, h100, Job(precision="bf16"), 256).best
    fp8 = plan(model, h100, Job(precision="fp8"), 256).best
    assert fp8.time.step_s < bf16.time.step_s


@pytest.mark.parametrize("rows", [1, 2, 100, 5000, 70000])
def test_rank_sort_orders_rows_as_numpy_lexsort(rows):
    """The ranking's sort (the last two keys sorted, rows tied on both ordered by the others) gives
    np.lexsort's order: ties in every key in table order, -0.0 equal to 0.0, NaN last (NaNs tied)."""
    from planner.core.search import lexsort

    rng = np.random.default_rng(rows)
    for _ in range(20):
        keys = tuple(rng.integers(0, rng.integers(2, 60), rows) * rng.choice([1.0, -1e-300, 1e17])
                     for _ in range(rng.integers(1, 5)))
        for key in keys:
            key[rng.random(rows) < rng.choice([0.0, 0.05, 0.5])] = np.nan
        assert np.array_equal(lexsort(keys), np.lexsort(keys))
        ints = tuple(rng.integers(-3, 3, rows) for _ in range(rng.integers(1, 5)))
        assert np.array_equal(lexsort(ints), np.lexsort(ints))
    key = np.round(rng.random(rows), 2)  # ties
    key[::7] = np.nan
    assert np.array_equal(lexsort((key,)), np.argsort(key, kind="stable"))


@pytest.mark.parametrize("rows", [255, 256, 3000])
def test_rank_sort_by_digits_orders_any_float_or_int_key(rows):
    """From RADIX_MIN_ROWS rows the sort goes by 16-bit digits of each key's bits: full-width floats
    of both signs (every bit varies), infinities, NaN of either sign, -0.0 beside 0.0, int64 over
    their whole range, keys of one value, and a key of another dtype (int32, bool: numpy's own
    sort) beside them: np.lexsort's order in each."""
    from planner.core.search import RADIX_MIN_ROWS, _sort_bits, lexsort

    assert RADIX_MIN_ROWS == 256
    rng = np.random.default_rng(rows)
    special = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308])

    def key(kind: int) -> np.ndarray:
        if kind == 0:  # every bit varies
            return rng.normal(size=rows) * 10.0 ** rng.integers(-300, 300, rows)
        if kind == 1:
            return rng.choice(np.concatenate([special, rng.normal(size=5)]), rows)
        if kind == 2:
            return rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, rows, dtype=np.int64)
        if kind == 3:
            return np.full(rows, 3.5)  # one value: no digit varies
        if kind == 4:
            return rng.integers(-2, 2, rows).astype(np.int32)
        return rng.random(rows) < 0.5

    for _ in range(30):
        keys = tuple(key(int(k)) for k in rng.integers(0, 6, rng.integers(1, 4)))
        assert np.array_equal(lexsort(keys), np.lexsort(keys))
    x = rng.choice(special, rows)
    assert np.array_equal(np.argsort(_sort_bits(x), kind="stable"), np.argsort(x, kind="stable"))
