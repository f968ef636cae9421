"""Whole-job planning: LoRA, checkpoints and failures (Young/Daly), the data feed."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli.main import main
from planner.core.finetune import trainable_params
from planner.core.layout import Job, Layout
from planner.core.plan import plan
from planner.core.presets import get_preset
from planner.core.resilience import LLAMA3_MTBF_GPU_HOURS, Operations, daly_interval, expected_wall_seconds
from planner.core.search import Pins
from planner.errors import PlannerError
from planner.hardware import get_profile
from tests.helpers import evaluate_one

A100 = get_profile("a100-80g")


def test_lora_trainable_params_llama7b_r8_q_v():
    # 32 layers x (q: 8 x (4096 + 4096) + v: 8 x (4096 + 4096)) = 4,194,304 (PEFT prints the same).
    assert trainable_params(get_preset("llama-7b"), Job(mode="lora", lora_r=8, lora_targets=("q_proj", "v_proj"))) \
        == 4_194_304


def test_lora_gqa_targets_use_the_kv_width():
    # llama3-8b: k_proj is 4096 -> 1024 (8 KV heads of 128): r * (4096 + 1024) per layer.
    job = Job(mode="lora", lora_r=16, lora_targets=("k_proj",))
    assert trainable_params(get_preset("llama3-8b"), job) == 32 * 16 * (4096 + 1024)


def test_lora_targets_take_the_heads_width_not_the_residual_streams():
    # Qwen3-30B-A3B (hidden 2048; 32 query heads and 4 K/V heads of 128): q_proj is 2048 -> 4096,
    # o_proj 4096 -> 2048, v_proj 2048 -> 512; 48 layers, r = 8: 8 x (6144 + 6144 + 2560) per layer.
    job = Job(mode="lora", lora_r=8, lora_targets=("q_proj", "o_proj", "v_proj"))
    assert trainable_params(get_preset("qwen3-30b-a3b"), job) == 48 * 8 * (6144 + 6144 + 2560)


def test_lora_rank_larger_than_the_matrix_is_refused():
    with pytest.raises(PlannerError) as err:
        trainable_params(get_preset("llama-7b"), Job(mode="lora", lora_r=5000))
    assert err.value.field == "lora_r"


def test_lora_uses_less_memory_and_time_than_full_finetuning():
    model = get_preset("llama-7b")
    lay = Layout(dp=8, micro_batch=1, global_batch=64)
    # Fused element-wise kernels (megatron-core): the hand count below is for them.
    full = evaluate_one(model, lay, Job(mode="full-finetune", stack="megatron-core"))
    lora = evaluate_one(model, lay, Job(mode="lora", stack="megatron-core"))
    # Frozen weights: 2 bytes per parameter, no gradients or optimizer states for them.
    states_full = float(full.memory.weights[0] + full.memory.gradients[0] + full.memory.optimizer[0])
    states_lora = float(lora.memory.weights[0] + lora.memory.gradients[0] + lora.memory.optimizer[0])
    assert states_full == pytest.approx(model.params * (2 + 4 + 12), rel=1e-6)
    assert states_lora == pytest.approx(model.params * 2 + 4_194_304 * (2 + 4 + 12), rel=1e-6)
    # Activations are still kept for the backward pass through the frozen layers, except the inputs
    # kept only for frozen weights' gradients: the MLP's (h) and down_proj's (f), 2 bytes each, per
    # token (2048 per micro-batch) and layer (32). o_proj's input is the attention output, which
    # the flash kernel's backward reads (FlashAttention-2 saves q, k, v, out and the log-sum-exp):
    # kept though o_proj is frozen.
    saved = float(full.memory.activations[0]) - float(lora.memory.activations[0])
    assert saved == pytest.approx(2 * (4096 + 11008) * 2048 * 32, rel=1e-9)
    standard = Job(mode="lora", stack="megatron-core", attention="standard")
    dropped = (float(evaluate_one(model, lay, standard.replace(mode="full-finetune")).memory.activations[0])
               - float(evaluate_one(model, lay, standard).memory.activations[0]))
    assert dropped == pytest.approx(2 * (4096 + 4096 + 11008) * 2048 * 32, rel=1e-9)  # unfused: o_proj's input too
    # No weight gradients for frozen matmuls: the step is about 2/3 of full fine-tuning.
    ratio = float(lora.step_s[0] / full.step_s[0])
    assert 0.6 < ratio < 0.8


def test_young_daly_interval_by_hand():
    # save 60 s, job MTBF 10 h: Young sqrt(2*60*36000) = 2078.46 s; Daly's correction -> 2038.65 s.
    assert daly_interval(60.0, 36000.0) == pytest.approx(2038.65, abs=0.01)
    assert math.sqrt(2 * 60 * 36000) == pytest.approx(2078.46, abs=0.01)
    assert daly_interval(100.0, 40.0) == 40.0  # save longer than 2M: checkpoint every M
    assert daly_interval(60.0, math.inf) == math.inf


def test_expected_time_first_order():
    # Small overheads: T ~= Ts (1 + d/tau + (tau + d)/(2M) + R/M)  (Daly 2006, eq. 20 expanded).
    ts, tau, d, r, m = 1e6, 2000.0, 60.0, 600.0, 3.6e6
    first_order = ts * (1 + d / tau + (tau + d) / (2 * m) + r / m)
    assert expected_wall_seconds(ts, tau, d, r, m) == pytest.approx(first_order, rel=1e-3)


def test_no_failures_gives_the_ideal_time_exactly():
    p = plan(get_preset("llama-7b"), A100, Job(), 64, ops=Operations(mtbf_gpu_hours=math.inf))
    r = p.best.reliability
    assert r.expected_seconds == r.ideal_seconds == p.best.train.seconds and r.goodput == 1.0
    assert p.best.checkpoint.interval_steps is None


def test_default_failure_rate_is_llama3s():
    assert LLAMA3_MTBF_GPU_HOURS == pytest.approx(16384 * 54 * 24 / 419)
    p = plan(get_preset("llama-33b"), A100, Job(), 128)
    r, c = p.best.reliability, p.best.checkpoint
    assert r.mtbf_job_hours == pytest.approx(LLAMA3_MTBF_GPU_HOURS / 128)
    assert r.expected_interruptions == pytest.approx(r.expected_seconds / 3600 / r.mtbf_job_hours)
    # 32.5B parameters x (4 + 8) bytes: the default stack (FSDP2) saves its fp32 parameters, which
    # are the master weights, and AdamW's two moments (Megatron-Core: 2 + 12, below); kept 3 times.
    assert c.bytes_total == pytest.approx(p.best.model.params * 12)
    mcore = plan(get_preset("llama-33b"), A100, Job(stack="megatron-core"), 128).best.checkpoint
    assert mcore.bytes_total == pytest.approx(p.best.model.params * 14)
    assert c.storage_bytes == pytest.approx(3 * c.bytes_total)
    assert c.save_s == pytest.approx(c.bytes_total / 20e9)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e3, 1e6), st.floats(0.0, 3600.0), st.floats(1.0, 1e4), st.sampled_from([8, 64, 512]))
def test_goodput_never_above_one(mtbf_gpu_hours, restart_s, write_gbps, gpus):
    ops = Operations(mtbf_gpu_hours=mtbf_gpu_hours, restart_s=restart_s, storage_write_bytes_per_s=write_gbps * 1e9)
    p = plan(get_preset("llama-7b"), A100, Job(), gpus, Pins(tp=1, pp=1, zero_stage=3), top=0, ops=ops)
    r = p.best.reliability
    assert 0 < r.goodput <= 1 and r.expected_seconds >= r.ideal_seconds


def test_data_feed_bytes():
    p = plan(get_preset("llama3-8b"), A100, Job(), 16, ops=Operations(storage_read_bytes_per_s=1e5))
    d = p.best.data_feed
    assert d.token_bytes == 4  # vocabulary 128256 needs uint32
    assert d.bytes_per_s == pytest.approx(p.best.tokens_per_s * 4)
    assert d.dataset_bytes == pytest.approx(20 * p.best.model.params * 4)
    assert not d.keeps_up and any("data feed" in w for w in p.best.warnings)


@pytest.mark.parametrize("argv, needle", [
    (["--mtbf-gpu-hours=-5"], "mtbf"),
    (["--mode", "lora", "--lora-r", "9000"], "lora_r"),
    (["--mode", "lora", "--lora-targets", "q_proj,wq"], "lora_targets"),
    (["--storage-gbps", "0"], "storage"),
    (["--packing-efficiency", "1.5"], "packing_efficiency"),
])
def test_bad_operations_input_is_one_line(capsys, argv, needle):
    code = main(["estimate", "--preset", "llama-7b", "--gpus", "8", *argv])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_json_has_the_new_keys_beside_the_old(capsys):
    import json

    assert main(["estimate", "--preset", "llama-7b", "--gpus", "8", "--mode", "lora", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["trainable_params"] == 4_194_304 and d["mode"] == "lora"
    assert {"checkpoint", "reliability", "data_feed", "memory", "time", "train"} <= set(d)
    assert d["checkpoint"]["interval_steps"] >= 1 and 0 < d["reliability"]["goodput"] <= 1


def test_a_node_mtbf_is_per_host_on_a_rack_scale_domain(capsys):
    """--mtbf-node-hours is per scheduler node: a GB200 NVL72 compute tray of 4 GPUs, not the
    72-GPU NVLink domain. 1,000 h per tray is 4,000 h per GPU: 72 GPUs fail every 55.6 h."""
    import json

    assert main(["estimate", "--params", "13B", "--gpus", "72", "--gpu", "gb200-nvl72", "--mtbf-node-hours", "1000",
                 "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)["reliability"]
    assert r["mtbf_job_hours"] == pytest.approx(1000 * 4 / 72, rel=1e-9)
