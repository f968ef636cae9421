"""The what-if explorer page: `planner app` serves it (or `streamlit run app.py` from a checkout).

Thin on purpose: the sidebar holds the inputs (planner.app.state: bounds, URL, the mapping of
declared names), the planner computes (planner.app.explore, cached per input), the page draws
(planner.app.charts).
The state lives in the URL query string, so a what-if can be shared by link.
"""

from __future__ import annotations

import functools
import gc
import json
import shlex
import time

import streamlit as st

from planner.app import explore
from planner.app import state as explore_state
from planner.app.runs import WARMED, RunsView, default_runs_folder, records_signature, runs_view
from planner.calibration import run_records
from planner.core.checks import BUBBLE_LIMIT
from planner.core.options import HF_MODEL_TYPES, HF_TEXT_CONFIG
from planner.core.report import roomier_note
from planner.evidence import calibration_line

TABS = ("Plan", "Layouts", "Hardware", "Runs", "Export")


@st.cache_resource(show_spinner=False, max_entries=512)
def cached_compute(values: dict) -> explore.View | explore.Problem:
    """explore.compute once per input, shared by sessions as it is (a View is frozen; st.cache_data
    would pickle it on the way in and unpickle it on every page run that reads it)."""
    return explore.compute(values)


# The Hardware tab's two views, every profile at one GPU count and every profile x 10 GPU counts,
# are computed a profile (or a count's layouts) at a time: a page run works on them until
# PAGE_BUDGET_S after it began and draws what is done; while they are not done, the tab's views
# rerun alone (a fragment) every POLL_S, each run working SLICE_S on them.
# A page run costs about 45 ms of CPU of its own (Streamlit drawing ~30 widgets, the charts; measured
# by benchmarks/app_speed.py): 25 ms of work on the views keeps it near 70 ms; a fragment run draws
# only the views, so its slice can be longer: a step is begun only where one as long as the longest
# so far still ends inside the slice (explore.InProgress.advance), so 40 ms of work keeps the
# fragment's worst run at 60-80 ms on the 2-core development machine (benchmarks/app_speed.py; with
# the last step as the guess, 30 ms slices reached 98-110 ms). A browser's timer asks for a
# fragment run every POLL_S whether or not one is under way (Streamlit queues one request, drops
# the rest): shorter than a fragment run, the first follows the page run at once and the others
# follow each other, and a click stops the run in hand after its step (advance_alone).
PAGE_BUDGET_S = 0.025
SLICE_S = 0.04
POLL_S = 0.02


@st.cache_resource(show_spinner=False, max_entries=8)  # as the sweep's: one not done at one of the sweep's
def comparison_in_progress(values: dict, gpus: int) -> explore.InProgress:  # counts holds the sweep's tables
    """One per input, shared by sessions (the same computation), kept as it advances."""
    return explore.comparison_in_progress(values, gpus)


@st.cache_resource(show_spinner=False, max_entries=8)  # one not done holds its layout tables (~60 MB at 70B)
def sweep_in_progress(values: dict) -> explore.InProgress:
    return explore.sweep_in_progress(values)


@st.cache_resource(show_spinner=False, max_entries=32)
def pictures_in_progress(values: dict, _best=None) -> explore.InProgress:  # _best: compute(values).best, not hashed
    """The Plan tab's two what-if pictures, computed like the Hardware tab's views: a step at a time."""
    return explore.pictures_in_progress(values, _best)


def init_state() -> None:
    """On a session's first run, the inputs come from the URL (bad values named, defaults used)."""
    if "_started" in st.session_state:
        return
    values, notes = explore_state.state_from_query(st.query_params.to_dict())
    for key, value in values.items():
        st.session_state[key] = value
    open_groups(values)
    st.session_state["_notes"] = notes  # shown once
    tab = st.query_params.get("tab", TABS[0])
    st.session_state["_first_tab"] = tab if tab in TABS else TABS[0]  # fixed for the session: it keys the tabs
    st.session_state["_started"] = True


def widget(f: explore_state.Field, where, disabled: bool = False) -> None:
    """One bounded widget per field; its value lives in st.session_state[f.name]."""
    common = {"key": f.name, "help": f.help or None, "disabled": disabled}
    if f.kind == "choice":
        where.selectbox(f.label, f.choices, **common)
    elif f.kind == "bool":
        where.checkbox(f.label, **common)
    elif f.kind == "text":  # checked where the plan is built: a bad entry is named on the page
        where.text_input(f.label, max_chars=2000, **common)
    # Numbers without min/max on the widget: a value out of range is named on the page
    # (explore_state.out_of_range) instead of being silently replaced by the previous one.
    elif f.kind == "int":
        where.number_input(f.label, step=int(f.step or 1), **common)
    else:
        extra = {"value": None, "placeholder": "profile's value"} if f.optional else {}
        where.number_input(f.label, step=float(f.step or 0.1), format="%g", **extra, **common)


