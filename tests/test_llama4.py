"""Llama 4: chunked attention on the RoPE layers, a shared expert beside the routed ones, and
Maverick's MoE layers interleaved with dense ones. Parameter counts against transformers and by
hand, the attention work against a brute-force count of the chunked mask, the Hugging Face config
variants, the exports, and bad input in one line."""

import json
from pathlib import Path

import numpy as np
import pytest

from planner.core.flops import attention_flops_per_token
from planner.core.layout import Job, Layout
from planner.core.model import ModelSpec
from planner.core.options import model_from_hf_config
from planner.core.presets import get_preset
from planner.errors import PlannerError
from tests.helpers import evaluate_one

DATA = Path(__file__).parent / "data"
SCOUT = DATA / "Llama-4-Scout-17B-16E.config.json"


def test_scout_counts_as_transformers_builds_it_and_by_hand():
    """Scout's language model: transformers 5.25.0's Llama4ForCausalLM from the file's text_config
    on the meta device has 107,769,861,120 parameters, 17,172,894,720 of them active (the routed
    experts' weights times 1/16 kept); Meta cites 109B total with the vision encoder and 17B active.
    By hand: 48 layers of q and o (5120 x 40*128), k and v (5120 x 8*128), a router (5120 x 16),
    a shared SwiGLU expert and 16 routed ones of width 8192, two RMSNorms; embedding and head
    (202048 x 5120, untied) and the final norm."""
    spec, note = model_from_hf_config(SCOUT)
    h, e = 5120, 3 * 5120 * 8192
    layer = 2 * h * 5120 + 2 * h * 1024 + h * 16 + e + 16 * e + 2 * h
    assert spec.params == 48 * layer + 2 * 202048 * h + h == 107_769_861_120
    assert spec.active_params == 48 * (layer - 15 * e) + 2 * 202048 * h + h == 17_172_894_720
    assert (spec.experts, spec.top_k, spec.shared_experts, spec.moe_every, spec.moe_layers) == (16, 1, 1, 1, 48)
    # chunks of 8192 on the 36 RoPE layers (no_rope_layers 1); the context before RoPE scaling
    assert (spec.window, spec.window_layers, spec.chunked, spec.seq_len) == (8192, 36, True, 8192)
    assert "text_config" in note and "llama4_text" in note


def test_maverick_interleaves_its_moe_layers_and_counts_as_transformers_builds_it():
    """Maverick: Scout's shape with 128 experts in every second layer (interleave_moe_layer_step 2:
    layers 1, 3, ..., 47) and the dense 16384-wide SwiGLU in the others. transformers 5.25.0 builds
    400,711,848,960 parameters, 17,184,691,200 active (Meta: 400B total, 17B active)."""
    spec = get_preset("llama4-maverick-17b-128e")
    h, e = 5120, 3 * 5120 * 8192
    attention, norms = 2 * h * 5120 + 2 * h * 1024, 2 * h
    dense = attention + 3 * h * 16384 + norms
    moe = attention + h * 128 + e + 128 * e + norms
    assert spec.moe_layers == 24
    assert spec.params == 24 * dense + 24 * moe + 2 * 202048 * h + h == 400_711_848_960
    assert spec.active_params == 400_711_848_960 - 24 * 127 * e == 17_184_691_200
    assert get_preset("llama4-scout-17b-16e").params == model_from_hf_config(SCOUT)[0].params
    assert "MoE in 24 of 48 layers (every 2)" in spec.describe()
    assert "chunked attention 8192 in 36 of 48 layers" in spec.describe()


