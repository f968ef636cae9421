"""DualPipeV (--schedule dualpipev): DeepSeek's DualPipe cut in half, two stages per rank in a V.
Expected values: the DualPipe README / DeepSeek-V3 report (Table 2) formulas worked by hand, torch's
own ScheduleDualPipeV order (the timeline must run what torch runs), and the rules torch states
(two stages per rank, at least as many micro-batches as stages, no compiled stages)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.layout import Candidates, Job, Layout
from planner.core.pipeline import dualpipe_bubble_ratio, in_flight
from planner.core.plan import plan
from planner.core.presets import get_preset
from planner.core.search import Pins
from planner.decisions import pictures as pic
from planner.errors import PlannerError
from planner.hardware import get_profile

H100 = get_profile("h100-80g")
L70 = get_preset("llama3-70b")


def test_activations_held_and_bubble_ratio_by_hand():
    """A rank holds PP + 1 = 2p + 1 micro-batches of one of its chunks: p + 1/2 of its two. The
    bubble over 1F1B's: (F + 2B - 3W) / (2 (F + B)), 1/3 for B = 2F, W = F; with a full recompute
    in the backward (B = 3F) 1/2."""
    held = in_flight(np.array([8]), np.array([2]), np.array([64]), np.array([2]), np.array([0]))
    assert float(held[0]) == 8.5
    assert float(in_flight(np.array([8]), np.array([2]), np.array([4]), np.array([2]), np.array([3]))[0]) == 4
    assert float(dualpipe_bubble_ratio(np.array(1.0), np.array(2.0), np.array(1.0))) == pytest.approx(1 / 3)
    assert float(dualpipe_bubble_ratio(np.array(1.0), np.array(3.0), np.array(1.0))) == pytest.approx(0.5)


def torch_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's ScheduleDualPipeV actions for one rank, as (kind, micro-batch, chunk)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    sched = schedules.ScheduleDualPipeV.__new__(schedules.ScheduleDualPipeV)
    sched.pp_group_size, sched._n_microbatches, sched._num_stages = pp, m, 2 * pp
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    out = []
    for action in sched._calculate_single_rank_operations(rank):
        if action is None:
            continue
        for a in (action.sub_actions or (action,)):
            kind = kinds[a.computation_type.name]
            out.append((kind, a.microbatch_index, 0 if a.stage_index == rank else 1))
    return out


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 13), (8, 16)])
def test_the_timeline_runs_torchs_dualpipev_order(pp, m):
    for rank in range(pp):
        assert pic._dualpipev_order(pp, m, rank) == torch_order(pp, m, rank), rank


def test_the_timeline_runs_every_pass_once_and_leaves_less_bubble_than_1f1b():
    rows = pic.timeline_rows(4, 2, 16, "dualpipev")
    for r in range(4):
        mine = [x for x in rows if x["rank"] == r]
        assert sum(x["kind"] == "forward" for x in mine) == 2 * 16  # two chunks per micro-batch
    assert 0 < pic.bubble_of(rows, 4) < pic.bubble_of(pic.timeline_rows(4, 2, 16, "1f1b"), 4)
    assert pic.drawn_micro_batches(16, 40, "dualpipev") == 32 and pic.drawn_micro_batches(16, 40, "1f1b") == 24


def test_pins_that_dualpipev_cannot_run_are_one_line_each():
    job = Job()
    for pins, field in ((Pins(pp=8, vpp=3, schedule="dualpipev"), "vpp"), (Pins(pp=1, schedule="dualpipev"), "pp")):
        with pytest.raises(PlannerError) as err:
            plan(L70, H100, job, 64, pins)
        assert err.value.field == field
    with pytest.raises(PlannerError, match="does not run compiled"):
        plan(L70, H100, Job(compile=True), 64, Pins(pp=8, schedule="dualpipev"))
    with pytest.raises(PlannerError, match="stacks with dualpipev: fsdp2, hai-llm"):
        plan(L70, H100, Job(stack="megatron-core"), 64, Pins(pp=8, schedule="dualpipev"))


def test_every_dualpipev_layout_has_two_stages_per_rank_and_enough_micro_batches():
    p = plan(L70, H100, Job(), 64, Pins(pp=8, schedule="dualpipev"), top=50)
    layouts = [p.best.layout, *(r.layout for r in p.runners_up)]
    assert layouts and all(x.schedule == "dualpipev" and x.vpp == 2 and x.grad_accum >= 16 for x in layouts)


def test_the_first_rank_holds_the_head_and_the_bubble_is_below_1f1bs():
    """The same layout under 1F1B and DualPipeV on the hai-llm stack (pp 8; no recompute; ZeRO-1,
    16-bit weights whole): the V puts the output head and final norm on rank 0 beside the
    embedding, and splits the 80 layers evenly (10 per rank, no head balancing); its bubble is
    under 1F1B's."""
    from planner.core.evaluate import evaluate

    base = {"dp": 4, "tp": 2, "pp": 8, "micro_batch": 1, "global_batch": 512, "zero_stage": 1, "recompute": "none",
            "sequence_parallel": True}
    lays = {s: Layout(**base, vpp=2 if s != "1f1b" else 1, schedule=s) for s in ("1f1b", "dualpipev")}
    ev = {s: evaluate(L70, H100, Job(stack="hai-llm"), Candidates.from_layouts([lay]), 64) for s, lay in lays.items()}
    assert 0 < ev["dualpipev"].time.bubble[0] < ev["1f1b"].time.bubble[0]
    v, h = L70.vocab, L70.hidden
    # One Llama 3 70B layer: q, o (h x h each), k, v (h x 1024 each), SwiGLU 3 x h x 28672, two norms.
    per_layer = 2 * h * h + 2 * h * 1024 + 3 * h * 28672 + 2 * h
    assert per_layer == 855_654_400 == L70.layer_params
    rank0 = 10 * per_layer + v * h + h + v * h  # layers, embedding, final norm, untied head
    assert float(ev["dualpipev"].stage_memory[0].weights[0]) == pytest.approx(rank0 / 2 * 2, rel=1e-9)


