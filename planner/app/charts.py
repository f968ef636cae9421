"""The explorer's charts as Vega-Lite specs (plain dicts), drawn from the rows planner.app.explore computes.

Plain specs rather than Altair objects: building and validating an Altair chart costs 5-30 ms,
which is most of an interaction's budget; a dict costs nothing and tests can read it.
The page draws them with ``st.vega_lite_chart``. No fixed pixel heights: Streamlit sizes the
chart and a fixed top-level height collapses bar charts there; bars get a band step instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.decisions.pictures import TIME_COLOURS

PART_COLOURS = {"weights": "#4c78a8", "gradients": "#72b7b2", "optimizer": "#54a24b", "activations": "#f58518",
                "other": "#bab0ac"}
LEGEND_BOTTOM = {"orient": "bottom", "title": None, "columns": 4}


def _colour(field: str, colours: dict[str, str]) -> dict:
    return {"field": field, "type": "nominal", "scale": {"domain": list(colours), "range": list(colours.values())},
            "legend": LEGEND_BOTTOM}


def memory_bar(rows: Sequence[dict], capacity_gib: float) -> dict:
    """Memory per GPU stacked by part, one bar per pipeline stage, against the capacity line (red)."""
    order = {p: i for i, p in enumerate(PART_COLOURS)}
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    totals = {s: sum(r["GiB"] for r in rows if r["stage"] == s) for s in stages}
    x_scale = {"domain": [0, 1.05 * max(capacity_gib, *totals.values())]}  # the capacity line inside the plot
    return {
        "height": {"step": 30},
        "layer": [
            {"data": {"values": [{**r, "order": order[r["part"]]} for r in rows]}, "mark": "bar",
             "encoding": {"y": {"field": "stage", "type": "nominal", "title": None, "sort": stages},
                          "x": {"field": "GiB", "type": "quantitative", "title": "GiB per GPU", "stack": "zero",
                                "scale": x_scale},
                          "color": _colour("part", PART_COLOURS), "order": {"field": "order", "type": "quantitative"},
                          "tooltip": [{"field": "stage"}, {"field": "part"},
                                      {"field": "GiB", "type": "quantitative", "format": ".2f"}]}},
            {"data": {"values": [{"capacity": capacity_gib}]},
             "mark": {"type": "rule", "color": "red", "strokeDash": [4, 3], "size": 2},
             "encoding": {"x": {"field": "capacity", "type": "quantitative", "scale": x_scale},
                          "tooltip": [{"field": "capacity", "type": "quantitative", "title": "capacity GiB",
                                       "format": ".0f"}]}},
        ],
    }


def step_bar(rows: Sequence[dict]) -> dict:
    """The step time split into its parts (they add up to the step). One layer, so the data stays
    inline (Streamlit converts top-level data through pandas, a few ms)."""
    order = {p: i for i, p in enumerate(TIME_COLOURS)}
    return {
        "height": {"step": 40},
        "layer": [{
            "data": {"values": [{**r, "order": order[r["part"]], "step": "step"} for r in rows if r["seconds"] > 0]},
            "mark": "bar",
            "encoding": {"y": {"field": "step", "type": "nominal", "title": None, "axis": None},
                         "x": {"field": "seconds", "type": "quantitative", "title": "seconds per step",
                               "stack": "zero"},
                         "color": _colour("part", TIME_COLOURS), "order": {"field": "order", "type": "quantitative"},
                         "tooltip": [{"field": "part"}, {"field": "seconds", "type": "quantitative", "format": ".3g"},
                                     {"field": "share", "type": "quantitative", "format": ".1%"}]},
        }],
    }


def bubble_curve(rows: Sequence[dict], current_m: int, limit: float) -> dict:
    """Bubble share against micro-batches per step; the plan's m dotted, the warning threshold dashed red."""
    x = {"field": "micro-batches", "type": "quantitative", "scale": {"type": "log", "base": 2},
         "title": "micro-batches per step (m)"}
    return {
        "layer": [
            {"data": {"values": list(rows)}, "mark": {"type": "line", "point": True},
             "encoding": {"x": x, "y": {"field": "bubble", "type": "quantitative", "axis": {"format": "%"},
                                        "title": "bubble share of the step"},
                          "color": {"field": "schedule", "type": "nominal", "legend": LEGEND_BOTTOM},
                          "tooltip": [{"field": "schedule"}, {"field": "micro-batches", "type": "quantitative"},
                                      {"field": "bubble", "type": "quantitative", "format": ".1%"}]}},
            {"data": {"values": [{"micro-batches": current_m}]}, "mark": {"type": "rule", "strokeDash": [2, 2]},
             "encoding": {"x": {"field": "micro-batches", "type": "quantitative"}}},
            {"data": {"values": [{"limit": limit}]}, "mark": {"type": "rule", "color": "red", "strokeDash": [4, 3]},
             "encoding": {"y": {"field": "limit", "type": "quantitative"}}},
        ],
    }