def set_values(values: dict) -> None:
    """Set fields from a callback (a pin button); a closed group given a value other than its
    default opens, so what was set is shown."""
    fields = explore_state.field_map()
    for key, value in values.items():
        st.session_state[key] = value
        f = fields.get(key)
        if f is not None and f.group in GROUPS and value != f.default:
            st.session_state[GROUPS[f.group][0]] = True


def keep_hidden(drawn: set[str]) -> dict:
    """The values of the fields this run does not draw, kept under one session key ("_hidden"):
    Streamlit forgets a keyed widget's value after a run that does not draw it, and every key in
    the session state costs each widget drawn (its filtered_state). A field drawn again takes its
    kept value, unless a callback has just set one."""
    kept = st.session_state.setdefault("_hidden", {})
    for f in explore_state.fields():
        if f.name in drawn:
            if f.name in kept:
                value = kept.pop(f.name)
                if f.name not in st.session_state:
                    st.session_state[f.name] = value
        elif f.name in st.session_state:
            kept[f.name] = st.session_state[f.name]
            del st.session_state[f.name]
    return kept


# The sidebar's groups drawn only while open (their expanders rerun the page when toggled): a
# widget drawn costs every page run about 0.5 ms (benchmarks/app_speed.py). Their values are
# kept while closed (keep_hidden) and count as always. Session key and label per field group.
GROUPS = {"hardware_custom": ("_open_hardware", "Custom hardware (overrides the profile)"),
          "kernels": ("_open_kernels", "Kernels, overlap, overheads"),
          "finetune": ("_open_finetune", "Fine-tuning"),
          "operations": ("_open_operations", "Failures, checkpoints, data"),
          "layout_more": ("_open_layout_more", "More layout: cp, ep, SP, schedule, sharding, offload")}


def open_groups(values: dict) -> None:
    """A group opens on a session's first run when one of its fields is not at its default (a link
    that sets one shows it); later, as the user leaves it."""
    for group, (key, _) in GROUPS.items():
        st.session_state[key] = any(values[f.name] != f.default for f in explore_state.fields() if f.group == group)


def drawn_fields(source: str) -> set[str]:
    """The fields this run draws: a shape's when the model comes from a shape, an open group's
    (LoRA's only under LoRA), and the rest."""
    kept = st.session_state.get("_hidden", {})

    def value(name: str):  # drawn last run: in the session; else kept
        return st.session_state[name] if name in st.session_state else kept[name]

    lora = value("mode") == "lora"
    for group, (key, _) in GROUPS.items():  # a group holding a value out of range opens, to show the field named
        if explore_state.out_of_range({f.name: value(f.name) for f in explore_state.fields() if f.group == group}):
            st.session_state[key] = True
    out = set()
    for f in explore_state.fields():
        if f.group == "shape":
            shown = source == "shape"
        elif f.group in GROUPS:
            shown = st.session_state.get(GROUPS[f.group][0], False) and (
                f.group != "finetune" or f.name == "mode" or lora)
        else:
            shown = True
        if shown:
            out.add(f.name)
    return out


def sidebar() -> dict:
    fields = explore_state.field_map()
    sb = st.sidebar
    sb.header("Model")
    sb.radio(fields["model"].label, fields["model"].choices, key="model", horizontal=True,
             format_func={"params": "parameters", "preset": "preset", "shape": "shape", "hf": "HF config"}.get)
    source = st.session_state["model"]
    drawn = drawn_fields(source)
    kept = keep_hidden(drawn)
    widget(fields["params"], sb, disabled=source != "params")
    widget(fields["preset"], sb, disabled=source != "preset")
    upload = sb.file_uploader("Hugging Face config.json", type=["json"], key="hf_upload",
                              disabled=source != "hf", help="`--hf-config`: model_type " + ", ".join(HF_MODEL_TYPES)
                              + "; the text_config of " + ", ".join(HF_TEXT_CONFIG))
    if source == "shape":
        with sb.expander("Shape", expanded=True):
            for f in explore_state.fields():
                if f.group == "shape":
                    widget(f, st)
    widget(fields["seq_len"], sb)
    widget(fields["mtp_layers"], sb)

    def group(name: str) -> None:
        key, label = GROUPS[name]
        with sb.expander(label, key=key, on_change="rerun"):
            for f in explore_state.fields():
                if f.group == name and f.name in drawn:
                    widget(f, st)

    sb.header("Hardware")
    widget(fields["gpu"], sb)
    widget(fields["gpus"], sb)
    group("hardware_custom")
    sb.header("Job")
    for f in explore_state.fields():
        if f.group == "job":
            widget(f, sb)
    group("kernels")
    group("finetune")
    group("operations")
    sb.header("Layout")
    sb.caption("0 or auto: searched. dp follows from GPUs / (tp x pp).")
    for name in explore_state.LAYOUT_PINS:
        if fields[name].group == "layout":
            widget(fields[name], sb)
    group("layout_more")
    widget(fields["sort"], sb)
    sb.button("Search every field (unpin all)", on_click=set_values,
              args=({n: explore_state.defaults()[n] for n in explore_state.LAYOUT_PINS},))
    values = {f.name: kept[f.name] if f.name in kept else st.session_state[f.name] for f in explore_state.fields()}
    if source == "hf" and upload is not None:
        values["hf_config"] = upload.getvalue()
    return values


