"""The mixture-of-experts, attention-variant and sliding-window fields of a Hugging Face
``config.json``, as ModelSpec fields (planner/core/model.py). planner.core.options reads the common
shape keys.

Key names follow transformers' configuration classes (MixtralConfig, Qwen2MoeConfig,
Qwen3MoeConfig, OlmoeConfig, DeepseekV2Config, DeepseekV3Config (Kimi K2's kimi_k2 too),
Glm4MoeConfig, GptOssConfig, Gemma2Config, Gemma3TextConfig, Llama4TextConfig, Olmo3Config,
SmolLM3Config, Glm4Config, SeedOssConfig); what a model type implies without a key follows its
modeling file (Qwen2 attention has q/k/v biases; ``attention_bias`` biases q, k, v and o in
Llama's attention and those like it, q, k and v in GLM's and Seed-OSS's; Qwen3 and Gemma 3
normalise q and k per head, OLMoE and OLMo 2/3 over their full widths; Gemma 2 and 3 and GLM-4
normalise each block's output too; DeepSeek-V3's and GLM-4.5's routers hold e_score_correction_bias;
gpt-oss biases its attention projections, router and experts and keeps a sink logit per head;
Llama 4 adds a shared expert to its routed ones, may interleave MoE layers with dense ones of
another width, and attends in chunks on its RoPE layers).
"""

from __future__ import annotations

from planner.errors import PlannerError

_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts")
# DeepSeekMoE's layout (n_shared_experts, first_k_dense_replace, n_group/topk_group); all but V2 keep
# the routing bias e_score_correction_bias. kimi_k2 is DeepseekV3ForCausalLM under its own name.
_DEEPSEEK_MOE = ("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe", "mistral4", "deepseek_v32", "glm_moe_dsa")
# DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5): ModelSpec field -> config key
_DSA = ("deepseek_v32", "glm_moe_dsa")
_DSA_KEYS = {"index_heads": "index_n_heads", "index_head_dim": "index_head_dim", "index_topk": "index_topk"}
_MLA = {"kv_lora_rank": "kv_lora_rank", "q_lora_rank": "q_lora_rank", "qk_rope_dim": "qk_rope_head_dim",
        "qk_nope_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim"}


