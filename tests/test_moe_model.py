"""Mixture-of-experts shapes and attention variants: exact counts against released configs,
published round numbers, hand derivations, the config loader and bad input."""

import json
from pathlib import Path

import pytest

from planner.core.flops import attention_core_flops, attention_flops_per_token
from planner.core.model import ModelSpec
from planner.core.options import model_from_hf_config
from planner.core.presets import get_preset, presets, resolve_params
from planner.errors import PlannerError

DATA = Path(__file__).parent / "data"

# (total, active) of Hugging Face transformers 5.24.0's model built on the meta device from each
# released config.json in tests/data/ (benchmarks/moe_param_counts.py prints them): parameters
# once each plus persistent weight buffers (DeepSeek-V3's e_score_correction_bias); active = total
# less each MoE layer's routed-expert tensors times (experts - top_k) / experts.
TRANSFORMERS_COUNTS = {
    "mixtral-8x7b": ("Mixtral-8x7B-v0.1", 46_702_792_704, 12_879_925_248),
    "mixtral-8x22b": ("Mixtral-8x22B-v0.1", 140_620_634_112, 39_152_031_744),
    "deepseek-v2-lite": ("DeepSeek-V2-Lite", 15_706_484_224, 2_661_150_208),
    "deepseek-v3": ("DeepSeek-V3", 671_026_419_200, 37_552_297_472),
    "qwen3-30b-a3b": ("Qwen3-30B-A3B", 30_532_122_624, 3_353_032_704),
    "qwen1.5-moe-a2.7b": ("Qwen1.5-MoE-A2.7B", 14_315_784_192, 2_689_173_504),
    "olmoe-1b-7b": ("OLMoE-1B-7B-0924", 6_919_161_856, 1_282_017_280),
    "gpt-oss-20b": ("gpt-oss-20b", 20_914_757_184, 4_187_440_704),  # transformers 5.25.0
    "llama4-scout-17b-16e": ("Llama-4-Scout-17B-16E", 107_769_861_120, 17_172_894_720),  # 5.25.0, the text_config
}


@pytest.mark.parametrize("name", TRANSFORMERS_COUNTS)
def test_moe_presets_equal_transformers_counts(name):
    _, total, active = TRANSFORMERS_COUNTS[name]
    spec = get_preset(name)
    assert (spec.params, spec.active_params) == (total, active)


@pytest.mark.parametrize("name, released", [
    # Sums of the released checkpoints' tensors, found quoted in public code and reports:
    ("mixtral-8x7b", 46_702_792_704),  # Hub safetensors total of Mixtral-8x7B(-Instruct)-v0.1; keras-hub preset
    ("mixtral-8x22b", 140_620_634_112),  # Hub safetensors total of the Mixtral-8x22B-v0.1 mirror
    ("deepseek-v2-lite", 15_706_484_224),  # 5,291 safetensors tensors of DeepSeek-V2-Lite-Chat, listed one by one
    ("qwen3-30b-a3b", 30_532_122_624),  # GGUF general.parameter_count; a checkpoint-size check of the shards
    ("qwen1.5-moe-a2.7b", 14_315_784_192),  # keras-hub preset; a serving banner of Qwen1.5-MoE-A2.7B
    ("olmoe-1b-7b", 6_919_161_856),  # the 3,219 safetensors headers of OLMoE-1B-7B-0924-Instruct
])
def test_moe_presets_equal_released_checkpoints(name, released):
    assert get_preset(name).params == released


@pytest.mark.parametrize("name, total_b, active_b, digits", [
    ("mixtral-8x7b", 46.7, 12.9, 1),  # Jiang et al. 2024, "Mixtral of Experts", Sec. 2
    ("mixtral-8x22b", 141, 39, 0),  # Mistral AI, Mixtral 8x22B announcement (Apr 2024)
    ("olmoe-1b-7b", 6.9, 1.3, 1),  # Muennighoff et al. 2024, OLMoE, Table 1
    ("qwen1.5-moe-a2.7b", 14.3, 2.7, 1),  # Qwen1.5-MoE model card
])
def test_published_round_numbers(name, total_b, active_b, digits):
    spec = get_preset(name)
    assert round(spec.params / 1e9, digits) == total_b
    assert round(spec.active_params / 1e9, digits) == active_b


