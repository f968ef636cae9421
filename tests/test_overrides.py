"""--set TABLE.KEY=VALUE: one stack key changed for one plan, checked as a stack file's key is.

The independent path is a stack file: the same key written in a file whose ``base`` is the stack
must give the same numbers (the file loader reads and converts it on its own path), and a key set
to the value the stack already has must change nothing, for every key the loader knows (so a key
added to the stack schema later is covered without editing this test)."""

import json

import pytest

from planner.cli.main import main as cli_main
from planner.core.options import build_inputs
from planner.core.plan import plan
from planner.errors import PlannerError
from planner.stacks import _KEYS, _TABLES, get_stack, job_stack, stack_keys

# 33B on 128 A100s, the layout pinned (so a changed key changes numbers, not the layout chosen).
PINNED = {"params": "33B", "gpus": 128, "stack": "megatron-core", "dp": 16, "tp": 4, "pp": 2, "micro_batch": 1,
          "zero_stage": 1, "recompute": "selective", "sequence_parallel": True, "memory_headroom": 0.0}


def _plan(values: dict):
    x = build_inputs(values)
    return plan(x.model, x.hardware, x.job, x.gpus, x.pins, ops=x.ops).best


def _file_value(key: str, stack) -> object:
    """The stack's own value of a file key, in the file's unit (the loader converts us, ms, MiB)."""
    attr, kind, _ = _KEYS[key]
    value = getattr(stack, attr)
    scale = {"us": 1e6, "ms": 1e3, "mib": 1 / 2**20}.get(kind)
    if scale:
        return value * scale
    return list(value) if isinstance(value, tuple) else value


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else repr(value)


@pytest.mark.parametrize("items", [("sharding.grad_reduce_bytes=2",),
                                   ("kernels.logit_bytes=12", "overlap.tp_overlap=0.5"),
                                   ("overhead.layer_overhead_us=40", "kernels.elementwise=eager")])
def test_a_set_key_gives_what_a_stack_file_with_that_key_gives(tmp_path, items):
    tables: dict[str, list[str]] = {}
    for item in items:
        name, value = item.split("=")
        table, key = name.split(".")
        tables.setdefault(table, []).append(f"{key} = {value if value[0].isdigit() else _toml(value)}")
    text = 'base = "megatron-core"\nname = "mine"\ndescription = "d"\nsource = "s"\n' + "".join(
        f"[{t}]\n" + "\n".join(lines) + "\n" for t, lines in tables.items())
    path = tmp_path / "mine.toml"
    path.write_text(text)
    by_file = _plan({**PINNED, "stack": str(path)})
    by_set = _plan({**PINNED, "stack_set": items})
    base = _plan(PINNED)
    assert by_set.layout == by_file.layout == base.layout
    assert by_set.time.step_s == by_file.time.step_s and by_set.memory.total_bytes == by_file.memory.total_bytes
    assert (by_set.time.step_s, by_set.memory.total_bytes) != (base.time.step_s, base.memory.total_bytes)


def test_every_key_set_to_the_stacks_own_value_changes_nothing():
    base = _plan(PINNED)
    stack = get_stack("megatron-core")
    for key, _ in stack_keys():
        item = f"{key}={_toml(_file_value(key, stack))}"
        s = job_stack(build_inputs({**PINNED, "stack_set": (item,)}).job)
        assert {f: getattr(s, f) for f in s.__slots__ if f != "overrides"} == \
               {f: getattr(stack, f) for f in stack.__slots__ if f != "overrides"}, key
    one = _plan({**PINNED, "stack_set": ("sharding.grad_reduce_bytes=4", "fp8.fp8_recipe=delayed")})
    assert (one.time.step_s, one.memory.total_bytes) == (base.time.step_s, base.memory.total_bytes)


def test_table_names_are_optional_and_checked():
    job = build_inputs({**PINNED, "stack_set": ("grad_reduce_bytes=2",)}).job
    assert job_stack(job).grad_reduce_bytes == 2.0
    with pytest.raises(PlannerError, match="a table of a stack file"):
        job_stack(build_inputs({**PINNED, "stack_set": ("nosuch.grad_reduce_bytes=2",)}).job)
    assert set(_TABLES) >= {"kernels", "sharding", "overlap"}


