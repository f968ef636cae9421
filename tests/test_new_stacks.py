"""The llm-foundry, megatron-fsdp, nemo and llama3 stacks, and full-square attention, against
bytes and FLOPs derived by hand from each framework's source (cited beside each number)."""

import numpy as np
import pytest

from planner.core.flops import attention_core_flops
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.core.steptime import attention_times
from planner.errors import PlannerError
from planner.hardware import get_profile
from planner.stacks import effective, get_stack, software, stack_names
from tests.helpers import evaluate_one

# A small Llama: h 1024, f 2816, 4 layers, MHA, untied 32000-token vocabulary, 2048 tokens.
H, F, L, V, S = 1024, 2816, 4, 32000, 2048
LLAMA = ModelSpec(arch="llama", layers=L, hidden=H, heads=8, kv_heads=8, ffn_hidden=F, vocab=V, seq_len=S)
# Parameters by hand: per layer Q, K, V, O (4h^2), gate, up, down (3hf), two RMSNorm weights (2h);
# the embedding and the output head (2Vh) and the final norm (h).
P = L * (4 * H * H + 3 * H * F + 2 * H) + 2 * V * H + H
BLOCK = 4 * H * H + 3 * H * F + 2 * H  # one transformer layer: one FSDP unit / wrapped block


def states(stack: str, zero: int, dp: int = 8, cp: int = 1, precision: str = "bf16"):
    lay = Layout(dp=dp, cp=cp, micro_batch=1, global_batch=dp, zero_stage=zero)
    ev = evaluate_one(LLAMA, lay, Job(precision=precision, stack=stack), gpu="h100-80g")
    m = ev.memory
    return float(m.weights[0]), float(m.gradients[0]), float(m.optimizer[0]), ev


def test_the_new_stacks_are_listed_and_nemo_is_its_own_stack():
    assert {"llm-foundry", "llm-foundry-default", "megatron-fsdp", "nemo", "llama3"} <= set(stack_names())
    assert get_stack("nemo").name == "nemo" and get_stack("megatron-bridge").name == "nemo"
    assert get_stack("mcore").name == "megatron-core"  # the other aliases stay


def test_model_has_the_hand_counted_parameters():
    assert LLAMA.params == P


@pytest.mark.parametrize("zero, weights, grads, optim", [
    # Composer's FSDP v1 keeps fp32 flat parameters (the master; MixedPrecision casts them to bf16
    # per all-gather) and casts each reduced gradient back to fp32 (keep_low_precision_grads=False);
    # AdamW keeps two fp32 moments (8 bytes). FULL_SHARD shards all three over dp = 8.
    (3, 4 * P / 8, 4 * P / 8, 8 * P / 8),
    # SHARD_GRAD_OP keeps the bf16 gathered weights from forward to backward beside the fp32 shard.
    (2, 2 * P + 4 * P / 8, 4 * P / 8, 8 * P / 8),
    # NO_SHARD: DDP-like, fp32 parameters, fp32 gradients, AdamW moments, whole.
    (0, 4 * P, 4 * P, 8 * P),
])
def test_llm_foundry_fsdp_v1_model_states(zero, weights, grads, optim):
    w, g, o, _ = states("llm-foundry", zero)
    assert (w, g, o) == pytest.approx((weights, grads, optim), rel=1e-12)


def test_llm_foundry_gathers_two_blocks_and_reduces_in_bf16_or_fp32():
    """FULL_SHARD: the block in use and the prefetched one gathered in bf16 (2 x 2 bytes per block
    parameter); the backward's unsharded bf16 gradient of one block (2), reduce-scattered as it is
    under PURE, or copied to fp32 first under Composer's DEFAULT (2 + 4)."""
    for stack, reduce_scatter in (("llm-foundry", 2), ("llm-foundry-default", 2 + 4)):
        *_, ev = states(stack, 3)
        assert float(ev.memory.gathered[0]) == pytest.approx((2 * 2 + reduce_scatter) * BLOCK, rel=1e-12)
    assert get_stack("llm-foundry").grad_reduce_bytes == 2 and get_stack("llm-foundry-default").grad_reduce_bytes == 4
    assert states("llm-foundry-default", 3)[:3] == states("llm-foundry", 3)[:3]  # the same model states


