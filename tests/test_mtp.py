"""Multi-token prediction (DeepSeek-V3 Sec. 2.2; Megatron-Core's --mtp-num-layers): each module a
transformer layer (the model's MoE layer, else its dense one), a projection of the hidden state and
the next token's embedding, both normalised, from 2h to h, three norms, and a pass of the shared
output head, on the last pipeline stage. Parameters and FLOPs by hand, the step and the memory
against the parts they add, the Megatron flags, and what is refused in one line."""

import json

import pytest

from planner.cli.main import main
from planner.core import pipeline
from planner.core.flops import Gemm, model_flops_per_token
from planner.core.layout import Job, Layout
from planner.core.model import ModelSpec
from planner.core.presets import get_preset
from planner.core.steptime import gemm_time, reference_peak
from planner.hardware import get_profile
from planner.stacks import effective, software
from tests.helpers import evaluate_one

V3 = get_preset("deepseek-v3")
MTP = V3.replace(mtp_layers=1)
SMALL = ModelSpec(name="small", layers=8, hidden=1024, heads=8, vocab=32000, seq_len=2048)
MEGATRON = Job(precision="bf16", stack="megatron-core")


def test_the_module_counts_as_deepseek_v3_s_checkpoint_holds_it():
    """DeepSeek-V3's layer 61 (its HF checkpoint's MTP module) less its copies of the embedding and
    the head: an MoE layer (MLA: q_a 7168 x 1536 and its norm, q_b 1536 x 128 x 192, kv_a 7168 x
    (512 + 64) and its norm, kv_b 512 x 128 x (128 + 128), o 128 x 128 x 7168; 256 routed experts
    and one shared, each 3 x 7168 x 2048; the router 256 x 7168 and its bias; two norms), eh_proj
    2 x 7168 x 7168, and enorm, hnorm and the head's norm."""
    h = 7168
    attention = h * 1536 + 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 + 512 * 128 * 256 + 128 * 128 * h
    mlp = 257 * 3 * h * 2048 + 256 * h + 256
    layer = attention + mlp + 2 * h
    assert MTP.mtp_params == layer + 2 * h * h + 3 * h == 11_610_068_224
    assert MTP.mtp_expert_params == 256 * 3 * h * 2048
    assert MTP.params == V3.params and V3.mtp_params == 0  # the main model's count is its own
    # DeepSeek-V3's 685B checkpoint: 671B main model and the module with its embedding and head copies
    assert (MTP.params + MTP.mtp_params + 2 * 129280 * h) / 1e9 == pytest.approx(684.5, abs=0.1)


def test_the_model_flops_by_hand():
    """One module a token, forward: the MoE layer's weights a token multiplies (attention, router,
    the shared and 8 routed experts), eh_proj and the head again (2 FLOPs a weight), and one
    layer's causal MLA core (s/2 keys, 128 heads x (192 + 128)); 3x for forward and backward."""
    h, s = 7168, 4096
    attention = h * 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * 256 + 128 * 128 * h
    layer = attention + h * 256 + 9 * 3 * h * 2048
    weights = 2 * (layer + 2 * h * h + 129280 * h)
    core = 0.5 * 2 * s * 128 * (192 + 128)
    gap = model_flops_per_token(MTP) - model_flops_per_token(V3)
    assert gap == pytest.approx(3 * (weights + core), rel=1e-12)
    assert 0.03 < gap / model_flops_per_token(V3) < 0.06  # a few percent of DeepSeek-V3's training FLOPs


def _step(model, layout, job=MEGATRON, gpu="h100-80g"):
    return evaluate_one(model, layout, job, gpu=gpu)


def test_one_stage_runs_one_more_layer_the_head_again_and_the_projection():
    """One stage, four micro-batches: the module adds, per micro-batch, what a ninth layer adds (the
    same model with one more layer, its MLP dense as the module's), the head's forward, backward and
    loss again (what the step holds beyond its eight layers), and eh_proj (2048 tokens x 2048 -> 1024,
    forward and backward: 3x its GEMM at the roofline the layers' GEMMs use)."""
    lay = Layout(dp=1, micro_batch=1, global_batch=4, zero_stage=1, recompute="none")
    base, mtp, deeper = (float(_step(m, lay).time.compute[0]) for m in
                         (SMALL, SMALL.replace(mtp_layers=1), SMALL.replace(layers=9)))
    per_layer = (deeper - base) / 4
    head = base / 4 - 8 * per_layer
    hw = effective(get_profile("h100-80g"), software(MEGATRON).stack)
    projection = gemm_time(Gemm(2048, 1024, 2048), hw, reference_peak(hw, "bf16"), 2)
    assert (mtp - base) / 4 == pytest.approx(per_layer + head + 3 * projection, rel=1e-9)


