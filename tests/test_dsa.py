"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) as Megatron-Core trains it: a lightning
indexer on every layer scores each query against every earlier key (replicated on every TP rank),
the query attends to its index_topk best in MLA's absorbed form (FlashMLA's sparse kernel, the
cuDNN backend), and the indexer learns from a KL loss over the selected keys. Parameter counts
against transformers, FLOPs, times, activations and context parallel's all-gather by hand, the
Megatron flags, and what is refused in one line."""

import json

import pytest

from planner.cli.main import main
from planner.core.flops import attention_flops_per_token, model_flops_per_token
from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer, dsa_scores_working
from planner.core.model import ModelSpec
from planner.core.options import model_from_hf_config
from planner.core.search import Pins, search
from planner.core.steptime import indexer_times
from planner.errors import PlannerError
from planner.hardware import get_profile
from tests.helpers import evaluate_one
from tests.test_hf_configs import DATA

# DeepSeek-V3.2 is DeepSeek-V3's model with the indexer on every layer: its config is V3's with
# model_type deepseek_v32 and the indexer's keys (deepseek-ai/DeepSeek-V3.2-Exp's reference
# inference config, inference/config_671B_v3.2.json: index_n_heads 64, index_head_dim 128,
# index_topk 2048; transformers' DeepseekV32Config has the same defaults).
V32 = {**json.loads((DATA / "DeepSeek-V3.config.json").read_text()), "model_type": "deepseek_v32",
       "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}
# GLM-5: transformers 5.25.0's GlmMoeDsaConfig defaults (its docstring's checkpoint zai-org/GLM-5),
# the keys the planner reads.
GLM5 = {"model_type": "glm_moe_dsa", "hidden_size": 6144, "num_hidden_layers": 78, "num_attention_heads": 64,
        "num_key_value_heads": 64, "intermediate_size": 12288, "moe_intermediate_size": 2048, "vocab_size": 154880,
        "max_position_embeddings": 202752, "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 1, "topk_group": 1,
        "tie_word_embeddings": False, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048}


def read(cfg: dict, **changes) -> ModelSpec:
    model, _ = model_from_hf_config(json.dumps(cfg).encode())
    return model.replace(**changes) if changes else model


def dense_twin(model: ModelSpec) -> ModelSpec:
    return model.replace(index_heads=0, index_head_dim=0, index_topk=0)


@pytest.mark.parametrize("cfg, total, indexer", [
    # transformers 5.25.0's model built from the config on the meta device, its parameters plus the
    # routing bias buffer (e_score_correction_bias: the checkpoint stores it; DeepSeek-V3's convention)
    (V32, 671_877_929_216 + 58 * 256, 1536 * 8192 + 7168 * 128 + 7168 * 64 + 2 * 128),
    (GLM5, 743_911_199_232 + 75 * 256, 2048 * 4096 + 6144 * 128 + 6144 * 32 + 2 * 128),
])
def test_the_indexer_counts_as_transformers_builds_it(cfg, total, indexer):
    """wq_b from the q latent (q_lora_rank x heads x width), wk (hidden x width) and its LayerNorm
    (weight and bias), weights_proj (hidden x heads), on every layer."""
    model = read(cfg)
    assert model.params == total and model.indexer_params == indexer
    assert model.params - dense_twin(model).params == model.layers * indexer


def test_the_model_flops_by_hand():
    """At 131,072 tokens: the sparse core, query i against min(i, 2048) keys, MLA absorbed (each of
    128 heads: q . latent key over 512 + 64, the latent as value over 512: 2 x 1088 FLOPs a pair
    forward); the indexer's scores over every causal pair (2 x 64 x 128 a pair, forward only: its
    inputs are detached), its KL loss's backward (3 x 2 x 64 x 128) and the loss's target (2 x 128
    x 576) over the selected pairs; the indexer's projections forward and their weights' gradients
    (2 + 2 a parameter: their inputs are detached, so no input gradients)."""
    s, k = 131072, 2048
    model = read(V32, seq_len=s)
    selected = (s * k - k * k / 2) / s  # a token's mean selected keys
    core = 2 * 128 * 1088 * selected
    assert attention_flops_per_token(model) == pytest.approx(61 * core, rel=1e-12)
    index = 2 * 64 * 128
    dsa = 61 * (index * s / 2 + (3 * index + 2 * 128 * 576) * selected)
    projections = 61 * (1536 * 8192 + 7168 * (128 + 64))
    weights = 2 * dense_twin(model).matmul_params_per_token
    assert model_flops_per_token(model) == pytest.approx(3 * (weights + 61 * core) + 4 * projections + dsa, rel=1e-12)


def test_under_lora_the_indexer_projections_run_forward_only_by_hand():
    """LoRA freezes the model and the indexer: a frozen weight takes its input's gradient (2 + 2 a
    parameter a token), the indexer's projections neither (their inputs are detached): 2 a
    parameter. Against its dense twin (the same model without the indexer, MLA's dense core) under
    the same LoRA: the projections' forward, the sparse core instead of the causal dense one (3x
    each, forward and backward), and the indexer's scores forward (2 x 64 x 128 a causal pair)."""
    s, k = 8192, 2048
    model = read(V32, seq_len=s)
    lora = Job(precision="bf16", stack="megatron-core", mode="lora")
    selected = (s * k - k * k / 2) / s
    sparse, dense = 2 * 128 * 1088 * selected, 0.5 * 2 * s * 128 * (192 + 128)
    projections = 61 * (1536 * 8192 + 7168 * (128 + 64))
    by_hand = 2 * projections + 3 * 61 * (sparse - dense) + 61 * 2 * 64 * 128 * s / 2
    assert model_flops_per_token(model, lora) - model_flops_per_token(dense_twin(model), lora) == pytest.approx(
        by_hand, rel=1e-12)


