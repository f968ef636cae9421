"""LLM training planner: an analytical cost model for layout, memory, step time and cost.

Python API (docs/api.md): ``planner.estimate(params="33B", gpus=128, tp=2)`` returns what
`planner estimate --format json` prints, ``planner.search(...)`` what `planner search --format
json` prints; each keyword is a flag of that command. Bad input raises ``planner.PlannerError``.

Importing ``planner`` loads nothing heavy (no numpy, torch, matplotlib or streamlit) and reads no
files: the API's functions import the model when first called.
"""

from planner.errors import PlannerError

__version__ = "0.1.0"
__all__ = ["PlannerError", "estimate", "search"]
_API: dict = {}  # the API's functions, once imported


def estimate(**flags: object) -> dict:
    """`planner estimate --format json` as a dict: the best layout with the layout fields given
    pinned, its memory, step time, days and cost. Keywords: the flags of `planner estimate` with
    dashes made underscores (``params="33B", gpus=128, tp=2, micro_batch=1, zero=3``); raises
    ``PlannerError`` (field, value, what is allowed) on a bad one."""
    run = _API.get("estimate")
    if run is None:  # the model is imported on the first call, not with the package
        from planner.cli.api import estimate_of as run

        _API["estimate"] = run
    return run(flags)


def search(**flags: object) -> dict:
    """`planner search --format json` as a dict: ``evaluated``, ``feasible``, ``search_seconds``
    and ``results`` (the ``top`` best layouts, 20 by default; ``top=0``: every one that fits;
    ``all=True``: those that do not fit too). Keywords: the flags of `planner search`."""
    from planner.cli.api import search as run

    return run(**flags)
