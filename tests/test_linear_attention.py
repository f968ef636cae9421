"""Linear attention (Gated DeltaNet) beside gated softmax attention: Qwen3-Next and Qwen3.5 (dense
and MoE). Parameter counts against transformers and written out, FLOPs against Megatron-LM's count
of a Gated DeltaNet layer, the attention kernel's time and the activations by hand, the layout rules
(tensor parallel splits the linear heads; context parallel by Megatron-Core's all-to-all on the
stacks that run it, refused on the others), LoRA's adapters, the exports, and bad input in one line."""

import json
import math

import pytest

from planner.cli.main import main
from planner.core.finetune import trainable_params
from planner.core.flops import attention_core_flops, attention_flops_per_token, model_flops_per_token
from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer, context_parallel_working
from planner.core.model import ModelSpec
from planner.core.options import model_from_hf_config
from planner.core.search import Pins, search
from planner.core.steptime import attention_times, reference_peak
from planner.errors import PlannerError
from planner.hardware import get_profile
from planner.stacks import software
from tests.helpers import evaluate_one
from tests.test_hf_configs import DATA

# file: (parameters, active, linear layers of layers). Parameters: Hugging Face transformers 5.25.0's
# model built from the file on the meta device (the language model; the multi-token-prediction layer
# is not built, as for DeepSeek-V3). The checkpoints' totals add the vision tower and that layer:
# Qwen3.5-27B 27,781,427,952, Qwen3.5-35B-A3B 35,951,822,704, Qwen3-Next 81,324,862,720.
CONFIGS = {
    "Qwen3-Next-80B-A3B-Instruct": (79_674_391_296, 3_874_929_408, 36, 48),
    "Qwen3.5-0.8B": (752_393_024, 752_393_024, 18, 24),
    "Qwen3.5-27B": (26_895_998_464, 26_895_998_464, 48, 64),
    "Qwen3.5-35B-A3B": (34_660_610_688, 3_454_988_928, 30, 40),
}


def small(**changes):
    """Qwen3.5-0.8B's shape at a 4096-token context."""
    spec, _ = model_from_hf_config(DATA / "Qwen3.5-0.8B.config.json")
    return spec.replace(**{"seq_len": 4096, **changes})


@pytest.mark.parametrize("name", CONFIGS)
def test_the_configs_count_as_transformers_builds_them(name):
    spec, _ = model_from_hf_config(DATA / f"{name}.config.json")
    assert (spec.params, spec.active_params, spec.linear_layers, spec.layers) == CONFIGS[name]
    assert spec.output_gate and spec.qk_norm == "head"


def test_qwen3_5_0_8b_by_hand():
    """24 layers, every fourth softmax attention: q's projection 1024 x (2 x 8 x 256) (the query and
    its gate), k and v 1024 x 512, o 2048 x 1024, per-head q/k norms of 256; the 18 others Gated
    DeltaNet with 16 key and 16 value heads of 128: in_proj q, k, v 1024 x 6144, z 1024 x 2048, b and
    a 1024 x 16 each, out 2048 x 1024, the depthwise convolution 6144 x 4, dt_bias and A_log (16
    each), the gated norm's 128; a 3584-wide SwiGLU and two norms in every layer; the tied 248320
    embedding and the final norm."""
    spec, _ = model_from_hf_config(DATA / "Qwen3.5-0.8B.config.json")
    h = 1024
    softmax = h * 4096 + 2 * h * 512 + 2048 * h + 2 * 256
    linear = h * 6144 + h * 2048 + 2 * h * 16 + 2048 * h + 6144 * 4 + 2 * 16 + 128
    mlp = 3 * h * 3584 + 2 * h
    assert spec.linear_attention_params == linear == 10_543_264
    assert spec.params == 6 * softmax + 18 * linear + 24 * mlp + 248320 * h + h == 752_393_024