def test_llm_foundry_keeps_four_bytes_per_logit(tmp_path):
    """flash-attn's CrossEntropyLoss (llm-foundry's default loss_fn fused_crossentropy) saves the
    bf16 logits for its backward (ctx.save_for_backward(logits, lse, labels)) and writes a bf16
    gradient (torch.empty_like(logits)): 2 + 2 = 4 bytes per logit. A variant holding 2 must hold
    (4 - 2) x tokens x vocabulary bytes less at the loss's peak; torchtitan's eager fp32 loss (12)
    8 x tokens x vocabulary more."""
    for logit, name in ((2, "two"), (12, "twelve")):
        (tmp_path / f"{name}.toml").write_text(
            f'base = "llm-foundry"\nname = "{name}"\ndescription = "d"\nsource = "s"\n'
            f'[kernels]\nlogit_bytes = {logit}\n')
    lay = Layout(dp=8, micro_batch=4, global_batch=32, zero_stage=3)
    act = {s: float(evaluate_one(LLAMA, lay, Job(stack=s), gpu="h100-80g").memory.activations[0])
           for s in ("llm-foundry", str(tmp_path / "two.toml"), str(tmp_path / "twelve.toml"))}
    tokens = 4 * S
    assert act["llm-foundry"] - act[str(tmp_path / "two.toml")] == pytest.approx((4 - 2) * tokens * V, rel=1e-9)
    assert act[str(tmp_path / "twelve.toml")] - act["llm-foundry"] == pytest.approx((12 - 4) * tokens * V, rel=1e-9)


def test_the_issues_125m_example_drops_from_30_to_10_gib_of_logits():
    """MPT-125M (vocabulary 50368) at micro-batch 26 and 2048 tokens: 12 bytes per logit are
    30 GiB, llm-foundry's 4 are 10 GiB."""
    tokens = 26 * 2048
    assert 12 * tokens * 50368 / 2**30 == pytest.approx(30.0, abs=0.1)
    assert get_stack("llm-foundry").logit_bytes * tokens * 50368 / 2**30 == pytest.approx(10.0, abs=0.05)


def test_llm_foundry_runs_data_parallel_only():
    from planner.core.search import Pins, search

    hw = get_profile("h100-80g")
    c = search(LLAMA, hw, Job(stack="llm-foundry", global_batch=64), 16).candidates
    assert len(c) and (c.tp == 1).all() and (c.pp == 1).all() and (c.cp == 1).all() and (c.dp == 16).all()
    assert set(c.zero_stage.tolist()) == {0, 2, 3}
    with pytest.raises(PlannerError) as err:
        search(LLAMA, hw, Job(stack="llm-foundry", global_batch=64), 16, Pins(tp=2))
    assert err.value.field == "tp" and "data parallel only" in str(err.value)


@pytest.mark.parametrize("zero, weights, grads, optim", [
    # Megatron-FSDP (param_and_grad_buffer.py): bf16 model-weight buffer, sharded under
    # optim_grads_params only; fp32 main weights (4) + Adam's two fp32 moments (8) = 12, sharded
    # under every strategy but no_shard; main grads in the parameters' dtype (main_grads_dtype auto:
    # bf16, 2 bytes), sharded under optim_grads and optim_grads_params.
    (3, 2 * P / 8, 2 * P / 8, 12 * P / 8),   # optim_grads_params
    (2, 2 * P, 2 * P / 8, 12 * P / 8),       # optim_grads
    (1, 2 * P, 2 * P, 12 * P / 8),           # optim
])
def test_megatron_fsdp_model_states(zero, weights, grads, optim):
    w, g, o, _ = states("megatron-fsdp", zero)
    assert (w, g, o) == pytest.approx((weights, grads, optim), rel=1e-12)


def test_megatron_fsdp_gathers_two_units_and_holds_one_bf16_gradient_bucket():
    """ZeRO-3: the unit in use and the prefetched one gathered in bf16 (2 x 2 bytes per parameter
    of a TransformerLayer) and one unit's unsharded bf16 gradient bucket (2 bytes)."""
    *_, ev = states("megatron-fsdp", 3)
    assert float(ev.memory.gathered[0]) == pytest.approx((2 * 2 + 2) * BLOCK, rel=1e-12)


def test_nemo_reduces_bf16_gradients_where_megatron_core_keeps_fp32():
    """Megatron-Bridge's perf recipes set grad_reduce_in_fp32 = False: Megatron-Core's DDP gradient
    buffer is bf16 (2 bytes) and the distributed optimizer (ZeRO-1) shards the fp32 master and the
    moments (12 bytes) over dp; megatron-core (grad_reduce_in_fp32 = True) keeps 4-byte main grads."""
    w, g, o, _ = states("nemo", 1)
    assert (w, g, o) == pytest.approx((2 * P, 2 * P, 12 * P / 8), rel=1e-12)
    assert states("megatron-core", 1)[1] == pytest.approx(4 * P, rel=1e-12)
    nemo, mcore = get_stack("nemo"), get_stack("megatron-core")
    assert nemo.grad_reduce_bytes == 2 and mcore.grad_reduce_bytes == 4
    hw = get_profile("h100-80g")  # TP communication overlap on by default: megatron-core's --tp-comm-overlap value
    assert effective(hw, nemo).efficiency.tp_overlap == mcore.tp_overlap_async > effective(hw, mcore).efficiency.tp_overlap


