"""An optional dependency that is missing fails in one line naming what to install (exit 2, before
any work, nothing written), and every file a command writes is named in its output (issue 37)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Runs the CLI with some modules made unimportable, as on an install without that extra.
HIDDEN = """
import sys
from importlib.abc import MetaPathFinder
hidden = set(sys.argv[1].split(","))

class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Hide())
import importlib.util
_find = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in hidden else _find(name, *a)
from planner.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def planner_without(modules: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDDEN, modules, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("argv", [("estimate", "--params", "7B", "--gpus", "8"),
                                  ("compare", "--params", "7B", "--gpus", "8", "--gpu", "h100-80g"),
                                  ("validate", "benchmarks/runs/cpu-2core")])
def test_plot_without_matplotlib_is_one_line_naming_the_extra(argv, tmp_path):
    out = tmp_path / "plan.png"
    r = planner_without("matplotlib", *argv, "--plot", str(out))
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr  # before any work
    line = r.stderr.strip()
    assert line.startswith(f"planner {argv[0]}: plot=") and "needs matplotlib" in line and "'.[app]'" in line
    assert not out.exists()


def test_a_grid_without_torch_fails_once_before_any_run(tmp_path):
    r = planner_without("torch", "profile", "--grid", "cpu", "--out", str(tmp_path / "grid"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "needs torch" in r.stderr and "'.[trainer]'" in r.stderr
    assert not (tmp_path / "grid").exists()


def test_every_written_plot_is_named(tmp_path):
    pytest.importorskip("matplotlib")
    for argv in (("estimate", "--params", "7B", "--gpus", "8", "--format", "json"),
                 ("compare", "--params", "7B", "--gpus", "8", "--gpu", "h100-80g", "--format", "json")):
        out = tmp_path / f"{argv[0]}.png"
        r = subprocess.run([sys.executable, "-m", "planner", *argv, "--plot", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {out}" in r.stderr.splitlines()
        json.loads(r.stdout)  # the file's line went to stderr: stdout is still one JSON document
