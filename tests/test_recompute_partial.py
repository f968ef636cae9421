"""Recompute "half" and "quarter": every second or fourth layer recomputed whole, the others
keeping all they keep without recompute (torchtitan's selective layer checkpointing, Megatron-LM's
block method). Their memory and time by hand from Korthikanti et al. 2022 and from the layers' two
kinds; the search, the exports and torchtitan's published rows of it."""

import pytest

from planner.core.layout import Candidates, Job, Layout
from planner.core.memory import activation_bytes_per_layer
from planner.core.model import ModelSpec
from planner.core.plan import plan
from planner.core.presets import get_preset
from planner.core.search import Pins
from planner.errors import PlannerError
from planner.hardware import get_profile
from tests.helpers import evaluate_one

GPT = ModelSpec(arch="gpt", layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048)
STANDARD = Job(precision="fp16", attention="standard", stack="megatron-core")  # Korthikanti et al.'s Megatron-LM


def act(layout: Layout, job: Job = STANDARD) -> float:
    return float(activation_bytes_per_layer(GPT, Candidates.from_layouts([layout]), job)[0])


SHARES = [("half", 1 / 2), ("quarter", 1 / 4)]  # the share of layers each recomputes whole


@pytest.mark.parametrize("rc, share", SHARES)
@pytest.mark.parametrize("tp, sp", [(1, False), (8, True)])
def test_a_layer_keeps_all_or_its_input_by_the_share(tp, sp, rc, share):
    """The layers not recomputed keep Korthikanti's 34sbh + 5as^2b (eq. 1; eq. 4 over t with
    sequence parallel), the share recomputed whole their input, 2sbh (over t with SP): per layer,
    the two weighted."""
    s, h, a, b = GPT.seq_len, GPT.hidden, GPT.heads, 2
    lay = Layout(dp=8 // tp if tp < 8 else 1, tp=tp, micro_batch=b, global_batch=16, sequence_parallel=sp,
                 recompute=rc)
    kept_all = s * b * h / tp * (34 + 5 * a * s / h)
    kept_input = 2 * s * b * h / tp
    assert act(lay) == pytest.approx((1 - share) * kept_all + share * kept_input, rel=1e-12)


@pytest.mark.parametrize("rc, share", SHARES)
def test_a_stage_holds_its_layers_by_the_share_and_one_recomputed_layer_at_its_peak(rc, share):
    """One stage of 24 layers: without recompute 24 x all; full: 24 x input, plus the layer run
    backward holding all again less its input; half (quarter): 12 (6) layers of input, the rest
    all, and the same peak layer (a recomputed one). So share s gives (1 - s) none + s full +
    (1 - s)(all - input), everything else (the loss, the gradients a backward holds) the same."""
    s, h, a, b = GPT.seq_len, GPT.hidden, GPT.heads, 1
    kept_all, kept_input = s * b * h * (34 + 5 * a * s / h), 2 * s * b * h
    acts = {r: float(evaluate_one(GPT, Layout(dp=8, micro_batch=b, global_batch=8, recompute=r),
                                  STANDARD).memory.activations[0]) for r in ("none", "full", rc)}
    assert acts["full"] - acts["none"] == pytest.approx(24 * (kept_input - kept_all) + kept_all - kept_input,
                                                        rel=1e-9)
    assert acts[rc] == pytest.approx((1 - share) * acts["none"] + share * acts["full"]
                                     + (1 - share) * (kept_all - kept_input), rel=1e-9)


@pytest.mark.parametrize("rc, share", SHARES)
@pytest.mark.parametrize("model, layout, job", [
    (GPT, Layout(dp=8, micro_batch=2, global_batch=16), STANDARD),
    (get_preset("llama-13b"), Layout(dp=2, tp=4, pp=2, micro_batch=1, global_batch=64, sequence_parallel=True), Job()),
    (get_preset("mixtral-8x7b"), Layout(dp=8, ep=8, micro_batch=1, global_batch=64, zero_stage=3),
     Job(stack="megatron-core")),
])
def test_a_share_of_layers_recomputes_that_share_of_what_full_recomputes(model, layout, job, rc, share):
    """Each layer is recomputed or not: the share of a full recompute's forward, TP collectives,
    EP all-to-alls and per-layer overhead, so every part of the step is none and full weighted by
    it (a sum over layers of one kind or the other), and so are the FLOPs the GPUs compute (HFU)."""
    ev = {r: evaluate_one(model, layout.replace(recompute=r), job) for r in ("none", "full", rc)}
    for part in ("compute", "tp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble", "step"):
        none, full, got = (float(getattr(ev[r].time, part)[0]) for r in ("none", "full", rc))
        assert got == pytest.approx((1 - share) * none + share * full, rel=1e-9, abs=1e-12), part
    assert full > none  # the test compares something
    flops = {r: float(e.hardware_flops_per_step[0]) for r, e in ev.items()}
    assert flops[rc] == pytest.approx((1 - share) * flops["none"] + share * flops["full"], rel=1e-12)


