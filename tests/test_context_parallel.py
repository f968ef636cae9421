"""Context parallel: the sequence split across cp GPUs (torchtitan, Megatron-Core), by hand."""

from pathlib import Path

import numpy as np
import pytest

from planner.calibration.published import load_torchtitan, predict_torchtitan
from planner.core.flops import attention_core_flops
from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer
from planner.core.presets import get_preset
from planner.core.search import Pins, search
from planner.errors import PlannerError
from planner.hardware import get_profile
from tests.helpers import evaluate_one

MODEL = get_preset("llama3-8b").replace(seq_len=65536)
FSDP2 = Job(stack="fsdp2-2024")  # torchtitan as it ran its CP benchmarks: K/V repeated (repeat_kv) before SDPA


def test_each_gpu_keeps_and_computes_one_cp_th_of_the_sequence():
    one = Candidates.from_layouts([Layout(dp=4, micro_batch=1, global_batch=4)])
    four = Candidates.from_layouts([Layout(dp=1, cp=4, micro_batch=1, global_batch=1)])
    assert activation_bytes_per_layer(MODEL, four, FSDP2)[0] == pytest.approx(
        activation_bytes_per_layer(MODEL, one, FSDP2)[0] / 4, rel=1e-12)
    # causal attention: 2 * s^2 * h FLOPs per layer forward, split evenly over cp ranks
    s, h = 65536, 4096
    assert attention_core_flops(MODEL, 1, 1, cp=4) == pytest.approx(2 * s * s * h / 4, rel=1e-12)


def test_zero_shards_over_data_and_context_parallel_ranks():
    """FSDP shards over dp_shard x cp (torchtitan): 4 x 2 = 8 ranks hold 1/8 of the fp32 parameters
    (the master weights under FSDP2's mixed precision) and of the AdamW moments (8 bytes)."""
    ev = evaluate_one(MODEL, Layout(dp=4, cp=2, micro_batch=1, global_batch=4, zero_stage=3, recompute="full"),
                      FSDP2, gpu="h100-80g")
    assert float(ev.memory.weights[0]) == pytest.approx(MODEL.params * 4 / 8, rel=1e-9)
    assert float(ev.memory.gradients[0]) == pytest.approx(MODEL.params * 4 / 8, rel=1e-9)
    assert float(ev.memory.optimizer[0]) == pytest.approx(MODEL.params * 8 / 8, rel=1e-9)


def test_the_kv_exchange_by_hand():
    """The reference trainer gathers K and V at their own heads (blocking) and all-reduces their
    gradient: per layer 2 bytes x (K + V) x s x h_kv, each rank receiving (cp-1)/cp of it over
    NVLink forward, twice that backward."""
    hw = get_profile("h100-80g")
    lay = Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=3)
    ev = evaluate_one(MODEL, lay, Job(stack="reference"), gpu="h100-80g")
    kv = 2 * 2 * 65536 * 1024
    bw = hw.network.intra_bytes_per_s * hw.efficiency.intra_node_bw
    gather = 3 / 4 * kv / bw + 3 * hw.network.intra_latency_s
    assert float(ev.time.cp_comm[0]) == pytest.approx(32 * 3 * gather, rel=1e-9)
    ring = evaluate_one(MODEL, lay, Job(stack="megatron-core"), gpu="h100-80g")
    assert float(ring.time.cp_comm[0]) == 0.0  # a ring hides it behind attention at this length


