"""The dense model types read since Mistral Small 3.1 (mistral3), Qwen3-VL (qwen3_vl), SmolLM3,
Granite, OLMo 3, GLM-4 (glm4) and Seed-OSS: parameter counts against transformers and by hand, the
attention biases that ``attention_bias`` sets, the tying rule of an image-and-text wrapper,
SmolLM3's and OLMo 3's default windows, the Megatron export, and bad input in one line."""

import json

import pytest

from planner.cli.main import main
from planner.core.options import model_from_hf_config
from planner.errors import PlannerError
from tests.test_hf_configs import DATA

# file: (parameters, tied, qkv_bias, out_bias, qk_norm, post_norms, windowed layers, seq_len).
# Parameters: Hugging Face transformers 5.25.0's model built from the file on the meta device
# (sum of p.numel(), the language model's for the image-and-text configs), except Mistral Small
# 3.1 (see test_mistral_small_keeps_its_own_head). Against the model cards: SmolLM3 3B, Granite 3.1
# 8B (8.17B), OLMo 3.1 32B, Seed-OSS 36B, Qwen3-VL 4B (4.02B of 4.44B with the vision tower).
CONFIGS = {
    "Mistral-Small-3.1-24B-Instruct-2503": (23_572_403_200, False, False, False, "none", False, 0, 131072),
    "Qwen3-VL-4B-Instruct": (4_022_468_096, True, False, False, "head", False, 0, 262144),
    "SmolLM3-3B": (3_075_098_624, True, False, False, "none", False, 0, 65536),
    "granite-3.1-8b-instruct": (8_170_848_256, True, False, False, "none", False, 0, 131072),
    "Olmo-3.1-32B-Instruct": (32_233_522_176, False, False, False, "full", False, 48, 8192),
    "Seed-OSS-36B-Instruct": (36_151_104_512, False, True, False, "none", False, 0, 524288),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_configs_count_as_transformers_builds_them(name):
    spec, _ = model_from_hf_config(DATA / f"{name}.config.json")
    assert (spec.params, spec.tied_embeddings, spec.qkv_bias, spec.out_bias, spec.qk_norm, spec.post_norms,
            spec.window_layers, spec.seq_len) == CONFIGS[name]


def test_seed_oss_biases_q_k_and_v_but_not_the_output_by_hand():
    """Seed-OSS 36B: 64 layers of q (5120 x 80*128) and o, k and v (5120 x 8*128) with biases on q,
    k and v (attention_bias; attention_out_bias false), a 27648-wide SwiGLU and two RMSNorms; an
    untied 155136-token embedding and head, and the final norm."""
    spec, _ = model_from_hf_config(DATA / "Seed-OSS-36B-Instruct.config.json")
    h, q, kv = 5120, 80 * 128, 8 * 128
    layer = h * q * 2 + h * kv * 2 + (q + 2 * kv) + 3 * h * 27648 + 2 * h
    assert spec.params == 64 * layer + 2 * 155136 * h + h == 36_151_104_512


def test_olmo_3_windows_three_layers_in_four_and_trains_at_its_original_context():
    """OLMo 3.1 32B: layer_types window all but every fourth layer at 4096 tokens; q and k
    normalised over their full widths; YaRN's original_max_position_embeddings (8192) is the context."""
    spec, note = model_from_hf_config(DATA / "Olmo-3.1-32B-Instruct.config.json")
    h, kv = 5120, 8 * 128
    layer = h * h * 2 + h * kv * 2 + (h + kv) + 3 * h * 27648 + 2 * h  # q_norm over 5120, k_norm over 1024
    assert spec.params == 64 * layer + 2 * 100278 * h + h
    assert (spec.window, spec.window_layers, spec.seq_len) == (4096, 48, 8192)
    assert "the context before RoPE scaling" in note


def test_olmo_3_without_layer_types_windows_all_but_every_fourth_layer(tmp_path):
    cfg = json.loads((DATA / "Olmo-3.1-32B-Instruct.config.json").read_text())
    del cfg["layer_types"], cfg["sliding_window"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec, note = model_from_hf_config(path)  # Olmo3Config's defaults: window 4096, every 4th layer full
    assert (spec.window, spec.window_layers) == (4096, 64 - 16)
    assert "sliding_window 4096 (the configuration class's defaults)" in note


def test_glm_4_normalises_each_block_output_and_biases_q_k_v_by_hand(tmp_path):
    """GLM-4-9B-0414's shape (4096 hidden, 40 layers, 32 heads, 2 KV heads of 128, a 13696-wide
    SwiGLU, vocab 151552, untied): q, k and v biased (attention_bias), the output not (Glm4Attention),
    and four RMSNorms a layer (before and after attention and the MLP). transformers 5.25.0 builds
    9,400,279,040 parameters from it; GLM's model card says 9.4B. Without attention_bias or
    head_dim the configuration class's defaults (true, 128) apply, and the report says so."""
    cfg = {"model_type": "glm4", "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
           "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 13696, "vocab_size": 151552,
           "max_position_embeddings": 32768, "attention_bias": True, "partial_rotary_factor": 0.5,
           "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec, _ = model_from_hf_config(path)
    h = 4096
    layer = h * h * 2 + h * 256 * 2 + (h + 2 * 256) + 3 * h * 13696 + 4 * h
    assert spec.params == 40 * layer + 2 * 151552 * h + h == 9_400_279_040
    assert (spec.qkv_bias, spec.out_bias, spec.post_norms) == (True, False, True)
    del cfg["attention_bias"], cfg["head_dim"]
    path.write_text(json.dumps(cfg))
    again, note = model_from_hf_config(path)
    assert again.params == spec.params and "head_dim 128, attention_bias True" in note


def test_mistral_small_keeps_its_own_head():
    """Mistral Small 3.1's config sets tie_word_embeddings nowhere. Its language model, a
    MistralConfig, defaults to an untied head, which the checkpoint holds (23.57B of its 24B with
    the vision tower); transformers 5's Mistral3Config defaults the wrapper to tied and builds
    22,901,314,560 (the vLLM issue #51063: the nested config is authoritative). Here: the
    language model's own key, else the wrapper's, else the language model's default."""
    spec, note = model_from_hf_config(DATA / "Mistral-Small-3.1-24B-Instruct-2503.config.json")
    h = 5120
    layer = h * 4096 * 2 + h * 1024 * 2 + 3 * h * 32768 + 2 * h
    assert spec.params == 40 * layer + 2 * 131072 * h + h == 23_572_403_200
    assert spec.params - 131072 * h == 22_901_314_560  # transformers 5.25.0's tied count
    assert "its language model (text_config; the vision tower is not planned)" in note


def test_a_wrapper_s_tying_key_applies_where_the_language_model_has_none(tmp_path):
    cfg = json.loads((DATA / "Mistral-Small-3.1-24B-Instruct-2503.config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    assert model_from_hf_config(path)[0].tied_embeddings
    text = {**cfg["text_config"], "tie_word_embeddings": False}
    path.write_text(json.dumps({**cfg, "tie_word_embeddings": True, "text_config": text}))
    assert not model_from_hf_config(path)[0].tied_embeddings  # the language model's own key wins
    qwen = json.loads((DATA / "Qwen3-VL-4B-Instruct.config.json").read_text())
    assert qwen["text_config"]["tie_word_embeddings"] is True  # read from text_config


def test_attention_bias_biases_q_k_v_and_o_where_the_model_type_takes_it(tmp_path):
    """LlamaAttention (and Granite's, SmolLM3's, Qwen3's, OLMo's, Gemma's) biases q, k, v and o
    with attention_bias: 4096 + 2 * 1024 + 4096 more parameters a layer for Llama 3 8B."""
    cfg = json.loads((DATA / "Meta-Llama-3-8B.config.json").read_text())
    plain, _ = model_from_hf_config(DATA / "Meta-Llama-3-8B.config.json")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "attention_bias": True}))
    biased, _ = model_from_hf_config(path)
    assert (biased.qkv_bias, biased.out_bias) == (True, True)
    assert biased.params - plain.params == 32 * (4096 + 2 * 1024 + 4096)


def test_smollm3_windows_its_nope_layers_only_when_asked(tmp_path):
    """SmolLM3Config: with use_sliding_window and a sliding_window, the layers without RoPE
    (no_rope_layers 0, every fourth) use the window; the released config asks for none."""
    cfg = json.loads((DATA / "SmolLM3-3B.config.json").read_text())
    del cfg["layer_types"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "use_sliding_window": True, "sliding_window": 4096}))
    spec, _ = model_from_hf_config(path)
    assert (spec.window, spec.window_layers) == (4096, 9)
    del cfg["no_rope_layers"]  # the class default: every no_rope_layer_interval-th layer without RoPE
    path.write_text(json.dumps({**cfg, "use_sliding_window": True, "sliding_window": 4096,
                                "no_rope_layer_interval": 3}))
    assert model_from_hf_config(path)[0].window_layers == 12


