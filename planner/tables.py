"""Text that fits a terminal: tables and report lines within 100 columns unless asked for all.

A table gives up columns in the order its caller names (the least needed first) and may wrap one
free-text column; ``--wide`` shows every column on one line each. Report lines longer than the
width wrap under their label ("step     ...", "  - warning ..."), never inside a table row.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

WIDTH = 100  # columns: a terminal split in two, or a laptop's at a readable font
SEP = "  "
WIDE_HELP = f"every column, and lines unwrapped (default: fit {WIDTH} columns)"


def _widths(rows: Sequence[Sequence]) -> list[int]:
    return [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]


def _line_width(widths: Sequence[int]) -> int:
    return sum(widths) + len(SEP) * (len(widths) - 1)


def fit_table(rows: Sequence[Sequence], *, drop: Sequence[str] = (), wrap: str | None = None,
              right: Sequence[int] | None = None, width: int | None = WIDTH, indent: str = "") -> str:
    """``rows[0]`` is the header. Columns named in ``drop`` are left out, in that order, until the
    table fits ``width``; then the ``wrap`` column (free text) is wrapped onto continuation lines.
    ``right``: the indices (of ``rows[0]``) aligned right; the rest align left. ``width=None``: all."""
    header = [str(h) for h in rows[0]]
    keep = list(range(len(header)))
    right_set = set(range(len(header)) if right is None else right)
    if width is not None:
        for name in drop:  # the wrap column is left out of the measure: it wraps, or goes below
            if _line_width(_widths([[r[i] for i in keep if header[i] != wrap] for r in rows])) + len(indent) <= width:
                break
            if name in header and header.index(name) in keep:
                keep.remove(header.index(name))
    cut = [[str(r[i]) for i in keep] for r in rows]
    widths = _widths(cut)
    wrap_at = keep.index(header.index(wrap)) if width is not None and wrap in header and header.index(wrap) in keep \
        else None
    below = None  # the wrap column's text, when too narrow beside the others: on lines of its own
    if wrap_at is not None:
        room = width - len(indent) - (_line_width(widths) - widths[wrap_at])
        if room < widths[wrap_at] and room < 30:
            below = [r.pop(wrap_at) for r in cut][1:]
            keep.pop(wrap_at)
            widths.pop(wrap_at)
            wrap_at = None
        else:
            widths[wrap_at] = min(widths[wrap_at], room)
    lines = []
    for n, r in enumerate(cut):
        cells = [(textwrap.wrap(v, widths[j]) or [""]) if j == wrap_at else [v] for j, v in enumerate(r)]
        for k in range(max(len(c) for c in cells)):
            parts = [c[k] if k < len(c) else "" for c in cells]
            lines.append(indent + SEP.join(p.rjust(wd) if keep[j] in right_set else p.ljust(wd)
                                           for j, (p, wd) in enumerate(zip(parts, widths))).rstrip())
        if below and n and below[n - 1]:
            lines += textwrap.wrap(below[n - 1], width, initial_indent=indent + "    ",
                                   subsequent_indent=indent + "    ")
    return "\n".join(lines)


# A label and its run of spaces ("step     ", "note   ", the report's 9-wide "expected ") or a
# bullet ("  - "): where a wrapped line's continuation starts.
_HANG = re.compile(r"^(\s*(?:- |[A-Za-z#][\w.:#-]*\s{2,}|\S{8} (?=\S)|(?=\S)))")


def wrap_lines(text: str, width: int | None = WIDTH) -> str:
    """Each line longer than ``width`` wrapped at spaces, its continuation under the line's text
    (after its label or bullet; else two columns in). Lines that fit are kept as they are (tables,
    bars)."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        hang = _HANG.match(line).group(1)
        indent = len(line) - len(line.lstrip())
        # Under the label's text; a line without a label hangs its continuation by two columns.
        lead = " " * (len(hang) if indent < len(hang) < width // 2 else indent + 2)
        # "dp 8 x tp 1 | ZeRO-3 | ...": short fields stay whole, a line breaks after a "|".
        body = f"{_KEEP_SPACES}| ".join(_KEEP_SPACES.join(part.split(" ")) if len(part) <= _FIELD else part
                                        for part in line[len(hang):].split(" | "))
        wrapped = textwrap.wrap(body, width, initial_indent=hang, subsequent_indent=lead,
                                break_long_words=False, break_on_hyphens=False) or [line]
        out += [x.replace(_KEEP_SPACES, " ") for x in wrapped]
    return "\n".join(out)


_KEEP_SPACES = "\x00"  # a space inside a short "|"-separated field, kept from wrapping
_FIELD = 40  # fields up to this long stay whole on a line
