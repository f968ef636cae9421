"""Gemma 4's language model (model_type gemma4, text_config gemma4_text): the full-attention layers
with an attention shape of their own (head_dim 512, their own K/V heads, K used as V) beside the
sliding-window layers, and the 26B-A4B MoE layer (128 experts beside a dense MLP, the router's
scales, three more norms). Parameter counts against transformers and written out, the attention
core's FLOPs, the activations and LoRA's adapters by hand, tensor parallel over the fewest K/V
heads, the exports that cannot write it, and what is not modelled (E2B's and E4B's per-layer
embeddings and shared K/V) refused in one line."""

import json
import math

import pytest

from planner.cli.main import main
from planner.core.finetune import trainable_params
from planner.core.flops import attention_flops_per_token
from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer
from planner.core.model import ModelSpec
from planner.core.options import model_from_hf_config
from planner.core.search import Pins, search
from planner.errors import PlannerError
from planner.hardware import get_profile
from tests.test_hf_configs import DATA

G31 = DATA / "gemma-4-31B-it.config.json"
G26 = DATA / "gemma-4-26B-A4B.config.json"


def spec(path=G31, **changes):
    model, _ = model_from_hf_config(path)
    return model.replace(**changes) if changes else model


@pytest.mark.parametrize("path, total, active", [
    # Hugging Face transformers 5.25.0's Gemma4ForConditionalGeneration built from the file on the
    # meta device, the parameters under model.language_model (the vision tower is not planned)
    (G31, 30_697_345_280, 30_697_345_280),
    (G26, 25_233_141_760, 3_822_530_560),
])
def test_the_configs_count_as_transformers_builds_them(path, total, active):
    model = spec(path)
    assert (model.params, model.active_params) == (total, active)


def test_gemma_4_31b_by_hand():
    """50 sliding-window layers: q 32 x 256, k and v 16 x 256, o, per-head q and k norms (v's has no
    weight); 10 full-attention layers: q 32 x 512, k 4 x 512 used as v (no v_proj), o, norms of 512;
    every layer a GeGLU MLP of 21504 and four norms; the tied embedding and the final norm."""
    model = spec()
    h = 5376
    sliding = h * 8192 + 2 * h * 4096 + 8192 * h + 2 * 256
    full = h * 16384 + h * 2048 + 16384 * h + 2 * 512
    rest = 3 * h * 21504 + 4 * h
    assert model.params == 50 * (sliding + rest) + 10 * (full + rest) + 262144 * h + h == 30_697_345_280
    assert (model.window, model.window_layers, model.global_layers) == (1024, 50, 10)
    assert (model.global_head_dim, model.global_kv_heads, model.global_k_eq_v) == (512, 4, True)
    assert model.seq_len == 262144 and model.tied_embeddings


def test_gemma_4_26b_a4b_moe_layer_by_hand():
    """Every layer: 128 experts of 704 (top 8) beside a dense GeGLU MLP of 2112 (planned as 3 shared
    experts of 704), the router (128 x h, a scale per channel, one per expert) and three norms more
    (the experts' input, each MLP output); attention as 31B's at h 2816, 16 heads, 8 sliding / 2 full
    K/V heads."""
    model = spec(G26)
    h = 2816
    sliding = h * 4096 + 2 * h * 2048 + 4096 * h + 2 * 256
    full = h * 8192 + h * 1024 + 8192 * h + 2 * 512
    expert = 3 * h * 704
    rest = 128 * expert + 3 * h * 2112 + (128 * h + h + 128) + 7 * h
    assert model.params == 25 * (sliding + rest) + 5 * (full + rest) + 262144 * h + h
    assert model.active_params == model.params - 30 * 120 * expert
    assert (model.experts, model.top_k, model.expert_ffn, model.shared_experts) == (128, 8, 704, 3)
    assert (model.router_scale, model.moe_norms) == (True, 3)


def test_the_attention_core_by_hand():
    """Forward attention FLOPs per token at 8192 tokens: a sliding layer computes (2 - r) r of the
    causal triangle (r = 1024 / 8192) at q + v widths of 8192 + 8192; a full layer the whole triangle
    at 16384 + 16384."""
    s = 8192
    model = spec(seq_len=s)
    r = 1024 / s
    per_token = 0.5 * 2 * s * (50 * (2 - r) * r * 16384 + 10 * 32768)
    assert attention_flops_per_token(model) == pytest.approx(per_token, rel=1e-12)


def test_the_activations_take_each_kind_of_layer_s_widths_by_hand():
    """Per token and layer (16-bit, flash attention, megatron-core: Q, K, V and the output kept):
    a sliding layer 8192 + 4096 + 4096 + 8192, a full one 16384 + 2048 + 2048 + 16384 (K used as V
    is still a V tensor for the kernel); the mean over 50 and 10, against every layer sliding."""
    model, job = spec(seq_len=8192), Job(precision="bf16", stack="megatron-core")
    plain = model.replace(global_head_dim=0, global_kv_heads=0, global_k_eq_v=False)
    c = Candidates.from_layouts([Layout(dp=8, micro_batch=1, global_batch=8)])
    mean = (50 * 24576 + 10 * 36864) / 60
    gap = float(activation_bytes_per_layer(model, c, job)[0] - activation_bytes_per_layer(plain, c, job)[0])
    assert gap == pytest.approx(2 * (mean - 24576) * 8192, rel=1e-12)


