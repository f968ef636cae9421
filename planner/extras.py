"""Optional dependencies: a missing one is one line naming what to install, never a traceback.

The planner itself needs numpy, PyYAML and tomli-w only; pictures need matplotlib (the ``app`` and
``test`` extras), the explorer streamlit (``app``), the trainer torch (``trainer``). Each face
checks before it does any work, so a bad setup fails at once and computes nothing.
"""

from __future__ import annotations

import importlib.util

from planner.errors import PlannerError

# module -> (what pip installs, the extra of pyproject.toml that brings it)
EXTRAS = {"matplotlib": ("matplotlib", "app"), "streamlit": ("streamlit", "app"), "scipy": ("scipy", "test"),
          "torch": ("torch==2.13.0", "trainer")}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def need(module: str, field: str, value: object) -> None:
    """Raise PlannerError(field, value, 'needs MODULE ...: pip install ...') unless ``module`` imports."""
    if installed(module):
        return
    package, extra = EXTRAS[module]
    raise PlannerError(field, value, f"needs {module}, which is not installed: pip install '{package}' "
                                     f"(or the {extra} extra: pip install '.[{extra}]' in a checkout)")
