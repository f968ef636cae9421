"""Sliding-window attention, post-norms, gpt-oss's biases and sinks, and the Hugging Face configs
that carry them (Mistral 7B v0.1, Phi-3, Gemma 2 and 3, OLMo 2, gpt-oss, Llama 3.1's RoPE scaling): parameter counts against
transformers, the attention work against a brute-force count of the mask, hand-derived FLOPs and
kernel times, the exports, and bad input in one line."""

import json
from pathlib import Path

import numpy as np
import pytest

from planner.core.flops import (
    attention_core_flops,
    attention_flops_per_token,
    hardware_flops_per_token,
    model_flops_per_token,
)
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.core.options import model_from, model_from_hf_config
from planner.core.steptime import attention_times
from planner.errors import PlannerError
from planner.hardware import get_profile
from planner.stacks import software
from tests.helpers import assert_same, columns, evaluate_one

DATA = Path(__file__).parent / "data"

# file: (parameters, windowed layers, window, seq_len). Parameters: Hugging Face transformers
# 5.25.0's model built from the file on the meta device (sum of p.numel()); windowed layers: the
# "sliding_attention" entries of that config's layer_types (Gemma 2: every second layer from the
# first; Gemma 3: all but every sixth), or every layer where the model applies sliding_window to
# all (Mistral, Phi-3). The counts also equal the released totals: Gemma 2 9B 9,241,705,984, Gemma 3
# 1B 999,885,952 (Hub safetensors), Phi-3-mini 3.8B, OLMo 2 7B 7.3B, Gemma 3 12B's language model
# 11.77B of its 12.2B (the rest is the SigLIP vision tower).
CONFIGS = {
    "gemma-2-9b": (9_241_705_984, 21, 4096, 8192),
    "gemma-3-12b-it": (11_766_034_176, 40, 1024, 131072),
    "gemma-3-1b-pt": (999_885_952, 22, 512, 32768),
    "Phi-3-mini-4k-instruct": (3_821_079_552, 32, 2047, 4096),
    "OLMo-2-1124-7B": (7_298_617_344, 0, 0, 4096),
    "Llama-3.1-8B": (8_030_261_248, 0, 0, 8192),
    "Mistral-7B-v0.1": (7_241_732_096, 32, 4096, 32768),
    "gpt-oss-20b": (20_914_757_184, 12, 128, 4096),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_configs_count_as_transformers_builds_them(name):
    params, windowed, window, seq = CONFIGS[name]
    spec, _ = model_from_hf_config(DATA / f"{name}.config.json")
    assert (spec.params, spec.window_layers, spec.window, spec.seq_len) == (params, windowed, window, seq)


def test_gemma_2_9b_by_hand():
    """Gemma 2 9B: 42 layers of q (3584 x 16*256), k and v (3584 x 8*256), o, a 14336-wide GeGLU
    and four RMSNorms (pre and post, attention and MLP); the tied 256000-token embedding and the
    final norm."""
    spec, _ = model_from_hf_config(DATA / "gemma-2-9b.config.json")
    h = 3584
    attention = h * 4096 * 2 + h * 2048 * 2
    layer = attention + 3 * h * 14336 + 4 * h
    assert spec.params == 42 * layer + 256000 * h + h == 9_241_705_984
    assert spec.post_norms and spec.tied_embeddings and spec.qk_norm == "none"


def test_gemma_3_norms_q_and_k_per_head_and_fills_the_class_defaults():
    """Gemma 3 1B: per-head RMSNorms of q and k (256 each) besides the four block norms."""
    spec, note = model_from_hf_config(DATA / "gemma-3-1b-pt.config.json")
    h = 1152
    layer = h * 1024 * 2 + h * 256 * 2 + 3 * h * 6912 + 4 * h + 2 * 256
    assert spec.params == 26 * layer + 262144 * h + h and spec.qk_norm == "head"
    assert "tie_word_embeddings True (the configuration class's defaults)" in note
    # gemma-3-12b-it names only the widths: the rest are Gemma3TextConfig's defaults, each said.
    spec, note = model_from_hf_config(DATA / "gemma-3-12b-it.config.json")
    assert (spec.vocab, spec.head_dim, spec.tied_embeddings) == (262208, 256, True)
    assert "its language model (text_config; the vision tower is not planned)" in note
    assert "vocab_size 262208, head_dim 256, max_position_embeddings 131072" in note


def test_olmo_2_norms_q_and_k_over_their_full_widths():
    spec, _ = model_from_hf_config(DATA / "OLMo-2-1124-7B.config.json")
    h = 4096
    layer = 4 * h * h + 3 * h * 11008 + 2 * h + (h + h)  # q_norm over 4096, k_norm over 32 x 128
    assert spec.params == 32 * layer + 2 * 100352 * h + h and spec.qk_norm == "full" and not spec.post_norms


def _pairs(s: int, w: int) -> int:
    """Query-key pairs a causal mask with a window of w keeps: query i sees keys max(0, i-w+1)..i."""
    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    return int(((j <= i) & (i - j < w)).sum())


@pytest.mark.parametrize("s, w", [(4096, 2047), (8192, 4096), (4096, 512), (2048, 4096)])
def test_the_attention_span_is_the_share_of_the_mask_a_window_keeps(s, w):
    """Against a brute-force count of the mask: s*w - w*w/2 pairs of the s*s/2 a causal mask
    keeps (to w/2 pairs of the diagonal's, < 0.05% here); a window as long as the sequence keeps
    them all."""
    spec = ModelSpec(arch="llama", layers=4, hidden=256, heads=4, seq_len=s, window=w)
    assert spec.attention_span == pytest.approx(_pairs(s, w) / _pairs(s, s), rel=5e-4)
    mixed = spec.replace(window_layers=1)  # one windowed layer of four
    assert mixed.attention_span == pytest.approx((3 + _pairs(s, w) / _pairs(s, s)) / 4, rel=5e-4)


def test_mistral_attention_flops_by_hand():
    """Mistral 7B v0.1 at 32K with a 4096 window on every layer: w/s = 1/8, so each layer computes
    2/8 - 1/64 = 15/64 of the causal triangle; forward attention per token 15/64 of half of
    2*s*(q + out widths) per layer (QK^T and AV over the whole square), and MFU's FLOPs
    3 x (2 x matmul weights + that)."""
    spec, _ = model_from_hf_config(DATA / "Mistral-7B-v0.1.config.json")
    s, L = 32768, 32
    per_token = 15 / 64 * (2 * s * (4096 + 4096) / 2) * L
    assert attention_flops_per_token(spec) == pytest.approx(per_token, rel=1e-12)
    assert model_flops_per_token(spec) == pytest.approx(3 * (2 * spec.matmul_params_per_token + per_token), rel=1e-12)
    full = spec.replace(window=0)
    assert attention_flops_per_token(full) == pytest.approx(64 / 15 * per_token, rel=1e-12)
    b = np.array([2.0])
    assert float(attention_core_flops(spec, b, np.array([1]))[0]) == pytest.approx(
        15 / 64 * 0.5 * 2 * 2 * s * s * 8192, rel=1e-12)
    # The full square (causal=False) is the full square, window or not.
    assert float(attention_core_flops(spec, b, np.array([1]), causal=False)[0]) == float(
        attention_core_flops(full, b, np.array([1]), causal=False)[0])


def test_a_flash_kernel_skips_what_the_window_masks_and_standard_attention_does_not():
    spec, _ = model_from_hf_config(DATA / "Mistral-7B-v0.1.config.json")
    hw, c = get_profile("h100-80g"), Candidates.from_layouts([Layout(dp=1, micro_batch=1, global_batch=1)])
    for job, ratio in ((Job(), 15 / 64), (Job(attention="standard"), 1.0)):
        windowed = attention_times(spec, hw, job, c, software(job))
        full = attention_times(spec.replace(window=0), hw, job, c, software(job))
        assert float(windowed[0][0]) == pytest.approx(ratio * float(full[0][0]), rel=1e-12)
        assert float(windowed[1][0]) == pytest.approx(ratio * float(full[1][0]), rel=1e-12)
    # HFU under standard attention: the square is computed, the model FLOPs count the window, the
    # difference is what was masked (3x: forward and backward).
    job = Job(attention="standard")
    rc = np.array([0])
    extra = hardware_flops_per_token(spec, job, rc, full_square=True) - model_flops_per_token(spec, job)
    square = 2 * spec.seq_len * 8192 * 32  # per token, all layers, the whole s x s
    assert float(extra[0]) == pytest.approx(3 * (square - attention_flops_per_token(spec)), rel=1e-12)


def test_a_window_as_long_as_the_sequence_changes_nothing():
    base = ModelSpec(arch="llama", layers=8, hidden=1024, heads=8, kv_heads=2, seq_len=4096)
    layout = Layout(dp=2, tp=2, micro_batch=2, global_batch=16, recompute="half")
    assert_same(columns(evaluate_one(base, layout)), columns(evaluate_one(base.replace(window=4096), layout)))
    shorter = evaluate_one(base.replace(window=1024), layout)
    assert float(shorter.time.step[0]) < float(evaluate_one(base, layout).time.step[0])


def test_replace_keeps_a_window_on_every_layer_and_a_partial_count_as_given():
    spec = ModelSpec(arch="llama", layers=8, hidden=512, heads=8, window=256)
    assert spec.replace(layers=12).window_layers == 12
    assert spec.replace(window_layers=3).replace(layers=12).window_layers == 3
    assert spec.replace(window=0).window_layers == 0
    assert spec.replace(window_layers=3).replace(window=0).window_layers == 0
    plain = ModelSpec(arch="llama", layers=8, hidden=512, heads=8)
    assert plain.replace(window=128).window_layers == 8 and plain.replace(layers=4).window_layers == 0


@pytest.mark.parametrize("fields, field", [
    ({"window": -1}, "window"), ({"window": 1.5}, "window"), ({"window": 64, "window_layers": 9}, "window_layers"),
    ({"window_layers": 2}, "window_layers"), ({"post_norms": "yes"}, "post_norms"),
])
def test_bad_window_fields_are_one_line(fields, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(arch="llama", layers=8, hidden=512, heads=8, **fields)
    assert err.value.field == field and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("changes, key", [
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"layer_types": ["chunked_attention"] * 42}, "layer_types"),
    ({"sliding_window": "4096"}, "sliding_window"),
    ({"model_type": "gemma3n_text"}, "model_type"),
])
def test_a_config_the_planner_cannot_read_is_one_line(tmp_path, changes, key):
    cfg = {**json.loads((DATA / "gemma-2-9b.config.json").read_text()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert err.value.field == f"hf_config {key}" and len(str(err.value).splitlines()) == 1


def test_layer_types_decide_and_a_gemma3_config_needs_its_text_config(tmp_path):
    cfg = json.loads((DATA / "gemma-2-9b.config.json").read_text())
    types = ["full_attention"] * 40 + ["sliding_attention"] * 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "layer_types": types}))
    assert model_from_hf_config(path)[0].window_layers == 2
    path.write_text(json.dumps({"model_type": "gemma3", "vision_config": {}}))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert err.value.field == "hf_config text_config"