@pytest.mark.parametrize("kernels, kept, streamed", [
    ("fused", 2, 2),  # one kernel: its 16-bit input kept; the input read and the output written
    # eager, on a stack whose eager RMSNorm keeps the normalised tensor too (reference's "plain"):
    # 2 + 2 bytes kept; square, mean, rsqrt and two products read and write 7 values
    ("eager", 4, 7),
])
def test_the_moe_layer_s_three_norms_keep_their_inputs_and_stream_through_hbm_by_hand(kernels, kept, streamed):
    """26B-A4B's MoE layers have three norms beyond the four of a Gemma layer (after the dense MLP,
    before and after the experts), each keeping and streaming what the layer's own norms do: a fused
    RMSNorm keeps its 16-bit input for backward (2 bytes x 2,816 a token, split by TP under
    sequence parallel) and reads and writes it once forward. At 4,096 tokens, tp 2: the mean
    layer, every one of its 30 an MoE layer, keeps 3 x 2 x 2,816 x 4,096 / 2 bytes more than
    without them, and its forward streams 3 x 2 x 2 x 2,816 x 4,096 / 2 bytes more through HBM."""
    from planner.core import steptime
    from planner.core.comm import Links
    from planner.core.memory import layer_activation_bytes
    from planner.stacks import effective, software

    with_norms = spec(G26, seq_len=4096)
    without = with_norms.replace(moe_norms=0)
    assert (with_norms.moe_norms, with_norms.moe_layers, with_norms.layers, with_norms.hidden) == (3, 30, 30, 2816)
    job = Job(kernels=kernels, stack="reference" if kernels == "eager" else "fsdp2")
    assert software(job).stack.eager_norm == ("plain" if kernels == "eager" else "fused")
    c = Candidates.from_layouts([Layout(dp=4, tp=2, micro_batch=1, global_batch=4, sequence_parallel=True)])
    for table in (c, c.one_row()):
        held = [float(layer_activation_bytes(m, table, job)[0] if table is c else layer_activation_bytes(m, table, job))
                for m in (with_norms, without)]
        assert held[0] - held[1] == pytest.approx(3 * kept * 2816 * 4096 / 2, rel=1e-12)
    # Every second layer recomputed whole (it keeps its input alone): half the difference, the table
    # (its recompute as two rows, with and without) and the one layout alike, to the bit.
    from planner.core.memory import layer_activations_and_working

    half = Candidates.from_layouts([Layout(dp=4, tp=2, micro_batch=1, global_batch=4, sequence_parallel=True,
                                           recompute="half")])
    rows = [layer_activations_and_working(m, half, job, software(job)) for m in (with_norms, without)]
    ones = [layer_activations_and_working(m, half.one_row(), job, software(job)) for m in (with_norms, without)]
    assert [float(x[0]) for x in rows[0]] == list(ones[0]) and [float(x[0]) for x in rows[1]] == list(ones[1])
    assert ones[0][0] - ones[1][0] == pytest.approx(0.5 * 3 * kept * 2816 * 4096 / 2, rel=1e-12)
    hw = get_profile("h100-80g")
    sw = software(job)
    hw_eff = effective(hw, sw.stack, False)
    one = c.one_row()
    fwd = [steptime.layer_times(m, hw_eff, job, one, Links.of(hw_eff), sw).forward for m in (with_norms, without)]
    hbm = hw_eff.gpu.hbm_bytes_per_s * hw_eff.efficiency.memory
    assert fwd[0] - fwd[1] == pytest.approx(3 * streamed * 2 * 2816 * 4096 / 2 / hbm, rel=1e-9)


def test_lora_adapts_each_layer_s_own_projections_by_hand():
    """r 8 on q_proj and v_proj: the 50 sliding layers' q (5376 -> 8192) and v (5376 -> 4096), the 10
    full layers' q (5376 -> 16384) and no v (K is used as V)."""
    job = Job(mode="lora", lora_r=8, lora_targets=("q_proj", "v_proj"))
    h = 5376
    assert trainable_params(spec(), job) == 50 * 8 * ((h + 8192) + (h + 4096)) + 10 * 8 * (h + 16384) == 10_956_800


def test_tensor_parallel_splits_the_full_layers_two_k_v_heads_too(capsys):
    """26B-A4B's full-attention layers have 2 K/V heads: tp 1 or 2 only (transformers' own plan
    keeps its attention unsplit for that reason)."""
    model, hw = spec(G26, seq_len=8192), get_profile("h100-80g")
    rows = search(model, hw, Job(precision="bf16", global_batch=64), 16, Pins()).table.candidates
    assert set(rows.tp.tolist()) == {1, 2}
    with pytest.raises(PlannerError) as err:
        search(model, hw, Job(precision="bf16", global_batch=64), 16, Pins(tp=4))
    assert err.value.field == "tp" and "global_kv_heads=2" in str(err.value)


