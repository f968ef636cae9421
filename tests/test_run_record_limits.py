"""The run-record contract's range for MFU: a GPU run's MFU above 1.5 is a broken record; a CPU
run's "peak" is the probe's matmul rate, measured at another moment on shared cores, which a run
may beat (seen: MFU 3.4 against a probe made under load), so only a negative or non-finite MFU is
refused there."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from planner.calibration.record import validate_record

CPU_RECORD = Path(__file__).resolve().parent / "app" / "data" / "runs" / "tiny-cpu" / "record.json"


def with_mfu(value: float, device_kind: str = "cpu") -> dict:
    rec = copy.deepcopy(json.loads(CPU_RECORD.read_text()))
    rec["mfu"], rec["hardware"]["device_kind"] = value, device_kind
    return rec


def test_a_cpu_run_may_beat_its_probed_peak():
    assert validate_record(with_mfu(3.4))["mfu"] == 3.4


@pytest.mark.parametrize("value, kind", [(1.6, "cuda"), (-0.1, "cpu"), (float("inf"), "cpu"), (float("nan"), "cpu")])
def test_out_of_range_mfu_is_named(value, kind):
    with pytest.raises(ValueError, match="field 'mfu'=.* out of range"):
        validate_record(with_mfu(value, kind))
