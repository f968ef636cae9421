"""What the explorer says matches the CLI and the docs (issue 37 item 7): every layout dimension in
the headline (ep for MoE), the Layouts tab's count, the Runs tab predicting CPU runs on the
calibrated CPU profile, a hardware chart whose colours can be told apart."""

import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from planner.app import charts
from tests.app.test_app import APP, cli, new_app

DOCS = Path(__file__).resolve().parents[2] / "docs"


def cli_layout_line(*argv: str) -> str:
    code, out, _ = cli(["estimate", *argv])
    assert code == 0
    return next(line for line in out.splitlines() if line.startswith("layout "))


def test_the_moe_headline_names_expert_parallel_as_the_cli_does():
    line = cli_layout_line("--preset", "mixtral-8x7b", "--gpus", "64", "--ep", "8")
    assert "(ep 8 of dp*cp)" in line and "x cp 4" in line  # what the CLI says (the complaint)
    at = new_app({"preset": "mixtral-8x7b", "model": "preset", "gpus": "64", "ep": "8"})
    [headline] = [m.value for m in at.markdown if m.value.startswith("**layout**")]
    assert "(ep 8 of dp*cp)" in headline and "x cp 4" in headline and "dp 8 x tp 2 x pp 1" in headline


def test_the_headline_names_offload_and_the_schedule():
    from planner.app.explore import layout_text

    lay = {"dp": 2, "tp": 1, "pp": 4, "vpp": 1, "cp": 1, "ep": 1, "micro_batch": 1, "grad_accum": 8,
           "global_batch": 16, "zero_stage": 3, "recompute": "full", "sequence_parallel": False,
           "schedule": "gpipe", "sharding": "hybrid", "offload": "optimizer"}
    text = layout_text(lay)
    assert "pp 4 GPipe" in text and "| HSDP" in text and "offload optimizer" in text


def test_the_layouts_tab_shows_the_twenty_the_docs_promise():
    assert "the 20 best layouts" in (DOCS / "app.md").read_text()
    at = new_app({"tab": "Layouts"})
    assert [h.value for h in at.subheader if h.value.startswith("Top ")][0].startswith("Top 20 layouts")
    assert len(at.dataframe[0].value) == 20


def test_the_runs_tab_predicts_cpu_runs_that_name_no_profile_on_the_calibrated_cpu_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_RUNS_ROOTS", str(tmp_path))
    runs = tmp_path / "runs"
    shutil.copytree(Path(__file__).resolve().parent / "data" / "runs", runs)
    record = runs / "tiny-cpu" / "record.json"
    rec = json.loads(record.read_text())
    rec["config"]["profile"]["hardware_profile"] = None  # as a README `planner run` on a CPU writes it
    record.write_text(json.dumps(rec))
    at = new_app({"tab": "Runs"})
    at.text_input(key="runs_dir").set_value(str(runs)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.selectbox(key="runs_profile").value == "cpu-2core"
    assert not [w.value for w in at.warning if w.value.startswith("no prediction")]
    points = at.dataframe[1].value
    assert set(points["run"]) == {"tiny-cpu"} and "step_s" in set(points["quantity"])
    assert any("planner validate" in c.value and "--gpu cpu-2core" in c.value for c in at.caption)


def test_the_hardware_chart_colours_a_few_and_greys_the_rest():
    profiles = [f"gpu{i:02d}" for i in range(19)]
    rows = [{"profile": p, "GPUs": n, "days": (i + 1) * 1000 / n} for i, p in enumerate(profiles) for n in (8, 64)]
    spec = charts.days_vs_gpus(rows, {"profile": "gpu12", "GPUs": 64, "days": 13000 / 64})
    grey, coloured, labels, ring = spec["layer"]
    assert {r["profile"] for r in grey["data"]["values"]} == set(profiles)  # every profile drawn
    assert "color" not in grey["encoding"] and grey["mark"]["color"] == grey["mark"]["point"]["color"] == "#c7c7c7"
    domain = coloured["encoding"]["color"]["scale"]["domain"]
    # the plan's GPU first, then the fastest (fewest days): gpu00, gpu01, ... by construction
    assert domain == ["gpu12", "gpu00", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert len(set(coloured["encoding"]["color"]["scale"]["range"])) == len(domain)
    assert [(r["label"], r["GPUs"]) for r in labels["data"]["values"]] == [("gpu12 (this plan)", 8)]  # its left end
    legend = coloured["encoding"]["color"]["legend"]
    assert legend["orient"] == "bottom" and legend["labelLimit"] == 0  # under the chart, names not cut
    x, y = coloured["encoding"]["x"], coloured["encoding"]["y"]
    assert "log" in x["title"] and "log" in y["title"] and x["scale"]["type"] == y["scale"]["type"] == "log"


def test_a_gpu_dependent_default_follows_the_gpu_in_the_page():
    """The page on a V100 with precision left at bf16 shows the CLI's plan without --precision (fp16,
    standard attention): one answer for one question (tests/test_one_path.py)."""
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update({"gpu": "v100-32g"})
    at.run()
    assert not at.exception
    assert any("fp16 (the v100-32g has no bf16" in m.value and "standard attention" in m.value for m in at.markdown)


def test_the_validation_chart_puts_each_run_against_y_equals_x():
    from planner.calibration.validate import Point

    points = [Point(run="a", quantity="step_s", predicted=1.2, measured=1.0, error=0.2),
              Point(run="b", quantity="step_s", predicted=2.0, measured=2.5, error=-0.2),
              Point(run="a", quantity="bubble", predicted=0.1, measured=0.3, error=-0.2, judged=False)]
    spec = charts.predicted_vs_measured(points)
    runs = [r for r in spec["data"]["values"] if r["kind"] == "run"]
    assert [(r["run"], r["measured"], r["predicted"], r["judged"]) for r in runs] == [
        ("a", 1.0, 1.2, "judged"), ("b", 2.5, 2.0, "judged"), ("a", 0.3, 0.1, "time-shared, not judged")]
    ref = {(r["quantity"], r["measured"]): (r["low"], r["high"]) for r in spec["data"]["values"] if r["kind"] == "ref"}
    # y = x from each panel's smallest to its largest value, the band +/-10% about it
    want = {("step_s", 1.0): (0.9, 1.1), ("step_s", 2.5): (2.25, 2.75), ("bubble", 0.1): (0.09, 0.11),
            ("bubble", 0.3): (0.27, 0.33)}
    assert ref.keys() == want.keys() and all(ref[k] == pytest.approx(want[k]) for k in want)


def test_rarely_changed_fields_wait_in_groups_and_a_pin_button_opens_theirs():
    from planner.app.state import SIDEBAR_GROUPS

    at = new_app()
    drawn = {w.key for w in (*at.sidebar.selectbox, *at.sidebar.number_input, *at.sidebar.checkbox)}
    assert not drawn & set(SIDEBAR_GROUPS)  # closed: not drawn, each would cost every page run
    assert {"gpus", "gpu", "precision", "tp", "pp", "micro_batch", "zero_stage", "recompute"} <= drawn
    next(b for b in at.button if b.label.startswith("Pin this layout")).click().run()
    assert at.selectbox(key="schedule").value == "1f1b" and at.selectbox(key="offload").value == "none"
    assert at.number_input(key="ep").value == 1  # the group holding them opened to show what was pinned
