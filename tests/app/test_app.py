"""The what-if explorer under streamlit.testing.v1.AppTest: it renders, its figures are the CLI's,
an impossible layout is an error message (with the nearest valid values), not a traceback."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import shlex
from pathlib import Path

import pytest

from planner.app import explore
from planner.cli.main import main as cli_main

AppTest = pytest.importorskip("streamlit.testing.v1", reason="streamlit is not installed (the app extra)").AppTest
APP = Path(__file__).resolve().parents[2] / "app.py"
DEFAULT_FLAGS = {"--params": "33B", "--gpus": "128"}  # the page's defaults (README's first example)


def cli(argv: list[str]) -> tuple[int, str, str]:
    """The real CLI entry point in process (not capsys: streamlit's log handler outlives a test's capture)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return code, out.getvalue(), err.getvalue()


def cli_json(flags: dict[str, str]) -> dict:
    """`planner estimate ... --format json` for these flags."""
    argv = ["estimate", *(x for kv in flags.items() for x in kv), "--format", "json"]
    code, out, _ = cli(argv)
    assert code in (0, 3), argv
    return json.loads(out)


def shown(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def human(seconds: float) -> str:
    """Seconds as the issue asks for them, by hand: minutes and hours under a day, days to one
    decimal under 100 (whole, thousands separated, to a year), years above."""
    days = seconds / 86400
    if days >= 365.25:
        return f"{days / 365.25:.1f} years" if days < 36525 else f"{days / 365.25:,.0f} years"
    if days >= 1:
        return f"{days:.1f} days" if days < 100 else f"{days:,.0f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def expected(j: dict) -> dict[str, str]:
    """The headline figures formatted here, by hand, from the CLI's JSON (not through the page's
    formatter): days and memory to 0.1, MFU to 0.1%, shares to whole percent."""
    m, tr = j["memory"], j["train"]
    pct = lambda x: f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"  # noqa: E731
    return {"time to train": human(tr["seconds"]), "MFU": f"{100 * j['mfu']:.1f}%",
            "memory per GPU": f"{m['total_bytes'] / 2**30:.0f}/{m['capacity_bytes'] / 2**30:.0f} GiB",
            "bubble": pct(j["bubble_fraction"]), "communication": pct(j["comm_fraction"])}


def shown_core(at: AppTest) -> dict[str, str]:
    return {k: v for k, v in shown(at).items() if k in ("time to train", "MFU", "memory per GPU", "bubble",
                                                        "communication")}


def new_app(query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update(query or {})
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_default_page_renders():
    at = new_app()
    assert not at.error
    figures = shown(at)
    assert shown_core(at) == expected(cli_json(DEFAULT_FLAGS))
    assert {"time to train", "GPU-hours", "cost", "energy", "MFU", "tokens/s", "memory per GPU", "bubble",
            "communication"} <= set(figures)
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    memory = next(s for s in specs if "layer" in s and s["layer"][0]["encoding"]["x"]["field"] == "GiB")
    assert memory["layer"][1]["data"]["values"][0]["capacity"] == pytest.approx(80.0)  # the A100 80GB line
    # The runs that check the stack, as the CLI's "checked" line names them.
    checked = cli_json(DEFAULT_FLAGS)["stack"]["checked_against"]
    assert any(c.value.startswith(f"checked against {checked['runs']} published torchtitan runs") for c in at.caption)


def test_a_stack_that_does_what_the_planner_does_not_model_says_so():
    """hai-llm's file names what the planner does not model (DualPipe's schedule, ...): the page
    says it beside the plan, as the CLI's "not modelled" line does; the default stack says nothing."""
    at = new_app({"model": "preset", "preset": "deepseek-v3", "gpus": "2048", "gpu": "h800", "stack": "hai-llm"})
    want = cli_json({"--preset": "deepseek-v3", "--gpus": "2048", "--gpu": "h800", "--stack": "hai-llm"})
    assert want["stack"]["not_modelled"].startswith("DualPipe's second copy of the parameters")
    assert any(c.value == f"hai-llm does what the planner does not model: {want['stack']['not_modelled']}"
               for c in at.caption)
    assert not any("does not model" in c.value for c in new_app().caption)


def test_gpus_profile_and_recompute_change_figures_as_the_cli_says(monkeypatch):
    from planner.app import explore

    computed = []
    real = explore.compute
    monkeypatch.setattr(explore, "compute", lambda values, *a, **k: computed.append(1) or real(values, *a, **k))
    at = new_app()
    flags = dict(DEFAULT_FLAGS)
    before = shown(at)
    steps = [(lambda: at.number_input(key="gpus").set_value(256), {"--gpus": "256"}),
             (lambda: at.selectbox(key="gpu").set_value("a6000"), {"--gpu": "a6000"}),
             # a6000 x 256 plans full recompute at micro-batch 8: pinning none moves it to dp 16 x pp 16
             (lambda: at.selectbox(key="recompute").set_value("none"), {"--recompute": "none"})]
    for change, flag in steps:
        change()
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        flags.update(flag)
        after = shown(at)
        assert shown_core(at) == expected(cli_json(flags)), flag
        assert after != before, f"{flag} changed nothing"
        before = after
    # Cached per input (benchmarks/app_speed.py has the times): a page run with nothing changed
    # computes no plan again.
    plans = len(computed)
    at.run()
    assert not at.exception and len(computed) == plans > 0


def test_export_reproduces_the_plan_through_the_cli():
    """State from the URL; the page's JSON is the CLI's, and its `planner estimate` line reproduces it."""
    at = new_app({"gpus": "256", "gpu": "a6000", "recompute": "full", "tab": "Export"})
    page_json = json.loads(at.json[0].value)
    command = at.code[0].value
    assert command.startswith("planner estimate ")
    assert cli_json(dict(zip(*[iter(shlex.split(command)[2:])] * 2))) == page_json
    assert (page_json["cluster"]["gpu"], page_json["cluster"]["gpus"]) == ("a6000", 256)
    assert page_json["layout"]["recompute"] == "full"


def test_impossible_layout_shows_the_error_and_nearest_values():
    at = new_app()
    at.number_input(key="tp").set_value(3).run()
    assert not at.exception
    assert not at.metric  # no figures for a plan that does not exist
    code, _, err = cli(["estimate", "--params", "33B", "--gpus", "128", "--tp", "3"])
    message = err.strip().removeprefix("planner estimate: ")
    assert code == 2 and message
    assert [e.value for e in at.error] == [f"No plan: {message}"]
    text = " ".join(m.value for m in at.markdown)
    assert "tp = 3" in text and "`2`, `4`" in text  # heads=52 on 128 GPUs: tp in 1, 2, 4
    next(b for b in at.button if b.label == "use tp = 4").click().run()
    assert not at.error and shown_core(at) == expected(cli_json({**DEFAULT_FLAGS, "--tp": "4"}))


def test_bad_link_values_are_named_and_defaults_used():
    at = new_app({"gpus": "many", "pue": "9"})
    notes = " ".join(i.value for i in at.info)
    assert "gpus='many'" in notes and "pue='9'" in notes
    assert shown_core(at) == expected(cli_json(DEFAULT_FLAGS))


def test_hardware_tab_compares_profiles():
    from planner.app.page import work_a_slice

    at = new_app({"tab": "Hardware", "params": "7", "gpus": "16"})
    # Both views fill in over runs: in a browser they rerun alone (a fragment) until they are done,
    # each run working a slice of time on them; AppTest has no fragment timer, so the test works the
    # fragment's slice (at least one step of each view not done) before each page run. A page run
    # also works on them until its budget, which a slow machine spends before it reaches them.
    drawn, compared = [], []
    for _ in range(1000):
        spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
        drawn.append({r["profile"] for r in spec["layer"][0]["data"]["values"]})
        compared.append(set(at.dataframe[0].value["profile"]) if len(at.dataframe[0].value) else set())
        chart_done = any(c.value.startswith("Fastest fitting layout per point") for c in at.caption)
        if chart_done and not [c for c in at.caption if "profiles so far" in c.value]:
            break  # both views complete (on a loaded machine a page run's budget may end with one still going)
        assert chart_done or any(c.value.startswith("Searching every profile") for c in at.caption)
        work_a_slice(at.session_state["_polled"])
        at.run()
        assert not at.exception, [e.message for e in at.exception]
    for seen in (drawn, compared):
        assert all(a <= b for a, b in itertools.pairwise(seen)) and len(seen) > 1  # it grew, run by run
    assert {"a100-80g", "a6000", "v100-32g (fp16)"} <= drawn[-1]
    assert not [c for c in at.caption if "profiles so far" in c.value]
    rows = at.dataframe[0].value
    assert {"a100-80g", "a6000", "v100-32g"} <= set(rows["profile"])
    assert set(rows.loc[rows["profile"] == "v100-32g", "precision"]) == {"fp16"}  # no bf16 on a V100
    # How many measured runs of the stack ran on each profile: the CLI's compare says the same.
    checked = dict(zip(rows["profile"], rows["checked runs"]))
    a100 = cli_json({"--params": "7B", "--gpus": "16", "--gpu": "a100-80g"})["stack"]["checked_against"]["on_this_gpu"]
    assert checked["a100-80g"] == a100 > 0 and checked["v100-32g"] == 0


def test_runs_tab_compares_records_and_names_the_bad_ones(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("PLANNER_RUNS_ROOTS", str(tmp_path))  # the tab reads only under its roots

    runs = tmp_path / "runs"
    shutil.copytree(Path(__file__).resolve().parent / "data" / "runs", runs)
    (runs / "half-written").mkdir()
    (runs / "half-written" / "record.json").write_text('{"schema_version": 1, "run_name": ')
    at = new_app({"tab": "Runs"})
    at.text_input(key="runs_dir").set_value(str(runs)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert [w.value for w in at.warning if w.value.startswith("skipped ") and "half-written" in w.value]
    points = at.dataframe[1].value  # after the list of runs: `planner validate`'s table
    assert set(points["run"]) == {"tiny-cpu"} and "step_s" in set(points["quantity"])
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    # its plot: predicted against measured, a panel per quantity (planner.app.charts.predicted_vs_measured)
    [validation] = [s for s in specs if s.get("facet", {}).get("field") == "quantity" and "layer" in s["spec"]]
    assert [layer["mark"]["type"] for layer in validation["spec"]["layer"]] == ["area", "line", "point"]
    assert any(s.get("facet", {}).get("field") == "quantity" for s in specs)  # the live view's small charts
    assert any(c.value.endswith("steps.csv: 12 steps") for c in at.caption)


def test_export_tab_is_what_planner_export_writes():
    at = new_app({"params": "7", "gpus": "16", "tab": "Export"})
    command = next(c.value for c in at.code if c.value.startswith("planner export "))
    code, out, _ = cli(shlex.split(command)[1:])
    assert code == 0
    assert out.rstrip("\n") == at.code[-1].value.rstrip("\n")  # the torchrun script with its run config


def test_lora_and_operations_figures_follow_the_cli():
    at = new_app()
    # The fine-tuning and operations groups are closed: their fields are drawn once opened.
    assert not any(w.key in ("mode", "lora_r", "mtbf_gpu_hours") for w in [*at.selectbox, *at.number_input])
    at.session_state["_open_finetune"] = True  # what a click on the expander sets
    at.run()
    assert not any(w.key == "lora_r" for w in at.number_input)  # LoRA's fields: only under LoRA
    at.selectbox(key="mode").set_value("lora")
    at.run()
    assert at.number_input(key="lora_r").value == 8
    at.session_state["_open_operations"] = True
    at.run()
    at.number_input(key="mtbf_gpu_hours").set_value(10000.0)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    # Closed again, both groups' values still count.
    at.session_state["_open_finetune"] = at.session_state["_open_operations"] = False
    at.run()
    assert not any(w.key in ("mode", "mtbf_gpu_hours") for w in [*at.selectbox, *at.number_input])
    assert at.query_params["mode"] == "lora" and at.query_params["mtbf_gpu_hours"] == "10000"
    j = cli_json({**DEFAULT_FLAGS, "--mode": "lora", "--lora-r": "8", "--lora-alpha": "16",
                  "--lora-targets": "q_proj,v_proj", "--mtbf-gpu-hours": "10000"})
    figures = shown(at)
    assert shown_core(at) == expected(j)
    assert figures["time with failures"] == human(j["reliability"]["expected_seconds"])
    # LLaMA-33B, r=8 on q and v: 60 layers x 2 x 8 x (6656 + 6656) parameters train.
    assert j["trainable_params"] == 60 * 2 * 8 * (6656 + 6656)
    assert figures["trainable parameters"] == explore.fmt_count(j["trainable_params"])
    assert j["reliability"]["expected_seconds"] >= j["train"]["seconds"]


def test_an_out_of_range_input_is_named_not_silently_kept():
    at = new_app()
    at.number_input(key="gpus").set_value(0).run()
    assert not at.exception
    assert any("Out of range: GPUs: 0" in e.value for e in at.error)
    assert not at.metric  # no plan shown for inputs that are not the ones the user sees


def test_a_closed_group_holding_a_value_out_of_range_opens_to_show_it():
    at = new_app()
    at.session_state["_open_operations"] = True
    at.run()
    at.number_input(key="packing_efficiency").set_value(1.5).run()
    at.session_state["_open_operations"] = False  # closed by the user: the value is kept, and named
    at.run()
    assert not at.exception
    assert any("Out of range: Packing efficiency: 1.5" in e.value for e in at.error)
    assert at.number_input(key="packing_efficiency").value == 1.5  # drawn again, so it can be mended
    at.number_input(key="packing_efficiency").set_value(0.9).run()
    assert not at.error and at.metric


def test_nothing_fits_shows_what_would_fit_not_metrics():
    at = new_app({"params": "405", "gpus": "8"})
    assert not at.exception
    assert any("Does not fit" in e.value for e in at.error)
    assert not at.metric  # no step time or days for a layout that cannot run
    assert any("more GPUs" in i.value for i in at.info)


def test_a_presets_sequence_length_is_set_as_the_cli_sets_it():
    """Long context with a preset (Llama 3 8B at 128K on 8 GPUs, context parallel 4, as torchtitan
    ran it): the sequence-length field replaces the preset's own 8,192, as `--seq-len` does."""
    query = {"model": "preset", "preset": "llama3-8b", "gpus": "8", "gpu": "h100-96g-hbm2e", "cp": "4",
             "precision": "fp8"}
    at = new_app({**query, "seq_len": "131072"})
    assert not at.error, [e.value for e in at.error]
    assert at.number_input(key="seq_len").value == 131072
    assert not any(w.key == "layers" for w in at.number_input)  # a shape's fields: only for a shape
    j = cli_json({"--preset": "llama3-8b", "--gpus": "8", "--gpu": "h100-96g-hbm2e", "--cp": "4",
                  "--precision": "fp8", "--seq-len": "131072"})
    assert j["model"]["seq_len"] == 131072 and j["model"]["layers"] == 32
    assert shown_core(at) == expected(j)
    at.number_input(key="seq_len").set_value(0).run()  # 0: the preset's own
    own = cli_json({"--preset": "llama3-8b", "--gpus": "8", "--gpu": "h100-96g-hbm2e", "--cp": "4",
                    "--precision": "fp8"})
    assert own["model"]["seq_len"] == 8192 and shown_core(at) == expected(own) != expected(j)
    assert "seq_len" not in at.query_params
    at.radio(key="model").set_value("shape").run()
    assert at.number_input(key="layers").value == 32  # the shape's fields drawn, with their values


def test_hardware_overrides_from_the_url_reach_the_plan():
    at = new_app({"gpu_memory_gib": "40"})
    assert not at.exception and not at.error
    assert at.number_input(key="gpu_memory_gib").value == 40  # its group opens: a link that sets one shows it
    assert shown(at)["memory per GPU"].endswith("/40 GiB")
    j = cli_json({**DEFAULT_FLAGS, "--gpu-memory-gib": "40"})
    assert shown_core(at) == expected(j)


def test_a_layouts_row_click_pins_it_and_scenario_a_stays_beside_b():
    at = new_app()
    at.button(key="keep_a").click().run()
    assert not at.exception
    at.number_input(key="gpus").set_value(256).run()
    assert not at.exception
    tables = [d.value for d in at.dataframe]
    side = next(t for t in tables if list(t.columns) == ["", "A", "B (now)"])
    hw = side[side[""] == "hardware"].iloc[0]
    assert hw["A"] == "128 x a100-80g" and hw["B (now)"] == "256 x a100-80g"


def test_the_runs_tab_starts_on_the_committed_runs_when_there_is_no_runs_folder():
    assert not (APP.parent / "runs").is_dir() or pytest.skip("a runs/ folder exists here")
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update({"tab": "Runs"})
    at.run()
    assert not at.exception
    assert at.text_input(key="runs_dir").value == "benchmarks/runs/cpu-2core"
    assert at.dataframe  # the committed records, predicted vs measured


def test_a_page_run_leaves_the_long_lived_heap_out_of_the_collectors_scans():
    """After a page run, what the process built is frozen (gc.freeze): a full collection during a
    later interaction does not rescan Streamlit's, pandas' and the profiles' objects."""
    import gc

    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.exception
    assert gc.get_freeze_count() > 1000  # the imported libraries' objects, at least


SWEEP = [  # the newer dimensions and stacks, each on every tab: nothing may raise or show an error
    {"model": "preset", "preset": "deepseek-v3", "gpus": "2048", "gpu": "h800", "stack": "hai-llm"},
    {"model": "preset", "preset": "mixtral-8x22b", "gpus": "256", "ep": "8", "cp": "2", "seq_len": "16384"},
    {"model": "preset", "preset": "llama3-8b", "gpus": "8", "gpu": "h100-96g-hbm2e", "cp": "4", "seq_len": "131072",
     "precision": "fp8"},
    {"params": "7", "gpus": "1", "gpu": "a6000", "mode": "full-finetune"},
    {"params": "70", "gpus": "64", "sharding": "hybrid"},
    {"model": "preset", "preset": "deepseek-v2-lite", "gpus": "16", "mode": "lora"},
]


@pytest.mark.parametrize("query", SWEEP, ids=lambda q: q.get("preset", q.get("params")))
def test_every_tab_renders_for_the_newer_dimensions(query):
    """The charts key each part of the step and of memory by name: a plan with a part no earlier
    test's plan had (expert parallel's all-to-all) raised a KeyError on the Plan tab."""
    from planner.app.page import TABS

    for tab in TABS:
        at = new_app({**query, "tab": tab})
        assert not at.error, (tab, [e.value for e in at.error])


def test_plan_tab_pictures_fill_in_over_runs():
    """The Plan tab's what-if pictures (memory vs micro-batch, step time vs GPUs: five GPU counts
    searched) are computed a step at a time, as the Hardware tab's views are: a page run draws the
    plan and the pictures as far as they are done, and runs of the pictures alone (in a browser: a
    fragment) complete them, with the rows that computing them in one pass gives."""
    from planner.app import explore
    from planner.app import state as explore_state
    from planner.app.page import work_a_slice

    at = new_app({"params": "71"})
    for _ in range(1000):  # each turn: the fragment's slice (as the Hardware tab's test), then a page run
        done = any(c.value.startswith("The best layout's step parts") for c in at.caption)
        if done:
            break
        assert any(c.value == "Searching the best layout at each GPU count..." for c in at.caption)
        work_a_slice(at.session_state["_polled"])
        at.run()
        assert not at.exception, [e.message for e in at.exception]
    assert done
    charts = [(json.loads(c.proto.spec), c.proto) for c in at.get("vega_lite_chart")]
    memory = next(s for s, _ in charts if "layer" in s and s["layer"][0]["encoding"]["x"]["field"] == "micro_batch")
    # the data inside the chart's one layer (top-level data Streamlit would convert through pandas)
    bars = next(s["layer"][0] for s, _ in charts if "layer" in s and s["layer"][0].get("mark") == "bar"
                and s["layer"][0]["encoding"]["x"]["field"] == "GPUs")
    parts = bars["data"]["values"]
    want_memory, want_time = explore.pictures(explore_state.mapping_from_state({**explore_state.defaults(),
                                                                                "params": 71.0}))
    assert memory["layer"][0]["data"]["values"] == want_memory and len(want_memory) >= 3
    assert [{k: r[k] for k in ("GPUs", "part", "seconds")} for r in parts] == want_time
    assert {r["GPUs"] for r in want_time} == {32, 64, 128, 256, 512}  # a quarter to four times the plan's 128


@contextlib.contextmanager
def fragment_reruns(ids: list[str]):
    """AppTest's runs while inside are reruns of the fragments ``ids`` alone, requested as a
    browser's timer requests them (RerunData's fragment_id_queue); AppTest has no timer."""
    from streamlit.testing.v1 import local_script_runner as lsr

    rerun_data = lsr.RerunData
    lsr.RerunData = lambda **kw: rerun_data(**kw, fragment_id_queue=list(ids), is_auto_rerun=True)
    try:
        yield
    finally:
        lsr.RerunData = rerun_data


def test_hardware_views_fill_in_by_runs_of_their_fragment_alone():
    """In a browser, the Hardware tab's views not yet complete rerun alone (a fragment on a timer):
    each such run draws only the views, each further along, and the one that finds them complete
    reruns the whole page, which draws them complete and sets no timer."""
    from streamlit.testing.v1 import local_script_runner as lsr

    timers: list[list[str]] = []
    run = lsr.LocalScriptRunner.run

    def run_reading_timers(self, *args, **kwargs):  # the ids a run asks the browser to rerun on a timer
        tree = run(self, *args, **kwargs)
        timers.append([m.auto_rerun.fragment_id for m in self.forward_msgs() if m.HasField("auto_rerun")])
        return tree

    lsr.LocalScriptRunner.run = run_reading_timers
    try:
        at = new_app({"tab": "Hardware", "params": "9", "gpus": "24"})
        page, ids = at._tree, timers[-1]
        assert ids and not any(c.value.startswith("Fastest fitting layout per point") for c in at.caption)
        drawn, reran = [], False
        for _ in range(1000):
            with fragment_reruns(ids):
                at._run(widget_state=page.get_widget_states())
            assert not at.exception, [e.message for e in at.exception]
            reran = any(c.value.startswith("page computed and drawn") for c in at.caption)
            if reran:
                break  # the whole page: the fragment found its views complete
            assert not at.number_input and not at.metric  # the views alone: no sidebar, no headline
            spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
            drawn.append({r["profile"] for r in spec["layer"][0]["data"]["values"]})
        assert reran and len(drawn) > 1 and all(a <= b for a, b in itertools.pairwise(drawn))
        assert at.number_input and at.metric and any(c.value.startswith("Fastest fitting layout per point") for c in at.caption)
        assert timers[-1] == [] and {"a100-80g", "h100-80g"} <= {p.split(" ")[0] for p in drawn[-1]}
    finally:
        lsr.LocalScriptRunner.run = run


def test_the_runs_tab_opens_on_the_view_the_warm_up_built(monkeypatch):
    """The page's background warm-up (after a process's first page) builds the Runs tab's default
    view: the default folder's runs predicted on their default profile. The tab's first open draws
    that view without predicting again, and it is the view the tab would have built."""
    from planner.app import page
    from planner.app import runs as app_runs

    monkeypatch.setattr(page, "_SETTLED", [True])  # no warm-up thread of the page's own in this test
    monkeypatch.setattr(app_runs, "_STARTED", [])  # (once per process: this test's own)
    app_runs.WARMED.clear()
    page.cached_runs.clear()
    page.cached_runs_view.clear()
    app_runs.warm_runs()
    [(folder, signature, profile)] = [k for k in app_runs.WARMED if len(k) == 3]
    assert folder == page.default_runs_folder() and signature == page.records_signature(folder)
    runs = app_runs.WARMED[folder, signature].runs
    assert runs and profile == app_runs.run_records.default_profile(runs, list(explore.profile_names()))
    built = []
    real = page.runs_view
    monkeypatch.setattr(page, "runs_view", lambda *a: built.append(a) or real(*a))
    at = new_app({"tab": "Runs"})
    assert not built and not app_runs.WARMED  # both taken from the warm-up, once
    fresh = real(runs, profile)
    shown = at.dataframe[1].value
    assert list(shown["predicted"]) == list(fresh.points_table.to_pandas()["predicted"])
    assert list(shown["measured"]) == list(fresh.points_table.to_pandas()["measured"])
