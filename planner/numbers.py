"""Strict number parsing for every command-line flag typed ``int`` or ``float``.

Python's ``int()`` and ``float()`` read ``1_0`` as 10, Arabic-Indic digits as decimals, and
``1e400`` as infinity; a flag must not. ``strict(parser)`` registers these parsers for the types
``int`` and ``float`` in the parser's registry (argparse looks a flag's ``type`` up there first),
so each ``add_argument(..., type=int)`` of the parser and of its subparsers and groups is strict,
and argparse's one-line "invalid int value" error still names the flag and the value.
"""

from __future__ import annotations

import argparse
import math
import re

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NAMED = ("inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan")  # said on purpose: kept


def strict_int(text: str) -> int:
    """ASCII digits with an optional sign; nothing else."""
    if not _INT.fullmatch(text.strip()):
        raise ValueError(text)
    return int(text)


def strict_float(text: str) -> float:
    """A decimal number (ASCII digits, optional exponent) that a float holds, or inf/nan written
    as such (a flag's own range check decides whether it may be infinite)."""
    t = text.strip()
    if t.lower() in _NAMED:
        return float(t)
    if not _FLOAT.fullmatch(t):
        raise ValueError(text)
    value = float(t)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} overflows a float (at most 1.8e308; write inf for infinity)")
    return value


strict_int.__name__, strict_float.__name__ = "int", "float"  # argparse's message: "invalid int value"


def strict(parser: argparse.ArgumentParser) -> None:
    parser.register("type", int, strict_int)
    parser.register("type", float, strict_float)
