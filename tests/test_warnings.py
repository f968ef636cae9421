"""The report's warnings: each names what is over its line and a fix that would help this plan."""

import pytest

import planner
from planner.core.checks import warnings_for


@pytest.mark.parametrize("parts, tp, searched, overlap, async_helps, what, fix", [
    ({"dp": 0.2, "tp": 0.05}, 2, frozenset(), False, False, "the data-parallel gradient reduction is 20%",
     ("overlap the reduction with backward (drop --no-overlap), a larger global batch (each gradient reduction "
      "serves more tokens), or fewer GPUs")),
    ({"tp": 0.2, "dp": 0.05}, 4, frozenset(), True, True, "tensor parallel's collectives are 20%",
     "a lower tp (traded for pp or dp), or asynchronous TP (--async-tp), which this stack overlaps further"),
    ({"tp": 0.2, "dp": 0.05}, 4, frozenset({"tp"}), True, False, "tensor parallel's collectives are 20%",
     ("the layouts with a lower tp rank behind this one, slower or holding more memory; faster links, fewer GPUs, "
      "or a GPU with more memory")),
    ({"tp": 0.2}, 4, frozenset({"tp"}), True, True, "tensor parallel's collectives are 20%",
     ("the layouts with a lower tp rank behind this one, slower or holding more memory; asynchronous TP "
      "(--async-tp), which this stack overlaps further")),
    ({"tp": 0.2}, 16, frozenset(), True, False, "tensor parallel's collectives are 20%",
     "keep tensor parallel inside a node"),
    ({"cp": 0.15, "tp": 0.1}, 2, frozenset(), True, False, "context parallel's K/V exchange is 15%", "a lower cp"),
    ({"pp": 0.15, "dp": 0.1}, 1, frozenset({"pp"}), True, False, "the pipeline's sends are 15%",
     ("the layouts with fewer pipeline stages rank behind this one, slower or holding more memory; faster links, "
      "fewer GPUs, or a GPU with more memory")),
])
def test_the_communication_warning_names_its_largest_part_and_that_parts_fix(parts, tp, searched, overlap,
                                                                            async_helps, what, fix):
    """The warning names the largest exposed part and a fix for it: the data-parallel reduction a
    larger batch (and the overlap, when it is off), tensor, context and pipeline parallel a lower
    degree unless the search chose it (then what is outside the layout); --async-tp only where the
    stack hides more with it."""
    got = warnings_for(comm_fraction=0.25, bubble_fraction=0.0, total_bytes=1.0, capacity_bytes=2.0, pp=1, vpp=1,
                       grad_accum=1, tp=tp, gpus_per_node=8, comm_parts=parts, searched=searched,
                       overlap_grad_reduce=overlap, async_tp_helps=async_helps)
    assert got == [f"communication is 25% of the step (> 15%); {what}; fix: {fix}"]


def _comm_warning(plan: dict) -> str:
    (warning,) = [w for w in plan["warnings"] if w.startswith("communication is")]
    return warning


def test_async_tp_is_offered_where_the_stack_hides_more_with_it():
    """A 7B model with tp 4 pinned on L40S nodes (PCIe): tensor parallel's collectives are most of
    the step. On fsdp2, whose async TP overlaps more of them (tp_overlap_async), the fix offers
    --async-tp, and taking it lowers their share; with it on, or on a stack without it
    (deepspeed-zero), it is not offered."""
    flags = {"params": "7B", "gpus": 64, "gpu": "l40s", "tp": 4}
    plain, with_async = planner.estimate(**flags), planner.estimate(**flags, async_tp=True)
    assert "tensor parallel's collectives are" in _comm_warning(plain)
    assert _comm_warning(plain).endswith("fix: a lower tp (traded for pp or dp), or asynchronous TP (--async-tp), "
                                         "which this stack overlaps further")
    share = [p["time"]["tp_comm_s"] / p["time"]["step_s"] for p in (plain, with_async)]
    assert share[1] < 0.75 * share[0]
    assert "--async-tp" not in _comm_warning(with_async)
    assert "--async-tp" not in _comm_warning(planner.estimate(**flags, stack="deepspeed-zero"))


SPLIT = ("a larger global batch (more micro-batches per step): every other split into stages, interleaving and "
         "micro-batches ranks behind this one, slower or holding more memory")