@pytest.mark.parametrize("mode", ["pretrain", "lora"])
def test_the_indexer_projections_backward_is_their_weights_gradients_alone(monkeypatch, mode):
    """A layer's backward counts every weight GEMM twice (input and weight gradients; once under
    LoRA, input gradients alone) but the indexer's projections once less: their inputs are
    detached (once, their weights' gradients; under LoRA, frozen, nothing). What it leaves out is
    their forward time, by the roofline by hand: wq_b (8,192 tokens x 1,536 -> 64 x 128) and wk
    with weights_proj (7,168 -> 128 + 64), whole on the TP rank, each the larger of its bf16
    compute (the matmul roof at its smallest side) and its bytes over HBM."""
    from planner.core import steptime
    from planner.core.comm import Links
    from planner.stacks import effective, software

    s = 8192
    model, hw = read(V32, seq_len=s), get_profile("h100-80g")
    job = Job(precision="bf16", stack="megatron-core", mode=mode)
    c = Candidates.from_layouts([Layout(dp=1, tp=2, micro_batch=1, global_batch=1, sequence_parallel=True)]).one_row()
    sw = software(job)
    hw_eff = effective(hw, sw.stack, False)
    bwd = steptime.layer_times(model, hw_eff, job, c, Links.of(hw_eff), sw).backward
    monkeypatch.setattr(steptime, "indexer_gemms", lambda *a: [])  # as if the inputs took gradients too
    as_weights = steptime.layer_times(model, hw_eff, job, c, Links.of(hw_eff), sw).backward
    e = hw_eff.efficiency
    peak, hbm = hw_eff.gpu.peak_flops["bf16"], hw_eff.gpu.hbm_bytes_per_s * e.memory
    by_hand = 0.0
    for m, n, k in ((s, 64 * 128, 1536), (s, 128 + 64, 7168)):
        d = min(m, n, k)
        compute = 2 * m * n * k / (peak * e.matmul * d / (d + e.matmul_half_dim))
        by_hand += max(compute, 2 * (m * k + k * n + m * n) / hbm)
    assert as_weights - bwd == pytest.approx(by_hand, rel=1e-9)


