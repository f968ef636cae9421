"""The explorer's live view: a run in progress, measured figures beside the plan.

What it reads: a run folder's TensorBoard event files, else its steps.csv, as the run writes
them (planner.calibration.run_series: no tensorboard or torch needed).

Beside each measured figure: the planner's prediction for the run's model, layout and hardware
profile (``<run>/config.yaml``, written by ``planner run`` before the run starts, or the finished
record's ``config``), evaluated by planner.core.evaluate on the profile the run names or one
chosen on the page; failing that, the event file's own ``.../predicted`` tags (what the trainer
computed at start). Measured step parts go through planner.core.step_parts.measured_parts, the
definition ``planner validate`` uses, so drift here is the drift validate would report.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from planner.calibration.run_series import Series, live_runs, read_run
from planner.core.step_parts import measured_parts

CONFIG_FILE = "config.yaml"
RECORD_FILE = "record.json"
RECENT_STEPS = 10  # the drift table compares the mean of the last this-many points with the plan


# --- the plan for the same run -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    source: str  # in words: which profile, or the trainer's own prediction
    figures: dict[str, float]  # a Panel's ``planned`` key -> value
    tp: int | None = None  # the run's layout, for splitting exposed communication as validate does
    dp: int | None = None


def run_config(run: str | Path) -> dict | None:
    """The run's config: config.yaml (written before the run starts), or the record's copy."""
    import yaml

    run = Path(run)
    try:
        if (run / CONFIG_FILE).is_file():
            data = yaml.safe_load((run / CONFIG_FILE).read_text())
        elif (run / RECORD_FILE).is_file():
            data = json.loads((run / RECORD_FILE).read_text()).get("config")
        else:
            return None
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) and {"model", "layout"} <= set(data) else None


def plan_for(config: Mapping, profile: str | None = None, run: Path | None = None) -> Plan | str:
    """The planner's prediction for a run config on ``profile`` (default: the one the run names,
    a file only from the project's profile folders or the run's own: measured.profile_reference);
    a one-line reason instead when there is none."""
    from planner.calibration.measured import LAYOUT_KEYS, MODEL_KEYS, profile_reference
    from planner.core.evaluate import evaluate
    from planner.core.layout import Candidates, Job, Layout
    from planner.core.model import ModelSpec
    from planner.core.step_parts import predicted_parts
    from planner.errors import PlannerError
    from planner.hardware import get_profile

    name = profile or (config.get("profile") or {}).get("hardware_profile")
    if not name:
        return "the run names no hardware profile: choose one to see the plan"
    model, lay, training = config["model"], config["layout"], config.get("training") or {}
    lora = config.get("lora") or {}
    try:
        spec = ModelSpec(**{k: model[k] for k in MODEL_KEYS if k in model})
        layout = Layout(**{k: lay[k] for k in LAYOUT_KEYS if k in lay})
        mode = training.get("mode", "pretrain")
        adapters = {f"lora_{k}": tuple(lora[k]) if k == "targets" else lora[k]
                    for k in ("r", "alpha", "targets") if k in lora} if mode == "lora" else {}
        job = Job(precision=training.get("precision", "bf16"), attention=model.get("attention", "flash"),
                  global_batch=layout.global_batch, mode=mode, stack="reference", **adapters)
        hw = get_profile(str(profile) if profile else profile_reference(name, (run or Path.cwd()) / "config.yaml"))
        ev = evaluate(spec, hw, job, Candidates.from_layouts([layout]), layout.gpus)
    except (PlannerError, ValueError, KeyError, TypeError) as exc:
        return f"no plan for this run: {exc}"
    parts = predicted_parts(ev.time, 0, hw.efficiency.step_overhead_s)
    figures = {"step_s": float(ev.step_s[0]), "tokens_per_s": float(ev.tokens_per_s[0]),
               "compute": parts["compute"], "tp_comm": parts["tp_comm"], "dp_comm": parts["dp_comm"],
               "bubble": parts["bubble"] + parts["pp_comm"], "optimizer": parts["optimizer"], "data_wait": 0.0,
               "memory_bytes": float(ev.memory.total[0]), "power_w": float(ev.power_watts)}
    return Plan(source=f"the planner on {name} (reference stack)", figures=figures, tp=layout.tp, dp=layout.dp)


# The trainer's ``.../predicted`` tags (reference_trainer/profiler.py Board) -> a Panel's key.
PREDICTED_TAGS = {"step_time_s/predicted": "step_s", "breakdown_s/compute_predicted": "compute",
                  "breakdown_s/tp_comm_predicted": "tp_comm", "breakdown_s/dp_comm_predicted": "dp_comm",
                  "breakdown_s/bubble_predicted": "bubble", "breakdown_s/pp_comm_predicted": "bubble",
                  "timers_s/optimizer_predicted": "optimizer"}


def plan_from_tags(series: Series) -> Plan | None:
    """What the trainer predicted at start, written beside its measurements (bubble + pipeline
    transfers summed, as the record books them)."""
    figures: dict[str, float] = {}
    for tag, key in PREDICTED_TAGS.items():
        if series.get(tag):
            figures[key] = figures.get(key, 0.0) + series[tag][-1][1]
    return Plan(source="the trainer's prediction at start (event file)", figures=figures) if figures else None


# --- panels: one measured figure each, with its plan ------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Panel:
    key: str  # also the Plan.figures key of its prediction, when the planner predicts it
    title: str
    scale: float = 1.0  # stored unit -> shown unit


PANELS: tuple[Panel, ...] = (
    Panel(key="loss", title="loss"), Panel(key="lr", title="learning rate"),
    Panel(key="grad_norm", title="gradient norm"), Panel(key="step_s", title="step time (s)"),
    Panel(key="tokens_per_s", title="tokens/s"), Panel(key="compute", title="compute (s, traced steps)"),
    Panel(key="tp_comm", title="exposed TP communication (s)"),
    Panel(key="dp_comm", title="exposed DP communication (s)"),
    Panel(key="bubble", title="bubble + pipeline transfers (s)"), Panel(key="optimizer", title="optimizer (s)"),
    Panel(key="data_wait", title="data wait (s)"), Panel(key="gpu_util", title="GPU utilisation (%)"),
    Panel(key="memory_bytes", title="GPU memory used (GiB)", scale=2.0**-30), Panel(key="power_w", title="GPU power (W)"),
)
DIRECT_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
               "step_s": "step_time_s/measured", "tokens_per_s": "throughput/tokens_per_s",
               "bubble": "breakdown_s/bubble", "optimizer": "timers_s/optimizer", "data_wait": "timers_s/data_wait",
               "gpu_util": "gpu/util_percent", "memory_bytes": "gpu/memory_used_bytes", "power_w": "gpu/power_w"}


def measured_series(series: Series, plan: Plan | None) -> dict[str, list[tuple[int, float]]]:
    """Panel key -> [(step, measured value)]. Compute and exposed TP / DP communication come from
    the traced steps' breakdown through step_parts.measured_parts (the layout's split, as validate
    makes it); without the layout, TP is the functional-collective waits and DP the rest."""
    out = {key: list(series[tag]) for key, tag in DIRECT_TAGS.items() if series.get(tag)}
    at = {tag: dict(series.get(tag, [])) for tag in ("breakdown_s/compute", "breakdown_s/comm_exposed",
                                                    "breakdown_s/comm_exposed_tp", "breakdown_s/bubble")}
    kind = "cuda" if series.get("gpu/util_percent") or series.get("gpu/power_w") else "cpu"
    for step in sorted(at["breakdown_s/comm_exposed"]):
        exposed, tp_waits = at["breakdown_s/comm_exposed"][step], at["breakdown_s/comm_exposed_tp"].get(step, 0.0)
        if plan is not None and plan.tp is not None and plan.dp is not None:
            parts = measured_parts({"comm_exposed": exposed, "comm_exposed_tp": tp_waits,
                                    "compute": at["breakdown_s/compute"].get(step),
                                    "bubble": at["breakdown_s/bubble"].get(step)}, plan.tp, plan.dp, kind)
        else:
            parts = {"compute": at["breakdown_s/compute"].get(step), "tp_comm": min(tp_waits, exposed),
                     "dp_comm": exposed - min(tp_waits, exposed)}
        for key in ("compute", "tp_comm", "dp_comm"):
            if parts.get(key) is not None:
                out.setdefault(key, []).append((step, float(parts[key])))
    return out


def chart_rows(measured: Mapping[str, list[tuple[int, float]]], plan: Plan | None) -> list[dict]:
    """Long form for the small charts: (quantity, step, value, series) with the plan drawn as a
    flat line over the steps measured so far."""
    rows = []
    for panel in PANELS:
        points = [(s, v) for s, v in measured.get(panel.key, []) if math.isfinite(v)]
        if not points:
            continue
        rows += [{"quantity": panel.title, "step": s, "value": v * panel.scale, "series": "measured"} for s, v in points]
        planned = plan.figures.get(panel.key) if plan else None
        if planned is not None and math.isfinite(planned):
            first, last = points[0][0], max(points[-1][0], points[0][0] + 1)
            rows += [{"quantity": panel.title, "step": s, "value": planned * panel.scale, "series": "plan"}
                     for s in (first, last)]
    return rows


def drift_rows(measured: Mapping[str, list[tuple[int, float]]], plan: Plan | None) -> list[dict]:
    """One row per predicted figure: the mean of its last RECENT_STEPS measured points, the plan,
    and the drift (measured / plan - 1; None when the plan is zero)."""
    rows = []
    for panel in PANELS:
        planned = plan.figures.get(panel.key) if plan else None
        points = [v for _, v in measured.get(panel.key, []) if math.isfinite(v)][-RECENT_STEPS:]
        if planned is None or not points:
            continue
        mean = sum(points) / len(points)
        rows.append({"figure": panel.title, "measured": mean * panel.scale, "plan": planned * panel.scale,
                     "drift %": (mean / planned - 1) * 100 if planned > 0 else None, "points": len(points)})
    return rows


def chart_spec(rows: list[dict]) -> dict:
    """One small line chart per quantity (independent y scales): measured solid, plan dashed."""
    return {
        "data": {"values": rows},
        "facet": {"field": "quantity", "type": "nominal", "title": None, "sort": [p.title for p in PANELS]},
        "columns": 3,
        "spec": {"width": 260, "height": 140, "mark": {"type": "line", "point": False},
                 "encoding": {"x": {"field": "step", "type": "quantitative"},
                              "y": {"field": "value", "type": "quantitative", "title": None, "scale": {"zero": False}},
                              "color": {"field": "series", "type": "nominal", "title": None,
                                        "scale": {"domain": ["measured", "plan"], "range": ["#4c78a8", "#e45756"]}},
                              "strokeDash": {"field": "series", "type": "nominal", "legend": None,
                                             "scale": {"domain": ["measured", "plan"], "range": [[1, 0], [6, 4]]}},
                              "tooltip": [{"field": "series"}, {"field": "step", "type": "quantitative"},
                                          {"field": "value", "type": "quantitative", "format": ".4g"}]}},
        "resolve": {"scale": {"y": "independent"}},
    }


def last_step(measured: Mapping[str, list[tuple[int, float]]]) -> int:
    return max((points[-1][0] for points in measured.values() if points), default=0)


# --- the page ----------------------------------------------------------------------------------
AS_NAMED = "as the run names"


def current_plan(run: Path, profile: str | None, series: Series) -> tuple[Plan | None, str]:
    """The plan to draw and a line saying where it comes from (or why there is none)."""
    config = run_config(run)
    why = "no config.yaml or record.json in the run folder"
    if config is not None:
        plan = plan_for(config, profile, run)
        if isinstance(plan, Plan):
            return plan, f"plan: {plan.source}"
        why = plan
    tagged = plan_from_tags(series)
    if tagged is not None:
        return tagged, f"plan: {tagged.source} ({why})"
    return None, f"no plan shown: {why}"


def show(folder: str, refused: str | None = None) -> None:
    """The live view under the Runs tab: pick a run, see each figure over the steps beside the
    plan, refreshed every 2 s when asked (a Streamlit fragment: only this part reruns)."""
    import streamlit as st

    from planner.app.explore import profile_names  # once per process

    st.subheader("Live view")
    runs = live_runs(folder) if not refused else []
    if not runs:
        st.caption(f"No run folder in {folder}/ with TensorBoard events or a steps.csv yet.")
        return
    left, middle = st.columns(2)
    run = left.selectbox("Run", runs, key="live_run", help="newest first")
    choice = middle.selectbox("Plan on profile", [AS_NAMED, *profile_names()], key="live_profile",
                              help="the hardware profile the plan is evaluated on (a calibrated one after "
                                   "`planner calibrate`)")
    refresh = st.toggle("Refresh every 2 s", value=False, key="live_refresh")
    path, profile = Path(folder) / run, None if choice == AS_NAMED else choice

    def draw() -> None:
        got = read_run(path)
        if got is None:
            st.caption(f"{path}: no steps yet")
            return
        plan, said = current_plan(path, profile, got.series)
        measured = measured_series(got.series, plan)
        rows = chart_rows(measured, plan)
        if not rows:
            st.caption(f"{got.source}: no complete step yet")
            return
        st.vega_lite_chart(spec=chart_spec(rows), width="stretch")
        drift = drift_rows(measured, plan)
        if drift:
            number = st.column_config.NumberColumn
            st.dataframe(drift, hide_index=True, width="stretch", column_config={
                "measured": number(format="%.4g"), "plan": number(format="%.4g"), "drift %": number(format="%+.1f")})
        st.caption(f"{got.source}: {last_step(measured)} steps")
        ago = f"; last event {time.time() - got.newest_wall_s:.0f} s ago" if got.newest_wall_s else ""
        st.caption(f"{said}. Dashed: the plan; drift: the mean of the last {RECENT_STEPS} points against it"
                   f"{ago}. The same files open in `tensorboard --logdir {folder}`.")

    st.fragment(draw, run_every=2.0 if refresh else None)()
