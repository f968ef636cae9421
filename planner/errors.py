"""One error type for bad input: it names the field, the value and what is allowed.

The CLI prints ``str(error)`` as a single line and exits with code 2.
"""

from __future__ import annotations

from collections.abc import Callable


class PlannerError(ValueError):
    """Bad input. ``field`` and ``value`` say what was wrong, ``allowed`` what would do."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        shown = repr(value)
        if len(shown) > 160:  # a 400-digit number or a binary blob stays one readable line; a path keeps its end
            shown = f"{shown[:100]}...{shown[-40:]} ({len(shown)} characters)"
        super().__init__(f"{field}={shown}: {allowed}")


def require(condition: bool, field: str, value: object, allowed: str | Callable[[], str]) -> None:
    """Raise ``PlannerError(field, value, allowed)`` unless ``condition`` holds. ``allowed`` may be
    a function giving the text, called only on failure (checks on every estimate build no text)."""
    if not condition:
        raise PlannerError(field, value, allowed() if callable(allowed) else allowed)


def closest_names(name: str, choices: list[str], n: int = 3) -> str:
    """'did you mean a, b?' text for an unknown name (difflib ratio, then substring)."""
    import difflib

    hits = difflib.get_close_matches(name.lower(), choices, n=n, cutoff=0.4)
    if not hits:
        hits = [c for c in choices if name.lower() in c or c in name.lower()][:n]
    return f"did you mean {', '.join(hits)}?" if hits else ""