# Profiles drawn in colour on the days-vs-GPUs chart (the rest grey, named on hover): more than
# about six hues cannot be told apart (Tableau 10's first six; Ware 2012, ch. 4: 5-10 nominal colours).
HIGHLIGHT_COLOURS = ("#4c78a8", "#f58518", "#e45756", "#54a24b", "#b279a2", "#9d755d")


def highlighted_profiles(rows: Sequence[dict], current: dict | None, count: int = len(HIGHLIGHT_COLOURS)) -> list[str]:
    """The profiles drawn in colour: the plan's own, then the fastest (fewest days at any count)."""
    best: dict[str, float] = {}
    for r in rows:
        best[r["profile"]] = min(r["days"], best.get(r["profile"], float("inf")))
    ranked = sorted(best, key=best.get)
    mine = [p for p in ranked if current and (p == current["profile"] or p.startswith(current["profile"] + " ("))]
    return (mine + [p for p in ranked if p not in mine])[:count]


def days_vs_gpus(rows: Sequence[dict], current: dict | None) -> dict:
    """Days to train against GPU count (log-log): every profile a thin grey line (named on hover),
    the plan's profile and the fastest few in colour, named in a legend under the chart (the plan's
    line also at its left end); the plan shown is ringed."""
    rows = list(rows)
    top = highlighted_profiles(rows, current)
    x = {"field": "GPUs", "type": "quantitative", "scale": {"type": "log", "base": 2},
         "axis": {"values": sorted({r["GPUs"] for r in rows}) or None}, "title": "GPUs (log scale)"}
    y = {"field": "days", "type": "quantitative", "scale": {"type": "log"}, "title": "days to train (log scale)"}
    tooltip = [{"field": "profile"}, {"field": "GPUs", "type": "quantitative"},
               {"field": "days", "type": "quantitative", "format": ".1f"}]
    colour = {"field": "profile", "type": "nominal", "sort": top,
              "scale": {"domain": top, "range": list(HIGHLIGHT_COLOURS[:len(top)])},
              "legend": {**LEGEND_BOTTOM, "columns": 3, "labelLimit": 0, "symbolStrokeWidth": 3}}
    shown = [r for r in rows if r["profile"] in top]
    # The plan's own line named where it starts (the fastest converge at the right: the legend names them).
    mine = [r for r in shown if current and r["profile"] == top[0] and r["GPUs"] == min(
        q["GPUs"] for q in shown if q["profile"] == top[0])]
    layers = [
        {"data": {"values": rows}, "mark": {"type": "line", "point": {"size": 12, "color": "#c7c7c7"},
                                             "color": "#c7c7c7", "strokeWidth": 1},
         "encoding": {"x": x, "y": y, "detail": {"field": "profile"}, "tooltip": tooltip}},
        {"data": {"values": shown}, "mark": {"type": "line", "point": True, "strokeWidth": 2.5},
         "encoding": {"x": x, "y": y, "color": colour, "tooltip": tooltip}},
        {"data": {"values": [{**r, "label": f"{r['profile']} (this plan)"} for r in mine]},
         "mark": {"type": "text", "align": "left", "baseline": "bottom", "dx": 4, "dy": -6, "fontSize": 12,
                  "fontWeight": "bold"},
         "encoding": {"x": x, "y": y, "text": {"field": "label"}, "color": {**colour, "legend": None}}},
    ]
    if current:
        layers.append({"data": {"values": [current]},
                       "mark": {"type": "point", "size": 200, "color": "black", "filled": False, "strokeWidth": 2},
                       "encoding": {"x": x, "y": y, "tooltip": tooltip}})
    return {"layer": layers}


