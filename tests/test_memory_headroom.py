"""--memory-headroom: a plan leaves that share of each GPU's memory free. Checked against an
independent path: the same job on a copy of the profile whose memory is already reduced."""

from pathlib import Path

import pytest

from planner.cli.main import main
from planner.core.layout import Job
from planner.core.plan import plan
from planner.core.presets import resolve_params
from planner.hardware import get_profile, load_profile_file

GIB = 2**30
A100 = Path(__file__).parent.parent / "hardware_profiles" / "a100-80g.toml"


def test_a_headroom_plans_as_a_gpu_with_that_much_less_memory(tmp_path):
    model = resolve_params(33e9)[0]
    full = plan(model, get_profile("a100-80g"), Job(memory_headroom=0.0), 128).best  # up to capacity
    kept = plan(model, get_profile("a100-80g"), Job(memory_headroom=0.15), 128).best
    # The plan without headroom uses 69 of 80 GiB: above 68 GiB, so it is not the plan with 15% kept.
    assert 0.85 * 80 * GIB < full.memory.total_bytes <= 80 * GIB
    assert kept.memory.total_bytes <= 0.85 * 80 * GIB and kept.layout != full.layout
    assert kept.memory.capacity_bytes == pytest.approx(68 * GIB)
    # The same job on an A100 profile written with 68 GiB: the same layout and the same numbers.
    smaller = tmp_path / "a100-68g.toml"
    smaller.write_text(A100.read_text().replace("memory_gib = 80 ", "memory_gib = 68 "))
    same = plan(model, load_profile_file(smaller), Job(memory_headroom=0.0), 128).best
    assert same.layout == kept.layout
    assert same.time.step_s == kept.time.step_s and same.memory.total_bytes == kept.memory.total_bytes


def test_no_headroom_is_the_capacity_itself():
    model = resolve_params(33e9)[0]
    assert plan(model, get_profile("a100-80g"), Job(memory_headroom=0.0), 128).best.memory.capacity_bytes == 80 * GIB


def test_the_report_names_the_headroom(capsys):
    assert main(["estimate", "--params", "33B", "--gpus", "128", "--memory-headroom", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "of 72 GiB per GPU" in out and "80 GiB less the 10% kept free (--memory-headroom)" in out


def test_json_carries_the_headroom_beside_the_capacity_it_leaves(capsys):
    import json

    assert main(["estimate", "--params", "33B", "--gpus", "128", "--memory-headroom", "0.25", "--format", "json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["memory_headroom"] == 0.25 and memory["capacity_bytes"] == pytest.approx(60 * GIB)
    assert memory["total_bytes"] <= memory["capacity_bytes"]
