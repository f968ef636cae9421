"""The explorer's live view (planner.app.live; planner.calibration.run_series reads the files):
TensorBoard event files read without tensorboard, checked against files encoded here by hand from
the format's definition and against TensorBoard's own writer and reader; the plan beside each figure is `planner validate`'s; the
measured parts are split as validate splits them; and the Runs tab draws it (AppTest)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from planner.app import live
from planner.calibration import run_series

RUNS = Path(__file__).resolve().parent / "data" / "runs"
TINY = RUNS / "tiny-cpu"  # a committed CPU record: config names the a100-80g profile, dp1 tp1 pp1


# --- the wire format, written here from its definition (protobuf encoding; TFRecord framing) ----
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, wire: int, payload: bytes) -> bytes:
    key = varint(number << 3 | wire)
    return key + (varint(len(payload)) + payload if wire == 2 else payload)


def scalar_event(step: int, tag: str, value: float, wall: float = 1.7e9, tensor: bool = False) -> bytes:
    if tensor:  # the new-style scalar: a TensorProto with dtype DT_FLOAT (1) and float_val (5, packed)
        body = field(1, 2, tag.encode()) + field(8, 2, field(1, 0, varint(1)) + field(5, 2, struct.pack("<f", value)))
    else:  # Summary.Value.simple_value (2, a float)
        body = field(1, 2, tag.encode()) + field(2, 5, struct.pack("<f", value))
    return field(1, 1, struct.pack("<d", wall)) + field(2, 0, varint(step)) + field(5, 2, field(1, 2, body))


def framed(payload: bytes) -> bytes:
    """One TFRecord: length, its CRC, the payload, its CRC (CRCs zero: the reader does not check them)."""
    return struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4


def write_events(folder: Path, events: list[bytes], name: str = "events.out.tfevents.1.host.1.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    version = field(1, 1, struct.pack("<d", 1.7e9)) + field(3, 2, b"brain.Event:2")  # the file's first event
    path = folder / name
    path.write_bytes(b"".join(framed(e) for e in [version, *events]))
    return path


def test_hand_encoded_events_read_back_with_a_half_written_tail(tmp_path):
    events = [scalar_event(s, "train/loss", 6.0 - 0.5 * s) for s in (1, 2, 3)]
    events.append(scalar_event(3, "step_time_s/measured", 0.25, tensor=True))
    path = write_events(tmp_path, events)
    path.write_bytes(path.read_bytes() + framed(scalar_event(4, "train/loss", 4.0))[:-7])  # still being written
    series, newest = run_series.read_events(tmp_path)
    assert series == {"train/loss": [(1, 5.5), (2, 5.0), (3, 4.5)], "step_time_s/measured": [(3, 0.25)]}
    assert newest == 1.7e9


def test_a_resumed_run_keeps_the_later_value_of_a_step(tmp_path):
    write_events(tmp_path, [scalar_event(s, "train/loss", 5.0) for s in (1, 2)], name="events.out.tfevents.1.h")
    write_events(tmp_path, [scalar_event(s, "train/loss", 4.0) for s in (2, 3)], name="events.out.tfevents.2.h")
    assert run_series.read_events(tmp_path)[0]["train/loss"] == [(1, 5.0), (2, 4.0), (3, 4.0)]


def test_tensorboards_own_writer_and_reader_agree_with_the_live_view(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path))
    for step in range(1, 8):
        writer.add_event(Event(wall_time=1.7e9 + step, step=step, summary=Summary(value=[
            Summary.Value(tag="train/loss", simple_value=7.0 / step),
            Summary.Value(tag="gpu/power_w", simple_value=300.0 + step)])))
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    series, newest = run_series.read_events(tmp_path)
    for tag in ("train/loss", "gpu/power_w"):
        assert series[tag] == [(e.step, e.value) for e in acc.Scalars(tag)]
    assert newest == 1.7e9 + 7


def test_the_csv_fallback_and_the_runs_listed(tmp_path):
    run = tmp_path / "runs" / "csv-only"
    run.mkdir(parents=True)
    lines = (TINY / "steps.csv").read_text().splitlines()
    (run / "steps.csv").write_text("\n".join(lines[:4]) + "\n" + lines[4][:15])  # a line half written
    write_events(tmp_path / "runs" / "events-only" / "tensorboard", [scalar_event(1, "train/loss", 6.0)])
    assert sorted(run_series.live_runs(tmp_path / "runs")) == ["csv-only", "events-only"]
    got = run_series.read_run(run)
    header = lines[0].split(",")
    third = dict(zip(header, lines[3].split(",")))
    assert got.source.endswith("steps.csv") and [s for s, _ in got.series["train/loss"]] == [1, 2, 3]
    assert got.series["train/lr"][-1] == (3, float(third["lr"]))
    assert got.series["timers_s/optimizer"][-1] == (3, float(third["optimizer_s"]))


def test_the_plan_is_what_planner_validate_predicts_for_the_run():
    from planner.calibration import run_records

    plan = live.plan_for(live.run_config(TINY))
    compared = run_records.compare(run_records.load_folder(TINY).runs, None)
    validate = {p.quantity: p.predicted for p in compared.points}
    assert plan.figures["step_s"] == pytest.approx(validate["step_s"], rel=1e-12)
    assert plan.figures["tokens_per_s"] == pytest.approx(validate["tokens_per_s"], rel=1e-12)
    assert (plan.tp, plan.dp) == (1, 1) and plan.figures["tp_comm"] == 0.0
    other = live.plan_for(live.run_config(TINY), "h100-80g")
    assert other.figures["step_s"] < plan.figures["step_s"]  # a faster GPU, chosen on the page
    nameless = {**live.run_config(TINY), "profile": {}}
    assert live.plan_for(nameless).startswith("the run names no hardware profile")


def test_exposed_communication_is_split_as_validate_splits_it():
    def traced(exposed: float, waits: float) -> dict:
        return {"breakdown_s/comm_exposed": [(5, exposed)], "breakdown_s/comm_exposed_tp": [(5, waits)],
                "breakdown_s/compute": [(5, 1.0)], "breakdown_s/bubble": [(5, 0.0)]}

    both = live.measured_series(traced(0.5, 0.125), live.Plan(source="", figures={}, tp=2, dp=2))
    assert both["tp_comm"] == [(5, 0.125)] and both["dp_comm"] == [(5, 0.375)]  # CPU: the waits are TP's
    tp_only = live.measured_series(traced(0.5, 0.125), live.Plan(source="", figures={}, tp=2, dp=1))
    assert tp_only["tp_comm"] == [(5, 0.5)] and tp_only["dp_comm"] == [(5, 0.0)]  # one kind: all of it
    gpu = {**traced(0.5, 0.125), "gpu/power_w": [(5, 300.0)]}
    assert "tp_comm" not in live.measured_series(gpu, live.Plan(source="", figures={}, tp=2, dp=2))  # NCCL: no split


def test_drift_is_the_recent_mean_against_the_plan():
    measured = {"step_s": [(s, 1.0) for s in range(1, 6)] + [(s, 0.5) for s in range(6, 16)],
                "tp_comm": [(3, 0.25)], "loss": [(1, 5.0)]}
    plan = live.Plan(source="", figures={"step_s": 0.4, "tp_comm": 0.0})
    rows = {r["figure"]: r for r in live.drift_rows(measured, plan)}
    assert set(rows) == {"step time (s)", "exposed TP communication (s)"}  # loss has no plan
    assert rows["step time (s)"]["measured"] == 0.5 and rows["step time (s)"]["points"] == 10
    assert rows["step time (s)"]["drift %"] == pytest.approx(25.0)
    assert rows["exposed TP communication (s)"]["drift %"] is None  # nothing planned: no ratio
    chart = live.chart_rows(measured, plan)
    assert [r["step"] for r in chart if r["series"] == "plan" and r["quantity"] == "step time (s)"] == [1, 15]


def test_the_trainers_predicted_tags_stand_in_without_a_config(tmp_path):
    events = [scalar_event(2, "step_time_s/measured", 0.5), scalar_event(2, "step_time_s/predicted", 0.25),
              scalar_event(2, "breakdown_s/bubble_predicted", 0.0625),
              scalar_event(2, "breakdown_s/pp_comm_predicted", 0.0625)]
    write_events(tmp_path / "run" / "tensorboard", events)
    got = run_series.read_run(tmp_path / "run")
    plan, said = live.current_plan(tmp_path / "run", None, got.series)
    assert plan.figures == {"step_s": 0.25, "bubble": 0.125} and "event file" in said


# --- the page ------------------------------------------------------------------------------------
def test_runs_tab_draws_a_live_run_beside_its_plan(tmp_path, monkeypatch):
    AppTest = pytest.importorskip("streamlit.testing.v1", reason="streamlit is not installed").AppTest
    monkeypatch.setenv("PLANNER_RUNS_ROOTS", str(tmp_path))
    run = tmp_path / "runs" / "live-run"
    run.mkdir(parents=True)
    config = json.loads((TINY / "record.json").read_text())["config"]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    events = [scalar_event(s, tag, v) for s in range(1, 13)
              for tag, v in (("train/loss", 6.0 - 0.25 * s), ("step_time_s/measured", 0.5), ("train/lr", 1e-4))]
    write_events(run / "tensorboard", events)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=60)
    at.query_params.update({"tab": "Runs"})
    at.run()
    at.text_input(key="runs_dir").set_value(str(tmp_path / "runs")).run()
    assert not at.exception, [e.message for e in at.exception]
    chart = next(c for c in at.get("vega_lite_chart") if json.loads(c.proto.spec).get("facet", {}).get("field")
                 == "quantity")
    pyarrow = pytest.importorskip("pyarrow")  # streamlit sends the chart's rows as an Arrow table
    rows = pyarrow.ipc.open_stream(chart.proto.data.data).read_all().to_pylist()
    shown = {(r["quantity"], r["series"]) for r in rows}
    assert {("loss", "measured"), ("learning rate", "measured"), ("step time (s)", "measured"),
            ("step time (s)", "plan")} <= shown
    table = at.dataframe[-1].value
    step = table[table["figure"] == "step time (s)"].iloc[0]
    planned = live.plan_for(config).figures["step_s"]
    assert step["plan"] == pytest.approx(planned) and step["drift %"] == pytest.approx((0.5 / planned - 1) * 100)
    assert any(c.value == f"{run / 'tensorboard'}: 12 steps" for c in at.caption)
    at.selectbox(key="live_profile").set_value("h100-80g").run()  # the plan on another profile
    table = at.dataframe[-1].value
    assert table[table["figure"] == "step time (s)"].iloc[0]["plan"] == pytest.approx(
        live.plan_for(config, "h100-80g").figures["step_s"])
