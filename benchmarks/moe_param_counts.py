"""Parameter counts of the MoE presets: Hugging Face transformers' model built from each released
config.json (tests/data/) on the meta device, against the planner's ModelSpec.

    python benchmarks/moe_param_counts.py            # one row per preset; exit 1 on a mismatch

transformers is not a project dependency: without it the script says so and exits 0. Its counts
are what tests/test_moe_model.py hard-codes (with this script's transformers version).

Counted as the checkpoint stores them: every parameter once (tied ones once) plus the persistent
buffers that are weights (DeepSeek-V3's router ``e_score_correction_bias``, a buffer in
transformers, a tensor of the released checkpoint). Active = total less the routed experts a token
does not use: each MoE layer's routed-expert tensors (names under ``.mlp.experts.``, Llama 4's ``.feed_forward.experts.``) times
(experts - top_k) / experts.

DeepSeek-V3's checkpoint also holds a multi-token-prediction module (``num_nextn_predict_layers``:
1, stored as layer 61) that transformers does not build; the planner does not count it either
(see README, "Mixture of experts").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
# preset -> released config.json (tests/data/README.md says where each copy comes from)
CONFIGS = {
    "mixtral-8x7b": "Mixtral-8x7B-v0.1.config.json",
    "mixtral-8x22b": "Mixtral-8x22B-v0.1.config.json",
    "deepseek-v2-lite": "DeepSeek-V2-Lite.config.json",
    "deepseek-v3": "DeepSeek-V3.config.json",
    "qwen3-30b-a3b": "Qwen3-30B-A3B.config.json",
    "qwen1.5-moe-a2.7b": "Qwen1.5-MoE-A2.7B.config.json",
    "olmoe-1b-7b": "OLMoE-1B-7B-0924.config.json",
    "gpt-oss-20b": "gpt-oss-20b.config.json",
    "llama4-scout-17b-16e": "Llama-4-Scout-17B-16E.config.json",  # its language model (text_config)
}
_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts")


def transformers_counts(path: Path) -> tuple[int, int]:
    """(total, active) of the transformers model built from the config at ``path``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads(path.read_text())
    raw.pop("auto_map", None)  # the built-in class, not the repository's remote code
    raw.pop("quantization_config", None)
    if raw.get("model_type") == "llama4":  # image and text: the language model, as the planner reads it
        raw = {**raw["text_config"], "model_type": "llama4_text"}
        # the released file's 4 (a temperature-tuning switch) where transformers 5 wants a bool
        raw["attn_temperature_tuning"] = bool(raw.get("attn_temperature_tuning", True))
    kind = raw.pop("model_type")
    config = AutoConfig.for_model(kind, **raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    seen, total, routed = set(), 0, 0
    for name, p in model.named_parameters(remove_duplicate=True):
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if ".mlp.experts." in name or ".feed_forward.experts." in name:  # Llama 4's MLP is feed_forward
            routed += p.numel()
    state = set(model.state_dict())
    total += sum(b.numel() for name, b in model.named_buffers() if name in state)
    experts = next(raw[k] for k in _EXPERTS if raw.get(k))
    active = total - routed * (experts - raw["num_experts_per_tok"]) // experts
    return total, active


def main() -> int:
    try:
        import transformers
    except ImportError:
        print("transformers is not installed (pip install transformers): nothing to compare; skipped")
        return 0
    from planner.core.presets import get_preset

    print(f"transformers {transformers.__version__}; configs from {DATA}")
    print(f"{'preset':<20}{'transformers total':>22}{'planner total':>20}{'transformers active':>22}"
          f"{'planner active':>20}  equal")
    bad = 0
    for preset, file in CONFIGS.items():
        total, active = transformers_counts(DATA / file)
        spec = get_preset(preset)
        equal = (spec.params, spec.active_params) == (total, active)
        bad += not equal
        print(f"{preset:<20}{total:>22,}{spec.params:>20,}{active:>22,}{spec.active_params:>20,}  {equal}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
