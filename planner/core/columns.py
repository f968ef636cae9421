"""What the formulas share to work on a table of layouts and on one layout alike.

The formulas (memory, step time, communication, pipeline) take their layouts as columns: numpy
arrays of one value per layout. One layout (a pinned estimate: ``Candidates.one_row``) is
evaluated with its columns as numpy scalars instead, through the same formulas: numpy's
arithmetic on a scalar costs 30-60 ns where on a one-element array it costs 0.5-0.8 us, and a
pinned estimate is about a thousand such operations. Scalars follow the same IEEE float64 and
int64 arithmetic as array elements, so each number is the one the table gives that row
(tests/test_search_paths.py checks rows of a spread of searches to the bit).

``where`` is ``np.where`` with the scalar case taken the short way (np.where costs 1.5 us on any
input).
"""

from __future__ import annotations

import numpy as np

_BOOLS = (bool, np.bool_)
_FLOATS = (float, np.float64)
_INTS = (int, np.int64)


def where(cond, a, b):
    """``np.where(cond, a, b)``. For a scalar condition and scalar branches, the chosen branch as
    np.where gives it: float64 when either branch is a float, else int64 (two ints) or bool."""
    if type(cond) in _BOOLS:
        ta, tb = type(a), type(b)
        if ta in _FLOATS or tb in _FLOATS:
            if (ta in _FLOATS or ta in _INTS) and (tb in _FLOATS or tb in _INTS):
                return np.float64(a if cond else b)
        elif ta in _INTS and tb in _INTS:
            return np.int64(a if cond else b)
        elif ta in _BOOLS and tb in _BOOLS:
            return np.bool_(a if cond else b)
    return np.where(cond, a, b)


def any_(x) -> bool:
    """``bool(np.any(x))``, a scalar read directly (np.any costs 2-4 us on any input)."""
    return bool(x) if type(x) in _BOOLS else bool(np.any(x))
