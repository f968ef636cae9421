"""Properties over random valid inputs (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer
from planner.core.model import ModelSpec
from planner.hardware import get_profile
from tests.helpers import evaluate_one


@st.composite
def setups(draw, llm_sized: bool = False):
    """Random valid (model, layout, job, gpu). ``llm_sized``: hidden >= 2048, >= 8 layers per
    stage, sequences >= 2048 and at least 4 micro-batches per step, where compute outweighs
    communication; a 1-layer 512-wide model on 16 GPUs really does train slower than on 8 (its
    step is all all-reduce)."""
    arch = draw(st.sampled_from(["gpt", "llama"]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    heads = tp * draw(st.integers(max(1, 16 // tp) if llm_sized else 1, 8 if not llm_sized else max(16 // tp, 8)))
    head_dim = draw(st.sampled_from([128] if llm_sized else [64, 128]))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0 and d % tp == 0]))
    pp = draw(st.sampled_from([1, 2, 4]))
    layers = pp * draw(st.integers(8 if llm_sized else 1, 8 if llm_sized else 8))
    model = ModelSpec(arch=arch, layers=layers, hidden=heads * head_dim, heads=heads, kv_heads=kv,
                      vocab=draw(st.sampled_from([32000, 50257, 128256])),
                      seq_len=draw(st.sampled_from([2048, 4096] if llm_sized else [512, 2048, 4096])))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    mb = draw(st.sampled_from([1, 2, 4]))
    m = draw(st.integers(4 if llm_sized else 1, 16))
    layout = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, global_batch=dp * mb * m * pp,
                    zero_stage=draw(st.integers(0, 3)), recompute=draw(st.sampled_from(["none", "selective", "full", "half"])),
                    sequence_parallel=tp > 1 and draw(st.booleans()))
    job = Job(precision=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
              attention=draw(st.sampled_from(["flash", "standard"])))
    # With llm_sized: data-centre GPUs on InfiniBand. Across the A6000 profile's 100 Gb/s Ethernet a
    # second node really can slow a small model's step more than it adds throughput.
    gpu = draw(st.sampled_from(["a100-80g", "h100-80g"] if llm_sized else ["a100-80g", "h100-80g", "a6000",
                                                                             "v100-32g"]))
    if gpu == "v100-32g" and job.precision == "bf16":
        job = job.replace(precision="fp16")
    return model, layout, job, gpu


@settings(max_examples=150, deadline=None)
@given(setups())
def test_memory_grows_with_micro_batch(s):
    model, layout, job, gpu = s
    small = evaluate_one(model, layout, job, gpu).memory.total[0]
    big = evaluate_one(model, layout.replace(micro_batch=layout.micro_batch * 2,
                                             global_batch=layout.global_batch * 2), job, gpu).memory.total[0]
    assert big > small


@settings(max_examples=150, deadline=None)
@given(setups())
def test_recompute_never_increases_activation_memory(s):
    model, layout, job, _ = s
    per = {rc: float(activation_bytes_per_layer(model, Candidates.from_layouts([layout.replace(recompute=rc)]),
                                                job)[0]) for rc in ("none", "selective", "full", "half")}
    assert per["full"] <= per["selective"] <= per["none"]
    assert per["full"] <= per["half"] <= per["none"]


@settings(max_examples=150, deadline=None)
@given(setups())
def test_fractions_are_fractions(s):
    model, layout, job, gpu = s
    ev = evaluate_one(model, layout, job, gpu)
    assert 0.0 <= float(ev.bubble_fraction[0]) < 1.0
    assert 0.0 <= float(ev.comm_fraction[0]) <= 1.0
    assert 0.0 < float(ev.mfu[0]) <= float(ev.hfu[0]) < 1.0


@settings(max_examples=150, deadline=None)
@given(setups())
def test_no_step_beats_the_datasheet_peak(s):
    """Independent floor: the matmuls of every non-embedding parameter cost 6 FLOP per token
    (Kaplan et al. 2020, C_forward+backward = 6N), so model FLOPs per step are at least
    6 (N - V h - s h) tokens and a step takes at least that over gpus x the datasheet peak."""
    model, layout, job, gpu = s
    ev = evaluate_one(model, layout, job, gpu)
    tokens = layout.global_batch * model.seq_len
    floor = 6 * (model.params - model.vocab * model.hidden - model.seq_len * model.hidden) * tokens
    assert float(ev.model_flops_per_step[0]) >= floor * (1 - 1e-9)
    peak = get_profile(gpu).gpu.peak_flops[job.precision]
    assert float(ev.time.step[0]) * layout.gpus * peak >= floor * (1 - 1e-9)
    assert all(float(getattr(ev.time, f)[0]) >= 0 for f in ev.time.__slots__)


@settings(max_examples=100, deadline=None)
@given(setups(llm_sized=True), st.sampled_from([2, 4, 8]))
def test_time_to_train_falls_as_gpus_rise_at_fixed_layout_shape(s, factor):
    model, layout, job, gpu = s
    # More data-parallel replicas, same per-replica shape (tp, pp, micro-batch, accumulation).
    bigger = layout.replace(dp=layout.dp * factor, global_batch=layout.global_batch * factor)
    a = evaluate_one(model, layout, job, gpu).train_seconds[0]
    b = evaluate_one(model, bigger, job, gpu).train_seconds[0]
    assert b < a
