"""The suite's two xdist workers (tests/conftest.py): every test that reads a trainer sweep, and
every activation-memory test, lands in one group each, so no sweep or measurement runs twice; a
test with nothing shared has no group and goes wherever a worker is free."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Collects the suite in a child process and prints {node id: [its xdist groups]} once every
# collection hook (tests/conftest.py's among them) has run.
PROBE = """
import json, sys, pytest

class Groups:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        self.found = {i.nodeid: [m.args[0] for m in i.iter_markers("xdist_group")] for i in items}

g = Groups()
code = pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[g])
print("GROUPS " + json.dumps(g.found))
sys.exit(code)
"""


def collected_groups(*paths: str) -> dict[str, list[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *paths], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("GROUPS "))
    return json.loads(line[len("GROUPS "):])


def test_shared_runs_stay_on_one_worker():
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    found = collected_groups("tests/trainer", "tests/test_validation_page.py", "tests/test_flops.py")
    readers = [n for n in found if "test_trainer_equivalence.py" in n or "test_trainer_precision.py" in n]
    assert readers and all(found[n] == ["trainer-sweeps"] for n in readers)  # each reads single_sweep
    # test_trainer_new_dims.py builds module sweeps of its own and reads single_sweep: all in one group.
    new_dims = [n for n in found if "new_dimensions_match_one_process" in n]
    assert new_dims and all(found[n] == ["trainer-sweeps"] for n in new_dims)
    measured = [n for n in found if "test_activation_memory.py" in n or "test_validation_page.py" in n]
    assert len(measured) >= 13 and all(found[n] == ["activation-memory"] for n in measured)
    # Nothing shared: no group (test_flops.py's tests, the faults test that launches its own runs).
    assert all(found[n] == [] for n in found if "test_flops.py" in n)
    assert found["tests/trainer/test_trainer_faults.py::test_random_kills_resume_from_the_newest_good_checkpoint_bitwise"] == []


def test_a_group_runs_on_one_worker_under_xdist(tmp_path):
    """tests/conftest.py in a suite of its own, run as the suite runs (two workers, load groups):
    the eight grouped tests all run on one worker, whatever pytest and pytest-xdist the
    environment resolved (pytest 9.2 dropped the node-id suffix xdist used to carry the groups;
    the conftest hands them over in a file). Which worker runs the ungrouped ones is the
    scheduler's choice, by timing: only that both may, and that all sixteen ran."""
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    body = "import os, pathlib\n" + "".join(
        f"def test_{i}():\n    pathlib.Path(__file__).with_name('{{name}}-{i}').write_text("
        f"os.environ['PYTEST_XDIST_WORKER'])\n" for i in range(8))
    (suite / "test_activation_memory.py").write_text(body.replace("{name}", "grouped"))
    (suite / "test_other.py").write_text(body.replace("{name}", "free"))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:benchmark",
                           "-p", "no:cacheprovider", "tests"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    passed = {line.split(" PASSED ")[1].strip().split("@")[0] for line in proc.stdout.splitlines()
              if " PASSED " in line}
    assert passed == ({f"tests/test_activation_memory.py::test_{i}" for i in range(8)}
                      | {f"tests/test_other.py::test_{i}" for i in range(8)}), proc.stdout[-2000:]
    workers = {kind: [p.read_text() for p in suite.glob(f"{kind}-*")] for kind in ("grouped", "free")}
    assert len(workers["grouped"]) == 8 and set(workers["grouped"]) in ({"gw0"}, {"gw1"}), proc.stdout[-3000:]
    assert len(workers["free"]) == 8 and set(workers["free"]) <= {"gw0", "gw1"}