@pytest.mark.parametrize("name, changes, key", [
    ("Meta-Llama-3-8B", {"mlp_bias": True}, "mlp_bias"),
    ("SmolLM3-3B", {"attention_bias": "yes"}, "attention_bias"),
    ("Seed-OSS-36B-Instruct", {"attention_out_bias": 1}, "attention_out_bias"),
    ("DeepSeek-V2-Lite", {"attention_bias": True}, "attention_bias"),
    ("SmolLM3-3B", {"layer_types": None, "use_sliding_window": True, "sliding_window": 4096,
                    "no_rope_layers": [1, 0]}, "no_rope_layers"),
])
def test_a_bias_or_layer_key_the_planner_does_not_model_is_one_line(tmp_path, name, changes, key):
    cfg = json.loads((DATA / f"{name}.config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **changes}))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_the_megatron_export_biases_q_k_v_and_says_what_it_leaves_out(tmp_path, capsys):
    """Seed-OSS: --add-qkv-bias with every other linear unbiased. A Llama with attention_bias also
    biases o, which Megatron cannot express alone: the script says it trains without that bias."""
    code = main(["export", "--hf-config", str(DATA / "Seed-OSS-36B-Instruct.config.json"), "--seq-len", "4096",
                 "--gpus", "64", "--gpu", "h100", "--format", "megatron"])
    text = capsys.readouterr().out
    assert code == 0
    assert "--add-qkv-bias" in text and "--disable-bias-linear" in text and "attention output" not in text
    cfg = json.loads((DATA / "Meta-Llama-3-8B.config.json").read_text())
    biased = tmp_path / "config.json"
    biased.write_text(json.dumps({**cfg, "attention_bias": True}))
    assert main(["export", "--hf-config", str(biased), "--gpus", "8", "--gpu", "h100", "--format", "megatron"]) == 0
    text = capsys.readouterr().out
    assert "--add-qkv-bias" in text and "--disable-bias-linear" in text
    assert "biases its attention output projection too" in text


def test_qwen3_vl_moe_s_language_model_is_qwen3_30b_a3b():
    """Qwen3-VL-30B-A3B's text_config (qwen3_vl_moe_text) is Qwen3-30B-A3B's shape: the same
    30,532,122,624 parameters and 3,353,032,704 active as that preset and transformers 5.25.0's
    model (31,070,754,032 with the vision tower, the checkpoint's total); untied by the wrapper's
    tie_word_embeddings false, which its text_config does not override."""
    spec, note = model_from_hf_config(DATA / "Qwen3-VL-30B-A3B-Instruct.config.json")
    text = model_from_hf_config(DATA / "Qwen3-30B-A3B.config.json")[0]
    assert (spec.params, spec.active_params) == (text.params, text.active_params) == (30_532_122_624, 3_353_032_704)
    assert (spec.experts, spec.top_k, spec.expert_ffn, spec.qk_norm, spec.tied_embeddings) == (128, 8, 768, "head", False)
    assert "Hugging Face config (qwen3_vl_moe_text); its language model" in note


def test_mistral_small_4_is_deepseek_v3_s_layout_with_a_plain_softmax_router(tmp_path):
    """Mistral Small 4 (119B): a mistral3 wrapper whose text_config is mistral4: MLA (kv_lora_rank
    256, q_lora_rank 1024, 64 + 64 q/k head, v 128), 128 routed experts of 2048 and one shared,
    top-4, no dense layers, a router without DeepSeek-V3's bias. The shape is SGLang's test fixture
    of the released text_config; with an untied head (as written here) transformers 5.25.0's
    Mistral4ForCausalLM counts 118,972,826,624, 6,632,588,288 active; Mistral's card says 119B."""
    text = {"model_type": "mistral4", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
            "num_hidden_layers": 36, "vocab_size": 131072, "head_dim": 128, "kv_lora_rank": 256,
            "q_lora_rank": 1024, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 0,
            "moe_intermediate_size": 2048, "n_group": 1, "topk_group": 1, "max_position_embeddings": 1048576,
            "rope_parameters": {"rope_type": "yarn", "factor": 128.0, "original_max_position_embeddings": 8192},
            "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral3", "text_config": text}))
    spec, note = model_from_hf_config(path)
    h = 4096
    attention = (h * 1024 + 1024 + 1024 * 32 * 128  # q_a, its norm, q_b
                 + h * (256 + 64) + 256 + 256 * 32 * (64 + 128)  # kv_a with the shared RoPE key, its norm, kv_b
                 + 32 * 128 * h)  # output
    expert = 3 * h * 2048
    layer = attention + 128 * h + 129 * expert + 2 * h  # router, 128 routed + 1 shared expert, two norms
    assert spec.params == 36 * layer + 2 * 131072 * h + h == 118_972_826_624
    assert spec.active_params == spec.params - 36 * 124 * expert == 6_632_588_288
    assert (spec.router_bias, spec.dense_layers, spec.seq_len) == (False, 0, 8192)
    assert "Hugging Face config (mistral4)" in note