def test_qwen_windows_the_layers_from_max_window_layers_when_asked(tmp_path):
    cfg = json.loads((DATA / "Qwen2.5-0.5B-Instruct.config.json").read_text())  # use_sliding_window false
    assert model_from_hf_config(DATA / "Qwen2.5-0.5B-Instruct.config.json")[0].window_layers == 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "use_sliding_window": True, "max_window_layers": 20, "sliding_window": 4096}))
    assert model_from_hf_config(path)[0].window_layers == cfg["num_hidden_layers"] - 20


def test_the_context_before_rope_scaling_is_the_default_and_the_note_says_so():
    spec, note = model_from({"hf_config": str(DATA / "Llama-3.1-8B.config.json")})
    assert spec.seq_len == 8192 and "seq 8,192: the context before RoPE scaling" in note
    assert "max_position_embeddings 131,072" in note
    spec, note = model_from({"hf_config": str(DATA / "Llama-3.1-8B.config.json"), "seq_len": 131072})
    assert spec.seq_len == 131072 and "seq 8,192" not in note and "seq_len=131072" in note


def test_the_exports_say_the_window():
    from planner.export.megatron import window_args
    from planner.export.rules import TRAINER_UNBUILT, megatron_checks

    gemma2, _ = model_from_hf_config(DATA / "gemma-2-9b.config.json")
    gemma3, _ = model_from_hf_config(DATA / "gemma-3-12b-it.config.json")
    mistral, _ = model_from_hf_config(DATA / "Mistral-7B-v0.1.config.json")
    # Megatron: layer n (from 1) is full when n % freq == 0: Gemma 2's layers 2, 4, ...; Gemma 3's 6, 12, ...
    assert window_args(gemma2) == ["--window-size", "4096,0", "--window-attn-skip-freq", 2]
    assert window_args(gemma3) == ["--window-size", "1024,0", "--window-attn-skip-freq", 6]
    assert window_args(mistral) == ["--window-size", "4096,0"]
    # Qwen's windowed tail (4 of 28 layers) is no every-N-th pattern: refused, one line naming it.
    qwen = ModelSpec(arch="llama", layers=28, hidden=896, heads=14, kv_heads=2, window=4096, window_layers=4)
    errors = megatron_checks(Layout(dp=1, micro_batch=1, global_batch=1), qwen, Job())
    assert [e.field for e in errors] == ["window_layers"]
    assert TRAINER_UNBUILT["window"] == 0 and TRAINER_UNBUILT["post_norms"] is False