def test_model_flops_are_megatron_s_count_of_each_layer():
    """Megatron-LM (training.py, num_floating_point_operations) counts a Gated DeltaNet layer as
    6 * [h (2 qk + 2 v + 2 Hv) + K (2 qk + v) + 4 Hv dv^2 + h v] per token (qk = Hk dk, v = Hv dv), a
    gated softmax layer as 6 * [h (2 q + k + v) + q h] plus 6 * s * q causal (q = heads * head_dim),
    the MLP 6 * 3 h f and the head 6 h V. Qwen3.5-0.8B at 4096 tokens."""
    spec = small()
    h, s, f, v_ = 1024, 4096, 3584, 248320
    qk = v = 16 * 128
    gdn = 6 * (h * (2 * qk + 2 * v + 2 * 16) + 4 * (2 * qk + v) + 4 * 16 * 128**2 + h * v)
    q = 8 * 256
    softmax = 6 * (h * (2 * q + 512 + 512) + q * h) + 6 * s * q  # causal: half of 12 * s * q
    expected = 18 * gdn + 6 * softmax + 24 * 6 * 3 * h * f + 6 * h * v_
    assert model_flops_per_token(spec) == pytest.approx(expected, rel=1e-12)
    assert spec.attention_span == 6 / 24
    # The full square (standard attention, HFU's masked part) is the softmax layers' only.
    assert attention_flops_per_token(spec, causal=False) == pytest.approx(
        6 * 4 * s * q + 18 * 8 * 16 * 128 * 128, rel=1e-12)
    assert attention_core_flops(spec, 1, 1, causal=False) == pytest.approx(6 / 24 * 2 * s * s * 2 * q, rel=1e-12)


def test_the_attention_kernel_time_adds_the_delta_rule_at_the_flash_kernel_s_rate():
    """Per layer (the mean) per micro-batch: the softmax layers' causal flash attention, 6/24 of it,
    and the linear layers' 8 Hv dk dv per token, 18/24 of them, at the flash kernel's fraction of the
    16-bit peak; backward 2.5x forward."""
    spec, hw, job = small(), get_profile("h100-80g"), Job(precision="bf16")
    c = Candidates.from_layouts([Layout(dp=8, micro_batch=2, global_batch=16)])
    fwd, bwd = (float(x[0]) for x in attention_times(spec, hw, job, c, software(job)))
    peak = reference_peak(hw, "bf16") * hw.efficiency.flash_attention
    s, q = 4096, 8 * 256
    softmax = 6 / 24 * 0.5 * 2 * 2 * s * s * 2 * q
    linear = 18 / 24 * 2 * s * 8 * 16 * 128 * 128
    assert fwd == pytest.approx((softmax + linear) / peak, rel=1e-9)
    assert bwd == pytest.approx(2.5 * fwd, rel=1e-12)


def test_at_a_long_context_linear_layers_make_the_step_shorter():
    """The same shape with every layer softmax attention (its gate kept) at 32K tokens: the hybrid's
    attention is a quarter of the softmax work plus the linear kernels'; its step is shorter."""
    hybrid = small(seq_len=32768)
    dense = ModelSpec(**{f: getattr(hybrid, f) for f in ("name", "arch", "layers", "hidden", "heads", "kv_heads",
                                                         "ffn_hidden", "vocab", "seq_len", "tied_embeddings",
                                                         "head_dim", "qk_norm", "output_gate")})
    hw, job = get_profile("h100-80g"), Job(precision="bf16", global_batch=64)
    times = {}
    for name, spec in (("hybrid", hybrid), ("dense", dense)):
        r = search(spec, hw, job, 8, Pins(tp=1, pp=1, cp=1, micro_batch=1, recompute="full", zero_stage=3))
        times[name] = float(r.evaluation.time.step[0])
    assert times["hybrid"] < 0.8 * times["dense"]


def test_a_linear_layer_keeps_its_tensors_for_backward_by_hand():
    """Per token, e = 2 bytes, one GPU, flash attention, no recompute: a gated softmax layer keeps
    q, k, v and the projection input (e (q + 2 kv) + e q: 8 heads of 256, twice the hidden width)
    plus the gate and the output before it
    (2 e q); a Gated DeltaNet layer the convolution's input and the kernel's q, k, v (2 e (2 qk + v)),
    z, the kernel's and the norm's outputs (3 e v), beta (twice), the fp32 decay and the 64-wide
    chunk triangle per value head (Hv (2 e + 4 + 64 e)); the layer is the mean, 6 of 24 softmax."""
    spec, job = small(), Job(precision="bf16")
    c = Candidates.from_layouts([Layout(dp=8, micro_batch=1, global_batch=8)])
    e, h, kv, q = 2, 1024, 512, 8 * 256
    qk = v = 16 * 128
    hybrid = float(activation_bytes_per_layer(spec, c, job)[0])
    plain = float(activation_bytes_per_layer(spec.replace(linear_layers=0, linear_key_heads=0, linear_value_heads=0,
                                                    linear_key_dim=0, linear_value_dim=0, linear_conv=0,
                                                    output_gate=False), c, job)[0])
    attention = e * (q + 2 * kv) + e * q
    assert q == 2 * h
    gated = attention + 2 * e * q
    linear = 2 * e * (2 * qk + v) + 3 * e * v + 16 * (2 * e + 4 + 64 * e)
    lse = 4 * 8  # flash attention's log-sum-exp per head, softmax layers only
    per_token = (6 * gated + 18 * linear) / 24 - attention - lse + 6 / 24 * lse
    assert hybrid - plain == pytest.approx(per_token * 4096, rel=1e-12)