# Micro-batch numbers are drawn on the bars up to this many bars (beyond, they are too narrow to
# read, and the labels double what the page sends: 1,536 bars at pp 32 were 400 KB of JSON, 25 ms).
TIMELINE_LABELS_MAX = 400


def pipeline_timeline(rows: Sequence[dict]) -> dict:
    """The pipeline schedule: one lane per rank, a bar per forward (light) or backward (dark) of a
    micro-batch, labelled with its number (when few enough to read); the gaps are the bubble
    (planner.decisions.pictures). Only the fields drawn, times rounded to 1e-3 of a forward."""
    bars = [{"rank": f"rank {r['rank']}", "kind": r["kind"], "mb": r["micro_batch"], "chunk": r["chunk"],
             "start": round(r["start"], 3), "end": round(r["end"], 3)} for r in rows]
    ranks = sorted({r["rank"] for r in rows})
    y = {"field": "rank", "type": "nominal", "title": None, "sort": [f"rank {r}" for r in ranks]}
    x = {"field": "start", "type": "quantitative", "title": "time (one full forward of a micro-batch = 1)"}
    layers = [
        {"data": {"values": bars}, "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
         "encoding": {"y": y, "x": x, "x2": {"field": "end"},
                      "color": {"field": "kind", "type": "nominal", "title": None, "legend": LEGEND_BOTTOM,
                                "scale": {"domain": ["forward", "backward"], "range": ["#9ecae9", "#4c78a8"]}},
                      "tooltip": [{"field": "rank"}, {"field": "kind"}, {"field": "mb", "title": "micro-batch"},
                                  {"field": "chunk"}, {"field": "start", "format": ".2f"},
                                  {"field": "end", "format": ".2f"}]}},
    ]
    if len(bars) <= TIMELINE_LABELS_MAX:  # in each layer, not at the top (see step_bar)
        labels = [{"rank": b["rank"], "start": b["start"], "label": str(b["mb"])} for b in bars]
        layers.append({"data": {"values": labels},
                       "mark": {"type": "text", "fontSize": 9, "dx": 2, "align": "left", "color": "black"},
                       "encoding": {"y": y, "x": x, "text": {"field": "label"}}})
    return {"height": {"step": 28}, "layer": layers}


def memory_vs_micro_batch(rows: Sequence[dict]) -> dict:
    """Peak memory per GPU against the micro-batch size, the chosen one ringed, the capacity a red line."""
    capacity = rows[0]["capacity_GiB"] if rows else 0.0
    x = {"field": "micro_batch", "type": "quantitative", "title": "micro-batch (sequences)",
         "scale": {"type": "log", "base": 2}}
    return {
        "layer": [
            {"data": {"values": list(rows)}, "mark": {"type": "line", "point": True},
             "encoding": {"x": x, "y": {"field": "GiB", "type": "quantitative", "title": "GiB per GPU (peak)"},
                          "tooltip": [{"field": "micro_batch"}, {"field": "GiB", "format": ".1f"}]}},
            {"data": {"values": [r for r in rows if r["chosen"]]},
             "mark": {"type": "point", "size": 200, "color": "black", "filled": False},
             "encoding": {"x": x, "y": {"field": "GiB", "type": "quantitative"}}},
            {"data": {"values": [{"capacity": capacity}]},
             "mark": {"type": "rule", "color": "red", "strokeDash": [4, 3], "size": 2},
             "encoding": {"y": {"field": "capacity", "type": "quantitative"}}},
        ],
    }


