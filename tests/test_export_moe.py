"""Mixture-of-experts and expert parallel in the exports, parsed back: Megatron-Core's MoE flags
(names checked against megatron/training/arguments.py and the TransformerConfig fields it derives
flags from), torchtitan's expert_parallel_degree, and refusals where a format has no expert degree.

Expected values are the released configs' (tests/data/*.config.json): Mixtral 8x7B has 8 experts,
top-2, expert width 14336, no shared expert, no dense layer, dropless; DeepSeek-V3 has 256 routed
experts, top-8, width 2048, one shared expert, its first 3 of 61 layers dense."""

from __future__ import annotations

import re
import tomllib

import pytest

from planner.core.model import ModelSpec
from tests.test_export import bash_arrays, export, flags, run
from tests.test_export_torchtitan import planned_layout, read_layout

MIXTRAL_EP = ["--preset", "mixtral-8x7b", "--gpus", "64", "--dp", "32", "--tp", "2", "--pp", "1", "--cp", "1",
              "--ep", "8", "--micro-batch", "2", "--global-batch", "128", "--recompute", "full", "--sequence-parallel"]


def megatron_flags(text: str) -> dict:
    return flags([w for words in bash_arrays(text).values() for w in words])


def layer_pattern(expr: str) -> list[int]:
    """--moe-layer-freq's "([0]*k+[1]*n)" list expression, evaluated without eval."""
    parts = re.fullmatch(r"\(((?:\[[01]\]\*\d+\+?)+)\)", expr)
    assert parts, expr
    out: list[int] = []
    for bit, count in re.findall(r"\[([01])\]\*(\d+)", parts.group(1)):
        out += [int(bit)] * int(count)
    return out


def test_megatron_mixtral_flags_and_expert_parallel(capsys):
    f = megatron_flags(export(capsys, "megatron", *MIXTRAL_EP, "--zero", "1")[0])
    assert (f["--num-experts"], f["--moe-router-topk"], f["--moe-ffn-hidden-size"]) == ("8", "2", "14336")
    assert f["--expert-model-parallel-size"] == "8" and f["--tensor-model-parallel-size"] == "2"
    assert f["--moe-token-dispatcher-type"] == "alltoall" and f["--moe-grouped-gemm"] is True
    for absent in ("--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--moe-expert-capacity-factor"):
        assert absent not in f  # no shared expert, no dense layer, dropless


def test_megatron_deepseek_v3_shared_expert_and_dense_layers(capsys):
    f = megatron_flags(export(capsys, "megatron", "--preset", "deepseek-v3", "--gpus", "2048", "--gpu", "h100")[0])
    assert (f["--num-experts"], f["--moe-router-topk"], f["--moe-ffn-hidden-size"]) == ("256", "8", "2048")
    assert f["--moe-shared-expert-intermediate-size"] == "2048"  # 1 shared expert x 2048
    pattern = layer_pattern(f["--moe-layer-freq"])
    assert pattern == [0, 0, 0] + [1] * 58 and len(pattern) == int(f["--num-layers"]) == 61


def test_megatron_capacity_factor_drops_tokens():
    from planner.export.megatron import moe_args as megatron_moe_args

    m = ModelSpec(name="moe-test", layers=4, hidden=512, heads=8, experts=8, top_k=2, expert_ffn=1024,
                  capacity_factor=1.25)
    f = flags([str(a) for a in megatron_moe_args(m)])
    assert f["--moe-expert-capacity-factor"] == "1.25" and f["--moe-token-drop-policy"] == "probs"
    assert megatron_moe_args(ModelSpec(name="dense", layers=4, hidden=512, heads=8)) == []


def test_torchtitan_expert_parallel_round_trips(capsys):
    code, out, err = run(capsys, "export", "--format", "torchtitan", *MIXTRAL_EP, "--zero", "3")
    assert code == 0, err
    cfg = tomllib.loads(out)
    got = read_layout(cfg, 32, 64)
    want = planned_layout(capsys, *MIXTRAL_EP, "--zero", "3")
    assert got == {k: want[k] for k in got}
    assert (got["ep"], got["dp"], got["tp"]) == (8, 32, 2)
    par = cfg["parallelism"]
    assert par["expert_tensor_parallel_degree"] == 2  # experts keep the layout's tp
    assert par["data_parallel_shard_degree"] * par["context_parallel_degree"] % par["expert_parallel_degree"] == 0
    assert cfg["model"]["name"] == "qwen3" and "register flavor 'mixtral-8x7b'" in out


@pytest.mark.parametrize("preset, name, flavor", [("deepseek-v3", "deepseek_v3", "671B"),
                                                  ("deepseek-v2-lite", "deepseek_v3", "16B"),
                                                  ("qwen3-30b-a3b", "qwen3", "30B-A3B")])
def test_torchtitan_flavors_of_released_moe_models(preset, name, flavor):
    from planner.core.presets import presets
    from planner.export.torchtitan import model_section

    section, notes = model_section(presets()[preset])
    assert (section["name"], section["flavor"], notes) == (name, flavor, [])