def show_problem(problem: explore.Problem) -> None:
    st.error(f"No plan: {problem.message}")
    for s in problem.suggestions:
        st.markdown(f"**{s.field} = {s.value}** fails with the other pins kept; nearest valid: "
                    + ", ".join(f"`{v}`" for v in s.valid))
        for col, v in zip(st.columns(max(1, len(s.valid))), s.valid):
            col.button(f"use {s.field} = {v}", key=f"fix-{s.field}-{v}", on_click=set_values,
                       args=(dict([explore_state.pin_value(s.field, v)]),))
    if not problem.suggestions:
        st.caption("Change the field the message names (bounds are in the sidebar), or unpin the layout.")


def show_fit_and_evaluation(view: explore.View) -> None:
    """The fit verdict with its band, the stack keys set for this plan, the evaluations' time, and
    the layouts above the plan's memory line that would be faster: the report's lines."""
    from planner.core.report import eval_lines, faster_lines, fit_lines
    from planner.stacks import overrides_text, software

    e = view.best
    st.caption("Memory " + "; ".join(x.strip() for x in fit_lines(e)).removeprefix("fit").strip())
    if e.job.stack_set:
        st.caption(f"Stack {software(e.job).stack.name}{overrides_text(software(e.job).stack)}")
    for line in eval_lines(e):
        st.caption("Evaluation: " + line.removeprefix("eval").strip())
    faster = faster_lines(e, view.faster, view.objective)
    if faster:
        st.info("  \n".join(x.strip() for x in faster if x.strip()))


def show_headline(view: explore.View, j: dict) -> None:
    st.markdown(f"**{view.best.model.describe()}**  \n{view.model_note}")
    st.markdown(f"**layout** {explore.layout_text(j['layout'])}")
    pinned = f"; pinned: {', '.join(view.pinned)}" if view.pinned else ""
    st.caption(f"best of {view.feasible} fitting layouts out of {view.evaluated} evaluated in "
               f"{view.search_seconds * 1e3:.1f} ms (ranked by {view.objective}){pinned}")
    calibrated = calibration_line(view.best.hardware)
    st.caption(f"checked against {view.best.evidence().line()}" + (f"; {calibrated}" if calibrated else ""))
    if j["stack"]["not_modelled"]:
        st.caption(f"{j['stack']['name']} does what the planner does not model: {j['stack']['not_modelled']}")
    if not view.best.fits:
        show_does_not_fit(view, j)
        return
    figures = explore.headline(j)
    for row in (figures[:4], figures[4:8], figures[8:12], figures[12:]):
        for col, fig in zip(st.columns(4), row):
            col.metric(fig.label, fig.value, help=fig.help or None)
    for w in view.best.warnings:
        if not w.startswith("does not fit"):
            st.warning(w)
    roomier = roomier_note(view.best, view.roomier, bool(view.pinned), view.objective)
    if roomier:
        st.info(roomier[0].upper() + roomier[1:])
    show_fit_and_evaluation(view)
    st.button("Pin this layout (then change one field)", on_click=set_values,
              args=(explore_state.pins_from_layout(j["layout"]),))