def test_the_exports_that_cannot_write_it_say_so_in_one_line(capsys):
    base = ["--hf-config", str(G31), "--gpus", "8", "--gpu", "h100", "--seq-len", "8192"]
    for fmt in ("megatron", "torchtitan", "torchrun"):
        assert main(["export", *base, "--format", fmt]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--format deepspeed" in err, fmt
    assert main(["export", *base[:3], "32", *base[4:], "--format", "deepspeed"]) == 0  # ZeRO-3 without TP
    assert json.loads(capsys.readouterr().out)["zero_optimization"]


def test_every_output_is_finite_and_the_json_names_the_full_layers(capsys):
    assert main(["estimate", "--hf-config", str(G26), "--gpus", "16", "--gpu", "h100", "--seq-len", "8192",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = out["model"]
    assert (model["global_head_dim"], model["global_kv_heads"], model["global_k_eq_v"]) == (512, 2, True)
    assert (model["router_scale"], model["moe_norms"], model["window_layers"]) == (True, 3, 25)

    def numbers(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from numbers(v)
        elif isinstance(x, list):
            for v in x:
                yield from numbers(v)
        elif isinstance(x, float):
            yield x
    assert all(math.isfinite(v) for v in numbers(out))
    assert main(["estimate", "--hf-config", str(G31), "--gpus", "8", "--gpu", "h100", "--seq-len", "8192"]) == 0
    assert "the 10 full-attention layers head_dim 512, kv_heads 4, K as V" in capsys.readouterr().out.replace("\n ", " ").replace("  ", "")


def test_without_layer_types_five_sliding_to_one_full_the_last_full(tmp_path):
    cfg = json.loads(G31.read_text())
    del cfg["text_config"]["layer_types"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert spec(path).window_layers == 50
    cfg["text_config"]["num_hidden_layers"] = 62  # layers 5, 11, ..., 59 full, and 61 forced full
    path.write_text(json.dumps(cfg))
    assert spec(path).window_layers == 62 - 11


@pytest.mark.parametrize("file, changes, key", [
    ("gemma-4-E2B-it", {}, "hidden_size_per_layer_input"),  # per-layer input embeddings
    ("gemma-4-E2B-it", {"hidden_size_per_layer_input": 0}, "num_kv_shared_layers"),
    ("gemma-4-31B-it", {"hidden_size_per_layer_input": None}, "hidden_size_per_layer_input"),  # the class default, 256
    ("gemma-4-31B-it", {"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ("gemma-4-31B-it", {"per_layer_config": {"5": {"head_dim": 512}}}, "per_layer_config"),
    ("gemma-4-31B-it", {"attention_k_eq_v": "yes"}, "attention_k_eq_v"),
    ("gemma-4-26B-A4B", {"intermediate_size": 2000}, "intermediate_size"),
    ("gemma-4-26B-A4B", {"top_k_experts": None}, "top_k_experts"),
    ("gemma-4-26B-A4B", {"moe_intermediate_size": 0}, "moe_intermediate_size"),
    ("gemma-4-26B-A4B", {"num_global_key_value_heads": 0}, "num_global_key_value_heads"),
    ("gemma-4-31B-it", {"global_head_dim": 0}, "global_head_dim"),
])
def test_what_is_not_modelled_or_malformed_is_one_line(tmp_path, capsys, file, changes, key):
    cfg = json.loads((DATA / f"{file}.config.json").read_text())
    cfg["text_config"].update(changes)
    if changes.get("hidden_size_per_layer_input", 0) is None:
        del cfg["text_config"]["hidden_size_per_layer_input"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert err.value.field == f"hf_config text_config {key}" and "\n" not in str(err.value)
    assert main(["estimate", "--hf-config", str(path), "--gpus", "8"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("fields, field", [
    ({"global_head_dim": 512}, "global_head_dim"),  # no window: no full layers of their own
    ({"window": 1024, "global_head_dim": 512}, "global_head_dim"),  # every layer windowed
    ({"window": 1024, "window_layers": 6, "global_kv_heads": 3}, "global_kv_heads"),  # does not divide 8 heads
    ({"window": 1024, "window_layers": 6, "global_k_eq_v": 1}, "global_k_eq_v"),
    ({"window": 1024, "window_layers": 6, "global_head_dim": -1}, "global_head_dim"),
    ({"router_scale": True}, "router_scale"),  # a dense model
    ({"experts": 8, "top_k": 2, "moe_norms": 9}, "moe_norms"),
])
def test_bad_fields_are_one_line(fields, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(arch="llama", layers=8, hidden=512, heads=8, **fields)
    assert err.value.field == field and "\n" not in str(err.value)