def test_the_indexer_s_time_by_hand():
    """One micro-batch of 131,072 tokens, cp 4, tp 2: this GPU's 32,768 queries against every earlier
    key (the causal share of its load-balanced chunks: half the pairs), whole on the TP rank; top-k
    writes and reads 4-byte scores over the whole key length; the backward over the selected keys:
    the KL loss (3 x 2 x 64 x 128 a pair) and its target (2 x 576 a head and pair, 64 heads a TP rank)."""
    s = 131072
    model, hw = read(V32, seq_len=s), get_profile("h100-80g")
    c = Candidates.from_layouts([Layout(dp=1, tp=2, cp=4, micro_batch=1, global_batch=1, sequence_parallel=True)])
    rate = 500e12
    fwd, bwd = (float(x[0]) for x in indexer_times(model, hw, Job(), c, rate))
    queries = s / 4
    hbm = hw.gpu.hbm_bytes_per_s * hw.efficiency.memory
    assert fwd == pytest.approx(queries * s / 2 * 2 * 64 * 128 / rate + 8 * queries * s / hbm, rel=1e-12)
    pairs = queries * (s * 2048 - 2048**2 / 2) / s
    assert bwd == pytest.approx(pairs * (3 * 2 * 64 * 128 + 2 * 64 * 576) / rate, rel=1e-12)


def test_the_activations_by_hand():
    """Per token and layer, 16-bit, tp 1, no recompute: MLA absorbed keeps every head's query against
    the latent key (128 x 576) and the kernel's latent-wide output (128 x 512) where dense MLA keeps
    q (128 x 192) and the up-projected K and V (128 x 192, 128 x 128); beside them, whole on every
    TP rank, the latent key (576), the int32 indices of 2048 keys, and the indexer's kept loss
    gradients (64 x 128 + 128 in 16-bit, 64 fp32 head weights)."""
    s = 8192
    model, job = read(V32, seq_len=s), Job(precision="bf16", stack="megatron-core")
    c = Candidates.from_layouts([Layout(dp=8, micro_batch=1, global_batch=8)])
    gap = float(activation_bytes_per_layer(model, c, job)[0] - activation_bytes_per_layer(dense_twin(model), c, job)[0])
    absorbed = 2 * 128 * (576 + 512) - 2 * (128 * 192 + 128 * 192 + 128 * 128)
    whole = 2 * 576 + 4 * 2048 + 2 * (64 * 128 + 128) + 4 * 64
    assert gap == pytest.approx((absorbed + whole) * s, rel=1e-12)
    tp2 = Candidates.from_layouts([Layout(dp=4, tp=2, micro_batch=1, global_batch=4, sequence_parallel=True)])
    gap2 = float(activation_bytes_per_layer(model, tp2, job)[0] - activation_bytes_per_layer(dense_twin(model), tp2,
                                                                                             job)[0])
    assert gap2 == pytest.approx((absorbed / 2 + whole) * s, rel=1e-12)  # the indexer's whole on each TP rank
    assert float(dsa_scores_working(model, c)[0]) == 4 * s * s  # 256 MiB of fp32 scores: under the 1 GiB chunk
    long = read(V32, seq_len=131072)
    assert float(dsa_scores_working(long, c)[0]) == 2**30


def test_context_parallel_gathers_the_latent_and_indexer_keys_by_hand():
    """cp 2 inside a node: the latent key (576) and the indexer's key (128) of the whole 131,072-token
    sequence all-gathered before the attention (each rank receives the other's half), their
    gradients reduce-scattered after, again in the recomputed forward, unhidden (Megatron-Core's
    allgather, the only kind DSA runs); one stage, one micro-batch: the 61 layers' sum."""
    s = 131072
    model, hw = read(V32, seq_len=s), get_profile("h100-80g")
    lay = Layout(dp=1, cp=2, ep=2, micro_batch=1, global_batch=1, zero_stage=1, recompute="full")
    ev = evaluate_one(model, lay, Job(stack="megatron-core"), gpu="h100-80g")
    bw = hw.network.intra_bytes_per_s * hw.efficiency.intra_node_bw
    gather = 1 / 2 * 2 * s * (576 + 128) / bw + hw.network.intra_latency_s
    assert float(ev.time.cp_comm[0]) == pytest.approx(61 * 3 * gather, rel=1e-9)