def show_scenarios(state: dict, j: dict) -> None:
    """Two scenarios side by side: keep this one as A, change inputs, see A next to the current B."""
    keep, clear = st.columns([1, 1])
    keep.button("Keep as scenario A (then change inputs to compare)", key="keep_a", on_click=lambda: st.session_state
                .update(_scenario_a={"query": explore_state.query_from_state(state), "json": j}))
    a = st.session_state.get("_scenario_a")
    if not a:
        return
    clear.button("Clear scenario A", key="clear_a", on_click=lambda: st.session_state.pop("_scenario_a", None))
    st.subheader("Scenario A vs B (now)")
    rows = explore.scenario_rows(a["json"], j)
    st.dataframe(rows, hide_index=True, width="stretch")
    changed = sorted(set(a["query"].items()) ^ set(explore_state.query_from_state(state).items()))
    st.caption("B differs from A in: " + (", ".join(sorted({k for k, _ in changed})) or "nothing yet"))


def show_does_not_fit(view: explore.View, j: dict) -> None:
    """The 'nothing fits' state: no step time or days for a layout that cannot run; what would fit."""
    from planner.core.plan import fit_hints
    from planner.units import fmt_days

    m = j["memory"]
    st.error(f"Does not fit: {m['total_bytes'] / 2**30:,.1f} GiB needed per GPU, {m['capacity_bytes'] / 2**30:.0f} "
             "GiB available. Step time and days are not shown for a layout that cannot run.")
    near = [n for n in (view.nearest_fit, *view.alternatives) if n is not None]
    if near:
        st.markdown("**Nearest layouts that fit** (fewest pinned fields changed, then fastest):")
        for i, n in enumerate(near):
            nj = n.to_json()
            changed = ", ".join(explore.changed_fields(j["layout"], nj["layout"])) or "same pins"
            left, right = st.columns([4, 1])
            left.info(f"{changed}: {explore.layout_text(nj['layout'])} "
                      f"({nj['memory']['total_bytes'] / 2**30:.1f} GiB, {fmt_days(nj['train']['days'])})")
            right.button("Pin it", key=f"pin-near-{i}", on_click=set_values,
                         args=(explore_state.pins_from_layout(nj["layout"]),))
    else:
        st.info(f"No layout fits on {j['cluster']['gpus']:,} x {j['cluster']['gpu']}, even with ZeRO-3 and full "
                "recompute. What would make it fit:\n" + "\n".join(f"- {h}" for h in fit_hints(view.best)))


@functools.lru_cache(maxsize=64)
def timeline(pp: int, vpp: int, micro_batches: int, schedule: str) -> tuple:
    """planner.decisions.pictures.timeline_rows, once per schedule shape (10 ms at pp 32)."""
    from planner.decisions.pictures import timeline_rows

    return tuple(timeline_rows(pp, vpp, micro_batches, schedule))


def plan_tab(j: dict, values: dict | None = None, best=None) -> None:
    from planner.app import charts

    left, right = st.columns(2)
    with left:
        st.subheader("Memory per GPU")
        capacity_gib = j["memory"]["capacity_bytes"] / 2**30
        st.vega_lite_chart(spec=charts.memory_bar(explore.memory_rows(j), capacity_gib), width="stretch")
        st.caption("Stacked by part; the dashed red line is the GPU's capacity. " +
                   ("One bar per pipeline stage: the first, the fullest and the last." if j["layout"]["pp"] > 1
                    else ""))
    with right:
        st.subheader("Step time")
        st.vega_lite_chart(spec=charts.step_bar(explore.time_rows(j)), width="stretch")
        st.caption(f"{j['time']['step_s']:.3g} s per step; exposed communication and bubble are the parts "
                   "not hidden behind compute.")
    lay = j["layout"]
    from planner.core.pipeline import schedule_name
    from planner.decisions.pictures import DUALPIPE_NOTE, drawn_micro_batches

    sched = schedule_name(lay["schedule"], lay["vpp"])
    st.subheader(f"Pipeline schedule ({sched}, pp {lay['pp']}, vpp {lay['vpp']}, m {lay['grad_accum']})")
    st.vega_lite_chart(spec=charts.pipeline_timeline(timeline(lay["pp"], lay["vpp"], lay["grad_accum"],
                                                              lay["schedule"])), width="stretch", key="timeline")
    drawn = drawn_micro_batches(lay["pp"], lay["grad_accum"], lay["schedule"])
    st.caption("One lane per pipeline rank; light: forward, dark: backward (twice as long), numbered by "
               "micro-batch; the gaps are the bubble." + (f" Drawn with the first {drawn} of {lay['grad_accum']} "
                                                          "micro-batches." if drawn < lay["grad_accum"] else "")
               + (f" {DUALPIPE_NOTE}" if lay["schedule"] == "dualpipev" else ""))
    if values is not None:
        progress = pictures_in_progress(values, best)
        draw_in_progress((progress,), picture_views, progress)
    st.subheader(f"Bubble vs micro-batches (pp {lay['pp']}, vpp {lay['vpp']})")
    if lay["pp"] == 1:
        st.caption("pp = 1: no pipeline, no bubble. Pin pp to see its curve.")
    else:
        rows = explore.bubble_rows(lay["pp"], lay["vpp"], lay["grad_accum"])
        st.vega_lite_chart(spec=charts.bubble_curve(rows, lay["grad_accum"], BUBBLE_LIMIT), width="stretch")
        st.caption(f"Ideal bubble share (p-1)/(v m + p-1) of the step. The plan runs m = {lay['grad_accum']} "
                   f"micro-batches per step (dotted line); dashed red: the {BUBBLE_LIMIT:.0%} warning threshold.")


