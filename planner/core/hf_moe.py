"""The mixture-of-experts and attention-variant fields of a Hugging Face ``config.json``, as
ModelSpec fields (planner/core/model.py). planner.core.options reads the common shape keys.

Key names follow transformers' configuration classes (MixtralConfig, Qwen2MoeConfig,
Qwen3MoeConfig, OlmoeConfig, DeepseekV2Config, DeepseekV3Config); what a model type implies
without a key follows its modeling file (Qwen2 attention has q/k/v biases; Qwen3 normalises q and
k per head, OLMoE over their full widths; DeepSeek-V3's router holds e_score_correction_bias).
"""

from __future__ import annotations

from planner.errors import PlannerError

_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts")
_MLA = {"kv_lora_rank": "kv_lora_rank", "q_lora_rank": "q_lora_rank", "qk_rope_dim": "qk_rope_head_dim",
        "qk_nope_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim"}


def _int(cfg: dict, key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlannerError(f"{where} {key}", "missing" if value is None else value, "required: a whole number >= 0")
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
    fields["qk_norm"] = {"qwen3": "head", "qwen3_moe": "head", "olmoe": "full"}.get(kind, "none")
    key = next((k for k in _EXPERTS if cfg.get(k)), None)
    if key is None:
        return fields
    experts, top_k = _int(cfg, key, where), _int(cfg, "num_experts_per_tok", where)
    width = "moe_intermediate_size" if cfg.get("moe_intermediate_size") else "intermediate_size"
    fields.update(experts=experts, top_k=top_k, expert_ffn=_int(cfg, width, where))
    if kind in ("deepseek_v2", "deepseek_v3"):
        if cfg.get("moe_layer_freq", 1) != 1:
            raise PlannerError(f"{where} moe_layer_freq", cfg["moe_layer_freq"], "1 (every layer after the dense ones)")
        fields.update(shared_experts=_int(cfg, "n_shared_experts", where, 0),
                      dense_layers=_int(cfg, "first_k_dense_replace", where, 0), router_bias=kind == "deepseek_v3")
        # group-limited routing (topk_method group_limited_greedy / noaux_tc): top_k inside topk_group of n_group
        groups = _int(cfg, "n_group", where, 1) or 1
        fields.update(expert_groups=groups, groups_per_token=_int(cfg, "topk_group", where, groups) or groups)
    if kind in ("qwen2_moe", "qwen3_moe") and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        raise PlannerError(f"{where} decoder_sparse_step", cfg.get("decoder_sparse_step"),
                               "1 with mlp_only_layers empty (every layer an MoE layer)")
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if shared:
        if shared % fields["expert_ffn"]:
            raise PlannerError(f"{where} shared_expert_intermediate_size", shared,
                               f"a multiple of the expert width {fields['expert_ffn']}")
        fields.update(shared_experts=shared // fields["expert_ffn"], shared_expert_gate=kind == "qwen2_moe")
    return fields