def test_at_128k_tokens_sparse_attention_makes_the_step_shorter():
    """DeepSeek-V3.2 against V3 (the same model without the indexer) at 131,072 tokens on 1,024 H100:
    the attention core falls from s/2 to about 2048 keys a query; the indexer's s/2 pairs remain at
    64 x 128 a pair, against 128 x (192 + 128) of dense MLA's."""
    hw, job = get_profile("h100-80g"), Job(precision="bf16", global_batch=480, stack="megatron-core")
    sparse = read(V32, seq_len=131072)
    steps = [float(search(m, hw, job, 1024, Pins()).ranked([0]).step_s[0]) for m in (sparse, dense_twin(sparse))]
    assert steps[0] < 0.6 * steps[1]


def test_the_megatron_flags_and_the_exports_that_cannot(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(V32))
    base = ["--hf-config", str(path), "--gpus", "1024", "--gpu", "h100", "--stack", "megatron-core",
            "--seq-len", "131072", "--global-batch", "480"]
    assert main(["export", *base, "--cp", "8", "--format", "megatron"]) == 0
    script = capsys.readouterr().out
    for flag in ("--experimental-attention-variant dsa", "--dsa-indexer-n-heads 64", "--dsa-indexer-head-dim 128",
                 "--dsa-indexer-topk 2048", "--dsa-indexer-use-sparse-loss", "--dsa-kernel-backend cudnn",
                 "--cp-comm-type allgather", "--multi-latent-attention"):
        assert flag in script, flag
    assert main(["estimate", *base, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model"]["index_heads"], out["model"]["index_head_dim"], out["model"]["index_topk"]) == (64, 128, 2048)
    for fmt in ("torchtitan", "torchrun"):
        assert main(["export", *base, "--format", fmt]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--format megatron" in err, fmt


@pytest.mark.parametrize("changes, key", [
    ({"index_topk_freq": 4}, "index_topk_freq"),  # GLM-5.x's IndexShare: layers reusing another's top-k
    ({"indexer_types": ["full", "shared"] * 39}, "indexer_types"),
    ({"attention_bias": True}, "attention_bias"),
    ({"index_topk": "2048"}, "index_topk"),
    ({"layer_types": ["full_attention"] * 78}, "layer_types"),
])
def test_what_is_not_modelled_or_malformed_is_one_line(changes, key, tmp_path, capsys):
    with pytest.raises(PlannerError) as err:
        read({**GLM5, **changes})
    assert err.value.field == f"hf_config {key}" and "\n" not in str(err.value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GLM5, **changes}))
    assert main(["estimate", "--hf-config", str(path), "--gpus", "1024"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("fields, field", [
    ({"index_heads": 64, "index_head_dim": 128, "index_topk": 2048}, "index_topk"),  # no MLA
    ({"kv_lora_rank": 512, "qk_nope_dim": 128, "qk_rope_dim": 64, "v_head_dim": 128,
      "index_heads": 64, "index_topk": 2048}, "index_head_dim"),  # one missing
    ({"kv_lora_rank": 512, "qk_nope_dim": 128, "qk_rope_dim": 64, "v_head_dim": 128,
      "index_heads": 64, "index_head_dim": 128, "index_topk": -1}, "index_topk"),
])
def test_bad_fields_are_one_line(fields, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(arch="llama", layers=8, hidden=1024, heads=8, **fields)
    assert err.value.field == field and "\n" not in str(err.value)


def test_the_indexer_s_weights_are_whole_on_every_tensor_parallel_rank():
    """Megatron-Core's indexer linears are duplicated, not split: at tp 2 each rank holds all 61
    layers' indexers (16-bit weights, 2 bytes), against half of every other weight."""
    lay = Layout(dp=1, tp=2, micro_batch=1, global_batch=1, zero_stage=1, sequence_parallel=True)
    job = Job(stack="megatron-core")
    sparse = read(V32)
    weights = [float(evaluate_one(m, lay, job, gpu="h100-80g").memory.weights[0]) for m in (sparse, dense_twin(sparse))]
    assert weights[0] - weights[1] == pytest.approx(61 * sparse.indexer_params * 2, rel=1e-9)


def test_under_lora_the_indexer_is_frozen():
    """LoRA freezes the indexer (its loss off, Megatron-Core runs it under no_grad): its scores
    forward remain, its loss's backward and target, and the gradients it keeps, go; its projections'
    weight gradients go as every frozen weight's (2 FLOPs a weight a token)."""
    s = 8192
    model = read(V32, seq_len=s)
    full, lora = Job(precision="bf16", stack="megatron-core"), Job(precision="bf16", stack="megatron-core", mode="lora")
    selected = (s * 2048 - 2048**2 / 2) / s
    loss = 61 * (3 * 2 * 64 * 128 + 2 * 128 * 576) * selected + 2 * 61 * (1536 * 8192 + 7168 * 192)
    weights_and_attention = model_flops_per_token(dense_twin(model), lora) - model_flops_per_token(dense_twin(model), full)
    assert (model_flops_per_token(model, lora) - model_flops_per_token(model, full)
            == pytest.approx(weights_and_attention - loss, rel=1e-9))
    c = Candidates.from_layouts([Layout(dp=8, micro_batch=1, global_batch=8)])
    gap = float(activation_bytes_per_layer(model, c, full)[0] - activation_bytes_per_layer(model, c, lora)[0])
    frozen = float(activation_bytes_per_layer(dense_twin(model), c, full)[0]
                   - activation_bytes_per_layer(dense_twin(model), c, lora)[0])
    assert gap - frozen == pytest.approx((2 * (64 * 128 + 128) + 4 * 64) * s, rel=1e-9)
    hw = get_profile("h100-80g")
    assert float(indexer_times(model, hw, lora, c, 500e12)[1]) == 0.0


def test_the_optimizer_steps_the_indexer_whole_on_every_tensor_parallel_rank():
    """The optimizer step reads and writes every weight a GPU holds (4 + 24 + 2 bytes a parameter:
    the fp32 gradient, master and moments, the 16-bit copy): at tp 2 all 61 indexers on each rank."""
    lay = Layout(dp=1, tp=2, micro_batch=1, global_batch=1, zero_stage=0, sequence_parallel=True)
    job, hw = Job(stack="megatron-core"), get_profile("h100-80g")
    sparse = read(V32)
    times = [float(evaluate_one(m, lay, job, gpu="h100-80g").time.optimizer[0]) for m in (sparse, dense_twin(sparse))]
    hbm = hw.gpu.hbm_bytes_per_s * hw.efficiency.memory
    assert times[0] - times[1] == pytest.approx(61 * sparse.indexer_params * (4 + 24 + 2) / hbm, rel=1e-6)


def test_a_stack_without_sparse_attention_is_refused_in_one_line(capsys):
    """DSA's time and memory are Megatron-Core's dsa variant's: torchtitan's stacks (the default) do
    not run it; the refusal names the stacks that do."""
    model, hw = read(V32), get_profile("h100-80g")
    with pytest.raises(PlannerError) as err:
        search(model, hw, Job(stack="fsdp2"), 256, Pins())
    assert err.value.field == "stack" and "megatron-core" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("changes, key", [
    ({"index_topk_pattern": 5}, "index_topk_pattern"),
    ({"indexer_types": [["full"]]}, "indexer_types"),
    ({"index_topk_freq": 0}, "index_topk_freq"),
    ({"index_n_heads": 0}, "index_n_heads"),
])
def test_malformed_indexer_keys_are_one_line(changes, key):
    with pytest.raises(PlannerError) as err:
        read({**GLM5, **changes})
    assert err.value.field == f"hf_config {key}" and "\n" not in str(err.value)