def test_the_last_stage_holds_the_module(monkeypatch):
    """pp 2 without the split's head balancing (so both splits are the same): the first stage is
    as before; the last holds the module's weights (16-bit, ZeRO-1 keeps them whole: 2 bytes a
    parameter: its dense layer, eh_proj and three norms) and its own copy of the token embedding
    (Megatron-Core builds one where the modules look the next tokens up), one more layer's
    activations (one micro-batch: the last stage's), its logits at the loss's peak (6 bytes a
    logit: 16-bit logits and the fp32 cross-entropy) and its inputs (4h a token in 16-bit)."""
    monkeypatch.setattr(pipeline, "head_layers", lambda model, sw: 0.0)
    lay = Layout(dp=1, pp=2, micro_batch=1, global_batch=4, zero_stage=1, recompute="none")
    model = SMALL.replace(layers=9)  # 4 | 5: the last stage holds the extra layer
    (first0, _, last0), (first1, _, last1) = (_step(m, lay).stage_memory for m in (model, model.replace(mtp_layers=1)))
    deeper = _step(model.replace(layers=10), lay).stage_memory  # 5 | 5: one more layer on the first stage
    assert float(first1.total[0]) == float(first0.total[0])
    h, tokens, vocab = 1024, 2048, 32000
    module = model.replace(mtp_layers=1).mtp_params
    assert module == model.dense_layer_params + 2 * h * h + 3 * h
    assert float(last1.weights[0] - last0.weights[0]) == pytest.approx(2 * (module + vocab * h), rel=1e-12)
    # one more layer on the first stage, which holds two micro-batches in flight (1F1B, pp 2)
    act_layer = float(deeper[0].activations[0] - first0.activations[0]) / 2
    assert float(last1.activations[0] - last0.activations[0]) == pytest.approx(
        act_layer + 6 * tokens * vocab + 2 * tokens * 4 * h, rel=1e-12)


def test_under_dualpipev_the_first_rank_holds_the_module_for_one_micro_batch(monkeypatch):
    """DualPipeV puts the last stage on rank 0, beside the embedding (no second copy of it): the
    module's weights, and one more layer's activations for the one micro-batch the V's last chunk
    holds (not the p + 1/2 of the rank's two chunks), its logits and inputs."""
    monkeypatch.setattr(pipeline, "head_layers", lambda model, sw: 0.0)
    job = Job(precision="bf16", stack="hai-llm")
    v = Layout(dp=1, pp=2, vpp=2, schedule="dualpipev", micro_batch=1, global_batch=8, zero_stage=1, recompute="none")
    base, mtp = (_step(m, v, job).stage_memory[0] for m in (SMALL, SMALL.replace(mtp_layers=1)))
    line = Layout(dp=1, pp=2, micro_batch=1, global_batch=4, zero_stage=1, recompute="none")
    first9, first10 = (_step(SMALL.replace(layers=n), line, job).stage_memory[0] for n in (9, 10))
    act_layer = float(first10.activations[0] - first9.activations[0]) / 2  # 4 -> 5 layers, two in flight
    h, tokens = 1024, 2048
    assert float(mtp.weights[0] - base.weights[0]) == pytest.approx(2 * SMALL.replace(mtp_layers=1).mtp_params,
                                                                    rel=1e-12)
    assert float(mtp.activations[0] - base.activations[0]) == pytest.approx(
        act_layer + 6 * tokens * 32000 + 2 * tokens * 4 * h, rel=1e-12)


