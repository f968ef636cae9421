"""What the formulas share to work on a table of layouts and on one layout alike.

The formulas (memory, step time, communication, pipeline) take their layouts as columns: numpy
arrays of one value per layout. One layout (a pinned estimate: ``Candidates.one_row``) is
evaluated with its columns as Python scalars instead (int, float, bool), through the same
formulas: Python's arithmetic on a float costs 20-30 ns, numpy's on a scalar 50-200 ns (an int64
times a float64: 200 ns) and on a one-element array 0.5-0.8 us, and a pinned estimate is about a
thousand such operations. Python's float is an IEEE float64 and its int an exact integer, so
each number is the one the table gives that row (+, -, *, / and // round alike; transcendental
functions stay numpy's: ``np.log`` of a Python float is numpy's log), which
tests/test_search_paths.py checks to the bit on rows of a spread of searches.

``where``, ``maximum``, ``minimum``, ``select``, ``not_``, ``floor`` and ``ceil_log2`` are numpy's,
with the scalar case taken the short way and giving Python's types (float when either branch is a
float, int for two ints, bool): on scalars np.where costs 1.5 us, np.maximum 0.5 us, np.select
11 us. ``as_float``, ``as_int``, ``as_array`` and ``ones_like`` are numpy's too, keeping a scalar a
Python scalar: a 0-d array would cost an array's 0.5-1 us in every operation after it. ``~`` on a
Python bool is an integer's complement (-2): formulas that may see one layout write ``not_(x)``.
"""

from __future__ import annotations

import math
from math import isnan

import numpy as np

_BOOLS = (bool, np.bool_)
_FLOATS = (float, np.float64)
_INTS = (int, np.int64)
_SCALARS = (*_BOOLS, *_FLOATS, *_INTS)


def where(cond, a, b):
    """``np.where(cond, a, b)``. For a scalar condition and scalar branches, the chosen branch as
    a Python scalar of np.where's kind: float when either branch is a float, else int when either
    is an int, else bool."""
    if cond is True or cond is False:  # the usual case: one layout's Python bool, two numbers of one type
        ta = type(a)
        if ta is type(b) and (ta is float or ta is int):
            return a if cond else b
    if type(cond) in _BOOLS:
        ta, tb = type(a), type(b)
        if ta is float or ta is int:  # the common cases: Python's numbers
            if ta is tb:
                return a if cond else b
            if tb is float or tb is int:
                return float(a if cond else b)
        kind = _scalar_kind(ta, tb)
        if kind is not None:
            return kind(a if cond else b)
    return np.where(cond, a, b)


def not_(x):
    """``~x`` of a boolean column; ``not x`` of one layout's bool (``~True`` is -2 in Python)."""
    return (not x) if type(x) in _BOOLS else ~x


def as_float(x):
    """``np.asarray(x, dtype=float)``; a scalar (numpy's or Python's int or float) as a float."""
    t = type(x)
    if t in _FLOATS or t in _INTS or t in _BOOLS:
        return float(x)
    return np.asarray(x, dtype=float)


def as_int(x):
    """``np.asarray(x).astype(np.int64)`` (truncating); a scalar as an int."""
    t = type(x)
    if t in _FLOATS or t in _INTS or t in _BOOLS:
        return int(x)
    return np.asarray(x).astype(np.int64)


def as_array(x):
    """``np.asarray(x)``; a scalar as a Python int, float or bool (numpy's as its Python value)."""
    t = type(x)
    if t is int or t is float or t is bool:
        return x
    if t in _SCALARS:
        return x.item()
    return np.asarray(x)


def ones_like(x):
    """``np.ones_like(x)``; for a scalar, one of its type."""
    t = type(x)
    return t(1) if t is int or t is float else np.ones_like(x)


def floor(x):
    """``np.floor(x)``; of a Python number, a Python float (numpy's would make every operation
    after it a numpy scalar's): the same value, a zero's sign, infinity and NaN kept."""
    x = as_array(x)  # numpy's scalars as Python's
    t = type(x)
    if t is float:
        return float(math.floor(x)) if x != 0 and math.isfinite(x) else x
    if t is int:
        return x  # numpy's floor of an integer is that integer
    return np.floor(x)


def ceil_log2(x):
    """``np.ceil(np.log2(x))``; of a positive Python number, by ``math``, as a Python float: the same
    number (log2 is exact at a power of two, and a count's log2 is far from any integer elsewhere;
    a log2 in (-1, 0) rounds up to -0.0, as numpy's)."""
    x = as_array(x)  # numpy's scalars as Python's
    t = type(x)
    if t is float or t is int:
        if not (x > 0 and x != math.inf):  # zero, negative, infinite, NaN: numpy's answer
            return float(np.ceil(np.log2(x)))
        v = math.log2(x)
        up = float(math.ceil(v))
        return -0.0 if up == 0 and v < 0 else up
    return np.ceil(np.log2(x))


def any_(x) -> bool:
    """``bool(np.any(x))``, a scalar read directly (np.any costs 2-4 us on any input; a NaN is
    true to both)."""
    return bool(x) if type(x) in _SCALARS else bool(np.any(x))


def all_(x) -> bool:
    """``bool(np.all(x))``, a scalar read directly."""
    return bool(x) if type(x) in _SCALARS else bool(np.all(x))


# Each scalar type's rank in numpy's promotion of two scalars: bool < int < float.
_KIND = {bool: 0, np.bool_: 0, int: 1, np.int64: 1, float: 2, np.float64: 2}
_KINDS = (bool, int, float)


def _scalar_kind(ta, tb):
    """bool, int or float: the kind numpy gives a binary operation on two scalars of types ``ta``
    and ``tb`` (numpy's or Python's bool, int and float), as Python's type; None for any other pair
    (an array)."""
    ka, kb = _KIND.get(ta), _KIND.get(tb)
    if ka is None or kb is None:
        return None
    return _KINDS[ka if ka > kb else kb]


def maximum(a, b):
    """``np.maximum(a, b)``; two scalars compared as numpy's scalar loop does (a NaN wins)."""
    ta, tb = type(a), type(b)
    if ta is float or ta is int:  # the common cases: Python's numbers (``a != a``: a NaN)
        if ta is tb:
            return a if a > b or a != a else b
        if tb is float or tb is int:
            return float(a if a > b or a != a else b)
    kind = _scalar_kind(ta, tb)
    if kind is None:
        return np.maximum(a, b)
    return kind(a if a > b or isnan(a) else b)


def minimum(a, b):
    """``np.minimum(a, b)``; two scalars compared as numpy's scalar loop does (a NaN wins)."""
    ta, tb = type(a), type(b)
    if ta is float or ta is int:
        if ta is tb:
            return a if a < b or a != a else b
        if tb is float or tb is int:
            return float(a if a < b or a != a else b)
    kind = _scalar_kind(ta, tb)
    if kind is None:
        return np.minimum(a, b)
    return kind(a if a < b or isnan(a) else b)


def select(conditions: list, choices: list, default):
    """``np.select(conditions, choices, default)``; for scalar conditions and float choices, the
    first chosen (a float, as np.select gives float64); for columns, nested ``np.where`` (the same
    values and dtype in a third of np.select's time on a few thousand rows)."""
    if all(type(x) in _BOOLS for x in conditions) and all(type(x) in _FLOATS for x in (*choices, default)):
        for cond, choice in zip(conditions, choices):
            if cond:
                return float(choice)
        return float(default)
    out = np.asarray(default)
    for cond, choice in zip(conditions[::-1], choices[::-1]):  # the first condition that holds chosen last
        out = np.where(cond, choice, out)
    return out