def picture_views(progress: explore.InProgress, polling: bool = False) -> None:
    """The memory-vs-micro-batch and step-time-vs-GPUs pictures, as far as they are done; run as a
    fragment while they are not (each run advances them SLICE_S), and the page once more when they are."""
    from planner.app import charts

    if polling:
        advance_alone((progress,))
    if progress.error is not None:
        st.warning(f"The pictures could not be computed: {progress.error}")
    parts = dict(progress.items)
    left, right = st.columns(2)
    with left:
        st.subheader("Memory vs micro-batch")
        st.vega_lite_chart(spec=charts.memory_vs_micro_batch(parts.get("memory", [])), width="stretch")
        st.caption("Peak memory per GPU of this layout with each micro-batch size; ringed: the plan's; "
                   "red: the capacity." if "memory" in parts or progress.done else "Computing...")
    with right:
        st.subheader("Step time vs GPUs")
        st.vega_lite_chart(spec=charts.breakdown_vs_gpus(parts.get("time", [])), width="stretch")
        st.caption("The best layout's step parts at a quarter, half, the same, twice and four times the GPUs "
                   "(same global batch)." if "time" in parts or progress.done
                   else "Searching the best layout at each GPU count...")


def layouts_tab(view: explore.View) -> None:
    st.subheader(f"Top {len(view.layouts)} layouts (ranked by {view.objective})")
    st.caption("Click a row to pin its layout (then change one field); click a column header to sort.")
    number = st.column_config.NumberColumn
    layouts = [e.to_json()["layout"] for e in view.layouts]

    def pin_selected() -> None:  # a callback: widget values may be set here, before the widgets are drawn
        rows = st.session_state["layouts_table"].selection.rows
        if rows:
            set_values(explore_state.pins_from_layout(layouts[rows[0]]))

    st.dataframe(explore.layout_rows(view.layouts), hide_index=True, width="stretch", key="layouts_table",
                 on_select=pin_selected, selection_mode="single-row", column_config={
        "memory GiB": number(format="%.1f"), "step s": number(format="%.3g"), "MFU %": number(format="%.1f"),
        "bubble %": number(format="%.1f"), "comm %": number(format="%.1f"), "days": number(format="%.1f"),
        "cost $": number(format="compact")})


def hardware_tab(state: dict, j: dict) -> None:
    comparison = comparison_in_progress(explore_state.comparison_mapping(state), int(state["gpus"]))
    sweep = sweep_in_progress(explore_state.sweep_mapping(state))
    current = {"profile": state["gpu"], "GPUs": j["cluster"]["gpus"], "days": j["train"]["days"]}
    # the table first: it is one GPU count
    draw_in_progress((comparison, sweep), hardware_views, comparison, sweep, j["train"]["tokens"], state, current)


def draw_in_progress(views: tuple[explore.InProgress, ...], draw, *args) -> None:
    """Work on ``views`` (in turn) until PAGE_BUDGET_S after the page run began; then ``draw(*args)``
    them as they are: at once when they are done, else as a fragment rerun alone every POLL_S
    until they are (``draw`` calls ``advance_alone`` when polling)."""
    deadline = st.session_state.get("_run_started", time.perf_counter()) + PAGE_BUDGET_S
    for view in views:
        view.advance(deadline)
    if all(view.done for view in views):
        draw(*args)
    else:
        # What the fragment polls, for a run without a browser (AppTest) to work on as it would
        # (work_a_slice): a page run that reaches the views after its budget adds nothing to them.
        st.session_state["_polled"] = st.session_state.get("_polled", ()) + views
        st.fragment(draw, run_every=POLL_S)(*args, polling=True)


def work_a_slice(views: tuple[explore.InProgress, ...], between_steps=None) -> None:
    """What one run of the polling fragment computes: SLICE_S more work on ``views`` (a step begun
    runs to its end, so each slice adds at least one step to a view not done)."""
    deadline = time.perf_counter() + SLICE_S
    for view in views:
        view.advance(deadline, between_steps)


