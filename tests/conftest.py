"""The suite runs on two pytest-xdist workers (pyproject.toml's addopts: ``-n 2 --dist loadgroup``):
a trainer test spends most of its time importing torch in one process at a time, so a second
worker fills the other core. What one process builds once and several tests read stays on one
worker, by group:

- the trainer sweeps (tests/trainer/conftest.py's session fixtures) and every test that reads them;
- a module's own shared fixture (module or session scope) with the tests of that module that read
  it (with the sweeps, where any of them reads a sweep);
- the activation-memory measurements (benchmarks/activation_memory.py caches them per process),
  read by the validation page's test and the activation-memory tests.

Every other test goes wherever a worker is free. ``-n 0`` runs the suite in one process."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SWEEPS = TESTS / "trainer" / "conftest.py"
ACTIVATION_MEMORY = {"test_validation_page.py", "test_activation_memory.py"}


def _defined_in(fixturedef) -> Path | None:
    code = getattr(fixturedef.func, "__code__", None)
    return Path(code.co_filename) if code else None


def _shared(item) -> set[Path]:
    """Where the suite's own fixtures built once for several tests (module or session scope) that
    ``item`` reads are defined (pytest's own, like tmp_path_factory, are left out)."""
    info = getattr(item, "_fixtureinfo", None)
    return {where for defs in (info.name2fixturedefs.values() if info else ()) for d in defs
            if d.scope != "function" and (where := _defined_in(d)) and where.is_relative_to(TESTS)}


def groups(items) -> dict[str, str]:
    """Item node id -> its xdist group, for the items that must share a worker."""
    by_module: dict[Path, list] = {}
    for item in items:
        by_module.setdefault(item.path, []).append(item)
    out = {}
    for path, module in by_module.items():
        if path.name in ACTIVATION_MEMORY:
            out.update((item.nodeid, "activation-memory") for item in module)
            continue
        shared = {item.nodeid: _shared(item) for item in module}
        # A module whose tests read the sweeps goes with them whole: its own shared fixtures too.
        group = ("trainer-sweeps" if any(SWEEPS in s for s in shared.values())
                 else path.relative_to(TESTS).as_posix())
        out.update((node, group) for node, s in shared.items() if s)
    return out


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups to send each to one worker
def pytest_collection_modifyitems(config, items):
    found = groups(items)
    for item in items:
        if item.nodeid in found:
            item.add_marker(pytest.mark.xdist_group(found[item.nodeid]))
