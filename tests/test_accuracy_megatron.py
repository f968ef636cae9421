"""Step time against published measurements: Megatron-LM 2021 (Narayanan et al.).

Table 1 (ten runs, 1.7B-1T on 32-3072 A100s): the default A100 factors are fitted to these rows
(benchmarks/fit_megatron.py), one set for all, no per-row tuning. Target: mean |error| <= 5%,
worst row <= 10%. The PTD rows of Table 2 (175B and 530B at 384-2240 GPUs) were NOT used in the
fit: they check the model out of sample, within 10% each.
"""

from pathlib import Path

import numpy as np
import pytest

from planner.calibration.published import load_published, load_table2
from planner.hardware import get_profile
from tests.helpers import evaluate_one

DATA = Path(__file__).parent.parent / "benchmarks" / "data"


def test_table1_step_time_mean_error_within_5_percent_worst_within_10():
    runs = load_published(DATA / "megatron2021_table1.csv")
    assert len(runs) == 10
    errors = []
    for r in runs:
        ev = evaluate_one(r.model, r.layout, r.job, r.gpu)
        errors.append(float(ev.step_s[0]) / r.measured_step_s - 1)
    errors = np.abs(errors)
    assert errors.mean() <= 0.05, errors
    assert errors.max() <= 0.10, errors


def test_table2_ptd_rows_out_of_sample():
    # Narayanan et al. 2021, Table 2, "PTD parallelism" rows (../shared/data/megatron2021_other.csv),
    # not used in the fit: each within 10%.
    ptd, zero = load_table2(DATA / "megatron2021_other.csv")
    assert len(ptd) == 6 and len(zero) == 6
    for r in ptd:
        ev = evaluate_one(r.model, r.layout, r.job, r.gpu)
        assert float(ev.step_s[0]) == pytest.approx(r.measured_step_s, rel=0.10), r.label


def test_table2_deepspeed_zero3_rows_out_of_sample():
    """DeepSpeed ZeRO-3 (2021) without model parallelism, not used in any fit: its step time stayed
    constant as the GPUs doubled at a fixed batch, which the deepspeed-zero stack's flat rings over
    the whole data-parallel group reproduce (each GPU moves the whole model at its NIC rate).
    Within 20% each, 10% on average."""
    _, zero = load_table2(DATA / "megatron2021_other.csv")
    errors = []
    for r in zero:
        assert r.job.stack == "deepspeed-zero"
        ev = evaluate_one(r.model, r.layout, r.job, r.gpu)
        errors.append(float(ev.step_s[0]) / r.measured_step_s - 1)
    errors = np.abs(errors)
    assert errors.max() <= 0.20 and errors.mean() <= 0.10, errors


def test_a100_profile_uses_dense_peak_not_sparse():
    hw = get_profile("a100-80g")
    assert hw.gpu.peak_flops["bf16"] == 312e12 and hw.gpu.peak_flops["fp16"] == 312e12
