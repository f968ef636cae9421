"""The import graph reads top to bottom: faces (cli, app) -> decisions, export, calibration -> core
-> base modules (errors, units, files, hardware, stacks, schema). Walked with ``ast`` over every
module's imports (at the top or inside functions), so a lazy import counts as much as any other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANNER = ROOT / "planner"

# Layer of each part of the package; an import may only point to the same layer or one below.
# Within a layer, modules may import each other (the graph must still have no cycle).
LAYERS = {"cli": 3, "app": 3, "decisions": 2, "export": 2, "calibration": 2, "core": 1}
BASE = 0  # planner/*.py: errors, units, files, hardware, stacks, schema, ...


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PLANNER.rglob("*.py"))}


def imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, absolute or relative, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from planner.core import plan`
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges[name] = {m for m in imports(path, package) if m in mods and m != name}
    return edges


ENTRY = ("planner", "planner.__main__")  # the package and `python -m planner`: above the faces


def layer(module: str) -> int:
    parts = module.split(".")
    if module in ENTRY:
        return max(LAYERS.values()) + 1
    if parts[1] in LAYERS:
        return LAYERS[parts[1]]
    return BASE


def test_planner_itself_imports_nothing():
    """`import planner` loads no module of the package but ``planner.errors`` (standard library only:
    ``planner.PlannerError``), so nothing heavy and no files; the Python API's functions
    (``planner.estimate``, ``planner.search``) import their face, ``planner.cli.api``, when called."""
    tree = ast.parse((PLANNER / "__init__.py").read_text())
    top = imports_of([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], "planner")
    assert {m for m in top if m in modules()} <= {"planner.errors"}
    assert graph()["planner"] <= {"planner.errors", "planner.cli.api"}
    assert graph()["planner.errors"] == set()


def imports_of(nodes: list, package: str) -> set[str]:
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_the_walk_sees_the_package():
    g = graph()
    assert {"planner.core.search", "planner.cli.main", "planner.app.explore", "planner.errors"} <= set(g)
    assert "planner.core.layout" in g["planner.core.search"]  # a top-level import
    assert "planner.core.options" in g["planner.app.explore"]  # an import inside a function


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node)


def test_the_planner_never_imports_the_trainer():
    bad = [f"{m} imports {i}" for m, p in modules().items()
           for i in imports(p, m) if i == "reference_trainer" or i.startswith("reference_trainer.")]
    assert not bad, bad


def test_imports_point_down_the_layers():
    bad = [f"{m} (layer {layer(m)}) imports {i} (layer {layer(i)})" for m, deps in graph().items() for i in deps
           if layer(i) > layer(m)]
    assert not bad, "\n".join(bad)


def test_the_trainer_imports_only_the_core_and_the_record_contract():
    allowed = ("planner.__version__", "planner.core", "planner.calibration.record", "planner.errors", "planner.units",
               "planner.hardware", "planner.files", "planner.stacks", "planner.schema", "planner.numbers")
    bad = []
    for path in sorted((ROOT / "reference_trainer").rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for i in imports(path, package):
            if i.startswith("planner.") and not any(i == a or i.startswith(a + ".")
                                                                        for a in allowed):
                bad.append(f"{name} imports {i}")
    assert not bad, bad