@pytest.mark.parametrize("item, words", [
    ("sharding.grad_reduce_bytes=7", ["--set sharding.grad_reduce_bytes=7", "a number from 1 to 4"]),
    ("kernels.attention=flash3", ["kernels.attention", "flash3", "one of flash2, fused, standard"]),
    ("sharding.grad_reduce=2", ["sharding.grad_reduce", "unknown stack key", "did you mean grad_reduce_bytes"]),
    ("pipeline.interleaved=maybe", ["pipeline.interleaved", "maybe", "true or false"]),
    ("grad_reduce_bytes", ["TABLE.KEY=VALUE"]),
])
def test_a_bad_key_or_value_is_one_line_and_exit_2(capsys, item, words):
    assert cli_main(["estimate", "--params", "7B", "--gpus", "8", "--set", item]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_json_and_report_name_what_was_set(capsys):
    # megatron-core runs cuDNN's fused attention; set to FlashAttention-2 (as on an older TE)
    flags = ["--params", "7B", "--gpus", "8", "--stack", "megatron-core", "--set", "sharding.grad_reduce_bytes=2",
             "--set", "kernels.attention=flash2"]
    assert cli_main(["estimate", *flags, "--format", "json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["stack"]["overrides"] == {"sharding.grad_reduce_bytes": 2, "kernels.attention": "flash2"}
    assert j["stack"]["attention_kernel"] == "flash2"
    assert cli_main(["estimate", *flags, "--wide"]) == 0  # --wide: the stack line unwrapped
    stack = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("stack "))
    assert stack.endswith('; set for this plan: sharding.grad_reduce_bytes=2, kernels.attention="flash2"')
    assert cli_main(["estimate", "--params", "7B", "--gpus", "8", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"]["overrides"] == {}


@pytest.mark.parametrize("command", [["search", "--top", "1"], ["compare", "--gpu", "a100-80g,h100-80g"],
                                     ["recommend", "--gpu", "a100-80g", "--deadline", "400d"],
                                     ["export", "--format", "megatron"]])
def test_every_planning_command_takes_it(capsys, command):
    # recommend picks the GPU count itself and has no --gpus (it once passed only as an
    # abbreviation of --gpus-per-node, which the parser now refuses)
    sizing = ["--params", "7B"] + ([] if command[0] == "recommend" else ["--gpus", "8"])
    assert cli_main([*command[:1], *sizing, "--set", "sharding.grad_reduce_bytes=2", *command[1:]]) == 0
    out = capsys.readouterr().out
    if command[0] in ("compare", "export"):
        assert "set for this plan: sharding.grad_reduce_bytes=2" in out
    assert cli_main([*command[:1], *sizing, "--set", "sharding.grad_reduce_bytes=9", *command[1:]]) == 2
    assert "a number from 1 to 4" in capsys.readouterr().err


def test_a_calibrated_profiles_factor_gives_way_to_a_set_key():
    from planner.hardware import get_profile
    from planner.stacks import effective

    hw = get_profile("a100-80g")
    mine = hw.__class__.__new__(hw.__class__)
    for f in hw.__slots__:
        object.__setattr__(mine, f, getattr(hw, f))
    object.__setattr__(mine, "efficiency_keys", frozenset({"dp_overlap"}))
    stack = job_stack(build_inputs({**PINNED, "stack_set": ("overlap.dp_overlap=0.25",)}).job)
    assert effective(mine, stack).efficiency.dp_overlap == 0.25
    assert effective(mine, get_stack("megatron-core")).efficiency.dp_overlap == hw.efficiency.dp_overlap


def test_the_explorer_field_round_trips_through_the_link_and_the_command():
    from planner.app import state

    s = {**state.defaults(), "stack_set": "sharding.grad_reduce_bytes=2; kernels.attention=flash2"}
    back, notes = state.state_from_query(state.query_from_state(s))
    assert back["stack_set"] == s["stack_set"] and not notes
    assert state.estimate_command(s).endswith("--set sharding.grad_reduce_bytes=2 --set kernels.attention=flash2")
    assert build_inputs(state.mapping_from_state(s)).job.stack_set == ("sharding.grad_reduce_bytes=2",
                                                                         "kernels.attention=flash2")
