"""CPU offload (ZeRO-Offload, ZeRO-Infinity, FSDP CPU offload), by hand."""

import pytest

from planner.cli.main import main as cli_main
from planner.core.layout import Job, Layout
from planner.core.presets import get_preset
from planner.core.search import Pins, search
from planner.errors import PlannerError
from planner.hardware import get_profile
from tests.helpers import evaluate_one

LLAMA2_7B = get_preset("llama2-7b")
P = 6_738_415_616  # parameters, equal to the released checkpoint


def test_a_full_finetune_of_7b_on_one_a6000_fits_only_offloaded(capsys):
    """bf16 AdamW needs 2 + 4 + 12 = 18 bytes per parameter: 121 GB for 7B, more than a 48 GB GPU;
    with weights, gradients and optimizer states in host memory it fits."""
    hw = get_profile("a6000")
    job = Job(mode="full-finetune")
    r = search(LLAMA2_7B, hw, job, 1)
    best = r.evaluation
    assert best.fits[0] and best.candidates.offload[0] == 2  # params (and so optimizer) offloaded
    none = search(LLAMA2_7B, hw, job, 1, Pins(offload="none")).evaluation
    assert not none.fits.any()
    host = float(best.memory.host[0])
    assert host == pytest.approx(P * (2 + 4 + 12), rel=1e-6)  # 16-bit weights, fp32 grads, master + AdamW
    assert cli_main(["estimate", "--preset", "llama2-7b", "--mode", "full-finetune", "--gpus", "1",
                     "--gpu", "a6000"]) == 0
    out = capsys.readouterr().out
    assert "offload params" in out and "in host memory" in out and "optimizer step on the CPU" in out


def test_the_optimizer_step_on_the_host_by_hand():
    """ZeRO-2 on 8 GPUs with the optimizer offloaded (DeepSpeed): each GPU's eighth of the AdamW
    step at the host's bandwidth shared by 8 GPUs, plus the updated 16-bit weights back over PCIe
    (the gradients' copy is hidden behind the backward)."""
    lay = Layout(dp=8, micro_batch=1, global_batch=64, zero_stage=2, offload="optimizer")
    ev = evaluate_one(LLAMA2_7B, lay, Job(stack="deepspeed-zero"))
    held = P / 8
    cpu = held * (4 + 24 + 2) / (300e9 / 8)  # fp32 grad, master/momentum/variance read+write, 16-bit weights
    h2d = held * 2 / 25e9
    assert float(ev.time.optimizer[0]) == pytest.approx(cpu + h2d, rel=1e-6)
    assert float(ev.memory.optimizer[0]) == 0.0
    # Each reduce bucket's partition goes straight to the host's fp32 gradients (DeepSpeed
    # stage_1_and_2.py under cpu_offload: no GPU partition buffer): the GPU holds one 16-bit
    # bucket, reduce_bucket_size's default 5e8 elements x 2 bytes, less than the 16-bit shard (P x 2 / 8).
    assert P * 2 / 8 > 1e9
    assert float(ev.memory.gradients[0]) == pytest.approx(5e8 * 2, rel=1e-4)


def test_megatron_core_copies_its_gradient_shard_out_at_the_step():
    """Megatron-Core's --optimizer-cpu-offload keeps the fp32 gradient buffer on the GPU and copies
    each rank's shard to the host at the step, before the CPU's AdamW: the copy is hidden by
    nothing and moves 4 bytes per parameter. ZeRO-1 on 8 GPUs: the eighth's AdamW at the host's
    bandwidth shared by 8 GPUs, its fp32 gradients out and its 16-bit weights back over PCIe."""
    lay = Layout(dp=8, micro_batch=1, global_batch=64, zero_stage=1, offload="optimizer")
    ev = evaluate_one(LLAMA2_7B, lay, Job(stack="megatron-core"))
    held = P / 8
    cpu = held * (4 + 24 + 2) / (300e9 / 8)
    assert float(ev.time.optimizer[0]) == pytest.approx(cpu + held * 2 / 25e9 + held * 4 / 25e9, rel=1e-6)


