"""A small YAML writer for the configs the planner exports (no YAML library on the planner's path).

Block style only: mappings, sequences, scalars, and multi-line strings as literal blocks. Strings
are double-quoted (JSON escapes are valid YAML) unless they are plain words that every YAML 1.1
and 1.2 reader takes as strings; floats always carry a '.' so YAML 1.1 readers (PyYAML) read a
float, not a string ('6e-05' is a string there, '6.0e-05' a float).
"""

from __future__ import annotations

import json
import math
import re

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
# Words YAML 1.1 reads as booleans or null (PyYAML does), which must stay quoted as strings.
_SPECIAL = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return mantissa + (f"e{exponent}" if exponent else "")
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _SPECIAL:
        return text
    return json.dumps(text, ensure_ascii=False)


def _key(k: object) -> str:
    k = str(k)
    return k if _KEY.match(k) and k.lower() not in _SPECIAL else json.dumps(k, ensure_ascii=False)


def _block(text: str, pad: str) -> str:
    chomp = "|" if text.endswith("\n") else "|-"
    body = "\n".join(pad + "  " + line if line else "" for line in text.rstrip("\n").split("\n"))
    return f"{chomp}\n{body}"


def _lines(value: object, pad: str) -> list[str]:
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            head = f"{pad}{_key(k)}:"
            if isinstance(v, dict) and v:
                out += [head, *_lines(v, pad + "  ")]
            elif isinstance(v, list) and v:
                out += [head, *_lines(v, pad + "  ")]
            elif isinstance(v, str) and "\n" in v:
                out.append(f"{head} {_block(v, pad)}")
            else:
                out.append(f"{head} {_inline(v)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _lines(item, pad + "  ")
                out.append(pad + "- " + inner[0][len(pad) + 2:])
                out += inner[1:]
            else:
                out.append(f"{pad}- {_inline(item)}")
    else:
        out.append(pad + _inline(value))
    return out


def _inline(v: object) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return scalar(v)


def dump(value: dict | list, comments: list[str] | tuple[str, ...] = ()) -> str:
    """``value`` as a YAML document, after ``# comment`` lines."""
    return "".join(f"# {c}\n" if c else "#\n" for c in comments) + "\n".join(_lines(value, "")) + "\n"
