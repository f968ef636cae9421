"""With --memory-headroom given (0 here: plan up to capacity, the behaviour before plans kept room
by default; tests/test_fit_verdict.py checks the default), a plan above 95% of the memory it may fill (the warnings' "within 5% of capacity") names the
fastest layout with its pins under that line and what it costs in time (planner.core.plan.Plan.roomier):
checked against the search's own table read row by row, against `planner export`, which picks
the same layout by its own path, and on the page."""

import json

import numpy as np
import pytest

from planner.cli.main import main as cli_main
from planner.core.options import build_inputs
from planner.core.plan import plan
from planner.core.search import search

GIB = 2**30
A6000_7B = {"preset": "llama2-7b", "mode": "full-finetune", "gpus": 1, "gpu": "a6000", "memory_headroom": 0.0}
A6000_FLAGS = ["--preset", "llama2-7b", "--mode", "full-finetune", "--gpus", "1", "--gpu", "a6000",
               "--memory-headroom", "0"]
UP_TO_CAPACITY = ["--memory-headroom", "0"]


def estimate_json(capsys, *flags: str) -> dict:
    assert cli_main(["estimate", *flags, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_roomier_layout_is_the_fastest_fitting_one_under_95_percent():
    """7B fully fine-tuned on one 48 GB A6000: the fastest layout (micro-batch 2, no recompute,
    everything offloaded) fills 97%; every layout of the search, read row by row, gives the fastest
    under 95% of 48 GiB."""
    x = build_inputs(A6000_7B)
    p = plan(x.model, x.hardware, x.job, x.gpus, x.pins)
    cap = p.best.memory.capacity_bytes
    assert cap == 48 * GIB and p.best.memory.total_bytes > 0.95 * cap
    table = search(x.model, x.hardware, x.job, x.gpus, x.pins).evaluation  # every row, rank order
    under = [i for i in range(len(table.candidates.dp))
             if table.fits[i] and table.memory.total[i] <= 0.95 * cap]
    assert under, "some layout fits under 95%"
    fastest = min(under, key=lambda i: float(table.time.step[i] / table.tokens_per_step[i]))  # seconds per token
    r = p.roomier
    assert r is not None and r.layout == table.candidates.layout(fastest)
    assert r.memory.total_bytes == pytest.approx(float(table.memory.total[fastest]))
    assert r.memory.total_bytes <= 0.95 * cap < p.best.memory.total_bytes
    assert r.train.seconds >= p.best.train.seconds  # slower, or it would be the best
    # Half the micro-batch, the same offload: activations halve, 46.4 -> about 25 GiB.
    assert (r.layout.micro_batch, r.layout.recompute, r.layout.offload) == (1, "none", "params")


def test_the_report_and_json_name_it(capsys):
    j = estimate_json(capsys, *A6000_FLAGS)
    r = j["roomier"]
    assert r is not None and r["layout"]["micro_batch"] == 1
    assert cli_main(["estimate", *A6000_FLAGS, "--wide"]) == 0  # lines unwrapped: one line to read
    out = capsys.readouterr().out
    total, cap = r["memory"]["total_bytes"], r["memory"]["capacity_bytes"]
    slower = r["train"]["seconds"] / j["train"]["seconds"] - 1
    line = next(x for x in out.splitlines() if "under 95% of the memory" in x)
    assert line.startswith("  - the fastest layout under 95% of the memory: dp 1 x tp 1 x pp 1 | micro-batch 1 x 64 accum")
    assert line.endswith(f": {total / GIB:.1f} GiB ({total / cap:.0%}), {slower:.1%} slower")
    assert 0 < slower < 0.2 and 0.5 < total / cap < 0.6
    # One GPU, everything offloaded: ZeRO-3 on one rank is what offload needs, not ZeRO-0 listed
    # again, so the runners-up list the other offloaded layouts.
    runners = out.split("runners-up:")[1].split("warnings:")[0]
    assert len([x for x in runners.splitlines() if " params " in x]) == 5


def test_none_below_95_or_a_plan_below_it_says_nothing(capsys):
    # Every field pinned to the 97% layout: nothing else has these pins.
    pinned = [*A6000_FLAGS, "--micro-batch", "2", "--recompute", "none", "--offload", "params", "--zero", "3"]
    assert cli_main(["estimate", *pinned]) == 0
    out = capsys.readouterr().out
    assert "  - no layout with these pins fits under 95% of the memory" in out
    assert estimate_json(capsys, *pinned)["roomier"] is None
    # 33B on 128 A100s (fsdp2): 90% of the memory, nothing to add.
    j = estimate_json(capsys, "--params", "33B", "--gpus", "128", *UP_TO_CAPACITY)
    assert j["memory"]["total_bytes"] < 0.95 * j["memory"]["capacity_bytes"] and j["roomier"] is None
    assert cli_main(["estimate", "--params", "33B", "--gpus", "128", *UP_TO_CAPACITY]) == 0
    assert "under 95% of the memory" not in capsys.readouterr().out


def test_export_writes_the_layout_the_estimate_names(capsys):
    """`planner export` finds its layout under 95% by its own path (planner.export.plan.choose, in
    rank order, with the format's limits): for Megatron-LM, which can express every layout here,
    the same one, at the same cost."""
    flags = ["--params", "33B", "--gpus", "128", "--stack", "megatron-core", *UP_TO_CAPACITY]
    j = estimate_json(capsys, *flags)
    assert j["memory"]["total_bytes"] > 0.95 * j["memory"]["capacity_bytes"]
    r = j["roomier"]
    assert cli_main(["export", *flags, "--format", "megatron"]) == 0
    captured = capsys.readouterr()
    written = next(x for x in captured.out.splitlines() if x.startswith("# layout: "))
    assert written.startswith(f"# layout: dp {r['layout']['dp']} x tp {r['layout']['tp']} x pp {r['layout']['pp']} "
                              f"(interleaved x{r['layout']['vpp']}) | micro-batch {r['layout']['micro_batch']} x ")
    slower = r["train"]["seconds"] / j["train"]["seconds"] - 1
    assert f"this one is {slower:.1%} slower" in captured.err
    assert np.isfinite(slower) and slower > 0


def test_ranked_by_cost_it_is_the_cheapest(capsys):
    flags = ["--params", "33B", "--gpus", "128", "--stack", "megatron-core", "--sort", "cost", *UP_TO_CAPACITY]
    j = estimate_json(capsys, *flags)
    r = j["roomier"]
    assert r["train"]["cost_usd"] >= j["train"]["cost_usd"]
    assert cli_main(["estimate", *flags]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "under 95% of the memory" in x)
    assert line.startswith("  - the cheapest layout under 95% of the memory: ")


def test_the_page_shows_it():
    pytest.importorskip("streamlit")
    from tests.app.test_app import new_app

    at = new_app({"gpus": "128", "params": "33", "stack": "megatron-core", "memory_headroom": "0"})
    notes = [i.value for i in at.info if i.value.startswith("The fastest layout under 95% of the memory: ")]
    assert len(notes) == 1 and "micro-batch 1 x 64 accum" in notes[0] and notes[0].endswith("1.1% slower")
