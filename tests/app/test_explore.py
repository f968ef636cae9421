"""The explorer's pure parts, without a browser: state <-> URL <-> the mapping of declared names
<-> CLI flags, the plan equal to `planner estimate`, the nearest valid values of an impossible pin,
the bubble curve, the cross-hardware sweep, run records (bad ones named and skipped) and `planner app`."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from planner.app import charts as explore_charts
from planner.app import explore
from planner.app import state as explore_state
from planner.calibration import run_records
from planner.cli.main import main as cli_main

RUNS = Path(__file__).resolve().parent / "data" / "runs"  # one real CPU run of the reference trainer


def cli_estimate(argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["estimate", *argv, "--format", "json"]) in (0, 3)
    return json.loads(out.getvalue())


STATES = [
    {},
    {"model": "preset", "preset": "llama-7b", "gpus": 16, "tokens": 1000.0, "price_usd_per_gpu_hour": 1.25,
     "pue": 1.1},
    {"model": "shape", "arch": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 50257,
     "gpus": 8, "gpu": "v100-32g", "precision": "fp16", "attention": "standard", "overlap_grad_reduce": False},
    {"params": 70.0, "gpus": 256, "pp": 4, "vpp": 2, "micro_batch": 1, "zero_stage": "3", "recompute": "selective",
     "sequence_parallel": "on", "attention": "standard", "sort": "cost"},
    {"params": 13.0, "gpus": 64, "gpu": "h100-80g", "global_batch": 1024, "tp": 2, "schedule": "1f1b"},
    {"params": 13.0, "gpus": 32, "stack": "megatron-core", "zero_stage": "1", "kernels": "eager", "compile": True},
]


@pytest.mark.parametrize("changes", STATES)
def test_state_is_the_cli_plan_and_survives_the_url(changes):
    state = {**explore_state.defaults(), **changes}
    query = explore_state.query_from_state(state)
    assert set(query) == {k for k, v in changes.items() if v != explore_state.defaults()[k]}
    again, notes = explore_state.state_from_query(query)
    assert again == state and notes == []
    argv = explore_state.argv_from_state(state)
    view = explore.compute(explore_state.mapping_from_state(state))  # the mapping, not the flags
    assert isinstance(view, explore.View)
    assert view.to_json() == cli_estimate(argv)  # the flags, parsed by the CLI
    assert explore_state.estimate_command(state).split()[2:] == argv


def test_link_values_out_of_bounds_are_named_and_replaced_by_defaults():
    keys = ("gpus", "tp", "gpu", "overlap_grad_reduce")
    state, notes = explore_state.state_from_query({"gpus": "0", "tp": "2.5", "gpu": "tpu-v9",
                                                   "overlap_grad_reduce": "maybe", "price_usd_per_gpu_hour": "",
                                                   "unrelated": "x"})
    defaults = explore_state.defaults()
    assert [state[k] for k in keys] == [defaults[k] for k in keys]
    assert state["price_usd_per_gpu_hour"] is None and len(notes) == 4
    assert any("gpus='0'" in n and "1 to 65536" in n for n in notes)
    assert any("tp='2.5'" in n and "whole number" in n for n in notes)


def mapping(argv: list[str]) -> dict:
    """The mapping of declared names that `planner estimate` parses these flags into."""
    from planner.cli.main import build_parser

    return vars(build_parser().parse_args(["estimate", *argv]))


@pytest.mark.parametrize("pins, field, valid", [
    (["--tp", "3"], "tp", (2, 4)),  # llama-33b: 52 heads
    (["--pp", "3"], "pp", (2, 4)),  # divisors of 128
    (["--pp", "4", "--vpp", "7", "--stack", "megatron-2021"], "vpp", (5, 15)),  # even split: pp*vpp divides 60
    (["--global-batch", "1001", "--micro-batch", "2"], "global_batch", (1000, 1002)),  # 1001 = 7 x 11 x 13
])
def test_impossible_pins_name_the_constraint_and_the_nearest_valid_values(pins, field, valid):
    argv = ["--params", "33B", "--gpus", "128", *pins]
    problem = explore.compute(mapping(argv))
    assert isinstance(problem, explore.Problem)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli_main(["estimate", *argv]) == 2
    assert err.getvalue().strip() == f"planner estimate: {problem.message}"  # the CLI's words
    found = {s.field: s.valid for s in problem.suggestions}
    assert found[field] == valid
    for value in valid:  # each suggestion does make a plan
        flag = "--" + field.replace("_", "-")
        fixed = [*argv[: argv.index(flag)], flag, str(value), *argv[argv.index(flag) + 2:]]
        assert isinstance(explore.compute(mapping(fixed)), explore.View), fixed


def test_a_pinned_layout_that_does_not_fit_offers_the_nearest_that_does():
    view = explore.compute(mapping(["--params", "33B", "--gpus", "32", "--tp", "1", "--pp", "1", "--zero", "0"]))
    assert isinstance(view, explore.View) and not view.best.fits
    assert view.nearest_fit is not None and view.nearest_fit.fits
    changed = explore.changed_fields(view.best.to_json()["layout"], view.nearest_fit.to_json()["layout"])
    assert changed and all("->" in c for c in changed)


def test_headline_formats_the_json_contract():
    j = cli_estimate(["--params", "33B", "--gpus", "128"])
    figures = {f.label: f.value for f in explore.headline(j)}
    assert figures["time to train"] == f"{j['train']['days']:.1f} days"  # 65 days: one decimal, under 100
    assert figures["MFU"] == f"{j['mfu']:.1%}"
    assert figures["memory per GPU"].endswith("/80 GiB") and len(figures["memory per GPU"]) <= 12  # not cut off


def test_a_short_job_is_in_hours_and_a_long_one_in_years():
    short = explore.headline(cli_estimate(["--params", "125M", "--gpus", "64", "--tokens", "1B"]))
    long = explore.headline(cli_estimate(["--params", "70B", "--gpus", "8", "--tokens", "10T"]))
    value = {f.label: f.value for f in short}["time to train"]
    assert value.endswith((" min", " h")), value
    value = {f.label: f.value for f in long}["time to train"]
    assert value.endswith(" years"), value


def test_nearest_fit_has_two_alternatives_changing_other_fields():
    view = explore.compute(mapping(["--params", "70B", "--gpus", "128", "--tp", "4", "--pp", "4", "--zero", "1",
                                    "--micro-batch", "4", "--recompute", "none", "--stack", "megatron-core"]))
    assert isinstance(view, explore.View) and not view.best.fits
    near = [view.nearest_fit, *view.alternatives]
    assert len(near) == 3 and all(n.fits for n in near)
    pins = ("tp", "pp", "zero_stage", "micro_batch", "recompute")
    changed = [frozenset(p for p in pins if getattr(n.layout, p) != getattr(view.best.layout, p)) for n in near]
    assert len(set(changed)) == 3  # each changes a different set of pinned fields
    assert len(changed[0]) <= min(len(c) for c in changed)  # the first changes the fewest
    assert view.to_json()["nearest_fit_alternatives"][0]["memory"]["fits"] is True


def test_memory_and_time_rows_add_up():
    j = cli_estimate(["--params", "70B", "--gpus", "256", "--pp", "4", "--vpp", "2"])
    rows = explore.memory_rows(j)
    peak = [r for r in rows if r["stage"].endswith("(peak)")]
    assert sum(r["GiB"] for r in peak) == pytest.approx(j["memory"]["total_bytes"] / 2**30)
    assert sum(r["seconds"] for r in explore.time_rows(j)) == pytest.approx(j["time"]["step_s"])
    spec = explore_charts.memory_bar(rows, 80.0)
    assert spec["layer"][1]["data"]["values"] == [{"capacity": 80.0}]


def test_bubble_curve_is_the_pipeline_formula():
    rows = explore.bubble_rows(pp=4, vpp=2, micro_batches=8)
    at8 = {r["schedule"]: r["bubble"] for r in rows if r["micro-batches"] == 8}
    x1, x2 = 3 / 8, 3 / 16  # (p-1)/(v m), Narayanan et al. 2021
    assert at8 == pytest.approx({"1F1B": x1 / (1 + x1), "interleaved v=2": x2 / (1 + x2)})


def test_hardware_views_match_a_search_per_profile():
    values = explore_state.comparison_mapping({**explore_state.defaults(), "params": 7.0})
    rows = {r.profile: r for r in explore.compare_hardware(values, 16, ["a100-80g", "v100-32g"])}
    a100 = cli_estimate(["--params", "7B", "--gpus", "16", "--gpu", "a100-80g"])
    assert rows["a100-80g"].days == pytest.approx(a100["train"]["days"])
    assert rows["v100-32g"].precision == "fp16"  # no bf16 on a V100
    points = explore.sweep(explore_state.sweep_mapping({**explore_state.defaults(), "params": 7.0}), (16, 32),
                           ["a100-80g"])
    days = explore.sweep_rows(points, a100["train"]["tokens"], "bf16")
    assert days[0] == {"profile": "a100-80g", "GPUs": 16, "days": pytest.approx(a100["train"]["days"])}


def test_runs_are_what_planner_validate_says_and_bad_records_are_named(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(RUNS, runs)
    (runs / "garbled").mkdir()
    (runs / "garbled" / "record.json").write_text("{not json")
    good = json.loads((RUNS / "tiny-cpu" / "record.json").read_text())
    (runs / "no-step-time").mkdir()
    (runs / "no-step-time" / "record.json").write_text(json.dumps({k: v for k, v in good.items()
                                                                    if k != "step_time_s"}))
    loaded = run_records.load_folder(runs)
    assert [r.label for r in loaded.runs] == ["tiny-cpu"]
    assert len(loaded.skipped) == 2
    assert any("garbled" in line and "not JSON" in line for line in loaded.skipped)
    assert any("no-step-time" in line and "step_time_s" in line for line in loaded.skipped)
    uploaded = run_records.load_uploaded([("mine.json", b"[]"), ("good.json", json.dumps(good).encode())])
    assert len(uploaded.runs) == 1 and len(uploaded.skipped) == 1 and uploaded.skipped[0].startswith("mine.json: ")
    assert run_records.load_folder(tmp_path / "nothing-here") == run_records.Loaded(runs=(), skipped=())

    compared = run_records.compare(loaded.runs, None)  # the run names a100-80g in its config
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["validate", str(runs / "tiny-cpu"), "--format", "json"]) == 0
    cli_points = json.loads(out.getvalue())["points"]
    assert [(p.quantity, p.predicted, p.measured, p.error) for p in compared.points] == \
        [(p["quantity"], p["predicted"], p["measured"], p["error"]) for p in cli_points]
    assert {"step_s", "tokens_per_s"} <= {p.quantity for p in compared.points}
    rows = run_records.point_rows(compared.points)
    assert rows[0]["error"].endswith("%") and rows[-1]["error"].endswith("pp")  # step_s ... comm_fraction
    assert run_records.plot_png(compared.points)[:4] == b"\x89PNG"

    anonymous = {**good, "config": {**good["config"], "profile": {**good["config"]["profile"],
                                                                    "hardware_profile": None}}}
    (runs / "tiny-cpu" / "record.json").write_text(json.dumps(anonymous))
    nameless = run_records.load_folder(runs / "tiny-cpu").runs
    assert run_records.compare(nameless, None).unpredicted[0].startswith("tiny-cpu: ")  # a CPU matches no GPU
    assert run_records.compare(nameless, "h100-80g").points  # unless a profile is chosen


def test_planner_app_serves_the_packaged_page(tmp_path):
    from planner.cli import app as app_cli
    from planner.cli.main import build_parser

    args = build_parser().parse_args(["app", "--port", "8600", "--headless"])
    cmd = app_cli.streamlit_command(args, app_cli.app_path())
    assert cmd[1:4] == ["-m", "planner.app.serve", "run"] and cmd[4].endswith("served.py")
    assert cmd[cmd.index("--server.port") + 1] == "8600" and cmd[cmd.index("--server.headless") + 1] == "true"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli_main(["app", "--port", "0"]) == 2
    assert "port=0" in err.getvalue()


def test_the_served_script_keeps_the_pages_state_between_runs(monkeypatch):
    """Streamlit runs the file `planner app` serves anew, as a fresh __main__, on every page run:
    it runs the page's imported module, so the once-per-process warm-up starts once over several
    runs (and the Runs tab's view built ahead stays where the tab looks for it)."""
    from streamlit.testing.v1 import AppTest

    from planner.app import page
    from planner.cli import app as app_cli

    started = []
    monkeypatch.setattr(page, "_SETTLED", [])
    monkeypatch.setattr(page, "_warm_up", lambda: started.append(True))
    at = AppTest.from_file(str(app_cli.app_path()), default_timeout=60)
    for gpus in (None, 96, 160):
        if gpus:
            at.number_input(key="gpus").set_value(gpus)
        at.run()
        assert not at.exception, [e.message for e in at.exception]
    assert started == [True] and page._SETTLED == [True]


def test_the_server_is_streamlits_command_line_after_a_warm_up_of_the_pages_imports():
    """`planner app` runs `python -m planner.app.serve run served.py ...`: Streamlit's own command
    line with the same arguments; before it, a thread imports what the first page and the first
    clicks need. Every module it names exists (a misspelt one would be skipped without a word)."""
    import importlib.util
    import subprocess
    import sys

    from planner.app import serve

    assert all(importlib.util.find_spec(name) is not None for name in serve.WARM_MODULES)
    thread = serve.start_warm_up()
    assert thread.daemon and thread.name == "planner-server-warm-up"
    thread.join()
    assert set(serve.WARM_MODULES) <= set(sys.modules)
    out = subprocess.run([sys.executable, "-m", "planner.app.serve", "version"], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.startswith("Streamlit, version ")


def test_an_uploaded_hf_config_plans_like_the_cli(tmp_path):
    """The explorer's upload hands the file's bytes to the same builder as --hf-config PATH."""
    from pathlib import Path

    from planner.app import state as explore_state

    data = Path(__file__).parents[1] / "data" / "Meta-Llama-3-8B.config.json"
    s = {**explore_state.defaults(), "model": "hf", "hf_config": data.read_bytes(), "gpus": 64}
    view = explore.compute(explore_state.mapping_from_state(s))
    assert isinstance(view, explore.View)
    assert view.best.model.params == 8_030_261_248  # the published count (tests/data/README.md)
    assert explore_state.argv_from_state(s)[:2] == ["--hf-config", "config.json"]
    bad = {**s, "hf_config": b"{not json"}
    problem = explore.compute(explore_state.mapping_from_state(bad))
    assert isinstance(problem, explore.Problem) and problem.field == "hf_config"


def test_an_uploaded_gemma3_config_plans_its_language_model_with_its_windows():
    """Gemma 3's image-and-text config: the explorer plans the text_config's model, windows and all."""
    from pathlib import Path

    from planner.app import state as explore_state

    data = Path(__file__).parents[1] / "data" / "gemma-3-12b-it.config.json"
    s = {**explore_state.defaults(), "model": "hf", "hf_config": data.read_bytes(), "gpus": 64, "seq_len": 8192}
    view = explore.compute(explore_state.mapping_from_state(s))
    assert isinstance(view, explore.View)
    m = view.best.model
    assert (m.params, m.window, m.window_layers, m.seq_len) == (11_766_034_176, 1024, 40, 8192)


def test_an_uploaded_qwen3_5_config_plans_its_linear_layers():
    """Qwen3.5's image-and-text config: the explorer plans its language model, Gated DeltaNet layers
    and all (context parallel left out)."""
    from pathlib import Path

    from planner.app import state as explore_state

    data = Path(__file__).parents[1] / "data" / "Qwen3.5-27B.config.json"
    s = {**explore_state.defaults(), "model": "hf", "hf_config": data.read_bytes(), "gpus": 64, "seq_len": 8192}
    view = explore.compute(explore_state.mapping_from_state(s))
    assert isinstance(view, explore.View)
    m = view.best.model
    assert (m.params, m.linear_layers, m.output_gate, m.seq_len) == (26_895_998_464, 48, True, 8192)
    assert view.best.layout.cp == 1


def test_the_explorer_plans_multi_token_prediction_as_the_flag_does(capsys):
    """The model's multi-token-prediction field (any source) is `--mtp-layers`: the same plan as the
    CLI's, and the command the page shows carries the flag; a stack that does not train the modules
    is the CLI's one-line refusal."""
    from planner.cli.main import main

    s = {**explore_state.defaults(), "model": "preset", "preset": "deepseek-v3", "gpus": 2048, "gpu": "h800",
         "stack": "megatron-core", "mtp_layers": 1}
    m = explore_state.mapping_from_state(s)
    assert m["mtp_layers"] == 1 and "--mtp-layers 1" in " ".join(explore_state.argv_from_state(s))
    view = explore.compute(m)
    assert isinstance(view, explore.View) and view.best.model.mtp_layers == 1
    assert main(["estimate", *explore_state.argv_from_state(s), "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["time"]["step_s"] == view.best.time.step_s and cli["model"]["mtp_params"] == view.best.model.mtp_params
    assert "mtp_layers" not in explore_state.mapping_from_state({**s, "mtp_layers": 0})
    refused = explore.compute(explore_state.mapping_from_state({**s, "stack": "fsdp2"}))
    assert "mtp_layers=1: 0 on the fsdp2 stack" in str(refused)