def test_the_search_recomputes_half_where_nothing_else_fits_as_fast():
    """LLaMA 65B on 512 B200s: FSDP over every GPU with four sequences per micro-batch keeps
    ~180 GiB of activations without recompute (no fit), ~6 GiB with full (a third more compute);
    recomputing half the layers fits at ~105 GiB (a quarter of them: above the plan's memory
    line) and is faster than any layout of the table with none or full."""
    hw, model = get_profile("b200"), get_preset("llama-65b")
    best = plan(model, hw, Job(), 512).best
    assert best.layout.recompute == "half" and best.fits
    assert best.memory.activations_bytes < 0.7 * hw.gpu.memory_bytes
    none = evaluate_one(model, best.layout.replace(recompute="none"), gpu="b200")
    assert float(none.memory.total[0]) > hw.gpu.memory_bytes  # the same layout without recompute: no fit
    full = evaluate_one(model, best.layout.replace(recompute="full"), gpu="b200")
    assert float(full.time.step[0]) > 1.05 * best.time.step_s  # with full: at least 5% slower
    # No layout of the search without "half" is as fast: the best with each pinned is slower.
    for rc in ("none", "full"):
        other = plan(model, hw, Job(), 512, pins=Pins(recompute=rc)).best
        assert other.time.step_s > best.time.step_s, rc


def _pins(layout: Layout, **change):
    fields = {f: getattr(layout, f) for f in Pins.__slots__}
    return Pins(**{**fields, **change})


def test_torchtitans_selective_layer_rows_are_half_and_predicted_within_5_percent():
    """torchtitan's A100 tables (docs/performance.md) measured "selective layer" (every second
    block checkpointed) at 2904 (Llama 3 8B) and 1914 (Llama 2 13B) tokens/s per GPU."""
    from planner.calibration.published import load_torchtitan, predict_torchtitan
    from tests.test_accuracy_torchtitan import CSV

    rows = [r for r in load_torchtitan(CSV) if "selective layer" in r.label]
    assert len(rows) == 2 and {r.layout.recompute for r in rows} == {"half"}
    for r in rows:
        got = predict_torchtitan(r).tokens_per_s_per_gpu
        assert got == pytest.approx(r.measured_tokens_per_s_per_gpu, rel=0.05), r.label


def test_block_recomputes_the_share_of_the_fullest_virtual_stage_rounded_up():
    """Megatron-Core's block method recomputes the first N layers of each virtual stage. 80
    layers on 4 stages: 20 each, half 10, a quarter 5; on 4 x 3 virtual stages of 6 and 7
    (Megatron's layout), 4 and 2; 126 layers on 16 stages of 7 and 8, 4 and 2."""
    from planner.export.megatron import block_recomputed_layers

    assert [block_recomputed_layers(80, 4, 1, k) for k in (2, 4)] == [10, 5]
    assert [block_recomputed_layers(80, 4, 3, k) for k in (2, 4)] == [4, 2]
    assert [block_recomputed_layers(126, 16, 1, k) for k in (2, 4)] == [4, 2]


@pytest.mark.parametrize("rc, n, every", [("half", "10", "2"), ("quarter", "5", "4")])
def test_exports_write_the_frameworks_own_switches(rc, n, every):
    from planner.export.render import megatron_args
    from planner.export.rules import deepspeed_checks
    from planner.export.torchtitan import job_config

    hw = get_profile("h100-80g")
    model = get_preset("llama3-70b")
    pins = _pins(Layout(dp=8, tp=8, pp=4, micro_batch=1, global_batch=512, sequence_parallel=True, recompute=rc))
    e = plan(model, hw, Job(stack="megatron-core"), 256, pins=pins).best
    assert megatron_args(e, 10)["MEMORY_ARGS"] == ["--recompute-granularity", "full", "--recompute-method", "block",
                                                   "--recompute-num-layers", n]
    config, _ = job_config(e, 10, "run", 5, 2)
    assert config["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": every}
    problems = deepspeed_checks(e.layout, model, e.job)
    assert any(isinstance(p, PlannerError) and p.field == "recompute" for p in problems)


def test_the_cli_takes_a_share_and_names_them_among_the_choices(capsys):
    from planner.cli.main import main

    for rc in ("half", "quarter"):
        assert main(["estimate", "--params", "7B", "--gpus", "8", "--recompute", rc, "--format", "csv"]) == 0
    with pytest.raises(SystemExit) as bad:
        main(["estimate", "--params", "7B", "--gpus", "8", "--recompute", "halves"])
    assert bad.value.code == 2 and "'full', 'half', 'quarter')" in capsys.readouterr().err


def test_exports_say_where_the_framework_recomputes_another_share_than_planned():
    """Megatron's block method takes one N for every virtual stage (rounded up: a smaller stage
    recomputes a larger share); torchtitan checkpoints floor(n / every) of a rank's n blocks (a
    count that is no multiple keeps more). Each says so in the file's header, and is silent when the
    share is the plan's: 80 layers on 4 stages (20 each: 5 of 20, 10 of 20)."""
    from planner.export.megatron import block_recompute_note
    from planner.export.torchtitan import layer_ac_notes

    assert block_recompute_note(80, 4, 1, 4) == block_recompute_note(80, 4, 1, 2) == ""
    assert "recomputes 1 of each virtual stage's 2 layers, not 1/4" in block_recompute_note(80, 40, 1, 4)
    assert "4 of the smallest virtual stage's 7 layers and 4 of the fullest's 8, not 1/2" in block_recompute_note(
        126, 16, 1, 2)
    assert layer_ac_notes(80, 4, 1, "1f1b", 4) == layer_ac_notes(60, 1, 1, "1f1b", 4) == []
    assert "checkpoints 1 of the 5 blocks of a rank that builds 5, not 1/4" in layer_ac_notes(80, 16, 1, "1f1b", 4)[0]
    assert "checkpoints 0 of the 2 blocks" in layer_ac_notes(80, 40, 1, "1f1b", 4)[0]
    # interleaved: a rank's chunks counted together (80 layers, pp 4 x vpp 5: 4 a chunk, 20 a rank)
    assert layer_ac_notes(80, 4, 5, "1f1b", 4) == []
