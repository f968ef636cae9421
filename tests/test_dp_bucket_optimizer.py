"""Three mechanisms the CPU calibration grid showed the planner missing (issue 13), checked
against hand-derived values:

- the data-parallel gradient bucket reduced after the backward ends (exposed even when the
  reduction as a whole hides behind the last backward), by the ring formula
  2 (n-1)/n * bytes / bw + 2 (n-1) * latency (Patarasuk & Yuan 2009);
- the optimizer window's host work per parameter tensor (eager AdamW, norm, clip, zero_grad),
  times the stack's DTensor ratio under tensor parallel, and the gradient norm's all-reduce;
- a time-shared CPU host's pipeline fill and drain, where half the stages idle and the others
  get their cores back.

Tensor counts are the reference trainer's ``len(list(GPT(spec).parameters()))``, counted with
torch for the CPU grid's shapes: gpt-s 52, llama-m 31, gpt-l 100 (tests/trainer checks the rule
against the trainer for more shapes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.core.steptime import param_tensors, step_time
from planner.hardware import get_profile, load_profile_file

MIB = 2**20
H100 = get_profile("h100-80g")  # 8 GPUs per node, 450 GB/s NVLink, 5 us latency: no shared cores


def ring_s(hw, nbytes: float, n: int, passes: float = 2.0) -> float:
    """A ring collective inside one node, written out (all-reduce: passes 2; reduce-scatter: 1)."""
    bw = hw.network.intra_bytes_per_s * hw.efficiency.intra_node_bw
    return passes * (n - 1) / n * nbytes / bw + passes * (n - 1) * hw.network.intra_latency_s


def times(model, layout, stack="reference", precision="fp32", hw=H100, **eff):
    hw = hw.with_efficiency(dataclasses.replace(hw.efficiency, **eff)) if eff else hw
    job = Job(precision=precision, global_batch=layout.global_batch, stack=stack)
    return step_time(model, hw, job, Candidates.from_layouts([layout]))


SMALL = ModelSpec(name="s", arch="gpt", layers=2, hidden=256, heads=4, vocab=1024, seq_len=128, dropout=0.0)
BIG = ModelSpec(name="b", arch="gpt", layers=4, hidden=2048, heads=16, vocab=32000, seq_len=2048, dropout=0.0)


def test_a_model_in_one_ddp_bucket_has_its_whole_reduction_exposed():
    # fp32 gradients, tied embeddings: every parameter on the one stage; 1.8M params = 7 MB < 25 MiB.
    lay = Layout(dp=2, tp=1, pp=1, micro_batch=4, global_batch=16)
    t = times(SMALL, lay, dp_overlap=1.0)
    assert SMALL.params * 4 < 25 * MIB
    assert float(t.dp_comm[0]) == pytest.approx(ring_s(H100, SMALL.params * 4, 2), rel=1e-9)


def test_a_large_model_exposes_only_its_last_bucket():
    # 201M fp32 parameters (805 MB): the rest of the reduction hides behind 16K tokens' backward.
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=8, global_batch=64)
    t = times(BIG, lay, dp_overlap=1.0)
    assert float(t.dp_comm[0]) == pytest.approx(ring_s(H100, 25 * MIB, 8), rel=1e-9)
    # torchtitan's DDP (replicate, bucket_cap_mb=100) exposes its 100 MiB bucket.
    t = times(BIG, lay, stack="fsdp2", dp_overlap=1.0)
    assert float(t.dp_comm[0]) == pytest.approx(ring_s(H100, 100 * MIB, 8), rel=1e-9)


def test_megatron_2021_all_reduces_everything_after_the_backward():
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=8, global_batch=64)
    t = times(BIG, lay, stack="megatron-2021", precision="fp16")  # fp16 gradients, no overlap, one buffer
    assert float(t.dp_comm[0]) == pytest.approx(ring_s(H100, BIG.params * 2, 8), rel=1e-9)


def test_zero1_exposes_its_last_reduce_scatter_bucket_and_the_weight_gather():
    lay = Layout(dp=2, tp=1, pp=1, micro_batch=4, global_batch=16, zero_stage=1)
    t = times(SMALL, lay, dp_overlap=1.0)
    # Gradients reduce-scattered (one bucket, after the backward), then fp32 weights all-gathered.
    expected = ring_s(H100, SMALL.params * 4, 2, passes=1) + ring_s(H100, SMALL.params * 4, 2, passes=1)
    assert float(t.dp_comm[0]) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("shape, tensors", [
    (dict(arch="gpt", layers=4, hidden=128, heads=4, vocab=512, seq_len=128), 52),
    (dict(arch="llama", layers=4, hidden=256, heads=8, kv_heads=4, vocab=1024, seq_len=128), 31),
    (dict(arch="gpt", layers=8, hidden=256, heads=8, vocab=1024, seq_len=256), 100),
])
def test_parameter_tensors_are_the_trainers(shape, tensors):
    per_layer, first, last = param_tensors(ModelSpec(name="m", **shape))
    assert shape["layers"] * per_layer + first + last == tensors


@pytest.mark.parametrize("tp, ratio", [(1, 1.0), (2, 4.0)])  # reference.toml: dtensor_optimizer_ratio = 4
def test_optimizer_host_work_is_per_parameter_tensor(tp, ratio):
    lay = Layout(dp=1, tp=tp, pp=1, micro_batch=4, global_batch=16)
    none, some = times(SMALL, lay, optimizer_tensor_overhead_s=0.0), times(SMALL, lay, optimizer_tensor_overhead_s=1e-4)
    tensors = 2 * 12 + 2 + 2  # per GPT layer: 2 LayerNorms (w, b), QKV, proj, fc, out (w, b); tok + pos; final norm
    assert float(some.optimizer[0] - none.optimizer[0]) == pytest.approx(tensors * 1e-4 * ratio, rel=1e-9)


def test_the_gradient_norm_is_all_reduced_over_every_rank():
    one = times(SMALL, Layout(dp=1, tp=1, pp=1, micro_batch=4, global_batch=8))
    two = times(SMALL, Layout(dp=2, tp=1, pp=1, micro_batch=4, global_batch=16))
    # Same micro-batch and held parameters per GPU (ZeRO 0): the optimizer differs by the norm's
    # all-reduce of a few bytes (loss and squared norm, 16 bytes) over the 2 GPUs: latency up and
    # down a tree of 2 ranks, 2 x 1 x the NVLink latency.
    assert float(two.optimizer[0] - one.optimizer[0]) == pytest.approx(2 * H100.network.intra_latency_s, rel=1e-6)


def test_a_tiny_all_reduce_over_thousands_of_gpus_costs_tree_latencies():
    """16,384 GPUs in 2,048 nodes of 8: 2 x (log2 8 = 3 NVLink + log2 2048 = 11 network latencies)
    (h100-80g: 5 us and 10 us): 0.25 ms, not a ring's 2 x (7 x 5 + 2047 x 10 us) = 41 ms."""
    from planner.core import comm

    links = comm.Links.of(H100)
    got = float(comm.small_all_reduce(links, np.array([16384]), np.array([1]))[0])
    assert got == pytest.approx(2 * (3 * 5e-6 + 11 * 10e-6), rel=1e-9)


