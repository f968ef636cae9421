"""planner.core.columns: numpy's functions with a scalar short-cut. Each must give what numpy gives
for the same inputs (dtype, value, NaN and the sign of zero), on scalars and on arrays alike; on
scalars as a Python scalar of numpy's kind (float for float64, int for int64, bool for bool): the
pinned estimate evaluates one layout as Python scalars and must equal that layout's row of a table."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from planner.core import columns

VALUES = [np.float64(1.5), np.float64(-0.0), np.float64(0.0), np.float64(np.nan), np.float64(-np.inf),
          np.int64(3), np.int64(-2), 2, 2.5, -0.0, float("nan"), True, np.bool_(False),
          np.array([1.0, np.nan, -0.0]), np.array([4, -1]), np.array(2.0)]


_PYTHON = {np.float64: float, np.int64: int, np.bool_: bool}


def same(got, want, *inputs) -> bool:
    """``got`` is ``want``: what numpy gives (an array of its dtype and values) where an input is an
    array, else the Python scalar of the kind of numpy's result, with its value (NaN and the sign of
    zero included)."""
    if np.ndim(want) == 0 and not any(type(x) is np.ndarray for x in inputs):
        want = np.asarray(want)[()]
        if type(got) is not _PYTHON[type(want)]:
            return False
        got = np.asarray(got, dtype=want.dtype)[()]
    if type(got) is not type(want) or np.shape(got) != np.shape(want):
        return False
    if np.asarray(got).dtype != np.asarray(want).dtype:
        return False
    g, w = np.asarray(got), np.asarray(want)
    if g.dtype.kind == "f":
        return bool(np.array_equal(g, w, equal_nan=True) and np.all(np.signbit(g) == np.signbit(w)))
    return bool(np.array_equal(g, w))


@pytest.mark.parametrize("ours, numpys", [(columns.maximum, np.maximum), (columns.minimum, np.minimum)])
def test_maximum_and_minimum_are_numpys(ours, numpys):
    for a, b in itertools.product(VALUES, VALUES):
        try:
            want = numpys(a, b)
        except ValueError:  # shapes that do not broadcast
            continue
        assert same(ours(a, b), want, a, b), (a, b, ours(a, b), want)


def test_where_is_numpys():
    for cond, a, b in itertools.product([True, np.bool_(False), np.array([True, False])], VALUES, VALUES):
        try:
            want = np.where(cond, a, b)
        except ValueError:
            continue
        got = columns.where(cond, a, b)
        # np.where gives a 0-d array for scalars (or a 0-d branch); the short-cut a Python scalar
        assert same(got, want, cond, a, b), (cond, a, b, got, want)


def test_select_is_numpys():
    choices = [np.float64(1.0), 2.0, np.float64(np.nan)]
    for zero in [np.int64(0), np.int64(1), np.int64(2), np.int64(3), np.array([0, 1, 2, 3])]:
        conds = [zero == 0, zero == 1, zero == 2]
        want, got = np.select(conds, choices, 4.0), columns.select(conds, choices, 4.0)
        if np.ndim(zero) == 0:
            assert type(got) is float, (zero, got)
        assert np.asarray(got).dtype == want.dtype and np.shape(got) == np.shape(want)
        assert np.array_equal(got, want, equal_nan=True), (zero, got, want)
    rng = np.random.default_rng(1)
    for _ in range(200):  # columns: overlapping conditions (the first that holds wins), scalars among them
        n = int(rng.integers(1, 50))
        conds = [rng.random(n) < 0.5 for _ in range(int(rng.integers(1, 4)))]
        kinds = [rng.random(n), float(rng.random()), np.arange(n), 7, np.full(n, np.nan)]
        choices = [kinds[int(rng.integers(len(kinds)))] for _ in conds]
        default = [rng.random(n), 0.0, 3, np.arange(n)][int(rng.integers(4))]
        want, got = np.select(conds, choices, default), columns.select(conds, choices, default)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=True), (conds, choices, default)


def test_as_float_as_array_and_ones_like_are_numpys():
    for x in [np.float64(1.5), np.int64(3), 2, 2.5, [1, 2], np.array([1, 2]), np.array(3)]:
        assert np.asarray(columns.as_float(x)).dtype == np.float64
        assert np.array_equal(columns.as_float(x), np.asarray(x, dtype=float))
        assert np.asarray(columns.as_array(x)).dtype == np.asarray(x).dtype
        assert np.array_equal(columns.as_array(x), np.asarray(x))
    for x in [1.5, 3, np.array([1, 2]), np.array([1.0])]:
        assert same(columns.ones_like(x), np.ones_like(x), x), x
    # scalars are Python scalars (a 0-d array would cost an array's time in every operation after
    # it, a numpy scalar 2-7x a Python float's)
    assert type(columns.as_float(np.int64(3))) is float and type(columns.as_array(np.int64(3))) is int
    assert type(columns.as_int(2.7)) is int and columns.as_int(2.7) == 2 and columns.as_int(-2.7) == -2
    assert np.array_equal(columns.as_int(np.array([2.7, -2.7])), np.array([2, -2]))
    assert columns.not_(True) is False and columns.not_(np.bool_(False)) is True
    assert np.array_equal(columns.not_(np.array([True, False])), [False, True])


@pytest.mark.parametrize("ours, numpys", [(columns.any_, np.any), (columns.all_, np.all)])
def test_any_and_all_are_numpys(ours, numpys):
    # scalars of every kind the formulas hold (a NaN is true, -0.0 false), and arrays
    for x in [*VALUES, np.array([0.0, -0.0]), np.array([], dtype=float), np.array([True, False])]:
        assert ours(x) is bool(numpys(x)), (x, ours(x), numpys(x))


def test_one_gemm_list_in_python_floats_is_the_tables_row():
    """gemms_time of one layout (scalars, in Python floats) gives to the bit what the array path
    gives that row, over random GEMM shapes on GPUs of different roofs; a GEMM of no size gives
    the array path's NaN."""
    from planner.core.flops import Gemm
    from planner.core.steptime import gemms_time
    from planner.hardware import get_profile

    rng = np.random.default_rng(7)
    for gpu in ("a100-80g", "h100-80g", "v100-32g"):
        hw = get_profile(gpu)
        for _ in range(200):
            dims = rng.integers(1, 1 << 17, size=(int(rng.integers(1, 8)), 4))
            scalar = [Gemm(np.int64(m), np.float64(n), int(k), np.float64(c % 64 + 1)) for m, n, k, c in dims]
            table = [Gemm(np.array([m, 5.0]), np.array([n, 7.0]), np.array([k, 9.0]), np.array([c % 64 + 1, 1.0]))
                     for m, n, k, c in dims]
            fp8, elem = bool(rng.integers(2)), int(rng.integers(1, 3))
            got = gemms_time(scalar, 1, hw, 312e12, elem, fp8)
            want = gemms_time(table, 2, hw, 312e12, elem, fp8)[0]
            assert type(got) is float and got == want, (gpu, dims, got, want)
    with np.errstate(all="ignore"):
        empty = gemms_time([Gemm(np.int64(0), np.int64(0), np.int64(8))], 1, get_profile("a100-80g"), 312e12, 2)
    assert np.isnan(empty)


# Counts and ratios the communication model takes floor and ceil(log2) of (ranks, nodes, ranks per
# node), and the edge values: zeros of both signs, fractions, infinity, NaN, numpy's scalars, arrays.
COUNTS = [1, 2, 3, 7, 8, 9, 16, 17, 1000, 1024, 16384, 2**40 + 1, 0.5, 0.75, 1.0, 1.5, 2.5, 3.0, 6.4, 100.25,
          0.0, -0.0, -0.3, -2.5, float("inf"), float("-inf"), float("nan"), np.float64(6.5), np.int64(12),
          np.array([1.0, 2.5, 8.0, 0.75]), np.array([3, 4])]


def test_floor_is_numpys():
    for x in COUNTS:
        assert same(columns.floor(x), np.floor(x), x), (x, columns.floor(x), np.floor(x))


def test_ceil_log2_is_numpys():
    with np.errstate(divide="ignore", invalid="ignore"):
        for x in COUNTS + [k / 8 for k in range(1, 80)] + list(range(1, 5000)):
            want = np.ceil(np.log2(x))
            got = columns.ceil_log2(x)
            assert same(got, want, x), (x, got, want)