@pytest.mark.parametrize("kind, what", [
    ("kimi_linear", "Kimi Delta Attention"), ("olmo_hybrid", "linear-attention layers"),
    ("nemotron_h", "state-space (Mamba)"),
    ("gemma3n", "per-layer input embeddings"), ("deepseek_v4", "compressed attention"),
])
def test_a_model_type_with_an_unmodelled_mechanism_says_which_in_one_line(kind, what):
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(json.dumps({"model_type": kind, "hidden_size": 1024}).encode())
    text = str(err.value)
    assert f"model_type={kind!r}" in text and what in text and "are not modelled" in text and "\n" not in text


def _cache(root, model_id, snapshots, main=None):
    repo = root / ("models--" + model_id.replace("/", "--"))
    for commit, source in snapshots:
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_bytes((DATA / f"{source}.config.json").read_bytes())
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(main + "\n")


def test_a_hub_id_reads_the_config_from_the_local_hugging_face_cache(tmp_path, monkeypatch, capsys):
    """huggingface_hub's layout: models--org--name/snapshots/<commit>/config.json, refs/main naming
    the commit; without refs/main the newest snapshot. The model is named as on the Hub."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _cache(tmp_path, "Qwen/Qwen3-8B", [("0123456789abcdef", "Qwen3-8B"), ("fedcba9876543210", "Qwen3-30B-A3B")],
           main="0123456789abcdef")
    spec, note = model_from_hf_config("Qwen/Qwen3-8B")
    assert (spec.name, spec.params) == ("Qwen3-8B", 8_190_735_360)
    assert "Qwen/Qwen3-8B from the local Hugging Face cache (0123456789ab)" in note
    _cache(tmp_path, "allenai/OLMo-2-1124-7B", [("aaaa", "OLMo-2-1124-7B")])  # no refs/main: the newest snapshot
    assert model_from_hf_config("allenai/OLMo-2-1124-7B")[0].params == 7_298_617_344
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))  # $HF_HOME/hub
    _cache(tmp_path / "home" / "hub", "google/gemma-2-9b", [("bbbb", "gemma-2-9b")], main="bbbb")
    assert model_from_hf_config("google/gemma-2-9b")[0].params == 9_241_705_984


def test_a_hub_id_not_in_the_cache_is_one_line_and_a_missing_file_still_says_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    code = main(["estimate", "--hf-config", "Qwen/Qwen3-9B", "--gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "hf_config='Qwen/Qwen3-9B'" in err and "models--Qwen--Qwen3-9B" in err and "hf download" in err
    with pytest.raises(PlannerError) as error:  # a path that is not there is a path, not a Hub id
        model_from_hf_config("configs/config.json")
    assert "a readable config.json" in str(error.value)


# MiniMax-M2's shape: transformers 5.25.0's MiniMaxM2Config defaults (the keys the planner reads).
MINIMAX_M2 = {"model_type": "minimax_m2", "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
              "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 196608, "tie_word_embeddings": False, "num_experts_per_tok": 8,
              "num_local_experts": 256}


def test_minimax_m2_by_hand_and_as_transformers_builds_it():
    """Every layer MoE: 256 experts of 1536 (top 8), a router with its routing bias (the
    e_score_correction_bias buffer, counted as the checkpoint stores it), q and k normalised over
    their whole projections (6144 and 1024 wide), no biases. transformers 5.25.0 builds
    228,689,748,992 parameters and 62 x 256 bias entries."""
    spec, _ = model_from_hf_config(json.dumps(MINIMAX_M2).encode())
    h = 3072
    attention = h * 6144 + 2 * h * 1024 + 6144 * h + 6144 + 1024
    layer = attention + 256 * 3 * h * 1536 + (256 * h + 256) + 2 * h
    assert spec.params == 62 * layer + 2 * 200064 * h + h == 228_689_748_992 + 62 * 256
    assert spec.active_params == spec.params - 62 * 248 * 3 * h * 1536
    assert (spec.qk_norm, spec.router_bias, spec.experts, spec.top_k) == ("full", True, 256, 8)


@pytest.mark.parametrize("wrapper, text, source, total", [
    # GLM-4.5V's language model is GLM-4.5-Air's (glm4v_moe_text, read as glm4_moe); Kimi K2.5's is
    # Kimi K2's (its text_config a kimi_k2 / deepseek_v3 config); Ministral 3 and Devstral 2 (mistral3's
    # text_config of model_type ministral3) are Mistral's layers. Totals: transformers 5.25.0's
    # image-and-text model built from the wrapper, its language model and head (plus the routing
    # bias buffers, as the checkpoint stores them).
    ("glm4v_moe", "glm4v_moe_text", "GLM-4.5-Air", 106_852_245_504 + 5_760),
    ("kimi_k25", "kimi_k2", "Kimi-K2-Instruct", 1_026_408_209_408 + 23_040),
    ("mistral3", "ministral3", "Mistral-Small-3.1-24B-Instruct-2503", 23_572_403_200),
])
def test_language_models_in_new_wrappers_and_aliases(wrapper, text, source, total):
    cfg = json.loads((DATA / f"{source}.config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    spec, note = model_from_hf_config(json.dumps({"model_type": wrapper, "tie_word_embeddings": False,
                                                  "text_config": {**cfg, "model_type": text}}).encode())
    assert spec.params == total
    assert "its language model (text_config" in note


def test_kimi_k2_5_keeps_its_head_where_the_wrapper_says_nothing():
    """transformers 5's Kimi_K25Config ties the wrapper by default (1,025,233,827,328 with the routing
    biases), while the language model's own key says untied: the text_config's key wins, as for
    Mistral 3 (vLLM #51063)."""
    k2 = json.loads((DATA / "Kimi-K2-Instruct.config.json").read_text())
    spec, _ = model_from_hf_config(json.dumps({"model_type": "kimi_k25", "text_config": k2}).encode())
    assert spec.params == 1_026_408_232_448 and not spec.tied_embeddings


def test_internlm3_reads_as_llama():
    """InternLM3 is LlamaForCausalLM in transformers: InternLM3Config's defaults build 8,804,241,408."""
    cfg = {"model_type": "internlm3", "vocab_size": 128512, "hidden_size": 4096, "intermediate_size": 10240,
           "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "max_position_embeddings": 32768, "tie_word_embeddings": False}
    spec, note = model_from_hf_config(json.dumps(cfg).encode())
    assert spec.params == 8_804_241_408 and "internlm3 read as llama" in note


@pytest.mark.parametrize("kind, keys, total", [
    # each type's configuration class defaults in transformers 5.25.0, the count it builds
    ("ernie4_5", {"vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18,
                  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "tie_word_embeddings": True,
                  "max_position_embeddings": 131072, "use_bias": False}, 360_748_032),
    ("helium", {"vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040, "num_hidden_layers": 24,
                "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 128, "tie_word_embeddings": False,
                "max_position_embeddings": 4096}, 2_172_643_840),
    ("granitemoe", {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False,
                    "max_position_embeddings": 2048, "num_local_experts": 8, "num_experts_per_tok": 2,
                    "attention_bias": False}, 37_039_116_288),
])
def test_types_transformers_builds_with_llama_s_or_mixtral_s_layers(kind, keys, total):
    spec, note = model_from_hf_config(json.dumps({"model_type": kind, **keys}).encode())
    assert spec.params == total and f"{kind} read as" in note


@pytest.mark.parametrize("kind, key", [("ernie4_5", "use_bias"), ("granitemoe", "attention_bias")])
def test_an_aliased_type_s_own_biases_are_refused_in_one_line(kind, key):
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(json.dumps({"model_type": kind, "hidden_size": 1024, "num_hidden_layers": 2,
                                         "num_attention_heads": 8, "vocab_size": 1000, key: True}).encode())
    assert err.value.field == f"hf_config {key}" and "\n" not in str(err.value)


EXAONE4 = {"model_type": "exaone4", "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False,
           "max_position_embeddings": 2048, "sliding_window": 4096, "sliding_window_pattern": 4}
ERNIE_MOE = {"model_type": "ernie4_5_moe", "vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288,
             "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
             "max_position_embeddings": 131072, "tie_word_embeddings": True, "use_bias": False,
             "moe_intermediate_size": 1536, "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2,
             "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1}


def test_exaone_4_by_hand_and_as_transformers_builds_it():
    """EXAONE 4.0 (Exaone4Config's defaults): its two norms after attention and after the MLP (none
    before), per-head QK-norm, three sliding-window layers to one full ("LLLG"). transformers 5.25.0:
    9,429,069,824."""
    spec, _ = model_from_hf_config(json.dumps(EXAONE4).encode())
    h = 4096
    layer = 4 * h * h + 2 * 128 + 3 * h * 16384 + 2 * h
    assert spec.params == 32 * layer + 2 * 102400 * h + h == 9_429_069_824
    assert (spec.window, spec.window_layers, spec.qk_norm) == (4096, 24, "head")


def test_ernie_4_5_moe_by_hand_and_as_transformers_builds_it():
    """ERNIE 4.5 MoE (Ernie4_5_MoeConfig's defaults, the 21B-A3B shape): layer 0 dense (12288 wide),
    layers 1-27 MoE: 64 experts of 1536, top 6, two shared experts as one MLP of 3072, the router
    and its routing bias (a weight, moe_statics); tied embeddings. transformers 5.25.0: 21,825,437,888."""
    spec, _ = model_from_hf_config(json.dumps(ERNIE_MOE).encode())
    h = 2560
    attention = h * 2560 + 2 * h * 512 + 2560 * h
    moe = 64 * 3 * h * 1536 + 3 * h * 3072 + 64 * h + 64
    assert spec.params == attention * 28 + 3 * h * 12288 + 27 * moe + 56 * h + 103424 * h + h == 21_825_437_888
    assert (spec.dense_layers, spec.experts, spec.top_k, spec.shared_experts) == (1, 64, 6, 2)


@pytest.mark.parametrize("changes, key", [
    ({"moe_layer_end_index": 20}, "moe_layer_end_index"),  # dense layers after the MoE ones
    ({"moe_layer_interval": 2}, "moe_layer_interval"),
    ({"use_bias": True}, "use_bias"),
])
def test_ernie_4_5_moe_layouts_not_modelled_are_one_line(changes, key):
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(json.dumps({**ERNIE_MOE, **changes}).encode())
    assert err.value.field == f"hf_config {key}" and "\n" not in str(err.value)


COHERE2 = {"model_type": "cohere2", "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
           "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
           "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False,
           "sliding_window": 4096, "sliding_window_pattern": 4}


def test_cohere_2_by_hand_and_as_transformers_builds_it():
    """Cohere 2 (Command R7B, Command A; Cohere2Config's defaults): attention and the MLP side by side
    after one LayerNorm (its weight only), three sliding-window layers to one full, tied embeddings.
    transformers 5.25.0: 34,980,831,232."""
    spec, _ = model_from_hf_config(json.dumps(COHERE2).encode())
    h = 8192
    assert spec.params == 40 * (4 * h * h + 3 * h * 22528 + h) + 256000 * h + h == 34_980_831_232
    assert (spec.parallel_block, spec.layer_norms, spec.window_layers) == (True, 1, 30)


def test_a_parallel_block_keeps_one_norm_and_one_input_by_hand(tmp_path, capsys):
    """Per token and layer (16-bit, megatron-core, tp 1): one norm's input instead of two, and the
    normalised input both halves read kept once instead of twice: 2 x 2 x h bytes fewer."""
    from planner.core.layout import Candidates, Job, Layout
    from planner.core.memory import activation_bytes_per_layer

    spec, _ = model_from_hf_config(json.dumps(COHERE2).encode())
    job = Job(precision="bf16", stack="megatron-core")
    c = Candidates.from_layouts([Layout(dp=8, micro_batch=1, global_batch=8)])
    gap = float(activation_bytes_per_layer(spec.replace(parallel_block=False), c, job)[0]
                - activation_bytes_per_layer(spec, c, job)[0])
    assert gap == pytest.approx(2 * 2 * 8192 * 8192, rel=1e-12)
    path = ["--gpus", "64", "--gpu", "h100", "--seq-len", "8192"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(COHERE2))
    assert main(["export", "--hf-config", str(cfg), *path, "--format", "megatron"]) == 2
    assert "parallel attention and MLP block" in capsys.readouterr().err
    with pytest.raises(PlannerError) as err:
        spec.replace(post_norms=True)
    assert err.value.field == "parallel_block"