def test_experts_split_over_expert_parallel_and_the_rest_over_tensor_parallel():
    """An MoE module on tp 2, ep 2, pp 2 (ZeRO-1: weights whole, 16-bit): the last stage holds its
    routed experts' weights over tp x ep, the rest of it (attention, router, eh_proj, norms) and
    the embedding's copy over tp."""
    moe = ModelSpec(name="moe", layers=4, hidden=512, heads=8, vocab=32000, seq_len=1024, experts=8, top_k=2,
                    expert_ffn=256)
    lay = Layout(dp=2, tp=2, pp=2, ep=2, micro_batch=1, global_batch=8, zero_stage=1, recompute="none",
                 sequence_parallel=True)
    job = Job(precision="bf16", stack="megatron-core")
    base, mtp = (_step(m, lay, job).stage_memory for m in (moe, moe.replace(mtp_layers=1)))
    module = moe.replace(mtp_layers=1)
    experts = 8 * 3 * 512 * 256
    assert module.mtp_expert_params == experts
    by_hand = 2 * ((module.mtp_params - experts + 32000 * 512) / 2 + experts / 4)
    assert float(mtp[2].weights[0] - base[2].weights[0]) == pytest.approx(by_hand, rel=1e-12)
    assert float(mtp[0].total[0]) == float(base[0].total[0])


def test_the_optimizer_steps_the_module_and_data_parallel_reduces_it():
    """One stage, dp 8, ZeRO-1: each rank's optimizer steps an eighth of the module too (its bytes a
    parameter at the profile's HBM rate), and the gradient reduction carries it."""
    from planner.core.steptime import optim_bytes_per_param

    lay = Layout(dp=8, micro_batch=1, global_batch=8, zero_stage=1, recompute="none")
    base, mtp = (_step(m, lay).time for m in (SMALL, SMALL.replace(mtp_layers=1)))
    hw = effective(get_profile("h100-80g"), software(MEGATRON).stack)
    module = SMALL.replace(mtp_layers=1).mtp_params
    by_hand = module / 8 * optim_bytes_per_param(MEGATRON, software(MEGATRON)) / (
        hw.gpu.hbm_bytes_per_s * hw.efficiency.memory)
    assert float(mtp.optimizer[0] - base.optimizer[0]) == pytest.approx(by_hand, rel=1e-9)
    no_overlap = Job(precision="bf16", stack="megatron-core", overlap_grad_reduce=False)  # the whole reduction shown
    base, mtp = (_step(m, lay, no_overlap).time for m in (SMALL, SMALL.replace(mtp_layers=1)))
    assert float(mtp.dp_comm[0]) > 1.05 * float(base.dp_comm[0])  # the module: 9% more parameters to reduce


def test_the_projection_s_gathers_over_tensor_parallel():
    """tp 2 with sequence parallel, one stage: beside one more layer's collectives, each micro-batch
    gathers the projection's input (2h a token) and output (h) over the TP pair, and reduce-scatters
    them back in the backward: 2 x 3h x 2 bytes x 2048 tokens in one-pass collectives."""
    from planner.core import comm

    lay = Layout(dp=1, tp=2, micro_batch=1, global_batch=4, zero_stage=1, recompute="none", sequence_parallel=True)
    base, mtp, deeper = (float(_step(m, lay).time.tp_comm[0]) for m in
                         (SMALL, SMALL.replace(mtp_layers=1), SMALL.replace(layers=9)))
    hw = effective(get_profile("h100-80g"), software(MEGATRON).stack)
    gathers = 2 * comm.tp_collective(comm.Links.of(hw), 2 * 2048 * 3 * 1024, 2, passes=1.0)
    assert (mtp - base) / 4 == pytest.approx((deeper - base) / 4 + gathers, rel=1e-9)


def test_full_recompute_runs_the_module_s_layer_and_projection_again():
    """HFU's count: under full recompute, the module's layer (its MoE layer's active weights and its
    causal MLA core) and its projection forward again, not the head."""
    import numpy as np

    from planner.core.flops import hardware_flops_per_token
    from planner.core.layout import RECOMPUTE

    h, s = 7168, 4096
    attention = h * 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * 256 + 128 * 128 * h
    layer = attention + h * 256 + 9 * 3 * h * 2048
    core = 0.5 * 2 * s * 128 * (192 + 128)
    full = np.array(RECOMPUTE.index("full"))
    gap = (hardware_flops_per_token(MTP, MEGATRON, full) - model_flops_per_token(MTP)
           - hardware_flops_per_token(V3, MEGATRON, full) + model_flops_per_token(V3))
    assert float(gap) == pytest.approx(2 * (layer + 2 * h * h) + core, rel=1e-12)