@pytest.mark.parametrize("searched, bubble_fix, stages_fix", [
    (frozenset(), ("more micro-batches per step (larger global batch or smaller micro-batch), interleaving (--vpp), "
                   "or fewer pipeline stages"), "at most 4 stages, or more micro-batches"),
    (frozenset({"pp", "vpp"}), ("more micro-batches per step (larger global batch or smaller micro-batch), "
                                "interleaving (--vpp), or fewer pipeline stages"), "at most 4 stages, or more micro-batches"),
    (frozenset({"pp", "vpp", "micro_batch", "tp"}), SPLIT, SPLIT),
])
def test_the_pipeline_warnings_fix_what_the_search_left(searched, bubble_fix, stages_fix):
    """8 stages, 8 micro-batches, a 20% bubble: the fixes name fewer stages, interleaving and
    smaller micro-batches unless the search chose all three (the micro-batch pinned keeps them);
    then only a larger global batch is left."""
    got = warnings_for(comm_fraction=0.0, bubble_fraction=0.2, total_bytes=1.0, capacity_bytes=2.0, pp=8, vpp=1,
                       grad_accum=8, tp=1, gpus_per_node=8, searched=searched)
    assert got == [f"pipeline bubble is 20% of the step (> 15%); fix: {bubble_fix}",
                   ("8 pipeline stages with only 8 micro-batches per step (< 4 per stage): the bubble grows as "
                    f"(pp-1)/(vpp*m); fix: {stages_fix}")]


def test_a_plan_the_search_pipelined_is_told_to_raise_the_batch():
    """GPT-3 6.7B on 1,024 L40S (Megatron-LM 2021): the search's best runs 8 stages with few
    micro-batches; its warning names a larger global batch alone. The same layout pinned keeps
    the fix of fewer stages."""
    best = planner.estimate(preset="gpt3-6.7b", gpu="l40s", gpus=1024, stack="megatron-2021")
    lay = best["layout"]
    assert lay["pp"] > 4
    (stages,) = [w for w in best["warnings"] if "pipeline stages with only" in w]
    assert stages.endswith(f"fix: {SPLIT}")
    pinned = planner.estimate(preset="gpt3-6.7b", gpu="l40s", gpus=1024, stack="megatron-2021",
                              **{k: lay[k] for k in ("tp", "pp", "vpp", "micro_batch")})
    assert any(w.endswith("fix: at most 4 stages, or more micro-batches") for w in pinned["warnings"])


def test_an_export_writes_the_estimates_warnings(capsys):
    """`planner export` writes the plan's warnings beside its layout: the same fixes as
    `planner estimate` gives the same search's best (here: a larger global batch alone)."""
    from planner.cli.main import main as cli_main

    flags = ["--preset", "gpt3-6.7b", "--gpu", "l40s", "--gpus", "1024", "--stack", "megatron-2021"]
    warnings = planner.estimate(preset="gpt3-6.7b", gpu="l40s", gpus=1024, stack="megatron-2021")["warnings"]
    assert any(w.endswith(f"fix: {SPLIT}") for w in warnings)
    assert cli_main(["export", *flags, "--format", "megatron"]) == 0
    written = [line.partition("warning: ")[2] for line in capsys.readouterr().out.splitlines() if "warning: " in line]
    assert written == warnings


def test_a_tight_plan_the_search_could_not_avoid_names_more_gpus():
    """Megatron 39B on 8 A100s (hai-llm): the search's best is tight, above the memory available.
    No layout of the search's table is under it (read off the table), so the fix names more GPUs
    or more memory; with the recompute pinned it keeps the layout fixes."""
    from planner.core.layout import Job
    from planner.core.plan import plan
    from planner.core.presets import get_preset
    from planner.core.search import Pins
    from planner.hardware import get_profile

    model, hw, job = get_preset("megatron-39b"), get_profile("a100-80g"), Job(stack="hai-llm")
    p = plan(model, hw, job, 8, Pins(), top=0)
    (tight,) = [w for w in p.best.warnings if w.startswith("tight:")]
    assert tight.endswith("fix: more GPUs or a GPU with more memory: no layout is under the memory available on "
                          "these GPUs, whatever its recompute, ZeRO stage, tp, pp and micro-batch")
    t = p.result.table
    assert len(t.candidates) > 50 and float(t.memory.total.min()) > t.capacity_bytes
    pinned = plan(model, hw, job, 8, Pins(recompute=p.best.layout.recompute), top=0).best
    assert any(w.startswith("tight:") and w.endswith("fix: a smaller micro-batch, recompute or a higher ZeRO stage")
               for w in pinned.warnings)


def test_a_searchs_first_row_warns_as_the_estimate_does():
    """`planner search` lists the search's best first: its warnings are `planner estimate`'s (the
    fields the search chose known); the rows after it are rows of a listing, with the fixes of
    their own layout."""
    flags = {"preset": "gpt3-6.7b", "gpu": "l40s", "gpus": 1024, "stack": "megatron-2021"}
    rows = planner.search(**flags, top=3)["results"]
    assert rows[0]["warnings"] == planner.estimate(**flags)["warnings"]
    assert any(w.endswith(f"fix: {SPLIT}") for w in rows[0]["warnings"])
    later = [w for row in rows[1:] for w in row["warnings"] if "pipeline stages with only" in w]
    assert later and all(w.endswith("fix: at most 4 stages, or more micro-batches") for w in later)