def advance_alone(views: tuple[explore.InProgress, ...]) -> None:
    """In a run of a fragment alone (not the page's): the whole page once more when ``views`` are
    done (drawn without polling), else SLICE_S more work on them."""
    if "_run_started" in st.session_state:
        return
    if all(view.done for view in views):
        st.rerun()
    # Between two steps, a message to the browser (an empty placeholder emptied again): Streamlit
    # checks for a newer request at each one, so a click while the fragment works stops it after
    # the step in hand (kept), not at the end of the slice.
    work_a_slice(views, st.empty().empty)


def hardware_views(comparison: explore.InProgress, sweep: explore.InProgress, tokens: float, state: dict,
                   current: dict, polling: bool = False) -> None:
    """The days-vs-GPUs chart and the comparison table, as far as they are done; run as a fragment
    while they are not (each run advances them SLICE_S), and the page once more when they are."""
    from planner.app import charts

    if polling:
        advance_alone((comparison, sweep))
    for view in (comparison, sweep):
        if view.error is not None:
            st.warning(f"Part of this tab could not be computed: {view.error}")
    st.subheader("Days to train vs GPUs")
    rows = explore.sweep_rows(sweep.items, tokens, state["precision"])
    st.vega_lite_chart(spec=charts.days_vs_gpus(rows, current), width="stretch")
    if sweep.done:
        st.caption("Fastest fitting layout per point, layout searched freely; missing points: nothing fits. "
                   "In colour: the plan's GPU and the fastest others; grey: the rest (hover for names). "
                   "A GPU without the chosen precision runs bf16 or fp16 (named in the legend). Ringed: the plan "
                   "shown.")
    else:
        st.caption(f"Searching every profile at {explore.SWEEP_GPUS[0]} to {explore.SWEEP_GPUS[-1]:,} GPUs: "
                   f"{sweep.profiles_done} of {sweep.total} profiles drawn so far...")
    st.subheader(f"Hardware comparison on {state['gpus']} GPUs")
    number = st.column_config.NumberColumn
    st.dataframe(explore.hardware_table(comparison.items), hide_index=True, width="stretch",
                 column_config={"days": number(format="%.1f"), "GPU-hours": number(format="compact"),
                                "cost $": number(format="compact"), "energy kWh": number(format="compact"),
                                "MFU %": number(format="%.1f"), "memory GiB": number(format="%.1f"),
                                "capacity GiB": number(format="%.0f")})
    st.caption("Each profile at its own indicative price per GPU-hour; layouts searched freely."
               + ("" if comparison.done else f" Comparing: {comparison.profiles_done} of {comparison.total} "
                                             "profiles so far..."))


@st.cache_resource(show_spinner=False, max_entries=16)
def cached_runs(folder: str, signature: tuple) -> run_records.Loaded:
    """run_records.load_folder, read again only when a record changes (``signature``)."""
    found = WARMED.pop((folder, signature), None)
    return found if found is not None else run_records.load_folder(folder)


def runs_tab(state: dict) -> None:
    from planner.app import live  # the live view: event files or steps.csv, beside the plan
    from planner.app.explore import profile_names

    folder = st.text_input("Runs folder", value=default_runs_folder(), max_chars=400, key="runs_dir",
                           help="where the reference trainer writes <run>/record.json and <run>/steps.csv "
                                "(runs/ once you have made runs; until then the committed CPU runs)")
    uploads = st.file_uploader("Or upload run records (record.json)", type=["json"], accept_multiple_files=True,
                               key="uploads")
    refused = run_records.runs_folder_problem(folder)  # only under the configured roots
    if refused:
        st.error(refused)
    signature = records_signature(folder) if not refused else ()
    found = cached_runs(folder, signature) if not refused else run_records.Loaded(runs=(), skipped=())
    uploaded = run_records.load_uploaded([(u.name, u.getvalue()) for u in uploads or []])
    runs = found.runs + uploaded.runs
    for line in found.skipped + uploaded.skipped:
        st.warning(f"skipped {line}")
    if not runs:
        st.info(f"No completed run records in {folder}/ yet. Make one (about a minute on 2 CPU cores): "
                "`planner run --layers 4 --hidden 64 --heads 4 --vocab 512 --seq-len 64 --steps 20` writes "
                "runs/<name>/record.json; the committed ones are in benchmarks/runs/cpu-2core; or upload some.")
    else:
        predicted_vs_measured(runs, folder, list(profile_names()), signature if not uploaded.runs else None)
    live.show(folder, refused)


