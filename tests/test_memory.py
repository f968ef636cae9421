"""Memory against the ZeRO paper and Korthikanti et al. 2022, by hand."""

import pytest

from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer
from planner.core.model import ModelSpec
from planner.core.presets import get_preset
from tests.helpers import evaluate_one

GPT = ModelSpec(arch="gpt", layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048)
# Korthikanti et al. counted Megatron-LM: fused kernels, selective recompute of the attention core.
STANDARD = Job(precision="fp16", attention="standard", stack="megatron-core")


def act(layout: Layout, job: Job = STANDARD, model: ModelSpec = GPT) -> float:
    return float(activation_bytes_per_layer(model, Candidates.from_layouts([layout]), job)[0])


@pytest.mark.parametrize("b", [1, 4])
def test_activations_per_layer_korthikanti(b):
    s, h, a = GPT.seq_len, GPT.hidden, GPT.heads
    base = dict(dp=8, micro_batch=b, global_batch=64 * b)
    # Korthikanti et al. 2022: eq. 1 (no parallelism), eq. 2 (tensor parallel t), eq. 4 (t with
    # sequence parallel), Table 2 (selective recompute with SP), Sec. 5 (full recompute: 2sbh).
    assert act(Layout(**base)) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    t = 8
    assert act(Layout(**base, tp=t)) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(Layout(**base, tp=t, sequence_parallel=True)) == pytest.approx(s * b * h / t * (34 + 5 * a * s / h))
    assert act(Layout(**base, tp=t, sequence_parallel=True, recompute="selective")) == pytest.approx(34 * s * b * h / t)
    assert act(Layout(**base, recompute="full")) == pytest.approx(2 * s * b * h)


def test_flash_attention_keeps_no_s_by_s_scores():
    lay = Layout(dp=8, micro_batch=2, global_batch=16)
    s, b, h, a = GPT.seq_len, 2, GPT.hidden, GPT.heads
    # 34 sbh plus the fp32 log-sum-exp per head and token (4 bytes x a).
    assert act(lay, Job(precision="fp16", stack="megatron-core")) == pytest.approx(s * b * (34 * h + 4 * a))