@pytest.mark.parametrize("name, total_b, activated_b, half_unit", [
    ("deepseek-v3", 671, 37, 0.5),  # DeepSeek-V3 Technical Report, abstract: 671B total, 37B activated
    # DeepSeek-V2 paper, App. B: 15.7B total, 2.4B activated (2.45B here: the paper truncates)
    ("deepseek-v2-lite", 15.7, 2.4, 0.06),
])
def test_deepseek_round_numbers_leave_out_the_input_embedding(name, total_b, activated_b, half_unit):
    # DeepSeek's "activated" parameters are the weights a token multiplies: the input embedding
    # (a lookup) is not among them (37.55B with it rounds to 38B); the output head is.
    spec = get_preset(name)
    assert spec.params / 1e9 == pytest.approx(total_b, abs=half_unit)
    assert (spec.active_params - spec.vocab * spec.hidden) / 1e9 == pytest.approx(activated_b, abs=half_unit)
    assert spec.matmul_params_per_token / 1e9 == pytest.approx(activated_b, abs=half_unit)


def test_deepseek_v3_checkpoint_is_the_main_model_plus_mtp_plus_fp8_scales():
    # The released checkpoint: Hub safetensors total 684,531,386,000 = BF16 3,918,786,560 +
    # F8_E4M3 680,571,043,840 + F32 41,555,600. Besides the main model (the preset) it holds the
    # multi-token-prediction module (DeepSeek-V3 report Sec. 2.2; README_WEIGHTS: "11.5B unique
    # parameters", "685B" in all): one MoE layer, eh_proj 2h -> h, RMSNorms enorm, hnorm and the
    # head's norm, with its own copies of the embedding and output head; and one fp32 scale per
    # 128 x 128 block of every fp8 weight (the projections of attention, MLPs and experts).
    spec = get_preset("deepseek-v3")
    h, e, blocks = spec.hidden, spec.experts, lambda rows, cols: -(-rows // 128) * -(-cols // 128)
    mtp = spec.moe_layer_params + 2 * h * h + 3 * h
    assert mtp / 1e9 == pytest.approx(11.5, abs=0.15)
    attention = sum(blocks(*w) for w in [(1536, h), (128 * 192, 1536), (576, h), (128 * 256, 512), (h, 128 * 128)])
    mlp = 2 * blocks(18432, h) + blocks(h, 18432)
    expert = 2 * blocks(2048, h) + blocks(h, 2048)
    scales = (spec.layers + 1) * attention + spec.dense_layers * mlp + (spec.moe_layers + 1) * (e + 1) * expert
    router_bias = (spec.moe_layers + 1) * e  # e_score_correction_bias, stored in fp32
    assert scales + router_bias == 41_555_600
    assert spec.params + mtp + 2 * spec.vocab * h + scales == 684_531_386_000


def test_mla_attention_by_hand():
    # DeepSeek-V3 attention, from the shapes of its projections: q_a (7168 -> 1536) + RMSNorm(1536),
    # q_b (1536 -> 128 x 192), kv_a (7168 -> 512 + 64) + RMSNorm(512), kv_b (512 -> 128 x (128 + 128)),
    # o (128 x 128 -> 7168).
    spec = get_preset("deepseek-v3")
    weights = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert spec.attention_matmul_params == weights
    assert spec.attention_params == weights + 1536 + 512
    assert (spec.attn_qk_dim, spec.attn_v_dim, spec.head_dim) == (192, 128, 192)
    assert (spec.k_width, spec.v_width, 2 * spec.kv_hidden) == (128 * 192, 128 * 128, 128 * 320)
    assert spec.kv_cache_width == 512 + 64  # the latent and the shared RoPE key (DeepSeek-V2 Sec. 2.1.2)


def test_mla_attention_flops_by_hand():
    # QK^T over 192 per head and AV over 128 per head: 2*s*128*(192 + 128) per layer per token,
    # half of it causal.
    spec = get_preset("deepseek-v3")
    s = spec.seq_len
    assert attention_flops_per_token(spec) == 0.5 * 2 * s * 128 * 320 * 61
    assert attention_core_flops(spec, 1, 1, causal=False) == 2 * s * s * 128 * 320


def test_reduced_qwen_moe_equals_a_measured_module_count():
    # torchinfo of a Qwen2MoeForCausalLM with the Qwen1.5-MoE-A2.7B shape cut to 3 layers, 4 experts
    # and vocabulary 1519 (a public model-reading note): 86,003,712 per layer, 264,235,008 in all.
    spec = get_preset("qwen1.5-moe-a2.7b").replace(layers=3, experts=4, vocab=1519)
    assert spec.layers_params == 3 * 86_003_712
    assert spec.params == 264_235_008


def test_qwen3_and_olmoe_attention_by_hand():
    qwen = get_preset("qwen3-30b-a3b")  # q 2048 -> 32 x 128, k and v 2048 -> 4 x 128, o 4096 -> 2048
    assert qwen.attention_params == 2048 * (4096 + 512 + 512) + 4096 * 2048 + 2 * 128  # q_norm, k_norm per head
    olmoe = get_preset("olmoe-1b-7b")  # q_norm and k_norm over the full 2048 widths
    assert olmoe.attention_params == 4 * 2048 * 2048 + 2 * 2048


def test_dense_presets_keep_standard_attention():
    # The new fields' defaults change nothing: q/k/v/o = h(h + 2 kv) + h^2 (+ biases for gpt) and
    # the attention core is 4*s*h per token per layer (2 * attn_core_width = 4h).
    for spec in presets().values():
        if spec.moe:
            continue
        h, kv = spec.hidden, spec.kv_heads * spec.hidden // spec.heads
        bias = (h + 2 * kv) + h if spec.arch == "gpt" else 0
        assert spec.head_dim * spec.heads == h
        assert spec.attention_params == h * (h + 2 * kv) + h * h + bias
        assert spec.attn_core_width == 2 * h and spec.kv_hidden == kv


@pytest.mark.parametrize("name", TRANSFORMERS_COUNTS)
def test_hf_config_loader_reads_the_released_configs(name):
    file, total, active = TRANSFORMERS_COUNTS[name]
    spec, _ = model_from_hf_config(DATA / f"{file}.config.json")
    preset = get_preset(name)
    assert (spec.params, spec.active_params) == (total, active)
    cfg = json.loads((DATA / f"{file}.config.json").read_text())
    cfg = cfg.get("text_config", cfg)  # Llama 4: the language model of an image-and-text config
    # The context before RoPE scaling where the file names it (DeepSeek-V2-Lite, V3: yarn from 4096),
    # else the longest position: the presets keep the pre-training context.
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    assert spec.seq_len == rope.get("original_max_position_embeddings", cfg["max_position_embeddings"])
    assert spec.replace(name=preset.name, seq_len=preset.seq_len) == preset


def test_params_resolution_never_picks_an_moe():
    for target in (46.7e9, 141e9, 671e9, 30.5e9):
        spec, _ = resolve_params(target)
        assert not spec.moe


def test_replace_keeps_an_explicit_head_dim_and_follows_a_derived_one():
    assert get_preset("llama-7b").replace(hidden=2048).head_dim == 64
    assert get_preset("qwen3-30b-a3b").replace(hidden=1024).head_dim == 128


BASE = {"arch": "llama", "layers": 2, "hidden": 64, "heads": 4}


@pytest.mark.parametrize("changes, field", [
    ({"head_dim": 0}, "head_dim"),
    ({"hidden": 66, "heads": 4}, "heads"),
    ({"qk_norm": "rms"}, "qk_norm"),
    ({"qkv_bias": "yes"}, "qkv_bias"),
    ({"q_lora_rank": 32}, "q_lora_rank"),
    ({"kv_lora_rank": 32, "qk_rope_dim": 8, "v_head_dim": 16}, "qk_nope_dim"),
    ({"kv_lora_rank": 32, "qk_nope_dim": 16, "qk_rope_dim": 8, "v_head_dim": 16, "head_dim": 16}, "head_dim"),
    ({"kv_lora_rank": 32, "qk_nope_dim": 16, "v_head_dim": 16, "kv_heads": 2}, "kv_heads"),
    ({"kv_lora_rank": -1}, "kv_lora_rank"),
    ({"kv_lora_rank": 32, "qk_nope_dim": 16, "v_head_dim": 16, "qkv_bias": True}, "qkv_bias"),
    ({"kv_lora_rank": 32, "qk_nope_dim": 16, "v_head_dim": 16, "arch": "gpt"}, "arch"),
    ({"router_bias": True}, "router_bias"),
    ({"experts": 4, "top_k": 1, "shared_expert_gate": True}, "shared_expert_gate"),
])
def test_bad_attention_and_moe_fields_name_the_field(changes, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(**{**BASE, **changes})
    assert err.value.field == field
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("changes, key", [
    ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ({"shared_expert_intermediate_size": 1000}, "shared_expert_intermediate_size"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
])
def test_a_moe_config_the_planner_cannot_model_is_one_line(tmp_path, changes, key):
    cfg = {**json.loads((DATA / "Qwen1.5-MoE-A2.7B.config.json").read_text()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert err.value.field == f"hf_config {key}"


def test_presets_listing_shows_active_parameters(capsys):
    from planner.cli.main import main

    assert main(["presets", "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["deepseek-v3"]["active_params"] == 37_552_297_472
    assert table["llama-7b"]["active_params"] == table["llama-7b"]["params"]
    assert main(["presets"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("mixtral-8x7b "))
    assert "46.70B" in row and "12.88B" in row and "2/8" in row


@pytest.mark.parametrize("name", TRANSFORMERS_COUNTS)
def test_active_less_matmul_weights_is_embedding_norms_and_biases(name):
    # What a token touches but does not multiply, by hand: the input embedding, two norms per
    # layer and the final one, QK-norm and MLA's low-rank norms, q/k/v biases (gpt-oss: o's too,
    # and a sink logit per head), the router bias, the biases of the top_k experts it uses.
    spec = get_preset(name)
    h, n = spec.hidden, spec.layers
    qk_norm = {"none": 0, "full": spec.q_width + spec.k_width, "head": 2 * spec.head_dim}[spec.qk_norm]
    per_layer = 2 * h + qk_norm + spec.q_lora_rank + spec.kv_lora_rank
    per_layer += (spec.q_width + spec.k_width + spec.v_width) if spec.qkv_bias else 0
    per_layer += h * spec.out_bias + spec.heads * spec.attention_sinks
    routed = spec.experts * (spec.router_bias + spec.expert_bias) + spec.top_k * (2 * spec.expert_ffn + h) * spec.expert_bias
    others = spec.vocab * h + n * per_layer + h + spec.moe_layers * routed
    assert spec.active_params - spec.matmul_params_per_token == others


def test_every_expert_active_is_the_total():
    spec = get_preset("mixtral-8x7b").replace(top_k=8)
    assert spec.active_params == spec.params


@pytest.mark.parametrize("file, released", [
    # Dense configs exercising the attention variants through the loader; released totals:
    ("Qwen3-8B", 8_190_735_360),  # Hub safetensors total of Qwen/Qwen3-8B (head_dim 128, per-head QK-norm)
    ("Qwen2.5-0.5B-Instruct", 494_032_768),  # Qwen2ForCausalLM's count of the released model (q/k/v biases, tied)
])
def test_hf_config_attention_variants_equal_released_counts(file, released):
    spec, _ = model_from_hf_config(DATA / f"{file}.config.json")
    assert not spec.moe and spec.params == released


def test_a_bad_moe_config_is_one_line_at_the_cli(tmp_path, capsys):
    from planner.cli.main import main

    cfg = {**json.loads((DATA / "DeepSeek-V3.config.json").read_text()), "moe_layer_freq": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["estimate", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "moe_layer_freq" in err[0] and err[0].startswith("planner estimate: hf_config")


def test_the_model_line_gives_a_dense_mlp_width_only_where_a_layer_has_one():
    """Qwen3-30B-A3B's intermediate_size (6144) is no layer's width: every layer is an MoE layer of
    768-wide experts. DeepSeek-V3's first three layers are dense, 18432 wide."""
    qwen, v3 = get_preset("qwen3-30b-a3b").describe(), get_preset("deepseek-v3").describe()
    assert "expert ffn 768" in qwen and ", ffn " not in qwen
    assert "expert ffn 2048, 3 dense layers first" in v3 and ", ffn 18432," in v3