@pytest.mark.parametrize("argv, needle", [
    (["--format", "deepspeed", "--preset", "mixtral-8x7b", "--gpus", "64", "--tp", "1", "--pp", "1", "--ep", "8",
      "--stack", "megatron-core"], "ep=8"),
    (["--format", "torchrun", "--preset", "olmoe-1b-7b", "--gpus", "8", "--tp", "2"], "tp=2"),
    (["--format", "torchrun", "--preset", "deepseek-v2-lite", "--gpus", "8"], "kv_lora_rank=512"),
    (["--format", "torchrun", "--preset", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--stack", "fsdp2"], "tp=2"),
    (["--format", "torchtitan", "--preset", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--zero", "0",
      "--stack", "megatron-core"], "zero_stage=0"),
])
def test_expert_parallel_a_format_cannot_express(capsys, argv, needle):
    code, out, err = run(capsys, "export", *argv)
    assert code == 2 and out == "", err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def preset_flags(name: str) -> dict:
    from planner.core.presets import presets
    from planner.export.megatron import megatron_model_args

    return flags([str(a) for a in megatron_model_args(presets()[name], "flash")])


def test_megatron_attention_variants_of_the_released_configs():
    # DeepSeek-V3 config.json: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
    # qk_rope_head_dim 64, v_head_dim 128, scoring_func sigmoid with e_score_correction_bias
    f = preset_flags("deepseek-v3")
    assert f["--multi-latent-attention"] is True and "--group-query-attention" not in f
    assert (f["--q-lora-rank"], f["--kv-lora-rank"], f["--qk-head-dim"], f["--qk-pos-emb-head-dim"],
            f["--v-head-dim"]) == ("1536", "512", "128", "64", "128")
    assert f["--moe-router-score-function"] == "sigmoid" and f["--moe-router-enable-expert-bias"] is True
    # DeepSeek-V3 Sec. 4.2: sequence-wise balance loss alpha = 0.0001 beside the bias
    assert f["--moe-router-load-balancing-type"] == "seq_aux_loss" and float(f["--moe-aux-loss-coeff"]) == 1e-4
    # Mixtral-style routers: Switch Transformer's auxiliary loss, alpha = 0.01 (Fedus et al. 2022, Sec. 2.2)
    f = preset_flags("mixtral-8x7b")
    assert f["--moe-router-load-balancing-type"] == "aux_loss" and float(f["--moe-aux-loss-coeff"]) == 1e-2
    # DeepSeek-V2-Lite: no q compression (q_lora_rank null)
    assert "--q-lora-rank" not in preset_flags("deepseek-v2-lite")
    # Qwen3-30B-A3B: head_dim 128 on hidden 2048 / 32 heads = 64; 4 KV heads; per-head q/k RMSNorm
    f = preset_flags("qwen3-30b-a3b")
    assert f["--kv-channels"] == "128" and f["--num-query-groups"] == "4" and f["--qk-layernorm"] is True
    # Qwen1.5-MoE-A2.7B: q/k/v biases, shared_expert_intermediate_size 5632 with a sigmoid gate
    f = preset_flags("qwen1.5-moe-a2.7b")
    assert f["--add-qkv-bias"] is True and f["--moe-shared-expert-intermediate-size"] == "5632"
    assert f["--moe-shared-expert-gate"] is True
    # a dense LLaMA has none of them
    f = preset_flags("llama3-8b")
    assert not {"--kv-channels", "--qk-layernorm", "--add-qkv-bias", "--multi-latent-attention"} & set(f)


def test_megatron_refuses_olmoe_full_width_qk_norm():
    from planner.core.layout import Job, Layout
    from planner.core.presets import presets
    from planner.export.rules import megatron_checks

    lay = Layout(dp=8, global_batch=64)
    bad = megatron_checks(lay, presets()["olmoe-1b-7b"], Job())
    assert [p.field for p in bad] == ["qk_norm"]


def test_torchtitan_refuses_what_its_moe_lacks():
    import dataclasses

    from planner.core.layout import Job, Layout
    from planner.core.presets import presets
    from planner.export.rules import torchtitan_checks

    lay = Layout(dp=8, zero_stage=3, global_batch=64)
    assert [p.field for p in torchtitan_checks(lay, presets()["qwen1.5-moe-a2.7b"], Job())] == ["shared_expert_gate"]
    capped = dataclasses.replace(presets()["mixtral-8x7b"], capacity_factor=1.25)
    assert [p.field for p in torchtitan_checks(lay, capped, Job())] == ["capacity_factor"]
    assert torchtitan_checks(lay, presets()["mixtral-8x7b"], Job()) == []


def test_trainer_run_config_of_an_moe_with_expert_parallel(capsys):
    from tests.test_export import heredoc_yaml

    config_mod = pytest.importorskip("reference_trainer.config")
    out, _ = export(capsys, "torchrun", "--preset", "mixtral-8x7b", "--gpus", "64", "--tp", "1", "--ep", "8",
                    "--stack", "fsdp2")
    raw = heredoc_yaml(out)
    assert {k: raw["model"][k] for k in ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers")} == {
        "experts": 8, "top_k": 2, "expert_ffn": 14336, "shared_experts": 0, "dense_layers": 0}
    assert raw["layout"]["ep"] == 8 and raw["checkpoint"]["interval"] == 0  # no checkpoints with ep > 1
    cfg = config_mod.build_config(raw)
    assert (cfg.spec.experts, cfg.layout.ep) == (8, 8)
    assert "--preset mixtral-8x7b" in out and "--ep 8" in out


def test_megatron_group_limited_routing_flags(capsys):
    """DeepSeek-V3's released config routes top-8 inside 4 of 8 groups (n_group, topk_group):
    Megatron-Core's --moe-router-num-groups / --moe-router-group-topk. Mixtral has no groups."""
    f = megatron_flags(export(capsys, "megatron", "--preset", "deepseek-v3", "--gpus", "2048", "--gpu", "h100")[0])
    assert (f["--moe-router-num-groups"], f["--moe-router-group-topk"]) == ("8", "4")
    f = megatron_flags(export(capsys, "megatron", *MIXTRAL_EP, "--zero", "1")[0])
    assert "--moe-router-num-groups" not in f and "--moe-router-group-topk" not in f
