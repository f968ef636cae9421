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


class _Event:
    """What profiler.classify reads of a torch.profiler FunctionEvent."""

    def __init__(self, name, start, end, device="cpu"):
        self.name = name
        self.time_range = type("R", (), {"start": start, "end": end})()
        self.device_type = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU


def test_a_wait_nested_inside_an_op_is_communication():
    # Tensor parallel on the CPU (issue 13): the residual add waits inside aten::add for the
    # all-reduce of its input (DTensor's wait_tensor); gloo runs the all-reduce on its worker
    # thread from 10 to 88 us. Compute: mm 0-30, the add's own work 30-40 and 90-100.
    events = [_Event("rt:step", 0, 120), _Event("rt:fwd_bwd", 0, 110), _Event("aten::mm", 0, 30),
              _Event("aten::add", 30, 100), _Event("_c10d_functional::wait_tensor", 40, 90),
              _Event("gloo:all_reduce", 10, 88)]
    out = profiler.analyse(events, "cpu")
    # Busy = [0, 40) + [90, 100) = 50 us; the wait (40-90) is exposed tensor-parallel
    # communication, 50 us; the all-reduce's tail (40-88) lies inside it.
    assert out["busy_s"] == pytest.approx(50e-6)
    assert out["comm_exposed_s"] == pytest.approx(50e-6)
    assert out["comm_exposed_tp_s"] == pytest.approx(50e-6)
    assert out["comm_total_s"] == pytest.approx(78e-6)
    assert out["bubble_s"] == 0.0


def test_before_the_fix_the_nested_wait_was_booked_as_hidden():
    # The same trace without the wait event (what the outer op alone shows): the all-reduce ends
    # inside aten::add, so it reads as hidden behind compute. The wait event is what tells.
    events = [_Event("rt:step", 0, 120), _Event("rt:fwd_bwd", 0, 110), _Event("aten::mm", 0, 30),
              _Event("aten::add", 30, 100), _Event("gloo:all_reduce", 10, 88)]
    assert profiler.analyse(events, "cpu")["comm_exposed_s"] == 0.0


def test_nccl_kernel_names_on_a_gpu_trace_fixture():
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "fixtures" / "nccl_kernels.json").read_text())
    events = [_Event(e["name"], e["start"], e["end"], e["device"]) for e in data["events"]]
    kinds = {e["name"].split("(")[0]: profiler.nccl_kind(e["name"]) for e in data["events"] if e["device"] == "cuda"}
    assert kinds["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == "collective"
    assert kinds["ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"] == "collective"
    assert kinds["ncclKernel_AllGather_RING_LL_Sum_int8_t"] == "collective"
    assert kinds["ncclDevKernel_SendRecv"] == "p2p" and kinds["ncclDevKernel_Recv"] == "p2p"
    assert kinds["ncclDevKernel_Send"] == "send"
    assert sum(k is None for k in kinds.values()) == 4  # two gemms, an element-wise add, flash attention
    out = profiler.analyse(events, "cuda")
    # Compute kernels: [0,100) [160,300) [420,500) [760,800) = 360 us.
    # Collectives in fwd-bwd: all-reduce 50-150 ends at 150, after compute ended at 100: tail 100-150;
    # reduce-scatter 480-560 ends after the flash kernel (500): tail 500-560; all-gather 600-700:
    # nothing computes from 500 to 700, tail 600-700. Receives: send-recv 250-400 ends at 400,
    # compute ended at 300: idle 300-400; recv 700-750: idle 700-750.
    assert out["busy_s"] == pytest.approx(360e-6)
    assert out["bubble_s"] == pytest.approx(150e-6)
    assert out["comm_exposed_s"] == pytest.approx((50 + 60 + 100) * 1e-6)
    # total: every collective in the step window, the optimizer's f64 all-reduce too; sends are not.
    assert out["comm_total_s"] == pytest.approx((100 + 80 + 100 + 50) * 1e-6)


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
    # One micro-batch over two stages idles half the time (ideal 1/2 of the step): the flag fires.
    assert "bubble_fraction" in {f["check"] for f in one["flags"]}
    assert [s["pp_rank"] for s in one["per_stage"]] == [0, 1]


@pytest.mark.slow
def test_tensor_parallel_waits_are_booked_as_tp_communication(two_sweep):
    runs, proc = two_sweep
    assert proc.returncode == 0, explain(proc)
    tp, dp = load_record(runs / "llama-tp2")["breakdown_s"], load_record(runs / "gpt-dp2")["breakdown_s"]
    # tp2: DTensor's all-reduces are waited for inside other ops; those waits are exposed TP time.
    assert 0 < tp["comm_exposed_tp"] <= tp["comm_exposed"]
    assert dp["comm_exposed_tp"] == 0.0  # DDP's reductions are not functional collectives


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