def test_tensor_parallel_splits_the_linear_heads_and_torchtitan_refuses_context_parallel(capsys):
    spec = ModelSpec(arch="llama", layers=8, hidden=1024, heads=16, kv_heads=16, linear_layers=6,
                     linear_key_heads=2, linear_value_heads=6, linear_key_dim=64, linear_value_dim=64, linear_conv=4,
                     seq_len=65536, output_gate=True)
    hw, job = get_profile("h100-80g"), Job(precision="bf16", global_batch=64)
    rows = search(spec, hw, job, 16, Pins()).table.candidates
    assert set(rows.tp.tolist()) == {1, 2} and set(rows.cp.tolist()) == {1}  # 2 key heads, 6 value heads
    with pytest.raises(PlannerError) as err:
        search(spec, hw, job, 16, Pins(tp=4))
    assert "linear_key_heads=2 and linear_value_heads=6" in str(err.value)
    with pytest.raises(PlannerError) as err:
        search(spec, hw, job, 16, Pins(cp=2))
    assert err.value.field == "cp" and "linear-attention layers" in str(err.value)
    assert "megatron-core" in str(err.value)  # names the stacks that run it
    code = main(["estimate", "--hf-config", str(DATA / "Qwen3.5-27B.config.json"), "--seq-len", "32768",
                 "--gpus", "64", "--gpu", "h100", "--cp", "2"])
    assert code == 2 and capsys.readouterr().err.count("\n") == 1


MEGATRON = Job(precision="bf16", global_batch=1, stack="megatron-core")


def test_megatron_core_splits_linear_layers_over_context_parallel_by_whole_heads(capsys):
    """Megatron-Core's Gated DeltaNet trades the sequence split for a head split (its in_proj
    split sections must divide by cp after TP): every searched layout gives each rank whole linear
    key and value heads, tp*cp dividing 2 and 6 here."""
    spec = ModelSpec(arch="llama", layers=8, hidden=1024, heads=16, kv_heads=16, linear_layers=6,
                     linear_key_heads=2, linear_value_heads=6, linear_key_dim=64, linear_value_dim=64, linear_conv=4,
                     seq_len=65536, output_gate=True)
    hw = get_profile("h100-80g")
    rows = search(spec, hw, MEGATRON.replace(global_batch=64), 16, Pins()).table.candidates
    pairs = set(zip(rows.tp.tolist(), rows.cp.tolist()))
    assert {(1, 2), (2, 1)} <= pairs <= {(1, 1), (1, 2), (2, 1)}
    with pytest.raises(PlannerError) as err:
        search(spec, hw, MEGATRON.replace(global_batch=64), 16, Pins(tp=2, cp=2))
    assert err.value.field == "cp" and "tp*cp=4 must divide linear_key_heads=2" in str(err.value)
    code = main(["estimate", "--hf-config", str(DATA / "Qwen3.5-27B.config.json"), "--gpus", "64", "--gpu", "h100",
                 "--stack", "megatron-core", "--tp", "2", "--cp", "32"])
    assert code == 2 and capsys.readouterr().err.count("\n") == 1
    # cp implied by the other degrees (64 / 4 = 16): tp*cp = 64 splits no 16 key heads; the line says so
    code = main(["estimate", "--hf-config", str(DATA / "Qwen3.5-27B.config.json"), "--gpus", "64", "--gpu", "h100",
                 "--stack", "megatron-core", "--tp", "4", "--pp", "1", "--dp", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "tp*cp dividing linear_key_heads=16" in err


def test_context_parallel_splits_the_delta_rule_over_heads():
    """Each of cp ranks runs the whole sequence of 1/cp of the linear heads, and 1/cp of the
    softmax layers' load-balanced triangle: the attention kernels take 1/cp of the time (the softmax
    layers' at Megatron-Core's fused kernel's rate, the delta rule's at the flash kernel's)."""
    spec, hw = small(seq_len=65536), get_profile("h100-80g")
    one, four = (Candidates.from_layouts([Layout(dp=1, cp=cp, micro_batch=1, global_batch=1)]) for cp in (1, 4))
    peak, e = reference_peak(hw, "bf16"), hw.efficiency
    s, q = 65536, 8 * 256
    for c, cp in ((one, 1), (four, 4)):
        fwd = float(attention_times(spec, hw, MEGATRON, c, software(MEGATRON))[0][0])
        softmax = 6 / 24 * 0.5 * 2 * s * s * 2 * q / cp  # one sequence: the triangle's QK^T and AV
        linear = 18 / 24 * s * 8 * 16 * 128 * 128 / cp
        assert fwd == pytest.approx(softmax / (peak * e.fused_attention) + linear / (peak * e.flash_attention),
                                    rel=1e-9)


def test_the_linear_layers_all_to_alls_by_hand():
    """Qwen3.5-0.8B at 65,536 tokens, cp 4 inside one node, no recompute: each of the 18 linear
    layers sends its input projection's output (q, k: 16 x 128; v, z: 16 x 128; beta, a: 16 each,
    8224 wide, 16-bit) from the rank's 16,384 tokens to the heads' layout, and its 2048-wide output
    back, each an all-to-all keeping 1/4 and sending 3/4 over NVLink; the backward sends both
    gradients. The 6 softmax layers' ring is hidden behind their attention (megatron-core's
    cp_overlap 1). One micro-batch, one stage: the step's CP time is the 24 layers' sum."""
    spec, hw = small(seq_len=65536), get_profile("h100-80g")
    ev = evaluate_one(spec, Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=1), MEGATRON,
                      gpu="h100-80g")
    bw = hw.network.intra_bytes_per_s * hw.efficiency.intra_node_bw
    lat = hw.network.intra_latency_s
    tokens = 65536 / 4
    into = 3 / 4 * 2 * tokens * (2 * 2048 + 2 * 2048 + 2 * 16) / bw + lat
    back = 3 / 4 * 2 * tokens * 2048 / bw + lat
    assert float(ev.time.cp_comm[0]) == pytest.approx(18 * 2 * (into + back), rel=1e-9)
    full = evaluate_one(spec, Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=1, recompute="full"),
                        MEGATRON, gpu="h100-80g")
    assert float(full.time.cp_comm[0]) == pytest.approx(18 * 3 * (into + back), rel=1e-9)  # forward again


