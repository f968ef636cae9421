"""The explorer shows issue 14's dimensions without code of its own: cp, ep and offload are fields
(from the layout declaration), the MoE presets are choices, and a state pinning them survives the
URL and plans exactly as `planner estimate` with the same flags."""

from __future__ import annotations

import pytest

from planner.app import explore
from planner.app import state as explore_state
from tests.app.test_explore import cli_estimate

MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b", "olmoe-1b-7b")


def test_new_dimensions_are_fields_and_moe_presets_are_choices():
    fields = explore_state.field_map()
    assert fields["cp"].kind == fields["ep"].kind == "int" and fields["cp"].default == fields["ep"].default == 0
    assert fields["offload"].choices == ("auto", "none", "optimizer", "params")
    assert set(MOE_PRESETS) <= set(fields["preset"].choices)


STATES = [
    # long context: 64K tokens split over cp 4
    {"model": "preset", "preset": "llama3-8b", "seq_len": 65536, "gpus": 32, "cp": 4, "tp": 2},
    # Mixtral with expert parallel 8
    {"model": "preset", "preset": "mixtral-8x7b", "gpus": 64, "ep": 8, "tp": 2},
    # a full fine-tune of Llama 2 7B on one A6000, optimizer states offloaded
    {"model": "preset", "preset": "llama2-7b", "mode": "full-finetune", "gpus": 1, "gpu": "a6000",
     "stack": "deepspeed-zero", "offload": "optimizer"},
]


@pytest.mark.parametrize("changes", STATES)
def test_new_dimensions_survive_the_url_and_plan_like_the_cli(changes):
    state = {**explore_state.defaults(), **changes}
    query = explore_state.query_from_state(state)
    assert {"cp", "ep", "offload"} & set(changes) <= set(query)
    again, notes = explore_state.state_from_query(query)
    assert again == state and notes == []
    argv = explore_state.argv_from_state(state)
    for name in {"cp", "ep", "offload"} & set(changes):
        assert argv[argv.index(f"--{name}") + 1] == str(changes[name])
    view = explore.compute(explore_state.mapping_from_state(state))
    assert view.to_json() == cli_estimate(argv)
    if "seq_len" in changes:  # a preset's own length replaced, as --seq-len does
        assert argv[argv.index("--seq-len") + 1] == str(changes["seq_len"])
        assert view.to_json()["model"]["seq_len"] == changes["seq_len"]
    layout = view.to_json()["layout"]
    assert all(layout[k] == v for k, v in changes.items() if k in ("cp", "ep", "offload", "tp"))


def test_export_tab_writes_the_torchtitan_config_planner_export_writes():
    import shlex
    import tomllib

    from tests.app.test_app import cli, new_app

    at = new_app({"model": "preset", "preset": "llama3-8b", "gpus": "16", "tab": "Export"})
    at.selectbox(key="export_format").set_value("torchtitan").run()
    assert not at.exception, [e.message for e in at.exception]
    command = next(c.value for c in at.code if c.value.startswith("planner export --format torchtitan"))
    code, out, _ = cli(shlex.split(command)[1:])
    assert code == 0 and out.rstrip("\n") == at.code[-1].value.rstrip("\n")
    assert at.code[-1].language == "toml" and tomllib.loads(out)["model"]["flavor"] == "8B"