@st.cache_resource(show_spinner=False, max_entries=32)
def cached_runs_view(folder: str, signature: tuple, profile: str | None, _runs: tuple) -> RunsView:
    """``runs_view`` once per folder state and profile (``_runs``, not hashed: the signature stands for them)."""
    view = WARMED.pop((folder, signature, profile), None)
    return view if view is not None else runs_view(_runs, profile)


def predicted_vs_measured(runs: tuple, folder: str, profiles: list[str], signature: tuple | None = None) -> None:
    """`planner validate` on the loaded runs: its table and its plot."""
    st.subheader("Predicted vs measured")
    choices = ["as recorded", *profiles]
    default = run_records.default_profile(runs, profiles)  # CPU runs: the calibrated CPU profile
    profile = st.session_state.get("runs_profile", default if default in choices else "as recorded")
    profile = None if profile == "as recorded" else profile
    view = (cached_runs_view(folder, signature, profile, runs) if signature is not None
            else runs_view(runs, profile))  # uploads: compared as they come
    st.dataframe(view.runs_table, hide_index=True, width="stretch")
    st.selectbox("Predict on profile", choices, key="runs_profile",
                 index=choices.index(default) if default in choices else 0,
                 help="'as recorded': the profile each run names, or the one whose GPU it ran on; "
                      f"CPU runs: the calibrated {run_records.CPU_PROFILE} (hardware_profiles/calibrated)")
    for line in view.compared.unpredicted:
        st.warning(f"no prediction for {line}")
    if view.points_table is not None:
        st.dataframe(view.points_table, hide_index=True, width="stretch",
                     column_config={"predicted": st.column_config.NumberColumn(format="%.4g"),
                                    "measured": st.column_config.NumberColumn(format="%.4g")})
        # a copy of the top level: Streamlit takes "datasets" out of the spec it is given
        st.vega_lite_chart(spec={**view.chart, "datasets": dict(view.chart["datasets"])}, width="content")
    st.caption("The same from the command line: `" + run_records.validate_command(folder, profile) + "`. "
               "Rates and sizes: relative error; bubble and communication shares: percentage points. "
               "CPU runs compare step time and tokens/s only (no MFU peak, RSS is not GPU memory). "
               "judged: false for the shares of a run with more processes than its host has cores (its "
               "trace books waits for a core as bubble or communication): shown, not in the summary.")


@st.cache_resource(show_spinner=False, max_entries=64)
def cached_export(values: dict, fmt: str, steps: int):
    """explore.export_plan once per input, format and step count (a search on the format's stack
    and the rendering: 30-60 ms); the refusal (a PlannerError) is kept as the value."""
    from planner.errors import PlannerError
    from planner.export.render import ExportOptions

    try:
        return explore.export_plan(values, fmt, ExportOptions(steps=steps or None))
    except PlannerError as exc:
        return exc


def export_tab(state: dict, view: explore.View) -> None:
    from planner.errors import PlannerError
    from planner.export import render as export
    from planner.export.formats import FORMATS, get_format

    argv = explore_state.argv_from_state(state)
    st.subheader("This plan from the command line")
    st.code(explore_state.estimate_command(state), language="bash", wrap_lines=True)
    st.subheader("Launch it")
    fmt = st.selectbox("Format", FORMATS, key="export_format",
                       help="the reference trainer under torchrun, Megatron-LM, DeepSpeed, Slurm, Kubernetes")
    total = export.train_steps(view.best, export.ExportOptions())
    steps = st.number_input(f"Steps (0: the whole job, {total:,})", min_value=0, max_value=100_000_000, value=0,
                            key="export_steps", help="a few hundred steps profile the layout; the record the "
                                                     "reference trainer writes shows up in the Runs tab")
    opts = export.ExportOptions(steps=int(steps) or None)
    st.code(shlex.join(["planner", "export", "--format", fmt, *argv, *(["--steps", str(steps)] if steps else [])]),
            language="bash", wrap_lines=True)
    out = cached_export(explore_state.mapping_from_state(state), fmt, int(steps))
    if isinstance(out, PlannerError):
        st.warning(f"No {fmt} export: {out}")
    else:
        st.caption(f"Planned for the {out.stack} stack, the one {fmt} runs" + (f"; {out.note}" if out.note else ""))
        if fmt == "torchrun":
            st.caption("or through the planner's launcher:")
            st.code(export.planner_run_line(out.chosen, export.train_steps(out.chosen, opts)), language="bash",
                    wrap_lines=True)
        st.code(out.text, language=get_format(fmt).language)
    st.subheader("JSON (`planner estimate --format json`)")
    text = json.dumps(view.to_json(), indent=2)
    st.download_button("Download JSON", text, file_name="plan.json", mime="application/json")
    st.json(text, expanded=False)