def test_the_all_to_all_working_memory_by_hand():
    """While a linear layer runs under cp 4, its projection's output is held twice beside what the
    layer keeps (the copy permuted for the exchange, the exchange's output before the load
    balancing is undone): 2 x 2 bytes x 16,384 tokens x 8224. The softmax layers' gathered K/V and
    its gradient (2 x 2 bytes x 65,536 x 512, twice) are smaller; the larger is the working set."""
    spec = small(seq_len=65536)
    c = Candidates.from_layouts([Layout(dp=1, cp=4, micro_batch=1, global_batch=1, zero_stage=1)])
    linear = 2 * 2 * 16384 * 8224
    softmax = 2 * (2 * 2 * 65536 * 512)
    assert softmax < linear
    assert float(context_parallel_working(spec, c, MEGATRON, software(MEGATRON))[0]) == pytest.approx(linear,
                                                                                                        rel=1e-12)


def test_qwen3_5_27b_at_its_file_context_fits_only_where_context_parallel_runs():
    """At 262,144 tokens on 64 H100: torchtitan (no context parallel for Qwen3.5) has no layout that
    fits; Megatron-Core's all-to-all splits the linear layers too, and a layout fits."""
    spec, _ = model_from_hf_config(DATA / "Qwen3.5-27B.config.json")
    hw, job = get_profile("h100-80g"), Job(precision="bf16", global_batch=16)
    assert not search(spec, hw, job, 64, Pins()).fits.any()
    megatron = search(spec, hw, job.replace(stack="megatron-core"), 64, Pins())
    best = megatron.ranked([0]).candidates
    assert megatron.fits.any() and int(best.cp[0]) > 1 and 16 % int(best.tp[0] * best.cp[0]) == 0


def test_lora_adapts_q_k_v_o_in_the_softmax_layers_only():
    """PEFT's q_proj, k_proj, v_proj, o_proj exist in the 6 softmax layers (q's projection twice as
    wide: the gate); a Gated DeltaNet layer has none of them, and every layer has its MLP's."""
    spec = small()
    job = Job(mode="lora", lora_r=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                    "up_proj", "down_proj"))
    r, h = 16, 1024
    attention = r * ((h + 4096) + (h + 512) + (h + 512) + (2048 + h))
    mlp = r * 3 * (h + 3584)
    assert trainable_params(spec, job) == 6 * attention + 24 * mlp


