"""docs/validation.md is generated from committed measurements; it must be current, and the
accuracy it states must meet the targets the README quotes."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("validation_page", ROOT / "docs" / "validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validation_page_is_current_and_meets_the_targets(tmp_path):
    pytest = __import__("pytest")
    pytest.importorskip("reference_trainer.record")
    page = _module()
    text = page.build(tmp_path, plots=False)
    assert text == (ROOT / "docs" / "validation.md").read_text(), "stale: run python docs/validation.py"
    # The estimate's "checked" line reads these records (planner/evidence.py): the same comparisons.
    assert page.evidence() == (ROOT / "planner" / "evidence.json").read_text(), "stale: run python docs/validation.py"
    table1 = re.search(r"Table 1.*?Mean absolute error \*\*([\d.]+)%\*\*, worst \*\*([\d.]+)%\*\*", text, re.S)
    assert float(table1.group(1)) <= 5 and float(table1.group(2)) <= 10
    cpu = re.search(r"Held-out step-time error: \*\*([\d.]+)%\*\* mean with the probed profile, "
                    r"\*\*([\d.]+)%\*\* after", text)
    before, after = float(cpu.group(1)), float(cpu.group(2))
    assert after <= 15 and after < before / 2