def test_the_megatron_flags(capsys):
    assert main(["export", "--preset", "deepseek-v3", "--gpus", "2048", "--gpu", "h800", "--stack", "megatron-core",
                 "--mtp-layers", "1", "--tp", "2", "--pp", "16", "--vpp", "2", "--ep", "64", "--micro-batch", "1",
                 "--zero-stage", "1", "--format", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "--mtp-num-layers 1" in out
    assert "mL'" in out  # the module before the loss on the last stage of the layout


@pytest.mark.parametrize(("argv", "needle"), [
    (["--stack", "fsdp2"], "mtp_layers=1: 0 on the fsdp2 stack"),
    (["--stack", "megatron-core", "--mode", "lora"], "mtp_layers=1: 0 under --mode lora"),
])
def test_what_is_not_run_is_one_line(capsys, argv, needle):
    assert main(["estimate", "--preset", "deepseek-v3", "--gpus", "2048", "--gpu", "h800", "--mtp-layers", "1",
                 *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("value", ["17", "-1", "x"])
def test_a_bad_count_is_one_line(capsys, value):
    try:
        code = main(["estimate", "--preset", "deepseek-v3", "--gpus", "2048", "--mtp-layers", value])
    except SystemExit as exit_:  # argparse's own refusal (not a number)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "mtp" in err.replace("-", "_") and len(err.splitlines()) == 1


def test_a_hugging_face_config_says_how_to_plan_its_module(tmp_path, capsys):
    from tests.test_hf_configs import DATA

    path = tmp_path / "config.json"
    path.write_text((DATA / "DeepSeek-V3.config.json").read_text())
    assert main(["estimate", "--hf-config", str(path), "--gpus", "2048", "--gpu", "h800", "--format", "json"]) == 0
    note = json.loads(capsys.readouterr().out)["model_note"]
    assert "num_nextn_predict_layers 1" in note and "--mtp-layers 1" in note
    assert main(["estimate", "--hf-config", str(path), "--gpus", "2048", "--gpu", "h800", "--stack", "megatron-core",
                 "--mtp-layers", "1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["mtp_layers"] == 1 and out["model"]["mtp_params"] == MTP.mtp_params
    assert "num_nextn_predict_layers" not in out["model_note"] and "main model's" not in out["model_note"]
    assert "mtp_layers=1" in out["model_note"]


def test_the_pipeline_balance_counts_the_head_alone():
    """Megatron-Core's --account-for-loss-in-pipeline-split reserves room for the loss alone: the
    planner's balanced split (planner.core.pipeline.head_layers) is the same with the modules."""
    sw = software(MEGATRON)
    assert pipeline.head_layers(MTP, sw) == pipeline.head_layers(V3, sw) > 0


def test_the_api_takes_the_flag():
    import planner

    out = planner.estimate(preset="deepseek-v3", gpus=2048, gpu="h800", stack="hai-llm", mtp_layers=1, tp=2,
                           pp=16, vpp=2, ep=64, micro_batch=1, zero_stage=1)
    assert out["model"]["mtp_layers"] == 1 and out["trainable_params"] == MTP.params + MTP.mtp_params


@pytest.mark.parametrize(("stack", "paces"), [("hai-llm", True), ("megatron-core", False)])
def test_the_slower_stage_with_its_collectives_sets_the_pace(stack, paces):
    """DeepSeek-V3, pp 8 (the last stage, balanced for the head, holds 6 layers; the fullest 8), ep 64:
    with the module the last stage computes more than the fullest but holds fewer layers' all-to-alls.
    On hai-llm (node-deduplicated all-to-all) it is the slower and sets the pace: the compute grows;
    on megatron-core the fullest stage's all-to-alls keep it the slower: the compute per micro-batch
    and the collectives stay the fullest stage's, and the step grows only by the module's states."""
    job = Job(precision="bf16", stack=stack)
    lay = Layout(dp=64, tp=4, pp=8, vpp=4, ep=64, micro_batch=1, global_batch=1024, zero_stage=1, recompute="none",
                 sequence_parallel=True)
    base, mtp = (_step(m, lay, job, gpu="h800").time for m in (V3, MTP))
    assert float(mtp.step[0]) > float(base.step[0])
    assert (float(mtp.compute[0]) > float(base.compute[0])) == paces
    assert (float(mtp.ep_comm[0]) == float(base.ep_comm[0])) == (not paces)
