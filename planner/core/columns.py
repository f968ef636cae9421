"""What the formulas share to work on a table of layouts and on one layout alike.

The formulas (memory, step time, communication, pipeline) take their layouts as columns: numpy
arrays of one value per layout. One layout (a pinned estimate: ``Candidates.one_row``) is
evaluated with its columns as numpy scalars instead, through the same formulas: numpy's
arithmetic on a scalar costs 30-60 ns where on a one-element array it costs 0.5-0.8 us, and a
pinned estimate is about a thousand such operations. Scalars follow the same IEEE float64 and
int64 arithmetic as array elements, so each number is the one the table gives that row
(tests/test_search_paths.py checks rows of a spread of searches to the bit).

``where``, ``maximum``, ``minimum`` and ``select`` are numpy's, with the scalar case taken the
short way: on scalars np.where costs 1.5 us, np.maximum 0.5 us, np.select 11 us. ``as_float``,
``as_array`` and ``ones_like`` are numpy's too, keeping a scalar a numpy scalar: a 0-d array
would cost an array's 0.5-1 us in every operation after it.
"""

from __future__ import annotations

from math import isnan

import numpy as np

_BOOLS = (bool, np.bool_)
_FLOATS = (float, np.float64)
_INTS = (int, np.int64)
_NUMPY = (np.float64, np.int64)


def where(cond, a, b):
    """``np.where(cond, a, b)``. For a scalar condition and scalar branches, the chosen branch as
    np.where gives it: float64 when either branch is a float, else int64 (two ints) or bool."""
    if type(cond) in _BOOLS:
        ta, tb = type(a), type(b)
        kind = _scalar_kind(ta, tb)
        if kind is not None:
            return kind(a if cond else b)
        if ta in _BOOLS and tb in _BOOLS:
            return np.bool_(a if cond else b)
    return np.where(cond, a, b)


def as_float(x):
    """``np.asarray(x, dtype=float)``; a scalar (numpy's or Python's int or float) as np.float64."""
    t = type(x)
    if t in _FLOATS or t in _INTS:
        return np.float64(x)
    return np.asarray(x, dtype=float)


def as_array(x):
    """``np.asarray(x)``; a numpy scalar as it is, a Python int or float as numpy's scalar of the
    dtype np.asarray would give it (int64, float64)."""
    t = type(x)
    if t in _NUMPY:
        return x
    if t is int:
        return np.int64(x)
    if t is float:
        return np.float64(x)
    return np.asarray(x)


def ones_like(x):
    """``np.ones_like(x)``; for a numpy scalar, one of its type."""
    return type(x)(1) if type(x) in _NUMPY else np.ones_like(x)


_SCALARS = (*_BOOLS, *_FLOATS, *_INTS)


def any_(x) -> bool:
    """``bool(np.any(x))``, a scalar read directly (np.any costs 2-4 us on any input; a NaN is
    true to both)."""
    return bool(x) if type(x) in _SCALARS else bool(np.any(x))


def all_(x) -> bool:
    """``bool(np.all(x))``, a scalar read directly."""
    return bool(x) if type(x) in _SCALARS else bool(np.all(x))


def _scalar_kind(ta, tb):
    """np.float64 or np.int64: the dtype numpy gives a binary operation on two scalars of types
    ``ta`` and ``tb`` (numpy's or Python's float and int); None for any other pair (arrays, bools)."""
    if ta in _FLOATS:
        return np.float64 if tb in _FLOATS or tb in _INTS else None
    if ta in _INTS:
        return np.float64 if tb in _FLOATS else np.int64 if tb in _INTS else None
    return None


def maximum(a, b):
    """``np.maximum(a, b)``; two scalars compared as numpy's scalar loop does (a NaN wins)."""
    ta = type(a)
    if ta is type(b) and ta in _NUMPY:  # the common case: two of one numpy type
        return a if a > b or isnan(a) else b
    kind = _scalar_kind(ta, type(b))
    if kind is None:
        return np.maximum(a, b)
    return kind(a if a > b or isnan(a) else b)


def minimum(a, b):
    """``np.minimum(a, b)``; two scalars compared as numpy's scalar loop does (a NaN wins)."""
    ta = type(a)
    if ta is type(b) and ta in _NUMPY:
        return a if a < b or isnan(a) else b
    kind = _scalar_kind(ta, type(b))
    if kind is None:
        return np.minimum(a, b)
    return kind(a if a < b or isnan(a) else b)


def select(conditions: list, choices: list, default):
    """``np.select(conditions, choices, default)``; for scalar conditions and float choices, the
    first chosen (float64, as np.select gives it)."""
    if all(type(x) in _BOOLS for x in conditions) and all(type(x) in _FLOATS for x in (*choices, default)):
        for cond, choice in zip(conditions, choices):
            if cond:
                return np.float64(choice)
        return np.float64(default)
    return np.select(conditions, choices, default)