def test_torch_context_parallel_by_hand():
    """torchtitan (torch's context_parallel, all-gather rotation): K/V repeated to the 32 query
    heads before SDPA (4x the bytes of 8 K/V heads); per layer forward one all-gather of the
    whole sequence's K/V and 3 fp32 merges of the partial output; backward the all-gather again,
    4 sends of one rank's dK/dV in fp32 to the next rank and 3 fp32 accumulations; the fitted
    cp_overlap 0 hides none of it. Bytes per element from the stack file (40 and 75)."""
    hw = get_profile("h100-80g")
    ev = evaluate_one(MODEL, Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=3), FSDP2,
                      gpu="h100-80g")
    bw = hw.network.intra_bytes_per_s * hw.efficiency.intra_node_bw
    lat = hw.network.intra_latency_s
    hbm = hw.gpu.hbm_bytes_per_s * hw.efficiency.memory
    kv = 2 * 2 * 65536 * 4096  # K and V, 16-bit, whole sequence, 32 heads x 128
    gather = 3 / 4 * kv / bw + 3 * lat
    send = 2 * kv / 4 / bw + lat  # one rank's dK/dV in fp32
    out = 65536 / 4 * 4096  # the rank's attention-output elements
    forward = gather + 3 * 40 * out / hbm
    backward = gather + 4 * send + 3 * 75 * out / hbm
    assert float(ev.time.cp_comm[0]) == pytest.approx(32 * (forward + backward), rel=1e-9)


def test_torch_context_parallel_working_memory_by_hand():
    """While a layer runs backward, torch's context parallel holds the gathered K/V of the whole
    sequence (16-bit, query heads) and seven local fp32 tensors (dQ, dK, dV; dK/dV sent and
    received): with full recompute this adds to the layer being recomputed."""
    from planner.core.memory import context_parallel_working
    from planner.stacks import software

    c = Candidates.from_layouts([Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=3,
                                        recompute="full")])
    local = 65536 / 4 * 4096
    want = 2 * 2 * local * 4 + 7 * 4 * local
    assert float(context_parallel_working(MODEL, c, FSDP2, software(FSDP2))[0]) == pytest.approx(want, rel=1e-12)
    one = Candidates.from_layouts([Layout(dp=4, micro_batch=1, global_batch=4, zero_stage=3, recompute="full")])
    assert float(context_parallel_working(MODEL, one, FSDP2, software(FSDP2))[0]) == 0.0


def test_cp_must_split_the_sequence_into_2cp_chunks():
    with pytest.raises(PlannerError) as err:
        search(get_preset("llama3-8b").replace(seq_len=8190), get_profile("h100-80g"), FSDP2, 8, Pins(cp=2))
    assert err.value.field == "cp"
    short = search(get_preset("llama3-8b"), get_profile("h100-80g"), FSDP2, 64).evaluation.candidates
    assert set(np.unique(short.cp)) == {1, 2}  # 8K tokens: searched while each rank keeps >= 4096
    assert np.all(search(get_preset("llama-7b"), get_profile("h100-80g"), FSDP2, 64).evaluation.candidates.cp == 1)
    long = search(MODEL.replace(seq_len=262144), get_profile("h100-80g"), FSDP2, 64).evaluation.candidates
    assert set(np.unique(long.cp)) >= {1, 2, 4, 8}


# Published: torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 2 and 6 (tokens/s per
# GPU, memory GiB). Tolerances: tokens/s within 15% and memory within 10% (issue 14), except the two
# 8B rows at cp 4 and 8 (predicted 23% and 27% fast: their per-step cost above the counted exchange
# and merges is not explained, docs/validation.md) and the 405B cp 8 memory (12% low).
CP_ROWS = {  # label prefix: (tokens/s tolerance, memory tolerance)
    "llama3-8b h100-96g-hbm2e x8 fsdp4 tp1 pp1 cp2": (0.15, 0.10),
    "llama3-8b h100-96g-hbm2e x8 fsdp2 tp1 pp1 cp4": (0.30, 0.10),
    "llama3-8b h100-96g-hbm2e x8 fsdp1 tp1 pp1 cp8": (0.30, 0.10),
    "llama3-405b h100-96g-hbm2e x512 fsdp4 tp8 pp8 cp2": (0.15, 0.10),
    "llama3-405b h100-96g-hbm2e x512 fsdp2 tp8 pp8 cp4": (0.15, 0.10),
    "llama3-405b h100-96g-hbm2e x512 fsdp1 tp8 pp8 cp8": (0.15, 0.15),
}


