"""Evaluation in the plan (--eval-every / --eval-every-steps, --eval-tokens): forward-only passes
added to the time to train and everything that follows from it.

The expected cost is derived here by hand: on a GPU whose GEMMs and attention run at exactly half
its peak at every size (matmul = flash/fused attention = 0.5, no size penalty) and whose memory
traffic is free (1e6 GB/s), with no per-layer overhead, one GPU and no pipeline, an evaluation of
T tokens costs T x (2 x matmul parameters + causal attention's 2 s h per layer) / (0.5 x peak)."""

import json
import math
from pathlib import Path

import pytest

from planner.cli.main import main as cli_main
from planner.core.options import build_inputs
from planner.core.plan import plan
from planner.hardware import load_profile_file

A100 = Path(__file__).parent.parent / "hardware_profiles" / "a100-80g.toml"
L, H, HEADS, F, V, S = 4, 512, 8, 1536, 4096, 512  # llama: gated MLP, untied head, multi-head attention
PEAK = 312e12  # the A100 profile's bf16 dense peak
SHAPE = {"arch": "llama", "layers": L, "hidden": H, "heads": HEADS, "ffn_hidden": F, "vocab": V, "seq_len": S}
LAYOUT = {"dp": 1, "tp": 1, "pp": 1, "micro_batch": 2, "zero_stage": 0, "recompute": "none", "global_batch": 8}


def ideal_gpu(tmp_path: Path) -> Path:
    text = A100.read_text().replace("hbm_gb_per_s = 2039 ", "hbm_gb_per_s = 1000000 ")
    assert "hbm_gb_per_s = 1000000" in text
    text = text.replace('name = "a100-80g"', 'name = "ideal"').replace("aliases = [", "aliases = [\"ideal-x\", ")
    text += ("matmul = 0.5\nmatmul_half_dim = 0\nflash_attention = 0.5\nfused_attention = 0.5\nmemory = 1.0\n"
             "layer_overhead_s = 0\nstep_overhead_s = 0\nstep_jitter = 0\n")
    path = tmp_path / "ideal.toml"
    path.write_text(text)
    return path


def forward_flops_per_token() -> float:
    matmul_params = L * (4 * H * H + 3 * H * F) + H * V  # Q, K, V, O; gate, up, down; the output head
    attention = L * 2 * S * H  # QK^T and AV: 4 s h per token over the square, half of it causal
    return 2 * matmul_params + attention


def test_the_evaluation_costs_its_forward_flops_at_the_forward_rate(tmp_path):
    gpu = str(ideal_gpu(tmp_path))
    values = {**SHAPE, **LAYOUT, "gpu": gpu, "gpus": 1, "stack": "megatron-core", "tokens": 1e8,
              "eval_every": 1e7, "eval_tokens": 2e6, "memory_headroom": 0.0}
    x = build_inputs(values)
    e = plan(x.model, x.hardware, x.job, x.gpus, x.pins).best
    evaluations = 10  # every 10M of 100M tokens
    expected = evaluations * 2e6 * forward_flops_per_token() / (0.5 * PEAK)
    assert e.train.evaluations == evaluations
    assert e.train.eval_seconds == pytest.approx(expected, rel=2e-3)
    # Added to the time to train, and so to GPU-hours, energy and cost.
    base = plan(x.model, x.hardware, x.job.replace(eval_every=None, eval_tokens=None), x.gpus, x.pins).best
    assert e.train.seconds == pytest.approx(base.train.seconds + e.train.eval_seconds, rel=1e-9)
    assert e.train.gpu_hours / base.train.gpu_hours == pytest.approx(e.train.seconds / base.train.seconds)
    assert e.train.cost_usd / base.train.cost_usd == pytest.approx(e.train.seconds / base.train.seconds)
    assert e.train.energy_kwh / base.train.energy_kwh == pytest.approx(e.train.seconds / base.train.seconds)
    assert load_profile_file(gpu).gpu.peak_flops["bf16"] == PEAK