def test_llama3_shards_gradients_and_optimizer_over_dp_and_cp_and_keeps_weights():
    """Llama 3 (arXiv 2407.21783, Sec. 3.3.2): weights not resharded after forward (2 bytes whole),
    fp32 gradients (4) and the optimizer (12) sharded over the data-parallel group, which spans
    dp x cp = 4 x 2 = 8 ranks."""
    w, g, o, _ = states("llama3", 2, dp=4, cp=2)
    assert (w, g, o) == pytest.approx((2 * P, 4 * P / 8, 12 * P / 8), rel=1e-12)
    assert get_stack("llama3").zero_stages == (2,) and get_stack("llama3").cp_overlap == 0.0


def _full_square_stack(tmp_path) -> str:
    path = tmp_path / "alibi.toml"
    path.write_text('base = "fsdp2"\nname = "alibi"\ndescription = "d"\nsource = "s"\n'
                    '[kernels]\nattention_square = "full"\n')
    return str(path)


def test_full_square_attention_takes_twice_the_causal_time(tmp_path):
    """QK^T and AV over the whole square: 2 matmuls of 2*s*s*d FLOPs per head, 4*b*s^2*h per layer
    forward; a causal kernel that skips the masked blocks does half."""
    hw = get_profile("h100-80g")
    b = 2
    c = Candidates.from_layouts([Layout(dp=1, micro_batch=b, global_batch=b)])
    full_job, causal_job = Job(stack=_full_square_stack(tmp_path)), Job(stack="fsdp2")
    assert float(attention_core_flops(LLAMA, c.micro_batch, c.tp, causal=False)[0]) == 4 * b * S * S * H
    full = attention_times(LLAMA, hw, full_job, c, software(full_job))
    causal = attention_times(LLAMA, hw, causal_job, c, software(causal_job))
    peak = hw.gpu.peak_flops["bf16"] * hw.efficiency.flash_attention
    assert float(full[0][0]) == pytest.approx(4 * b * S * S * H / peak, rel=1e-12)
    assert float(causal[0][0]) == pytest.approx(2 * b * S * S * H / peak, rel=1e-12)
    assert float(full[1][0]) == pytest.approx(2 * float(causal[1][0]), rel=1e-12)


def test_mfu_counts_model_flops_and_hfu_the_square_computed(tmp_path):
    """MFU's numerator is the model's causal FLOPs whatever the kernel; HFU adds the masked half the
    kernel computes: 2*s*h per layer per token forward, 3x with the backward."""
    lay = Layout(dp=8, micro_batch=1, global_batch=8)
    full = evaluate_one(LLAMA, lay, Job(stack=_full_square_stack(tmp_path)), gpu="h100-80g")
    causal = evaluate_one(LLAMA, lay, Job(stack="fsdp2"), gpu="h100-80g")
    tokens = 8 * S
    assert float(np.ravel(full.model_flops_per_step)[0]) == float(np.ravel(causal.model_flops_per_step)[0])
    extra = float(np.ravel(full.hardware_flops_per_step)[0] - np.ravel(causal.hardware_flops_per_step)[0])
    assert extra == pytest.approx(3 * 2 * S * H * L * tokens, rel=1e-12)
    assert float(full.mfu[0]) < float(causal.mfu[0])
    assert float(full.time.step[0]) > float(causal.time.step[0])


def test_a_bad_attention_square_is_one_line_naming_file_key_and_choices(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('base = "fsdp2"\nname = "bad"\ndescription = "d"\nsource = "s"\n'
                    '[kernels]\nattention_square = "triangle"\n')
    from planner.stacks import load_stack_file

    with pytest.raises(PlannerError) as err:
        load_stack_file(path)
    text = str(err.value)
    assert "bad.toml" in text and "attention_square" in text and "'triangle'" in text and "causal, full" in text
    assert "\n" not in text
    path.write_text('base = "fsdp2"\nname = "bad"\ndescription = "d"\nsource = "s"\n'
                    '[sharding]\nmodel_parallel = "no"\n')
    with pytest.raises(PlannerError) as err:
        load_stack_file(path)
    assert "model_parallel" in str(err.value) and "true or false" in str(err.value)
