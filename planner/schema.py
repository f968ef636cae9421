"""One validation layer for every number that enters: data-file tables and command-line flags.

A ``Key`` declares one value: its type, its range (documented here, shown in every error), the
factor that converts the file's unit to SI base units, and whether it is required.
``check_table(table, spec, where)`` checks a parsed TOML table against a spec and returns the
converted values; ``check_flags(values, spec)`` checks parsed command-line flags against a spec
(every flag's: ``planner.core.limits.FLAGS``, this module's ``FLAGS`` plus the declared options').
Errors are one ``PlannerError`` line naming where (file and key, or flag), the value and what is
allowed. Nothing here imports more than the standard library (CLI start-up stays fast).

Why not pydantic: measured on this machine, ``import pydantic`` plus one model adds ~70 ms to a
~90 ms interpreter start (``planner estimate`` takes ~300 ms in all); msgspec would be a new
dependency. The checks below are the few dozen lines those libraries would replace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError

REQUIRED: Any = object()  # the default of a required key

# Documented upper bounds (docs/cli.md, "Limits"). Far above any real job; they keep the arithmetic
# finite and exact (float64 and int64) and every loop short.
MAX_GPUS = 10**6
MAX_PARAMS = 1e15
MAX_TOKENS = 1e16
MAX_USD = 1e15


@dataclass(frozen=True, slots=True)
class Key:
    """One value: ``kind`` is int, float, str, bool, list (of str) or dict (a free-form table).

    Numbers must lie in [lo, hi] (``lo_open``/``hi_open`` exclude the ends); ``inf_ok`` admits
    +inf (e.g. an MTBF of inf: no failures). ``scale`` converts the file's unit to SI base units.
    """

    kind: type = float
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    unit: str = ""
    scale: float = 1.0
    default: Any = REQUIRED
    help: str = ""
    inf_ok: bool = False
    zero_ok: bool = False  # 0 also allowed below ``lo`` (a peak of 0: precision not supported)

    def allowed(self) -> str:
        """'a number in (0, 1]', 'an integer from 1 to 1024', 'a number >= 0 (USD)', 'text'."""
        if self.kind is str:
            return "text"
        if self.kind is bool:
            return "true or false"
        if self.kind is list:
            return "a list of text"
        if self.kind is dict:
            return "a table"
        what = "an integer" if self.kind is int else "a number"
        unit = f" ({self.unit})" if self.unit else ""
        inf = " or inf" if self.inf_ok else ""
        lo, hi = _fmt(self.lo), _fmt(self.hi)
        if self.zero_ok:
            what = "0 or " + what
        if self.lo is not None and self.hi is not None:
            if self.kind is int and not self.lo_open and not self.hi_open:
                return f"{what} from {lo} to {hi}{unit}{inf}"
            return f"{what} in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}{unit}{inf}"
        if self.lo is not None:
            return f"{what} {'>' if self.lo_open else '>='} {lo}{unit}{inf}"
        if self.hi is not None:
            return f"{what} {'<' if self.hi_open else '<='} {hi}{unit}"
        return f"a finite {what[2:] if what.startswith('a ') else what[3:]}{unit}{inf}"


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    if float(x).is_integer() and abs(x) < 1e10:
        return f"{int(x):,}"
    return f"{x:g}"


def check_value(value: Any, key: Key, field: str) -> Any:
    """``value`` checked against ``key`` and converted to base units (numbers times ``scale``)."""
    if key.kind is str:
        if not isinstance(value, str):
            raise PlannerError(field, value, key.allowed())
        return value
    if key.kind is bool:
        if not isinstance(value, bool):
            raise PlannerError(field, value, key.allowed())
        return value
    if key.kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PlannerError(field, value, key.allowed())
        return value
    if key.kind is dict:
        if not isinstance(value, dict):
            raise PlannerError(field, value, key.allowed())
        return value
    return check_number(value, key, field) * key.scale if key.scale != 1.0 else check_number(value, key, field)


def check_number(value: Any, key: Key, field: str) -> float | int:
    """A finite int or float in the key's range (bool and text refused; 2.0 accepted as an integer)."""
    if type(value) is not int:  # (a plain int, the usual flag, goes straight to its range)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PlannerError(field, value, key.allowed())
        if isinstance(value, float):
            if math.isnan(value) or (math.isinf(value) and not (key.inf_ok and value > 0)):
                raise PlannerError(field, value, key.allowed())
            if key.kind is int:
                if not value.is_integer():
                    raise PlannerError(field, value, key.allowed())
                value = int(value)
        if isinstance(value, float) and math.isinf(value):
            return value  # (an int is never infinite; a huge one fails the range check below)
    if key.zero_ok and value == 0:
        return value
    lo_bad = key.lo is not None and (value <= key.lo if key.lo_open else value < key.lo)
    hi_bad = key.hi is not None and (value >= key.hi if key.hi_open else value > key.hi)
    if lo_bad or hi_bad:
        raise PlannerError(field, value, key.allowed())
    return value