def test_the_window_flags_shape_any_model_and_bad_ones_are_one_line(capsys):
    from planner.cli.main import main

    assert main(["estimate", "--preset", "llama3-8b", "--window", "4096", "--window-layers", "16", "--gpus", "8",
                 "--format", "json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert (model["window"], model["window_layers"]) == (4096, 16)
    for argv in (["--window", "-1"], ["--window-layers", "4"], ["--window", "64", "--window-layers", "33"]):
        assert main(["estimate", "--preset", "llama3-8b", "--gpus", "8", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("window_layers=" if "--window-layers" in argv else "window=") in err


def test_the_explorer_passes_a_shape_window_to_the_cli_flags():
    from planner.app.state import argv_from_mapping, mapping_from_state

    state = {"model": "shape", "layers": 8, "hidden": 1024, "heads": 8, "window": 512, "window_layers": 4}
    m = mapping_from_state(state)
    assert (m["window"], m["window_layers"]) == (512, 4)
    argv = argv_from_mapping(m)
    assert argv[argv.index("--window") + 1] == "512" and argv[argv.index("--window-layers") + 1] == "4"
    spec, _ = model_from(m)
    assert (spec.window, spec.window_layers) == (512, 4)
    assert "window" not in mapping_from_state({**state, "window": 0})  # 0: full attention


def test_gpt_oss_by_hand_and_against_openai_s_active_counts():
    """gpt-oss-20b: 24 layers of biased q (2880 x 64*64), k and v (2880 x 8*64), o (4096 x 2880)
    and 64 sink logits; a router Linear(2880, 32) with its bias; 32 experts of gate/up (2880 x
    2*2880) and down (2880 x 2880), each with biases; two RMSNorms; untied 201088-token embedding
    and head. Active: 4 of 32 experts. OpenAI's model card gives 3.6B active (20b) and 5.1B (120b:
    36 layers, 128 experts), counted without the input embedding."""
    spec, _ = model_from_hf_config(DATA / "gpt-oss-20b.config.json")
    h, e, f = 2880, 32, 2880
    attention = h * 4096 + 4096 + 2 * (h * 512 + 512) + 4096 * h + h + 64
    expert = 3 * h * f + 2 * f + h
    layer = attention + (h + 1) * e + e * expert + 2 * h
    assert spec.params == 24 * layer + 2 * 201088 * h + h
    assert spec.active_params == spec.params - 24 * (e - 4) * expert == 4_187_440_704
    assert (spec.qkv_bias, spec.out_bias, spec.attention_sinks, spec.expert_bias, spec.router_bias) == (
        True, True, True, True, False)
    assert round((spec.active_params - 201088 * h) / 1e9, 1) == 3.6
    big = spec.replace(layers=36, experts=128, window_layers=18)
    assert big.params == 116_829_156_672  # transformers 5.25.0, the 120b shape; the model card's 116.8B
    assert round((big.active_params - 201088 * h) / 1e9, 1) == 5.1
    from planner.export.megatron import megatron_model_args

    args = [str(a) for a in megatron_model_args(spec, "flash")]
    assert "--disable-bias-linear" not in args and args[args.index("--softmax-type") + 1] == "learnable"
    assert args[args.index("--window-size") + 1] == "128,0"


@pytest.mark.parametrize("fields, field", [
    ({"expert_bias": True}, "expert_bias"), ({"out_bias": 1}, "out_bias"), ({"attention_sinks": "yes"}, "attention_sinks"),
])
def test_bad_bias_fields_are_one_line(fields, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(arch="llama", layers=8, hidden=512, heads=8, **fields)
    assert err.value.field == field and len(str(err.value).splitlines()) == 1


def test_a_model_folder_is_read_for_its_config_json(tmp_path):
    folder = tmp_path / "gemma-2-9b"
    folder.mkdir()
    (folder / "config.json").write_bytes((DATA / "gemma-2-9b.config.json").read_bytes())
    spec, _ = model_from_hf_config(folder)
    assert (spec.name, spec.params) == ("gemma-2-9b", 9_241_705_984)
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(tmp_path)  # a folder without one
    assert err.value.field == "hf_config" and "config.json" in str(err.value)


@pytest.mark.parametrize("name, total, active", [
    # transformers 5.25.0's models of the files (the routing bias e_score_correction_bias, a buffer
    # there, counted as the checkpoint stores it); GLM-4.5-Air is announced as 106B total, Kimi K2
    # as 1T total and 32B activated (31.7B here without the input embedding).
    ("GLM-4.5-Air", 106_852_251_264, 13_424_129_664),
    ("Kimi-K2-Instruct", 1_026_408_232_448, 32_861_500_928),
])
def test_glm_and_kimi_configs_count_as_transformers_builds_them(name, total, active):
    spec, _ = model_from_hf_config(DATA / f"{name}.config.json")
    assert (spec.params, spec.active_params) == (total, active)
    assert spec.router_bias and spec.shared_experts == 1 and spec.dense_layers == 1


def test_glm_4_5_biases_q_k_v_and_norms_them_per_head_when_asked():
    """GLM-4.5-Air: q, k, v biased (attention_bias), no QK-norm (use_qk_norm false); GLM-4.5 (92
    layers, hidden 5120, 160 experts of 1536, 3 dense layers, use_qk_norm true) counts
    352,797,829,024 in transformers 5.25.0 (announced 355B with its multi-token-prediction layer)."""
    air, _ = model_from_hf_config(DATA / "GLM-4.5-Air.config.json")
    assert (air.qkv_bias, air.qk_norm, air.head_dim, air.q_width) == (True, "none", 128, 96 * 128)
    big = air.replace(hidden=5120, layers=92, ffn_hidden=12288, expert_ffn=1536, experts=160, dense_layers=3,
                      qk_norm="head")
    assert (big.params, big.active_params) == (352_797_829_024, 33_632_266_144)


@pytest.mark.parametrize("name, said", [
    ("DeepSeek-V3.config.json", "num_nextn_predict_layers 1: its multi-token-prediction module is not planned"),
    ("GLM-4.5-Air.config.json", "num_nextn_predict_layers 1: its multi-token-prediction module is not planned"),
    ("Qwen3.5-27B.config.json", "mtp_num_hidden_layers 1: its multi-token-prediction module is not planned"),
    ("Kimi-K2-Instruct.config.json", None),  # num_nextn_predict_layers 0: none to plan
])
def test_a_multi_token_prediction_module_the_config_declares_is_said_not_planned(name, said, tmp_path):
    """The module trains beside the model (one more layer and a pass of the head each) and
    transformers drops it: the note says the figures are the main model's; the count is the same
    without the key (two modules: "modules are")."""
    model, note = model_from_hf_config(DATA / name)
    if said is None:
        assert "multi-token" not in note
        return
    assert said in note and "these are the main model's figures" in note
    cfg = json.loads((DATA / name).read_text())
    key = said.split()[0]
    where = cfg["text_config"] if key not in cfg and "text_config" in cfg else cfg
    where[key] = 2
    (tmp_path / "two.json").write_text(json.dumps(cfg))
    assert f"{key} 2: its multi-token-prediction modules are not planned" in model_from_hf_config(tmp_path / "two.json")[1]
    del where[key]
    (tmp_path / "none.json").write_text(json.dumps(cfg))
    without, plain = model_from_hf_config(tmp_path / "none.json")
    assert without.params == model.params and "multi-token" not in plain
