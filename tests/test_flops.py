"""FLOP counts against Megatron-LM's eq. 3 and the transcribed per-iteration FLOPs."""

import csv
from pathlib import Path

import numpy as np
import pytest

from planner.calibration.published import load_published
from planner.core.flops import megatron_eq3_flops, model_flops_per_token, recompute_flops_per_token

DATA = Path(__file__).parent.parent / "benchmarks" / "data" / "megatron2021_table1.csv"


def test_hardware_flops_with_full_recompute_match_eq3_and_the_csv():
    rows = list(csv.DictReader(DATA.read_text().splitlines()))
    for run, row in zip(load_published(DATA), rows):
        tokens = run.layout.global_batch * run.model.seq_len
        ours = (model_flops_per_token(run.model) + float(recompute_flops_per_token(run.model, np.array(2)))) * tokens
        assert ours == pytest.approx(megatron_eq3_flops(run.model, run.layout.global_batch), rel=0.01)
        assert ours == pytest.approx(float(row["flops_per_iter_eq3_derived"]), rel=0.01)


def test_model_flops_per_token_by_hand_llama7b():
    from planner.core.presets import get_preset

    m = get_preset("llama-7b")
    h, f, l, v, s = 4096, 11008, 32, 32000, 2048
    matmul_weights = l * (4 * h * h + 3 * h * f) + v * h
    assert model_flops_per_token(m) == pytest.approx(6 * matmul_weights + 12 * l * h * s, rel=1e-12)
