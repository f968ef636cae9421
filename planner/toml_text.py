"""TOML text from plain data, for the profiles `planner probe` and `planner calibrate` write.

tomli-w (a core dependency) where it is installed; otherwise a small writer for the shapes these
files hold (tables of strings, numbers, booleans and lists of them), so that a plain checkout run
with ``PYTHONPATH=.`` on a GPU machine that has no tomli-w (benchmarks/gpu_session.py) still
writes its profiles. Either way the text is read back and must give the same data: a name with a
quote or a newline stays one string (TOML 1.0 basic-string escapes), never a key of its own.
"""

from __future__ import annotations

import math
import re
import tomllib

from planner.errors import PlannerError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def dumps(data: dict, head: str = "") -> str:
    """``head`` (comment lines, each made one line here) and then ``data`` as TOML."""
    data = _plain(data)
    try:
        import tomli_w
    except ImportError:
        body = _dumps(data)
    else:
        body = tomli_w.dumps(data)
    if tomllib.loads(body) != data:  # a writer bug, never bad input: every value is escaped
        raise PlannerError("toml", "text", "text that reads back as the data written")
    # A comment may hold no control character (TOML 1.0): a device name's DEL becomes "?".
    clean = "".join("?" if ord(c) == 0x7F or (ord(c) < 0x20 and c not in "\n\t") else c for c in head)
    lines = [f"# {' '.join(line.split())}".rstrip() for line in clean.splitlines()]
    return "\n".join(lines) + ("\n" if lines else "") + body


def _plain(value: object) -> object:
    """Tuples as lists; strings checked for what no TOML file can hold (lone surrogates)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}  # TOML has no null
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise PlannerError("text", value, "valid Unicode text (this has an undecodable byte)")
    if isinstance(value, float) and not math.isfinite(value):
        raise PlannerError("value", value, "a finite number")
    return value


def _string(s: str) -> str:
    out = []
    for ch in s:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:  # the other control characters: \uXXXX
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _string(k)


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # shortest round-tripping form; 1e-05 and 1e+16 are TOML floats
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise PlannerError("toml", type(v).__name__, "strings, numbers, booleans, lists and tables")


def _dumps(data: dict, path: tuple[str, ...] = ()) -> str:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    out = []
    if path and (lines or not any(isinstance(v, dict) for v in data.values())):
        out.append("[" + ".".join(_key(p) for p in path) + "]")
    out += lines
    text = "\n".join(out) + ("\n" if out else "")
    for k, v in data.items():
        if isinstance(v, dict):
            text += ("\n" if text else "") + _dumps(v, (*path, k))
    return text
