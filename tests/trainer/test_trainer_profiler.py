"""The profiler: interval arithmetic, communication on a dp=2 run, the pipeline bubble, NVML."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reference_trainer import profiler  # noqa: E402
from reference_trainer.record import load_record  # noqa: E402
from tests.trainer.helpers import explain  # noqa: E402


def test_interval_arithmetic():
    assert profiler.union([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert profiler.length([(0, 3), (5, 6)]) == 4
    assert profiler.subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert profiler.clip([(0, 4), (6, 9)], (2, 7)) == [(2, 4), (6, 7)]


def test_waiting_tails():
    busy = [(0, 10), (20, 30)]
    # ends inside compute: hidden; ends in a gap: waited from the last compute's end (or its start)
    ops = [(5, 25), (12, 18), (8, 15), (31, 40)]
    assert profiler.waiting_tails(ops, busy) == [(10, 18), (31, 40)]


@pytest.mark.slow
def test_dp2_communication_is_measured_and_below_the_step(two_sweep):
    runs, proc = two_sweep
    assert proc.returncode == 0, explain(proc)
    rec = load_record(runs / "gpt-dp2")
    b, step = rec["breakdown_s"], rec["step_time_s"]["median"]
    assert 0 < b["comm_total"] < step
    assert 0 <= b["comm_exposed"] <= b["comm_total"] and b["comm_hidden"] >= 0
    assert rec["comm_share"] == pytest.approx(b["comm_exposed"] / sum(r["step"] for r in rec["per_rank"]) * 2)
    parts = sum(b[k] for k in ("compute", "comm_exposed", "data_wait", "bubble", "optimizer", "other"))
    assert parts == pytest.approx(sum(r["step"] for r in rec["per_rank"]) / 2, rel=1e-6)
    assert rec["bubble_fraction"] == 0.0 and rec["steps"]["traced"] == [3, 4]


@pytest.mark.slow
def test_bubble_shrinks_with_more_micro_batches(two_sweep):
    runs, proc = two_sweep
    assert proc.returncode == 0, explain(proc)
    one, eight = load_record(runs / "gpt-pp2-m1"), load_record(runs / "gpt-pp2-m8")
    assert one["layout"]["grad_accum"] == 1 and eight["layout"]["grad_accum"] == 8
    assert one["bubble_fraction_ideal"] == 1.0 and eight["bubble_fraction_ideal"] == 0.125
    assert one["bubble_fraction"] > eight["bubble_fraction"] > 0
    assert [s["pp_rank"] for s in one["per_stage"]] == [0, 1]


@pytest.mark.slow
def test_without_nvml_the_record_still_validates(single_sweep):
    runs, proc = single_sweep
    rec = load_record(runs / "gpt-1")  # validated on load
    assert rec["nvml"] is None and rec["nvml_reason"].startswith("no GPU")
    assert rec["memory"]["kind"] == "cpu_rss" and rec["memory"]["peak_allocated_bytes"] > 0
    assert rec["cpu"]["process_cpu_s"] > 0 and rec["mfu"] is None and "CPU run" in rec["peak_flops_source"]
    assert "no GPU: NVML not used (CPU run)" in proc.stdout


def test_nvml_failure_gives_a_reason(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    sampler = profiler.NvmlSampler(torch.device("cuda", 0), 0.1)
    reason = sampler.start()
    assert reason.startswith("NVML unavailable") and sampler.stop() is None
    assert sampler.latest() == {"gpu_util_percent": None, "power_w": None}