def breakdown_vs_gpus(rows: Sequence[dict]) -> dict:
    """Step-time parts stacked, one bar per GPU count (the best layout at each count)."""
    order = {p: i for i, p in enumerate(TIME_COLOURS)}
    return {"layer": [{  # one layer, so the data stays inline (see step_bar)
        "data": {"values": [{**r, "order": order.get(r["part"], 99)} for r in rows]},
        "mark": "bar",
        "encoding": {"x": {"field": "GPUs", "type": "ordinal", "title": "GPUs"},
                     "y": {"field": "seconds", "type": "quantitative", "title": "seconds per step", "stack": "zero"},
                     "color": _colour("part", TIME_COLOURS), "order": {"field": "order", "type": "quantitative"},
                     "tooltip": [{"field": "GPUs"}, {"field": "part"},
                                 {"field": "seconds", "type": "quantitative", "format": ".3g"}]},
    }]}


def predicted_vs_measured(points: Sequence) -> dict:
    """`planner validate --plot` as a chart: one small panel per quantity (its own scales), each
    run's predicted against its measured value, the y = x line and a +/-10% band; hollow: a
    time-shared run's shares (shown, not judged). A chart spec, not matplotlib: the PNG took
    seconds of CPU on the tab's first open."""
    rows = [{"kind": "run", "quantity": p.quantity, "run": p.run, "measured": p.measured, "predicted": p.predicted,
             "judged": "judged" if p.judged else "time-shared, not judged"} for p in points]
    for q in dict.fromkeys(p.quantity for p in points):  # the y = x line and band across each panel
        vals = [v for p in points if p.quantity == q for v in (p.predicted, p.measured)]
        rows += [{"kind": "ref", "quantity": q, "measured": v, "predicted": v, "low": 0.9 * v, "high": 1.1 * v}
                 for v in (min(vals), max(vals))]
    x = {"field": "measured", "type": "quantitative", "scale": {"zero": False}}
    y = {"field": "predicted", "type": "quantitative", "scale": {"zero": False}}
    ref = [{"filter": "datum.kind == 'ref'"}]
    return {
        "data": {"values": rows},
        "facet": {"field": "quantity", "type": "nominal", "title": None},
        "columns": 3,
        "spec": {"width": 170, "height": 140, "layer": [
            {"transform": ref, "mark": {"type": "area", "color": "#bbbbbb", "opacity": 0.35},
             "encoding": {"x": x, "y": {"field": "low", "type": "quantitative", "title": "predicted"},
                          "y2": {"field": "high"}}},
            {"transform": ref, "mark": {"type": "line", "color": "black", "strokeWidth": 1},
             "encoding": {"x": x, "y": y}},
            {"transform": [{"filter": "datum.kind == 'run'"}], "mark": {"type": "point", "size": 40, "filled": True},
             "encoding": {"x": x, "y": y,
                          "fill": {"field": "judged", "type": "nominal", "title": None, "legend": LEGEND_BOTTOM,
                                   "scale": {"domain": ["judged", "time-shared, not judged"],
                                             "range": ["#4c78a8", "transparent"]}},
                          "stroke": {"value": "#4c78a8"},
                          "tooltip": [{"field": "run"}, {"field": "measured", "type": "quantitative", "format": ".4g"},
                                      {"field": "predicted", "type": "quantitative", "format": ".4g"}]}},
        ]},
        "resolve": {"scale": {"x": "independent", "y": "independent"}},
    }