def check_table(table: Mapping[str, Any], spec: Mapping[str, Key], where: str) -> dict[str, Any]:
    """Every key of ``table`` checked against ``spec``; returns {key: converted value}, defaults
    (already in base units) filled in. Unknown keys are named with the allowed ones; a missing
    required key is named with what it should hold. ``where`` prefixes every error ('file [gpu]')."""
    if not isinstance(table, Mapping):
        raise PlannerError(where, table, "a table of keys")
    unknown = [k for k in table if k not in spec]
    if unknown:
        raise PlannerError(f"{where} {unknown[0]}", table[unknown[0]],
                           f"unknown key; allowed: {', '.join(sorted(spec))}")
    out: dict[str, Any] = {}
    for name, key in spec.items():
        if name in table:
            out[name] = check_value(table[name], key, f"{where} {name}")
        elif key.default is REQUIRED:
            raise PlannerError(f"{where} {name}", "missing", f"required: {key.allowed()}"
                                                             + (f", {key.help}" if key.help else ""))
        else:
            out[name] = key.default
    return out


def check_csv_row(row: Mapping[str, Any], spec: Mapping[str, Key], where: str) -> dict[str, Any]:
    """The ``spec`` columns of one CSV row (text) parsed as numbers and checked; other columns are
    left out. ``where`` names the file and the row ('table.csv row 3')."""
    out: dict[str, Any] = {}
    for name, key in spec.items():
        text = row.get(name)
        if text is None or not str(text).strip():
            raise PlannerError(f"{where} {name}", text or "", f"required: {key.allowed()}")
        try:
            value: Any = float(str(text).strip()) if key.kind in (int, float) else text
        except ValueError:
            raise PlannerError(f"{where} {name}", text, key.allowed()) from None
        out[name] = check_value(value, key, f"{where} {name}")
    return out


# --- command-line flags -------------------------------------------------------------------
# argparse dest -> range, for the flags that are no declared option: the declared job options,
# operations options and layout dimensions carry their ranges in their declarations, and
# planner.core.limits.FLAGS joins the two (this base module cannot see them). A flag in neither
# still gets the generic check: a float must be finite, an int must fit in int64's exact float
# range (|n| <= 2**53).

FLAGS: dict[str, Key] = {
    "gpus": Key(int, 1, MAX_GPUS, help="GPUs"),
    "max_gpus": Key(int, 1, MAX_GPUS),
    "gpus_per_node": Key(int, 1, 1024),
    # operations options declared without explorer bounds (planner.core.options.OpsOptions)
    "checkpoint_interval": Key(int, 1, 10**9, unit="steps"),
    "token_bytes": Key(int, 1, 8, unit="bytes"),
    "layers": Key(int, 1, 10**4), "hidden": Key(int, 1, 2**18), "heads": Key(int, 1, 2**14),
    "kv_heads": Key(int, 1, 2**14), "ffn_hidden": Key(int, 1, 2**20), "vocab": Key(int, 1, 2**24),
    "seq_len": Key(int, 1, 2**22, unit="tokens"),
    "mtp_layers": Key(int, 0, 16, unit="modules"),
    "top": Key(int, 0, 10**6),
    "steps": Key(int, 1, 10**12),
    "nprocs": Key(int, 1, 1024),
    "port": Key(int, 1, 65535),
    "timeout": Key(float, 0, 1e7, lo_open=True, unit="seconds"),
    # hardware overrides (planner.core.options.HW_OVERRIDES): the profile files' ranges, in the flags' units
    "gpu_tflops": Key(float, 1e-4, 1e6, unit="TFLOP/s dense"),
    "gpu_memory_gib": Key(float, 1e-3, 1e5, unit="GiB"),
    "hbm_gbps": Key(float, 1e-2, 1e6, unit="GB/s"),
    "intra_node_gbps": Key(float, 1e-3, 1e6, unit="GB/s per GPU per direction"),
    "inter_node_gbps": Key(float, 1e-3, 1e6, unit="GB/s per GPU per direction"),
}
# Flags written as counts ('33B', '1T'), parsed by units.parse_count: their upper bounds.
COUNT_FLAGS: dict[str, tuple[float, float]] = {"params": (1e3, MAX_PARAMS), "tokens": (1, MAX_TOKENS)}


def check_flags(values: Mapping[str, Any], spec: Mapping[str, Key] = FLAGS) -> None:
    """Parsed command-line flags (``vars(args)``) against ``spec`` (every flag's range:
    planner.core.limits.FLAGS); raises on the first bad one, naming the field as the rest of the
    planner does (the flag's destination: ``max_gpus``)."""
    from planner.units import parse_count

    for dest, value in values.items():
        flag = dest
        if value is None or isinstance(value, (bool, str)) and dest not in COUNT_FLAGS:
            continue
        if dest in COUNT_FLAGS:
            parse_count(value, flag, lo=COUNT_FLAGS[dest][0], hi=COUNT_FLAGS[dest][1])
        elif dest in spec:
            if isinstance(value, list):  # argparse hands over [] for `--flag=--`
                raise PlannerError(flag, value, spec[dest].allowed())
            check_number(value, spec[dest], flag)
        elif isinstance(value, float) and not math.isfinite(value):
            raise PlannerError(flag, value, "a finite number")
        elif isinstance(value, int) and abs(value) > 2**53:
            raise PlannerError(flag, value, f"an integer of at most {2**53:,}")



def limits_markdown(spec: Mapping[str, Key]) -> str:
    """A markdown table of ``spec``'s numeric keys and their ranges (keys sharing a range share a
    row): docs/cli.md's "Limits" tables are this output (docs/cli_reference.py), tested stale."""
    rows: dict[str, list[str]] = {}
    for name, key in spec.items():
        if key.kind in (int, float):
            rows.setdefault(key.allowed(), []).append(f"`{name}`")
    lines = ["| keys | allowed |", "| --- | --- |"]
    lines += [f"| {', '.join(names)} | {allowed} |" for allowed, names in rows.items()]
    return "\n".join(lines)
