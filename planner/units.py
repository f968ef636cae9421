"""Parsing and formatting of quantities. Inside the planner everything is SI base units.

GB means 1e9 bytes and GiB means 2**30 bytes; the two are never mixed silently.
"""

from __future__ import annotations

import math
import re

from planner.errors import PlannerError

GIB = 2**30
GB = 10**9
TERA = 10**12

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGTP]?)\s*$", re.IGNORECASE)


def parse_count(text: str | float, field: str, hi: float = math.inf, lo: float = 0.0) -> float:
    """'33B' -> 3.3e10, '1T' -> 1e12, '4M' -> 4e6, '2e9' -> 2e9. Finite, greater than zero, at
    least ``lo`` and at most ``hi``."""
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise PlannerError(field, text, "a positive number with an optional K/M/B/T suffix, e.g. 33B, 1T, 4M")
    if isinstance(text, (int, float)):
        value = float(text) if abs(text) < 1e308 else math.inf
    else:
        match = _NUMBER.match(text)
        if not match:
            raise PlannerError(field, text, "a positive number with an optional K/M/B/T suffix, e.g. 33B, 1T, 4M")
        value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    bound = f"at most {hi:g}" if math.isfinite(hi) else "finite"
    if not (0 < value <= hi and value >= lo) or math.isinf(value):
        least = f"at least {lo:g}" if lo > 0 else "greater than zero"
        raise PlannerError(field, text, f"{least} and {bound}")
    return value


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d|w)?\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


MAX_DURATION_S = 1000 * 365 * 86400.0  # a thousand years: the documented upper bound


def parse_duration(text: str, field: str) -> float:
    """'30d' -> seconds, '12h', '90min', '3600s' or a bare number of days; at most 1000 years."""
    match = _DURATION.match(str(text))
    if not match:
        raise PlannerError(field, text, "a duration like 30d, 12h, 90min or 3600s")
    unit = (match.group(2) or "d").lower()
    value = float(match.group(1)) * _SECONDS[unit]
    if not 0 < value <= MAX_DURATION_S:
        raise PlannerError(field, text, "greater than zero and at most 1000 years (365000d)")
    return value


def fmt_count(value: float) -> str:
    """3.25e10 -> '32.5B' (for parameters and tokens)."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def fmt_params(value: float) -> str:
    """A parameter count to two decimals in its own scale: '32.53B', '124.44M', '9.47K', '512'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}"


def fmt_bytes(value: float) -> str:
    """Storage and transfer sizes in decimal units (KB, MB, GB, TB), as disks and links are sold.
    GPU memory is written in GiB where it is shown."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


YEAR_S = 365.25 * 86400  # a Julian year


def fmt_seconds(value: float) -> str:
    """A duration as a person reads it: '850 ms', '42.0 s', '12 min', '5.3 h' under a day, '65.3
    days' under a year, '1.4 years' and '35,847 years' above, thousands separated. Not finite: 'never'."""
    if not math.isfinite(value):
        return "never"
    if value >= YEAR_S:
        years = value / YEAR_S
        return f"{years:.1f} years" if years < 100 else f"{years:,.0f} years"
    if value >= 86400:
        days = value / 86400
        return f"{days:.1f} days" if days < 100 else f"{days:,.0f} days"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.0f} min"
    if value >= 1:
        return f"{value:.1f} s"
    return f"{value * 1e3:.1f} ms"


def fmt_days(days: float) -> str:
    """Days (as the planner's results hold them) in human units: fmt_seconds(days x 86400)."""
    return fmt_seconds(days * 86400)