def test_every_n_steps_counts_the_steps(tmp_path):
    """100M tokens in steps of 8 x 512 tokens: 24,414.06 steps, an evaluation every 1,000: 24."""
    values = {**SHAPE, **LAYOUT, "gpu": str(ideal_gpu(tmp_path)), "gpus": 1, "stack": "megatron-core",
              "tokens": 1e8, "eval_every_steps": 1000, "eval_tokens": 4096, "memory_headroom": 0.0}
    x = build_inputs(values)
    e = plan(x.model, x.hardware, x.job, x.gpus, x.pins).best
    assert e.train.evaluations == math.floor(1e8 / (8 * S) / 1000) == 24
    assert e.train.eval_seconds == pytest.approx(24 * 4096 * forward_flops_per_token() / (0.5 * PEAK), rel=2e-3)


def test_a_pipeline_evaluates_with_its_own_fill_and_drain(tmp_path):
    """Two stages of 2 layers (the head not balanced away: --set pipeline.balance_pipeline=false),
    m = 8 micro-batches: a forward-only pipeline takes m + (p - 1) forward slots of its slowest
    stage (the last: 2 layers and the head) per batch, GPipe's forward half. Each slot also sends
    one activation to the next stage (2 MiB over NVLink, about 2% here): the bound allows it."""
    h, f, heads = 2048, 6144, 16
    values = {**SHAPE, **LAYOUT, "hidden": h, "ffn_hidden": f, "heads": heads, "gpu": str(ideal_gpu(tmp_path)),
              "stack": "megatron-core", "tokens": 1e8, "eval_every": 1e7, "eval_tokens": 2e6,
              "memory_headroom": 0.0, "micro_batch": 1, "gpus": 2, "pp": 2, "vpp": 1,
              "stack_set": ("pipeline.balance_pipeline=false",)}
    x = build_inputs(values)
    two = plan(x.model, x.hardware, x.job, x.gpus, x.pins).best
    assert (two.layout.pp, two.layout.grad_accum) == (2, 8)
    layer = (2 * (4 * h * h + 3 * h * f) + 2 * S * h) / (0.5 * PEAK)  # seconds per token
    slowest = 2 * layer + 2 * h * V / (0.5 * PEAK)
    batches = 10 * 2e6 / (8 * S)
    expected = batches * (8 + 1) * slowest * S
    assert expected <= two.train.eval_seconds <= 1.03 * expected


def _inputs(values):
    x = build_inputs(values)
    return x.model, x.hardware, x.job, x.gpus, x.pins


def test_no_evaluation_changes_no_number(capsys):
    flags = ["--params", "7B", "--gpus", "8", "--format", "json"]
    assert cli_main(["estimate", *flags]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["train"]["evaluations"] == 0 and j["train"]["eval_seconds"] == 0
    tokens_s = j["tokens_per_s"]
    assert j["train"]["seconds"] == pytest.approx(j["train"]["tokens"] / tokens_s, rel=1e-12)


def test_report_json_and_errors(capsys):
    flags = ["estimate", "--params", "7B", "--gpus", "8"]
    assert cli_main([*flags, "--eval-every", "1B", "--eval-tokens", "100M", "--format", "json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["train"]["evaluations"] == math.floor(j["train"]["tokens"] / 1e9)
    assert 0 < j["train"]["eval_seconds"] < j["train"]["seconds"]
    assert cli_main([*flags, "--eval-every", "1B", "--eval-tokens", "100M", "--wide"]) == 0  # --wide: the eval line unwrapped
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("eval "))
    assert f"{j['train']['evaluations']:,} evaluations (every 1B tokens, 100M tokens each, forward only)" in line
    share = j["train"]["eval_seconds"] / j["train"]["seconds"]
    assert f"({share:.1%}), included above" in line
    for bad, words in ((["--eval-every", "1B"], "go together"),
                       (["--eval-every", "1B", "--eval-every-steps", "10", "--eval-tokens", "1M"], "not both"),
                       (["--eval-every-steps", "0", "--eval-tokens", "1M"], "eval_every_steps"),
                       (["--eval-every", "-5", "--eval-tokens", "1M"], "eval_every")):
        assert cli_main([*flags, *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, (bad, err)


def test_the_explorer_offers_the_fields():
    from planner.app import state

    s = {**state.defaults(), "eval_every": 1.0, "eval_tokens": 0.1}
    m = state.mapping_from_state(s)
    job = build_inputs(m).job
    assert (job.eval_every, job.eval_tokens) == (1e9, 1e8)
    assert "--eval-every 1B --eval-tokens 0.1B" in state.estimate_command(s)