def _chunked_pairs(s: int, c: int) -> int:
    """Query-key pairs a causal mask split into aligned chunks of c keeps: query i sees keys
    c*(i // c) .. i, written out as the mask."""
    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    return int(((j <= i) & (i // c == j // c)).sum())


@pytest.mark.parametrize("s, c", [(8192, 1024), (4096, 1000), (2048, 512), (1024, 4096)])
def test_the_attention_span_is_the_share_of_the_mask_chunks_keep(s, c):
    """Against the brute-force mask: chunks of c keep about s*c/2 of the s*s/2 causal pairs (to the
    diagonal's c/2 per chunk, < 0.2% here); a partial last chunk its own triangle; a chunk as long
    as the sequence keeps them all."""
    spec = ModelSpec(arch="llama", layers=4, hidden=256, heads=4, seq_len=s, window=c, chunked=True)
    share = _chunked_pairs(s, c) / _chunked_pairs(s, s)
    assert spec.attention_span == pytest.approx(share, rel=2e-3)
    assert spec.replace(window_layers=3).attention_span == pytest.approx((1 + 3 * share) / 4, rel=2e-3)
    # a sliding window of the same length keeps nearly twice as much (each query its c last keys)
    if c < s:
        assert spec.replace(chunked=False).attention_span > 1.7 * spec.attention_span


def test_chunks_at_a_long_context_cut_the_attention_work_and_the_step():
    """Scout at 131,072 tokens: 36 of 48 layers attend in 16 chunks of 8192, 1/16 of the causal
    triangle each; attention FLOPs per token (36/16 + 12) / 48 of full attention's."""
    spec = get_preset("llama4-scout-17b-16e").replace(seq_len=131072)
    full = spec.replace(window=0)
    assert not full.chunked and full.window_layers == 0
    assert attention_flops_per_token(spec) == pytest.approx((36 / 16 + 12) / 48 * attention_flops_per_token(full),
                                                            rel=1e-12)
    small = ModelSpec(arch="llama", layers=8, hidden=1024, heads=8, kv_heads=2, seq_len=8192, experts=4, top_k=1,
                      expert_ffn=1024, shared_experts=1, window=1024, chunked=True)
    layout = Layout(dp=2, tp=2, micro_batch=1, global_batch=8, recompute="half")
    chunked = float(evaluate_one(small, layout).time.step[0])
    assert chunked < float(evaluate_one(small.replace(chunked=False), layout).time.step[0])  # less than a window
    assert chunked < float(evaluate_one(small.replace(window=0), layout).time.step[0])


@pytest.mark.parametrize("text, expected", [
    ({"layer_types": ["chunked_attention", "full_attention"] * 24}, (8192, 24, True)),
    ({"no_rope_layers": [1, 0] * 24}, (8192, 24, True)),
    ({"no_rope_layers": None}, (8192, 36, True)),  # the class's layout: every 4th layer NoPE
    ({"no_rope_layers": None, "no_rope_layer_interval": 3}, (8192, 32, True)),
    ({"attention_chunk_size": None}, (0, 0, False)),  # null: no chunks
    ({"attention_chunk_size": 2048}, (2048, 36, True)),
])
def test_the_chunked_layers_follow_the_config(tmp_path, text, expected):
    cfg = json.loads(SCOUT.read_text())
    cfg["text_config"].update(text)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec, _ = model_from_hf_config(path)
    assert (spec.window, spec.window_layers, spec.chunked) == expected


def test_a_text_only_llama4_config_and_maverick_s_interleaving(tmp_path):
    text = json.loads(SCOUT.read_text())["text_config"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(text))  # llama4_text, as fine-tuned text-only models ship it
    assert model_from_hf_config(path)[0].params == 107_769_861_120
    maverick = {**text, "num_local_experts": 128, "interleave_moe_layer_step": 2, "moe_layers": list(range(1, 48, 2))}
    path.write_text(json.dumps(maverick))
    assert model_from_hf_config(path)[0].params == get_preset("llama4-maverick-17b-128e").params


@pytest.mark.parametrize("text, key", [
    ({"attention_chunk_size": "8192"}, "attention_chunk_size"),
    ({"attention_chunk_size": 0}, "attention_chunk_size"),
    ({"moe_layers": [0, 2, 5]}, "moe_layers"),  # no every-N-th pattern
    ({"interleave_moe_layer_step": 0}, "interleave_moe_layer_step"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers"),
    ({"layer_types": ["sliding_attention"] * 48}, "layer_types"),
    ({"layer_types": [{"kind": "chunked"}] * 48}, "layer_types"),  # entries not even names
    ({"intermediate_size_mlp": -1}, "intermediate_size_mlp"),
])
def test_a_llama4_config_the_planner_cannot_read_is_one_line(tmp_path, text, key):
    cfg = json.loads(SCOUT.read_text())
    cfg["text_config"].update(text)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert err.value.field == f"hf_config text_config {key}" and len(str(err.value).splitlines()) == 1
    path.write_text(json.dumps({"model_type": "llama4", "text_config": [1, 2]}))
    with pytest.raises(PlannerError) as err:
        model_from_hf_config(path)
    assert err.value.field == "hf_config text_config" and "llama4" in str(err.value)


@pytest.mark.parametrize("fields, field", [
    ({"moe_every": 2}, "moe_every"),  # a dense model
    ({"experts": 4, "top_k": 1, "moe_every": 0}, "moe_every"),
    ({"experts": 4, "top_k": 1, "moe_every": 9}, "moe_every"),  # no MoE layer in 8
    ({"experts": 4, "top_k": 1, "dense_layers": 6, "moe_every": 3}, "moe_every"),
    ({"chunked": True}, "chunked"),  # no window
    ({"window": 64, "chunked": 1}, "chunked"),
])
def test_bad_llama4_fields_are_one_line(fields, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(arch="llama", layers=8, hidden=512, heads=8, **fields)
    assert err.value.field == field and len(str(err.value).splitlines()) == 1


def test_the_exports_place_the_moe_layers_and_name_the_chunks():
    from planner.export.megatron import moe_args
    from planner.export.rules import TRAINER_UNBUILT, megatron_checks
    from planner.export.torchtitan import model_section

    maverick = get_preset("llama4-maverick-17b-128e")
    flags = moe_args(maverick)
    pattern = eval(flags[flags.index("--moe-layer-freq") + 1])  # the list expression, as Megatron evaluates it
    assert [i for i, moe in enumerate(pattern) if moe] == list(range(1, 48, 2)) and len(pattern) == 48
    odd = ModelSpec(arch="llama", layers=9, hidden=256, heads=4, experts=4, top_k=1, dense_layers=2, moe_every=3)
    flags = moe_args(odd)
    pattern = eval(flags[flags.index("--moe-layer-freq") + 1])
    assert pattern == [0, 0, 0, 0, 1, 0, 0, 1, 0] and sum(pattern) == odd.moe_layers == 2
    errors = megatron_checks(Layout(dp=1, micro_batch=1, global_batch=1), maverick, Job())
    assert [e.field for e in errors] == ["chunked"]
    assert model_section(maverick)[0] == {"name": "llama4", "flavor": "17bx128e",
                                          "hf_assets_path": "./assets/hf/llama4-maverick-17b-128e"}
    assert model_section(get_preset("llama4-scout-17b-16e"))[0]["flavor"] == "17bx16e"
    assert TRAINER_UNBUILT["chunked"] is False and TRAINER_UNBUILT["moe_every"] == 1


def test_the_json_names_the_chunks_and_the_interleaving(capsys):
    from planner.cli.main import main

    assert main(["estimate", "--preset", "llama4-maverick-17b-128e", "--gpus", "256", "--gpu", "h100",
                 "--format", "json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert (model["moe_every"], model["window"], model["window_layers"], model["chunked"]) == (2, 8192, 36, True)
    assert main(["estimate", "--preset", "llama3-8b", "--gpus", "8", "--format", "json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert "chunked" not in model and "moe_every" not in model