def test_torchtitan_context_parallel_rows():
    runs = [r for r in load_torchtitan(Path(__file__).parent.parent / "benchmarks" / "data" /
                                       "torchtitan_performance.csv", with_cp=True) if r.cp > 1]
    assert len(runs) == 6
    for r in runs:
        (tok_tol, mem_tol), = [v for k, v in CP_ROWS.items() if r.label.startswith(k)]
        p = predict_torchtitan(r)
        assert p.fits, r.label
        assert abs(p.tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1) <= tok_tol, r.label
        assert abs(p.memory_bytes / r.measured_memory_bytes - 1) <= mem_tol, r.label


def test_validation_page_states_how_the_8b_step_grows_with_the_sequence():
    """Table 2's 8B rows hold 32K tokens per GPU each (local batch 1 x cp ranks): the step is
    32768 / (tokens/s per GPU). By hand from the table: 32768/3890 = 8.42 s, /2540 = 12.90 s,
    /1071 = 30.60 s, /548 = 59.80 s; per 32K tokens of sequence added: 4.48, 17.70/2 = 8.85,
    29.20/4 = 7.30 s."""
    from planner.calibration.torchtitan import _sequence_increments

    csv = Path(__file__).parent.parent / "benchmarks" / "data" / "torchtitan_performance.csv"
    text, = _sequence_increments(csv)
    assert "the step gains 4.5 s from cp 1 to 2" in text
    assert "8.8 s from cp 2 to 4" in text  # 8.849
    assert "7.3 s from cp 4 to 8" in text


def test_the_exchange_grows_with_the_query_heads_under_torchtitan():
    """torchtitan repeats K/V to the query heads before SDPA: Llama 3 405B (128 heads, 8 K/V
    heads) exchanges 16x the bytes a GQA-aware ring would; at cp 8 across nodes (tp 8 fills each
    node) that is most of the exposed exchange."""
    model = get_preset("llama3-405b").replace(seq_len=262144)
    lay = Layout(dp=1, tp=8, cp=8, micro_batch=1, global_batch=1, zero_stage=3, recompute="full",
                 sequence_parallel=True)
    torch_ = evaluate_one(model, lay, Job(stack="fsdp2-2024", precision="bf16"), gpu="h100-80g")
    gqa = evaluate_one(model, lay, Job(stack="reference", precision="bf16"), gpu="h100-80g")
    assert float(torch_.time.cp_comm[0]) > 10 * float(gqa.time.cp_comm[0])
    # torchtitan since January 2026 (PR 2259) passes enable_gqa to SDPA: K/V and dK/dV at their own
    # heads (16x fewer bytes); the fp32 merges of the partial output stay at the query width.
    today = evaluate_one(model, lay, Job(stack="fsdp2", precision="bf16"), gpu="h100-80g")
    assert float(torch_.time.cp_comm[0]) / 16 < float(today.time.cp_comm[0]) < float(torch_.time.cp_comm[0]) / 4


def test_the_exchange_is_as_wide_as_the_heads_not_the_residual_stream():
    """Qwen3-30B-A3B: hidden 2048, but 32 query heads x 128 = 4096 wide (4 K/V heads x 128 = 512).
    torchtitan's repeat_kv exchanges K/V at the query heads' 4096, and its backward holds dQ at
    4096, dK/dV at 4096 and their send/receive copies, all fp32 (2 x 4096 x 2 bytes gathered per
    token, (4096 + 6 x 4096) x 4 bytes local); the reference trainer gathers them at the K/V
    heads' 512."""
    from planner.core.memory import context_parallel_working
    from planner.stacks import software

    model = get_preset("qwen3-30b-a3b").replace(seq_len=65536)
    c = Candidates.from_layouts([Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=3,
                                        recompute="full")])
    local = 65536 / 4
    want = 2 * 2 * local * 4 * 4096 + (4096 + 6 * 4096) * 4 * local
    assert float(context_parallel_working(model, c, FSDP2, software(FSDP2))[0]) == pytest.approx(want, rel=1e-12)
    ref = Job(stack="reference")
    assert float(context_parallel_working(model, c, ref, software(ref))[0]) == pytest.approx(
        2 * (2 * 2 * local * 4 * 512), rel=1e-12)