def test_the_gradients_an_offloading_gpu_still_holds_by_stack():
    """FSDP2's CPUOffloadPolicy copies each block's reduced gradients to the host as soon as they
    are reduce-scattered (torch's foreach_reduce, offload_to_cpu): Llama 2 7B fine-tuned on one GPU
    holds one layer's, unsharded and in fp32 (the reduce dtype): 4 h^2 + 3 h f + 2 h = 202,383,360
    parameters x 4 bytes. Megatron-Core's --optimizer-cpu-offload keeps its fp32 gradient buffer
    on the GPU: ZeRO-1 on 8 GPUs holds all P x 4 bytes, as without offload."""
    h, f = 4096, 11008
    layer = 4 * h * h + 3 * h * f + 2 * h
    assert layer == 202_383_360
    lay = Layout(dp=1, micro_batch=1, global_batch=64, zero_stage=3, offload="params")
    ev = evaluate_one(LLAMA2_7B, lay, Job(mode="full-finetune"))
    assert float(ev.memory.gradients[0]) == pytest.approx(layer * 4, rel=1e-9)
    for offload in ("optimizer", "none"):
        lay = Layout(dp=8, micro_batch=1, global_batch=64, zero_stage=1, offload=offload)
        ev = evaluate_one(LLAMA2_7B, lay, Job(stack="megatron-core"))
        assert float(ev.memory.gradients[0]) == pytest.approx(P * 4, rel=1e-9)


def test_offload_is_what_the_stack_runs():
    with pytest.raises(PlannerError) as err:
        search(LLAMA2_7B, get_profile("a100-80g"), Job(stack="megatron-2021"), 8, Pins(offload="optimizer"))
    assert err.value.field == "offload" and "deepspeed-zero" in str(err.value)
    with pytest.raises(PlannerError) as err:
        search(LLAMA2_7B, get_profile("a100-80g"), Job(stack="deepspeed-zero"), 8,
               Pins(offload="params", zero_stage=2))
    assert err.value.field == "zero_stage"
    pretrain = search(LLAMA2_7B, get_profile("a100-80g"), Job(), 64).evaluation.candidates
    assert (pretrain.offload == 0).all()  # searched for fine-tuning only; pin it to pretrain offloaded


def test_offload_on_a_rack_scale_domain_counts_each_host():
    """GB200 NVL72: host memory belongs to a compute tray (2 Grace CPUs, 894 GiB, 4 GPUs), not to
    the 72-GPU NVLink domain. Llama 3 70B on 8 GPUs with the optimizer offloaded: each GPU's host
    share is its shard of fp32 master, AdamW states and fp32 gradients, 16 bytes x 70.55B / 8 =
    131.4 GiB; a tray holds four of them (526 GiB <= 894), where eight on one host (1,051) would not."""
    import dataclasses

    model, job = get_preset("llama3-70b"), Job(stack="deepspeed-zero")
    hw = get_profile("gb200-nvl72")
    assert (hw.network.host_gpus, hw.network.gpus_per_node) == (4, 72)
    r = search(model, hw, job, 8, Pins(offload="optimizer"))
    ev = r.ranked([0])
    host = float(ev.memory.host[0])
    assert host == pytest.approx(model.params * 16 / 8, rel=1e-3)
    assert ev.fits[0] and 4 * host <= hw.network.host_memory_bytes < 8 * host
    # The same rack with no hosts declared (one OS over the domain's 8 GPUs used here): the layout does not fit.
    one_host = dataclasses.replace(hw, network=dataclasses.replace(hw.network, gpus_per_host=None))
    lay = ev.candidates.layout(0)
    pins = Pins(**{n: getattr(lay, n) for n in Pins.__slots__})
    assert not search(model, one_host, job, 8, pins).ranked([0]).fits[0]
    # --gpus-per-node keeps a host that divides the new node, and drops one that does not.
    assert hw.with_gpus_per_node(36).network.host_gpus == 4
    assert hw.with_gpus_per_node(6).network.host_gpus == 6
