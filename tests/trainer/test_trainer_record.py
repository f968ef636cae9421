"""The run record: what calibration reads. The loader names the missing or bad field; the
loader, the config and the launcher import no torch; README.md documents every field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from reference_trainer.record import CSV_COLUMNS, OPTIONAL, SCHEMA, load_record, validate_record

README = Path(__file__).resolve().parents[2] / "reference_trainer" / "README.md"


def fields(schema: dict, prefix: str = "") -> list[str]:
    out = []
    for key, kind in schema.items():
        out.append(prefix + key)
        if isinstance(kind, dict):
            out += fields(kind, f"{prefix}{key}.")
    return out


@pytest.fixture(scope="module")
def record(single_sweep):
    runs, _ = single_sweep
    return load_record(runs / "gpt-1")


@pytest.mark.slow
def test_a_real_record_validates(record, single_sweep):
    assert record["schema_version"] == 1 and record["status"] == "completed"
    assert record["model"]["params"] == 236928 and record["layout"]["grad_accum"] == 4
    assert record["steps"]["measured"] == 3 and record["steps"]["warmup_excluded"] == 2
    assert record["step_time_s"]["p10"] <= record["step_time_s"]["median"] <= record["step_time_s"]["p90"]
    assert record["tokens_per_s"] == pytest.approx(8 * 64 / record["step_time_s"]["median"])
    # planner/core/flops.py: 3 x (2 x matmul weights + causal attention 2 s h l) per token
    assert record["model_flops_per_token"] == 3 * (2 * (4 * 49_152 + 512 * 64) + 2 * 64 * 64 * 4)
    assert record["loss"]["last"] < record["loss"]["first"] and record["loss"]["any_nonfinite"] is False
    header = (single_sweep[0] / "gpt-1" / "steps.csv").read_text().splitlines()[0]
    assert tuple(header.split(",")) == CSV_COLUMNS


@pytest.mark.slow
@pytest.mark.parametrize("path, value, message", [
    (("step_time_s",), None, "field 'step_time_s' is missing"),
    (("breakdown_s", "bubble"), None, "field 'breakdown_s.bubble' is missing"),
    (("tokens_per_s",), "fast", "field 'tokens_per_s' has type str, expected number"),
    (("model", "layers"), 4.5, "field 'model.layers' has type float, expected integer"),
    (("mfu",), -1.0, "field 'mfu'=-1.0 out of range"),
    (("schema_version",), 2, "field 'schema_version' is 2, expected 1"),
    (("layout",), [], "layout: expected an object"),
    (("per_rank",), "x", "field 'per_rank' has type str, expected array"),
])
def test_bad_records_name_the_field(record, path, value, message):
    bad = copy.deepcopy(record)
    node = bad
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    with pytest.raises(ValueError) as err:
        validate_record(bad)
    assert message in str(err.value)


def test_unreadable_records(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_record(tmp_path / "nothing.json")
    (tmp_path / "record.json").write_text("{half")
    with pytest.raises(ValueError, match="not JSON"):
        load_record(tmp_path)  # a run folder works too
    (tmp_path / "record.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(ValueError, match="field 'run_name' is missing"):
        load_record(tmp_path)


def test_light_modules_import_no_torch():
    code = ("import sys, reference_trainer.record, reference_trainer.config, reference_trainer.launch; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_readme_documents_every_field():
    text = README.read_text()
    missing = [f for f in fields({**SCHEMA, **OPTIONAL}) + list(CSV_COLUMNS) if f"`{f}`" not in text]
    assert not missing, f"reference_trainer/README.md does not document: {missing}"