@pytest.mark.parametrize("dp, slots", [(1, 4 + 1), (2, 4)])
def test_a_time_shared_host_keeps_its_cores_busy_through_the_pipeline_fill_and_drain(dp, slots):
    # 2 cores, pp2, m = 4 micro-batches. pp2 alone (2 processes, a core each): the 1F1B step is
    # m + p - 1 = 5 micro-batch slots. pp2 x dp2 (4 processes, 2 per core): while one stage idles in
    # the fill and drain, the other's 2 processes have the 2 cores to themselves and run twice as
    # fast, so the cores never idle and the step is the work, 4 processes x m / 2 cores = m slots
    # at the shared pace (the bubble, (p-1) slots at half that pace, is absorbed by the stage that
    # runs alone). X: one micro-batch at the shared pace, from the bubble.
    cpu = load_profile_file("benchmarks/runs/cpu-2core/probed.toml")
    lay = Layout(dp=dp, tp=1, pp=2, micro_batch=2, global_batch=8 * dp)
    t = times(SMALL, lay, hw=cpu, step_jitter=0.0, step_overhead_s=0.0)
    x = float(t.bubble[0]) / (1.0 if dp == 1 else 0.5)
    pipeline = float(t.compute[0] + t.other[0] + t.tp_comm[0] + t.pp_comm[0] + t.bubble[0])
    assert pipeline == pytest.approx(slots * x, rel=1e-9)