DPV = ["--preset", "llama3-70b", "--gpus", "64", "--gpu", "h100", "--pp", "8", "--schedule", "dualpipev"]


def test_torchtitan_and_the_trainer_run_it_and_megatron_says_it_cannot(capsys):
    """torchtitan names torch's schedule DualPipeV and places the 2 pp stages in a V itself: 80
    layers over 16 stages of 5. The reference trainer's command line pins it (its runs match one
    process: tests/trainer/test_trainer_equivalence.py). Megatron-LM has no DualPipe: one line."""
    import tomllib

    from tests.test_export import export, run

    cfg = tomllib.loads(export(capsys, "torchtitan", *DPV)[0])
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == "DualPipeV" and par["pipeline_parallel_degree"] == 8
    assert par["pipeline_parallel_layers_per_stage"] == 5
    code, _, err = run(capsys, "export", "--format", "megatron", *DPV, "--stack", "hai-llm")
    assert code == 2 and "not DualPipeV" in err and len(err.strip().splitlines()) == 1
    small = ["--arch", "llama", "--layers", "8", "--hidden", "1024", "--heads", "8", "--vocab", "32000", "--seq-len",
             "2048", "--gpus", "4", "--gpu", "h100", "--pp", "2", "--schedule", "dualpipev", "--global-batch", "16"]
    words = export(capsys, "torchrun", *small)[0].split()
    assert words[words.index("--schedule") + 1] == "dualpipev" and words[words.index("--vpp") + 1] == "2"


def test_without_a_pipeline_the_schedule_names_nothing():
    """pp 1 with --schedule gpipe pinned: gradient accumulation holds one micro-batch at a time
    (GPipe's all-m forwards exist only across stages). It used to count all m micro-batches' activations
    (7B on 8 A100s: 2,048 of them, 128 GiB, "does not fit"); the plan is now the unpinned one's
    and its report names no schedule."""
    from planner.core.layout import GPIPE
    from planner.core.options import build_inputs
    from planner.core.report import layout_line

    assert float(in_flight(np.array([1]), np.array([1]), np.array([2048]), np.array([GPIPE]), np.array([0]))[0]) == 1
    assert float(in_flight(np.array([4]), np.array([1]), np.array([32]), np.array([GPIPE]), np.array([0]))[0]) == 32
    a100 = get_profile("a100-80g")
    model = build_inputs({"params": "7B", "gpus": 8}).model
    free = plan(model, a100, Job(), 8).best
    gpipe = plan(model, a100, Job(), 8, Pins(schedule="gpipe")).best
    assert gpipe.layout.pp == free.layout.pp == 1 and gpipe.fits
    assert gpipe.memory.total_bytes == pytest.approx(free.memory.total_bytes, rel=1e-12)
    assert "GPipe" not in layout_line(gpipe)