def _int(cfg: dict, key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlannerError(f"{where} {key}", "missing" if value is None else value, "required: a whole number >= 0")
    return value


def _positive(cfg: dict, key: str, where: str, default: int | None = None) -> int:
    """``_int``, and at least 1 (a width or a count of heads)."""
    value = _int(cfg, key, where, default)
    if value < 1:
        raise PlannerError(f"{where} {key}", value, "a positive integer")
    return value


def _flag(cfg: dict, key: str, where: str, default: bool = False) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PlannerError(f"{where} {key}", value, "true or false")
    return value


def hf_variant_fields(cfg: dict, kind: str, where: str = "hf_config") -> dict:
    """ModelSpec fields beyond the dense shape: attention variants for every model type, MoE
    fields for the MoE ones. One PlannerError naming the key for what is not modelled."""
    fields: dict = {}
    if cfg.get("kv_lora_rank"):  # multi-head latent attention; its "head_dim" key is not the q/k width
        fields.update({f: _int(cfg, k, where, 0 if k == "q_lora_rank" else None) for f, k in _MLA.items()})
    elif cfg.get("head_dim") is not None:
        fields["head_dim"] = _int(cfg, "head_dim", where)
    if kind in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = True  # Qwen2Attention: q_proj, k_proj, v_proj with bias
    fields.update(_biases(cfg, kind, where))
    if kind == "gpt_oss":  # GptOssAttention: a sink logit per head
        fields["attention_sinks"] = True
    fields["qk_norm"] = {"qwen3": "head", "qwen3_moe": "head", "qwen3_vl_text": "head", "qwen3_vl_moe_text": "head",
                         "gemma3_text": "head", "gemma4_text": "head", "qwen3_next": "head", "qwen3_5_text": "head", "qwen3_5_moe_text": "head",
                         "olmoe": "full", "olmo2": "full", "olmo3": "full", "minimax_m2": "full",
                         "exaone4": "head"}.get(kind, "none")
    if kind == "glm4_moe" and _flag(cfg, "use_qk_norm", where):
        fields["qk_norm"] = "head"
    fields["post_norms"] = kind in ("gemma2", "gemma3_text", "gemma4_text", "glm4")  # a norm after attention and after the MLP too
    if kind == "cohere2":  # Cohere2DecoderLayer: attention and the MLP side by side after one LayerNorm
        fields["parallel_block"] = True
    if kind == "gemma4_text":  # its own keys (hf_gemma4_fields): top_k_experts, enable_moe_block
        return {**fields, **hf_gemma4_fields(cfg, where)}
    if kind in _DSA:
        fields.update(_dsa_fields(cfg, where))
    if kind == "ernie4_5_moe":
        return {**fields, **_ernie_moe_fields(cfg, where)}
    key = next((k for k in _EXPERTS if cfg.get(k)), None)
    if key is None:
        return fields
    experts, top_k = _int(cfg, key, where), _int(cfg, "num_experts_per_tok", where)
    width = "moe_intermediate_size" if cfg.get("moe_intermediate_size") else "intermediate_size"
    fields.update(experts=experts, top_k=top_k, expert_ffn=_int(cfg, width, where))
    if kind in _DEEPSEEK_MOE:
        if cfg.get("moe_layer_freq", 1) != 1:
            raise PlannerError(f"{where} moe_layer_freq", cfg["moe_layer_freq"], "1 (every layer after the dense ones)")
        fields.update(shared_experts=_int(cfg, "n_shared_experts", where, 0),
                      dense_layers=_int(cfg, "first_k_dense_replace", where, 0),
                      router_bias=kind not in ("deepseek_v2", "mistral4"))  # their routers: softmax, no bias
        # group-limited routing (topk_method group_limited_greedy / noaux_tc): top_k inside topk_group of n_group
        groups = _int(cfg, "n_group", where, 1) or 1
        fields.update(expert_groups=groups, groups_per_token=_int(cfg, "topk_group", where, groups) or groups)
    if kind == "gpt_oss":  # GptOssMLP: a router Linear with its bias, experts with biased gate_up and down
        fields["expert_bias"] = True
    if kind == "minimax_m2":  # MiniMaxM2TopKRouter: sigmoid scores, the routing bias e_score_correction_bias
        fields["router_bias"] = True
    if kind == "llama4_text":  # Llama4TextMoe: the routed experts and one shared expert of their width
        fields.update(shared_experts=1, ffn_hidden=_int(cfg, "intermediate_size_mlp", where),
                      moe_every=_llama4_moe_every(cfg, where))
    if kind in _QWEN_MOE and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        raise PlannerError(f"{where} decoder_sparse_step", cfg.get("decoder_sparse_step"),
                               "1 with mlp_only_layers empty (every layer an MoE layer)")
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if shared:
        if shared % fields["expert_ffn"]:
            raise PlannerError(f"{where} shared_expert_intermediate_size", shared,
                               f"a multiple of the expert width {fields['expert_ffn']}")
        fields.update(shared_experts=shared // fields["expert_ffn"],
                      shared_expert_gate=kind in ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text"))
    return fields


# attention_bias: the projections a model type's attention biases with it (its modeling file);
# Seed-OSS biases its output projection with attention_out_bias instead.
_QKVO_BIAS = ("llama", "granite", "smollm3", "qwen3", "qwen3_vl_text", "olmo2", "olmo3", "gemma", "gemma2",
              "gemma3_text", "gemma4_text", "cohere2", "qwen3_moe", "qwen3_vl_moe_text", "olmoe", "llama4_text", "gpt_oss", "qwen3_next",
              "qwen3_5_text", "qwen3_5_moe_text")
_QKV_BIAS = ("glm4", "glm4_moe", "seed_oss")
# mlp_bias: a bias on every matrix of the dense SwiGLU MLP, not modelled (refused when true)
_MLP_BIAS = ("llama", "granite", "smollm3", "seed_oss", "deepseek_v2")


def _biases(cfg: dict, kind: str, where: str) -> dict:
    """``qkv_bias`` and ``out_bias`` from ``attention_bias`` (and Seed-OSS's ``attention_out_bias``)
    for the model types whose attention takes it; one PlannerError for a bias not modelled."""
    if kind in _MLP_BIAS and _flag(cfg, "mlp_bias", where):
        raise PlannerError(f"{where} mlp_bias", True, "false (biases on the MLP's matrices are not modelled)")
    if kind in ("deepseek_v2", "deepseek_v3", "kimi_k2", "mistral4", *_DSA) and _flag(cfg, "attention_bias", where):
        raise PlannerError(f"{where} attention_bias", True, "false (biased MLA projections are not modelled)")
    if kind in _QKVO_BIAS:
        biased = _flag(cfg, "attention_bias", where, kind == "gpt_oss")  # GptOssConfig's default: true
        return {"qkv_bias": biased, "out_bias": biased}
    if kind in _QKV_BIAS:
        out = _flag(cfg, "attention_out_bias", where) if kind == "seed_oss" else False
        return {"qkv_bias": _flag(cfg, "attention_bias", where), "out_bias": out}
    return {}


ERNIE_BIAS = "false (ERNIE 4.5's biases on every projection, the MLP's and the head's, are not modelled)"
# A type read as another (planner.core.options' aliases): its key that would give it weights the other
# type lacks, refused when true.
ALIAS_FLAGS = {"ernie4_5": ("use_bias", ERNIE_BIAS),
               "granitemoe": ("attention_bias", "false (biases on a Granite MoE's attention are not modelled)")}


def _ernie_moe_fields(cfg: dict, where: str) -> dict:
    """ERNIE 4.5's MoE (Ernie4_5_MoeConfig): ``moe_num_experts`` of ``moe_intermediate_size``, top
    ``moe_k``, one shared MLP of ``moe_num_shared_experts`` experts' width, a routing bias held as
    a weight (moe_statics), MoE layers from ``moe_layer_start_index`` to the last (every
    ``moe_layer_interval``-th: 1 only); the dense layers before them of ``intermediate_size``. One
    PlannerError for what is not modelled (biases, MoE layers ending before the last, an interval)."""
    if _flag(cfg, "use_bias", where):
        raise PlannerError(f"{where} use_bias", True, ERNIE_BIAS)
    layers = _int(cfg, "num_hidden_layers", where)
    end = cfg.get("moe_layer_end_index")
    if end not in (None, -1, layers - 1):
        raise PlannerError(f"{where} moe_layer_end_index", brief(end), f"the last layer ({layers - 1}), -1 or null "
                           "(dense layers after the MoE ones are not modelled)")
    if _int(cfg, "moe_layer_interval", where) != 1:
        raise PlannerError(f"{where} moe_layer_interval", cfg["moe_layer_interval"], "1 (every layer from "
                           "moe_layer_start_index an MoE layer)")
    return {"experts": _int(cfg, "moe_num_experts", where), "top_k": _int(cfg, "moe_k", where),
            "expert_ffn": _int(cfg, "moe_intermediate_size", where),
            "shared_experts": _int(cfg, "moe_num_shared_experts", where, 0),
            "dense_layers": _int(cfg, "moe_layer_start_index", where), "router_bias": True}


def _dsa_fields(cfg: dict, where: str) -> dict:
    """DeepSeek sparse attention's indexer on every layer (DeepseekV32Config, GlmMoeDsaConfig); one
    PlannerError for GLM-5's IndexShare (layers reusing an earlier layer's top-k: not modelled)."""
    freq = _positive(cfg, "index_topk_freq", where, 1)
    kinds = {"index_topk_pattern": ("F", "S", "full", "shared"), "indexer_types": ("full", "shared")}
    for key, allowed in kinds.items():
        value = cfg.get(key)
        if value is None:
            continue
        letters = isinstance(value, str) and key == "index_topk_pattern"  # "FSSF...": one letter a layer
        if not (letters or isinstance(value, list)) or any(not isinstance(v, str) or v not in allowed for v in value):
            raise PlannerError(f"{where} {key}", brief(value), f"a list of {' or '.join(allowed[-2:])} per layer"
                               + (' (or a string of F and S)' if key == "index_topk_pattern" else ""))
    reuse = next((k for k in kinds if any(v in ("S", "shared") for v in cfg.get(k) or ())), None)
    if freq > 1 or reuse:
        key = reuse or "index_topk_freq"
        raise PlannerError(f"{where} {key}", brief(cfg[key]), "every layer its own indexer (layers reusing an earlier "
                           "layer's top-k, GLM-5.x's IndexShare, are not modelled)")
    return {field: _positive(cfg, key, where) for field, key in _DSA_KEYS.items()}


def hf_gemma4_fields(cfg: dict, where: str = "hf_config") -> dict:
    """Gemma 4's language model (Gemma4TextConfig, transformers 5.5): the full-attention layers'
    head width (``global_head_dim``) and, with ``attention_k_eq_v``, their own K/V heads
    (``num_global_key_value_heads``) and K used as V; with ``enable_moe_block`` the experts
    (``num_experts``, ``top_k_experts``, ``moe_intermediate_size``) beside the dense MLP of
    ``intermediate_size`` (planned as shared experts of the experts' width), the router's two scales
    and the block's three norms. One PlannerError for what is not modelled: per-layer input
    embeddings and K/V shared across layers (E2B, E4B), bidirectional text attention, a
    ``per_layer_config``."""
    ple = _int(cfg, "hidden_size_per_layer_input", where, 0)
    if ple:
        raise PlannerError(f"{where} hidden_size_per_layer_input", ple, "0: per-layer input embeddings (Gemma 4 "
                           "E2B's and E4B's) are not modelled")
    shared = _int(cfg, "num_kv_shared_layers", where, 0)
    if shared:
        raise PlannerError(f"{where} num_kv_shared_layers", shared, "0: K/V shared across layers (Gemma 4 E2B's and "
                           "E4B's) are not modelled")
    if cfg.get("use_bidirectional_attention") not in (None, "vision"):
        raise PlannerError(f"{where} use_bidirectional_attention", brief(cfg["use_bidirectional_attention"]),
                           'null or "vision" (causal text attention; a bidirectional text model is not modelled)')
    if cfg.get("per_layer_config") is not None:
        raise PlannerError(f"{where} per_layer_config", brief(cfg["per_layer_config"]), "absent: per-layer attention "
                           "shapes beyond global_head_dim and num_global_key_value_heads are not read")
    k_eq_v = _flag(cfg, "attention_k_eq_v", where)
    fields: dict = {"global_head_dim": _positive(cfg, "global_head_dim", where, 512), "global_k_eq_v": k_eq_v}
    if k_eq_v and cfg.get("num_global_key_value_heads") is not None:  # the class reads it only with K as V
        fields["global_kv_heads"] = _positive(cfg, "num_global_key_value_heads", where)
    if not _flag(cfg, "enable_moe_block", where):
        return fields
    width, dense = _positive(cfg, "moe_intermediate_size", where), _positive(cfg, "intermediate_size", where)
    if dense % width:
        raise PlannerError(f"{where} intermediate_size", dense, f"a multiple of moe_intermediate_size={width} (the "
                           "dense MLP beside the experts is planned as shared experts of their width)")
    return {**fields, "experts": _int(cfg, "num_experts", where), "top_k": _int(cfg, "top_k_experts", where),
            "expert_ffn": width, "shared_experts": dense // width, "router_scale": True, "moe_norms": 3}


_QWEN_MOE = ("qwen2_moe", "qwen3_moe", "qwen3_vl_moe_text", "qwen3_next", "qwen3_5_moe_text")
# Gated DeltaNet beside gated softmax attention (Qwen3-Next, Qwen3.5 dense and MoE)
_GATED_DELTANET = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_LINEAR = {"full_attention": False, "linear_attention": True}
_LINEAR_KEYS = {"linear_key_heads": "linear_num_key_heads", "linear_value_heads": "linear_num_value_heads",
                "linear_key_dim": "linear_key_head_dim", "linear_value_dim": "linear_value_head_dim",
                "linear_conv": "linear_conv_kernel_dim"}


def hf_linear_fields(cfg: dict, kind: str, layers: int, where: str = "hf_config") -> dict:
    """Qwen3-Next's and Qwen3.5's layers: Gated DeltaNet ("linear_attention" in ``layer_types``; else
    all but every ``full_attention_interval``-th, 4) beside softmax attention whose output is gated
    (their attention's q projection is twice q's width: the query and the gate)."""
    if kind not in _GATED_DELTANET:
        return {}
    if cfg.get("layer_types") is not None:
        linear = _count_layer_types(cfg["layer_types"], _LINEAR, layers, where)
    else:
        interval = _int(cfg, "full_attention_interval", where, 4)
        if not 1 <= interval <= layers:
            raise PlannerError(f"{where} full_attention_interval", interval, f"from 1 to num_hidden_layers={layers}")
        linear = layers - layers // interval
    fields = {field: _int(cfg, key, where) for field, key in _LINEAR_KEYS.items()}
    return {"linear_layers": linear, **fields, "output_gate": True} if linear else {"output_gate": True}


def _llama4_moe_every(cfg: dict, where: str) -> int:
    """Llama 4's MoE layers: every ``interleave_moe_layer_step``-th (layers step-1, 2*step-1, ...;
    Scout 1, Maverick 2), or the ``moe_layers`` list when it is that pattern."""
    step = _int(cfg, "interleave_moe_layer_step", where, 1)
    layers = cfg["num_hidden_layers"]
    if not 1 <= step <= layers:
        raise PlannerError(f"{where} interleave_moe_layer_step", step, f"from 1 to num_hidden_layers={layers}")
    listed = cfg.get("moe_layers")
    if listed is not None and listed != list(range(step - 1, layers, step)):
        raise PlannerError(f"{where} moe_layers", brief(listed), f"every {step}-th layer (interleave_moe_layer_step: "
                           f"layers {step - 1}, {2 * step - 1}, ...); another placement is not modelled")
    return step


# layer_types' entries: whether the layer attends to a window (a chunk) rather than the whole context.
_WINDOWED = {"full_attention": False, "sliding_attention": True}
_CHUNKED = {"full_attention": False, "chunked_attention": True}  # Llama 4


def _count_layer_types(types: object, kinds: dict[str, bool], layers: int, where: str) -> int:
    """How many of ``layer_types`` are of the kind ``kinds`` marks True (windowed, chunked, linear);
    one PlannerError for a list that is not one of ``kinds`` per layer."""
    if not isinstance(types, list) or len(types) != layers or any(not isinstance(t, str) or t not in kinds for t in types):
        raise PlannerError(f"{where} layer_types", brief(types),
                           f"a list of {layers} (num_hidden_layers) of {' or '.join(kinds)}")
    return sum(kinds[t] for t in types)


def hf_window_fields(cfg: dict, kind: str, layers: int, where: str = "hf_config") -> dict:
    """``window`` and ``window_layers``: the layers with sliding-window attention, as transformers
    lays them out: the config's ``layer_types`` where it has them; else by model type: Mistral,
    Mixtral and Phi-3 window every layer when ``sliding_window`` is set; Qwen2/3 (and their MoE)
    the layers from ``max_window_layers`` on when ``use_sliding_window``; Gemma 2 and gpt-oss every
    second layer from the first; Gemma 3 all but every ``sliding_window_pattern``-th. {} for full
    attention."""
    if kind == "llama4_text":
        return _llama4_chunks(cfg, layers, where)
    if kind in _GATED_DELTANET:  # layer_types name linear and full attention there: hf_linear_fields
        return {}
    if kind in _DSA:  # every layer DSA (layer_types "indexed_attention" where a config writes them)
        if cfg.get("layer_types") is not None:
            _count_layer_types(cfg["layer_types"], {"indexed_attention": False}, layers, where)
        return {}
    if kind == "gemma4_text":  # Gemma4TextConfig forces its last layer to full attention
        types = cfg.get("layer_types")
        if types is not None:
            windowed = _count_layer_types(types, _WINDOWED, layers, where) - (types[-1] == "sliding_attention")
        else:  # 5 sliding to 1 full, the last full
            windowed = sum(1 for i in range(layers - 1) if (i + 1) % 6)
    elif cfg.get("layer_types") is not None:
        windowed = _count_layer_types(cfg["layer_types"], _WINDOWED, layers, where)
    elif kind in ("mistral", "mixtral", "phi3"):
        windowed = layers if cfg.get("sliding_window") is not None else 0
    elif kind == "olmo3":
        windowed = layers - layers // 4  # all but every 4th layer (Olmo3Config's layer_types)
    elif kind == "smollm3":  # with use_sliding_window, its NoPE layers (SmolLM3Config's layer_types)
        windowed = (layers - _rope_layers(cfg, layers, where)
                    if cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None else 0)
    elif kind in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        windowed = max(0, layers - _int(cfg, "max_window_layers", where, 0)) if cfg.get("use_sliding_window") else 0
    elif kind in ("gemma2", "gpt_oss"):
        windowed = (layers + 1) // 2  # layers 0, 2, 4, ... (Gemma2Config's and GptOssConfig's layer_types)
    elif kind in ("gemma3_text", "exaone4", "cohere2"):  # EXAONE 4, Cohere 2: three sliding layers to one full
        pattern = cfg.get("sliding_window_pattern")
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise PlannerError(f"{where} sliding_window_pattern", pattern, "a positive integer")
        windowed = layers - layers // pattern  # every pattern-th layer attends to the whole context
    else:
        windowed = 0
    if not windowed:
        return {}
    window = cfg.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise PlannerError(f"{where} sliding_window", "missing" if window is None else window,
                           f"a positive integer: {windowed} layers use a sliding window")
    return {"window": window, "window_layers": windowed}


def _rope_layers(cfg: dict, layers: int, where: str) -> int:
    """Layers with RoPE, as Llama 4 and SmolLM3 lay them out: ``no_rope_layers`` (1: RoPE, 0: NoPE),
    by default all but every ``no_rope_layer_interval``-th (4)."""
    rope = cfg.get("no_rope_layers")
    if rope is not None:
        if not isinstance(rope, list) or len(rope) != layers or any(r not in (0, 1) or isinstance(r, bool) for r in rope):
            raise PlannerError(f"{where} no_rope_layers", brief(rope), f"a list of {layers} (num_hidden_layers) of 0 or 1")
        return sum(rope)
    interval = _int(cfg, "no_rope_layer_interval", where, 4)
    if interval < 1:
        raise PlannerError(f"{where} no_rope_layer_interval", interval, "a positive integer")
    return layers - layers // interval


def _llama4_chunks(cfg: dict, layers: int, where: str) -> dict:
    """Llama 4's chunked attention: ``attention_chunk_size`` tokens per chunk (the class default
    8192 when the key is absent; null: none) on the layers ``layer_types`` names
    ``chunked_attention``, else on the RoPE layers (``no_rope_layers`` 1; by default all but every
    ``no_rope_layer_interval``-th, 4), as Llama4TextConfig lays them out."""
    chunk = cfg.get("attention_chunk_size", 8192)
    if chunk is None:
        return {}
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise PlannerError(f"{where} attention_chunk_size", chunk, "a positive integer, or null (no chunking)")
    if cfg.get("layer_types") is not None:
        chunked = _count_layer_types(cfg["layer_types"], _CHUNKED, layers, where)
    else:  # the RoPE layers are chunked; the NoPE ones attend to the whole context
        chunked = _rope_layers(cfg, layers, where)
    return {"window": chunk, "window_layers": chunked, "chunked": True} if chunked else {}


def brief(value: object) -> object:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