def main() -> None:
    st.set_page_config(page_title="planner: what-if explorer", layout="wide")
    start = time.perf_counter()
    st.session_state["_run_started"] = start  # a page run (fragments run without it)
    st.session_state["_polled"] = ()  # the views this run leaves to the fragment (draw_in_progress)
    try:
        page()
    finally:
        del st.session_state["_run_started"]
        st.session_state["_run_ms"] = (time.perf_counter() - start) * 1e3
        st.caption(f"page computed and drawn in {st.session_state['_run_ms']:.0f} ms")
        _settle_heap()


_SETTLED: list[bool] = []  # set by the process's first page run


def _settle_heap() -> None:
    """After the process's first page run, move what it has built (Streamlit, pandas, the
    profiles: long-lived) out of the garbage collector's reach (gc.freeze), so that a full
    collection during a later interaction scans only what that interaction made: unfrozen, one
    took 13-61 ms, and an interaction 130 ms instead of 45 (benchmarks/app_speed.py). Once per
    process, told by a flag: gc.get_freeze_count() walks every frozen object (several ms a call)."""
    if not _SETTLED:
        _SETTLED.append(True)
        gc.collect()
        gc.freeze()
        _warm_up()


def _warm_up() -> None:
    """Once per process, after its first page is drawn: import in a background thread what the
    other tabs need the first time they open and build the Runs tab's default view
    (planner.app.serve.warm_up: pandas for the first table, the Runs tab's modules, the profile
    names, planner.app.runs.warm_runs), so the visitor's first click on a tab does not pay for it;
    then freeze what that built, as ``_settle_heap`` does for the first page. Under `planner app`
    the server did the same at its start (planner.app.serve): what is left is little."""
    import threading

    from planner.app.serve import warm_up

    def work() -> None:
        warm_up()
        gc.collect()
        gc.freeze()

    threading.Thread(target=work, name="planner-warm-up", daemon=True).start()


def send_values_with_the_widgets() -> None:
    """Every input's value goes to the browser with its widget on every page run (set again before
    the widgets are drawn: Streamlit then sends the value along). Left to the browser, a widget
    whose state it dropped (seen in a real browser while the Plan tab's pictures filled in:
    tests/app/test_browser.py) is drawn at the widget's own default (0, the first choice,
    unchecked), and the browser sends that back on the next run in place of the session's value:
    GPUs 0, the first GPU profile, overlap off, after one click on a sidebar group."""
    for f in explore_state.fields():
        if f.name in st.session_state:
            st.session_state[f.name] = st.session_state[f.name]


def page() -> None:
    init_state()
    send_values_with_the_widgets()
    state = sidebar()
    st.title("How to train this model on these GPUs")
    for note in st.session_state.pop("_notes", []):
        st.info(note)
    query = explore_state.query_from_state(state)
    bad = explore_state.out_of_range(state)
    if bad:
        st.query_params.from_dict(query)
        for line in bad:
            st.error(f"Out of range: {line}")
        st.caption("No plan until every field is in range (the sidebar's help names each field's bounds).")
        return
    if state["model"] == "hf" and "hf_config" not in state:
        st.info("Upload a Hugging Face config.json in the sidebar (Model from: HF config).")
        return
    result = cached_compute(explore_state.mapping_from_state(state))
    if isinstance(result, explore.Problem):
        st.query_params.from_dict(query)
        show_problem(result)
        return
    view, j = result, result.to_json()
    show_headline(view, j)
    show_scenarios(state, j)
    tabs = st.tabs(TABS, key="_tabs", on_change="rerun", default=st.session_state["_first_tab"])
    current = next((name for name, t in zip(TABS, tabs) if t.open), TABS[0])
    st.query_params.from_dict({**query, **({"tab": current} if current != TABS[0] else {})})
    draw = {"Plan": lambda: plan_tab(j, explore_state.mapping_from_state(state), view.best),
            "Layouts": lambda: layouts_tab(view),
            "Hardware": lambda: hardware_tab(state, j), "Runs": lambda: runs_tab(state),
            "Export": lambda: export_tab(state, view)}
    for name, tab in zip(TABS, tabs):
        if tab.open:
            with tab:
                draw[name]()


if __name__ == "__main__":  # `streamlit run planner/app/page.py`: the imported module's main, whose state
    from planner.app.page import main as _main  # lives between page runs (planner/app/served.py says why)

    _main()