@pytest.mark.parametrize("changes, field", [
    ({"linear_key_heads": 4}, "linear_key_heads"),
    ({"linear_layers": 8, "linear_key_heads": 2, "linear_value_heads": 2, "linear_key_dim": 8,
      "linear_value_dim": 8, "linear_conv": 4}, "linear_layers"),
    ({"linear_layers": 2, "linear_key_heads": 4, "linear_value_heads": 6, "linear_key_dim": 8,
      "linear_value_dim": 8, "linear_conv": 4}, "linear_value_heads"),
    ({"linear_layers": 2, "linear_key_heads": 2, "linear_value_heads": 2, "linear_key_dim": 8,
      "linear_value_dim": 8, "linear_conv": 0}, "linear_conv"),
    ({"linear_layers": 2, "linear_key_heads": 2, "linear_value_heads": 2, "linear_key_dim": 8,
      "linear_value_dim": 8, "linear_conv": 4, "window": 128}, "window"),
    ({"linear_layers": 2, "linear_key_heads": 2, "linear_value_heads": 2, "linear_key_dim": 8,
      "linear_value_dim": 8, "linear_conv": 4, "arch": "gpt"}, "linear_layers"),
    ({"output_gate": 1}, "output_gate"),
])
def test_bad_linear_fields_are_one_line(changes, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(**{"arch": "llama", "layers": 8, "hidden": 256, "heads": 4, **changes})
    assert err.value.field == field and "\n" not in str(err.value)


def test_the_layer_pattern_comes_from_layer_types_or_the_interval(tmp_path):
    cfg = json.loads((DATA / "Qwen3.5-27B.config.json").read_text())
    text = cfg["text_config"]
    path = tmp_path / "config.json"
    types = ["linear_attention", "full_attention"] * 32
    path.write_text(json.dumps({**cfg, "text_config": {**text, "layer_types": types}}))
    assert model_from_hf_config(path)[0].linear_layers == 32
    del text["layer_types"]
    path.write_text(json.dumps({**cfg, "text_config": {**text, "full_attention_interval": 8}}))
    assert model_from_hf_config(path)[0].linear_layers == 56
    for bad, key in ((["linear_attention", "sliding_attention"] * 32, "layer_types"), (0, "full_attention_interval")):
        entry = {"layer_types": bad} if key == "layer_types" else {"full_attention_interval": bad}
        path.write_text(json.dumps({**cfg, "text_config": {**text, **entry}}))
        with pytest.raises(PlannerError) as err:
            model_from_hf_config(path)
        assert key in str(err.value) and "\n" not in str(err.value)


def test_the_exports(capsys):
    """Megatron-Core: --attention-output-gate, --experimental-attention-variant gated_delta_net with
    --linear-attention-freq 4 and the linear heads; torchtitan's Gated DeltaNet model has no TOML job
    config and the reference trainer builds none: both refused in one line naming linear_layers."""
    args = ["--hf-config", str(DATA / "Qwen3-Next-80B-A3B-Instruct.config.json"), "--seq-len", "4096",
            "--gpus", "128", "--gpu", "h100"]
    assert main(["export", *args, "--format", "megatron"]) == 0
    text = capsys.readouterr().out
    for flag in ("--attention-output-gate", "--experimental-attention-variant gated_delta_net",
                 "--linear-attention-freq 4", "--linear-num-key-heads 16", "--linear-num-value-heads 32",
                 "--linear-key-head-dim 128", "--linear-value-head-dim 128", "--linear-conv-kernel-dim 4",
                 "--moe-shared-expert-gate", "--qk-layernorm"):
        assert flag in text
    for fmt in ("torchtitan", "torchrun"):
        assert main(["export", *args, "--format", fmt]) == 2
        err = capsys.readouterr().err
        assert "linear_layers=36" in err and err.count("\n") == 1
    from planner.export.rules import megatron_checks

    odd = small(linear_layers=17)  # 7 softmax layers of 24: no every-N-th pattern
    assert [e.field for e in megatron_checks(Layout(dp=1, micro_batch=1, global_batch=1), odd, Job())] == [
        "linear_layers"]


def test_every_output_is_finite_and_the_json_names_the_linear_fields(capsys):
    for name in CONFIGS:
        assert main(["estimate", "--hf-config", str(DATA / f"{name}.config.json"), "--seq-len", "4096",
                     "--gpus", "64", "--gpu", "h100", "--format", "json"]) == 0
        out = json.loads(capsys.readouterr().out)
        model = out["model"]
        assert model["linear_layers"] == CONFIGS[name][2] and model["output_gate"] is True
        assert math.isfinite(out["time"]["step_s"]) and 0 < out["mfu"] < 1
    assert main(["estimate", "--preset", "llama3-8b", "--gpus", "8", "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)["model"]
    assert "linear_layers" not in plain and "output_gate" not in plain