@pytest.mark.parametrize("zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_model_states_zero_paper_figure1(zero, expected_gb):
    # Rajbhandari et al. 2020, Fig. 1: 7.5B parameters, 64-way data parallel, fp16 Adam (K = 12).
    model = get_preset("megatron-7.5b")  # 7.47B parameters
    ev = evaluate_one(model, Layout(dp=64, micro_batch=1, global_batch=64, zero_stage=zero),
                      Job(precision="fp16", stack="megatron-core"))
    states = ev.memory.weights + ev.memory.gradients + ev.memory.optimizer
    # The paper prints one decimal: allow its rounding (0.05 GB) on the value scaled to 7.47B.
    assert float(states[0]) / 1e9 == pytest.approx(expected_gb * model.params / 7.5e9, abs=0.06)


@pytest.mark.parametrize("zero, expected_gb", [(1, 31.4), (2, 16.6), (3, 1.9)])
def test_deepspeed_bf16_keeps_the_zero_papers_16_bytes(zero, expected_gb):
    """DeepSpeed accumulates a bf16 job's gradients in bf16 under ZeRO 1-3 (engine.get_data_types:
    grad_accum_dtype defaults to the model dtype with ZeRO), so its model states are the ZeRO
    paper's 2 + 2 + 12 bytes per parameter, Fig. 1's figures as for fp16; without ZeRO it keeps them
    in fp32, and Megatron-Core keeps fp32 main gradients: 4 bytes each."""
    model = get_preset("megatron-7.5b")
    lay = Layout(dp=64, micro_batch=1, global_batch=64, zero_stage=zero)
    ev = evaluate_one(model, lay, Job(precision="bf16", stack="deepspeed-zero"))
    states = ev.memory.weights + ev.memory.gradients + ev.memory.optimizer
    assert float(states[0]) / 1e9 == pytest.approx(expected_gb * model.params / 7.5e9, abs=0.06)
    grads = {1: model.params * 2, 2: model.params * 2 / 64, 3: model.params * 2 / 64}[zero]
    assert float(ev.memory.gradients[0]) == pytest.approx(grads, rel=1e-9)
    ddp = evaluate_one(model, lay.replace(zero_stage=0), Job(precision="bf16", stack="deepspeed-zero"))
    assert float(ddp.memory.gradients[0]) == pytest.approx(model.params * 4, rel=1e-9)
    if zero == 1:
        mcore = evaluate_one(model, lay, Job(precision="bf16", stack="megatron-core"))
        assert float(mcore.memory.gradients[0]) == pytest.approx(model.params * 4, rel=1e-9)


def test_deepspeed_holds_its_gradient_bucket_beside_the_gradients():
    """DeepSpeed's contiguous_gradients (on by default) copies gradients into a bucket buffer of
    reduce_bucket_size elements (5e8) in the training dtype before reducing them: ZeRO 1-2 allocate
    it for each backward, ZeRO-3 once; ZeRO 0 (plain data parallel) has none. Offloading, the
    gradients the GPU holds are that bucket (counted with them, not twice)."""
    model, job = get_preset("llama2-7b"), Job(stack="deepspeed-zero")
    bucket = 5e8 * 2
    for zero, want in ((0, 0.0), (1, bucket), (2, bucket)):
        ev = evaluate_one(model, Layout(dp=8, micro_batch=1, global_batch=64, zero_stage=zero), job)
        assert float(ev.memory.gathered[0]) == pytest.approx(want, rel=1e-4)
    off = evaluate_one(model, Layout(dp=8, micro_batch=1, global_batch=64, zero_stage=2, offload="optimizer"), job)
    assert float(off.memory.gathered[0]) == 0.0
    assert float(off.memory.gradients[0]) == pytest.approx(bucket, rel=1e-4)


def test_first_pipeline_stage_holds_one_microbatch_of_the_whole_model():
    # 1F1B: stage 0 holds p micro-batches of L/p layers: L layers' worth, independent of p
    # (Korthikanti et al. 2022, Sec. 4.2.3); interleaving multiplies it by 1 + (p-1)/(p*v).
    model = GPT.replace(layers=32)
    per_layer = act(Layout(dp=1, micro_batch=1, global_batch=64, recompute="full"), STANDARD, model)
    for pp, vpp in ((1, 1), (4, 1), (8, 1), (4, 2)):
        ev = evaluate_one(model, Layout(dp=1, pp=pp, vpp=vpp, micro_batch=1, global_batch=64, recompute="full"),
                          STANDARD)
        stage0 = float(ev.stage_memory[0].activations[0])
        # minus the working set (one full layer recomputed beside its kept input, and the MLP's
        # gradients in its backward: 2 bytes x (h + f) per token, GELU) and the embedding dropout mask
        working = (act(Layout(dp=1, micro_batch=1, global_batch=64), STANDARD, model) - per_layer
                   + 2 * (model.hidden + model.ffn_hidden) * model.seq_len)
        mask = model.seq_len * model.hidden * (pp + (pp - 1) / vpp if vpp > 1 else pp)
        logits = 6 * model.seq_len * model.vocab if pp == 1 else 0
        expected = 32 * per_layer * (1 + (pp - 1) / (pp * vpp) if vpp > 1 else 1)
        assert stage0 - working - mask - logits == pytest.approx(expected, rel=1e-9)


def test_recompute_sequence_parallel_and_zero_only_ever_lower_memory():
    model = get_preset("llama-13b")
    base = Layout(dp=8, tp=4, pp=2, micro_batch=2, global_batch=256)
    ref = float(evaluate_one(model, base).memory.total[0])
    for change in ({"recompute": "full"}, {"sequence_parallel": True}, {"zero_stage": 1}):
        assert float(evaluate_one(model, base.replace(**change)).memory.total[0]) < ref


def test_model_states_per_stage_by_hand():
    """A small LLaMA-style shape on two pipeline stages, no ZeRO, bf16 AdamW. Megatron-Core holds
    each stage's parameters at 2 (bf16 weights) + 4 (fp32 gradients) + 12 (fp32 master, momentum,
    variance) bytes (Rajbhandari et al. 2020, Sec. 3.1, with bf16's fp32 gradient accumulation);
    the default stack (torchtitan: DDP under autocast) keeps fp32 weights, which are the master:
    4 + 4 + 8. Stage 0 has two layers and the embedding, the last two layers, the final norm and
    the head."""
    h, f, vocab = 256, 512, 1000
    model = ModelSpec(arch="llama", layers=4, hidden=h, heads=4, ffn_hidden=f, vocab=vocab, seq_len=128)
    layer = 4 * h * h + 3 * h * f + 2 * h  # q, k, v, o; gate, up, down; two RMSNorms
    first, last = 2 * layer + vocab * h, 2 * layer + h + vocab * h
    for job, per_param in ((Job(stack="megatron-core"), (2, 4, 12)), (Job(), (4, 4, 8))):
        ev = evaluate_one(model, Layout(dp=1, pp=2, micro_batch=1, global_batch=8), job)
        by_stage = {int(sm.stage[0]): sm for sm in ev.stage_memory}
        for stage, params in ((0, first), (1, last)):
            sm = by_stage[stage]
            assert (float(sm.weights[0]), float(sm.gradients[0]), float(sm.optimizer[0])) == tuple(
                b * params for b in per_param)
    # The peak is the stage with the larger total, and its parts are that stage's.
    peak = max(by_stage.values(), key=lambda sm: float(sm.total[0]))
    assert int(ev.memory.stage[0]) == int(peak.stage[0])
    assert float(ev.memory.total[0]) == float(peak.total[0])


def test_the_backward_of_a_layer_holds_its_mlps_gradients_by_hand():
    """Beside what every layer kept, the layer being run backward holds the gradient arriving at
    its output (e*h per token; split by TP under sequence parallel) and, in its MLP's backward,
    the gradients of gate, up and their product less the product itself once the down projection
    is done: e*(h + 2f) per token for SwiGLU, e*(h + f) for GELU, f split by TP."""
    from planner.core.memory import backward_working
    from planner.stacks import software

    llama = get_preset("llama3-8b").replace(seq_len=4096)  # h 4096, f 14336
    h, f, s, e = 4096, 14336, 4096, 2
    for tp, sp, arriving in ((1, False, h), (4, False, h), (4, True, h / 4)):
        c = Candidates.from_layouts([Layout(dp=1, tp=tp, micro_batch=2, global_batch=2, sequence_parallel=sp)])
        got = float(backward_working(llama, c, Job(), software(Job()))[0])
        assert got == pytest.approx(e * (arriving + 2 * f / tp) * 2 * s)
    c = Candidates.from_layouts([Layout(dp=1, micro_batch=1, global_batch=1, cp=2)])
    got = float(backward_working(GPT, c, STANDARD, software(STANDARD))[0])
    assert got == pytest.approx(e * (2048 + 4 * 2048) * 2048 / 2)


def test_what_an_eager_rmsnorm_and_repeat_kv_keep_by_hand(tmp_path):
    """No recompute, Llama 3 8B per token and layer (e = 2). With one-kernel norms (torch's
    nn.RMSNorm on CUDA) and K/V at their heads, eager kernels keep the norms' and matmuls' inputs
    (6eh), Q, K, V (e(h + 2kv)), gate, up, SiLU out, down's input (4ef) and the log-sum-exp (4a).
    An RMSNorm run op by op also keeps its normalised tensor for the weight (eh per norm); one that
    upcasts (x.float(), torchtitan's of 2024) keeps its input as that fp32 copy (4h, not eh) beside
    it; repeat_kv makes K and V copies at the query heads (2e(h - kv) more) except on a TP rank
    holding one K/V head, where the repeat is a view. Compiled, the norm and SwiGLU are fused (no
    normalised tensor, no SiLU output) but repeat_kv still feeds SDPA its copies."""
    model = get_preset("llama3-8b").replace(seq_len=1024)
    h, kv, f, a, e = 4096, 1024, 14336, 32, 2
    fused = e * (6 * h + 2 * kv + 4 * f) + 4 * a
    plain = tmp_path / "plain.toml"
    plain.write_text('base = "fsdp2"\nname = "plain"\ndescription = "d"\nsource = "s"\n[kernels]\neager_norm = "plain"\n')
    lay = Layout(dp=1, micro_batch=1, global_batch=1)
    per_token = {stack: act(lay, Job(stack=stack), model) / 1024
                 for stack in ("fsdp2", str(plain), "fsdp2-2024", "fsdp2-2024-triton-norm", "fsdp2-2025")}
    repeated = 2 * e * (h - kv)
    assert per_token["fsdp2"] == pytest.approx(fused)
    assert per_token[str(plain)] == pytest.approx(fused + 2 * e * h)
    assert per_token["fsdp2-2024"] == pytest.approx(fused + 2 * 4 * h + repeated)
    assert per_token["fsdp2-2024-triton-norm"] == pytest.approx(fused + repeated)
    assert per_token["fsdp2-2025"] == pytest.approx(fused + repeated)
    compiled = act(lay, Job(stack="fsdp2-2024", compile=True), model) / 1024
    assert compiled == pytest.approx(fused - e * f + repeated)
    # tp 8: one K/V head per rank (8 of them): no copies
    tp8 = Layout(dp=1, tp=8, micro_batch=1, global_batch=1, sequence_parallel=True)
    assert act(tp8, Job(stack="fsdp2-2024"), model) == pytest.approx(act(tp8, Job(stack="fsdp2-2024-triton-norm"), model)
                                                                      + 2 * 4 * h / 8 * 1024)


def test_what_torch_counts_as_allocated_includes_the_zero3_gather_buffers():
    """torch.cuda.max_memory_allocated (what run records report and planner validate compares)
    counts every tensor: under ZeRO-3 the current block's gathered 16-bit weights and the next's,
    prefetched (fsdp2: gather_layers = 2), and in the backward a block's 16-bit gradients beside
    their fp32 copy for the reduce-scatter (fsdp2: reduce_scatter_bytes = 2 + 4); not the CUDA
    context or the allocator's fragmentation."""
    from planner.core.memory import allocated_bytes

    model = get_preset("llama3-8b")
    lay = Layout(dp=8, micro_batch=1, global_batch=8, recompute="full")
    h, kv, f = 4096, 1024, 14336
    layer = h * (h + kv + kv + h) + 3 * h * f + 2 * h  # q, k, v, o; gate, up, down; two norms
    for zero, gathered in ((0, 0.0), (3, 2 * 2 * layer + (2 + 4) * layer)):
        ev = evaluate_one(model, lay.replace(zero_stage=zero), Job(stack="fsdp2"), gpu="h100-80g")
        m = ev.memory
        tensors = float(m.weights[0] + m.gradients[0] + m.optimizer[0] + m.activations[0])
        got = float(allocated_bytes(m)[0])
        assert got - tensors == pytest.approx(gathered, rel=1e-9)
