"""The suite runs on two pytest-xdist workers (pyproject.toml's addopts: ``-n 2 --dist loadgroup``):
a trainer test spends most of its time importing torch in one process at a time, so a second
worker fills the other core. What one process builds once and several tests read stays on one
worker, by group:

- the trainer sweeps (tests/trainer/conftest.py's session fixtures) and every test that reads them;
- a module's own shared fixture (module or session scope) with the tests of that module that read
  it (with the sweeps, where any of them reads a sweep);
- the activation-memory measurements (benchmarks/activation_memory.py caches them per process),
  read by the validation page's test and the activation-memory tests.

Every other test goes wherever a worker is free. ``-n 0`` runs the suite in one process.

How the groups reach xdist's scheduler: each worker writes its collection's groups to a file named
in its ``workerinput``, and the controller's scheduler (xdist's loadgroup, subclassed) reads them.
xdist's own channel, a ``@group`` suffix it writes into each marked item's node id, stopped working
with pytest 9.2 (node ids became structured; pytest-xdist issue 1386): the tests were then spread
over both workers without a word. Both channels agree where the suffix still works (pytest < 9.2)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks (pytest < 9.2)
def pytest_collection_modifyitems(config, items):
    found = groups(items)
    for item in items:
        if item.nodeid in found:
            item.add_marker(pytest.mark.xdist_group(found[item.nodeid]))


GROUPS_DIR = "suite_groups_dir"  # the workerinput key naming the folder the workers write into


def marked_groups(items) -> dict[str, str]:
    """Item node id -> its group, from the xdist_group marks (the hook's and any written in a test)."""
    out = {}
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names:
            out[item.nodeid] = "_".join(names)
    return out


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reports its collection to the controller
def pytest_collection_finish(session):
    where = getattr(session.config, "workerinput", {}).get(GROUPS_DIR)
    if where:  # a worker: hand the groups to the controller, written whole before it can be read
        path = Path(where) / f"{session.config.workerinput['workerid']}.json"
        path.with_suffix(".tmp").write_text(json.dumps(marked_groups(session.items)))
        os.replace(path.with_suffix(".tmp"), path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Controller side, once per worker: the folder the worker writes its groups into."""
    config = node.config
    if not hasattr(config, "_suite_groups_dir"):
        config._suite_groups_dir = tempfile.mkdtemp(prefix="pytest-groups-")
    node.workerinput[GROUPS_DIR] = config._suite_groups_dir


def pytest_unconfigure(config):
    if hasattr(config, "_suite_groups_dir"):
        shutil.rmtree(config._suite_groups_dir, ignore_errors=True)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own choice of scheduler
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        """xdist's loadgroup, reading each test's group from the workers' files (written before
        each worker reported its collection, so all there once the collection is complete)."""

        groups: dict[str, str] = {}

        def schedule(self):
            if self.collection is None:
                where = Path(getattr(config, "_suite_groups_dir", "") or os.devnull)
                self.groups = {k: v for f in (sorted(where.glob("*.json")) if where.is_dir() else ())
                               for k, v in json.loads(f.read_text()).items()}
            super().schedule()

        def _split_scope(self, nodeid):
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)
