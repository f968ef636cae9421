"""What the what-if explorer computes: pure functions of a mapping of declared names.

The page turns its widgets into that mapping (planner.app.state.mapping_from_state), calls these
through Streamlit's cache (so each input is computed once), and draws what they return. The mapping
goes to the same builder as the CLI's parsed flags (planner.core.options.build_inputs), which is
what makes the page's figures and `planner estimate` agree. One explorer update evaluates one
table of layouts; the plan, its runners-up, the nearest fit and the pin suggestions are read off it
(pins whose own layouts fit: only those layouts, as `planner estimate` does).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.core.report import TIME_PARTS  # one list of the step's parts and their labels
from planner.errors import PlannerError
from planner.units import GIB, fmt_count, fmt_days, fmt_seconds

# GPU counts of the days-to-train sweep (powers of two; a cluster is bought in nodes of 8).
SWEEP_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TOP_LAYOUTS = 20  # the best and its runners-up: the Layouts tab's "Top 20"


@dataclass(frozen=True, kw_only=True, slots=True)
class View:
    """Everything the page shows for one input: the plan, its top layouts, how the search went."""

    best: object  # planner.core.results.Estimate
    layouts: tuple  # the best, then the fitting runners-up, in rank order
    nearest_fit: object | None
    alternatives: tuple = ()  # two more fitting layouts near the pins (changing other fields)
    evaluated: int
    feasible: int
    search_seconds: float
    objective: str
    model_note: str
    pinned: tuple[str, ...]
    roomier: object | None = None  # planner.core.plan.Plan.roomier
    faster: tuple = ()  # planner.core.plan.Plan.faster

    def to_json(self) -> dict:
        """Exactly what `planner estimate --format json` prints for the same flags."""
        from planner.core.plan import plan_json

        return plan_json(self.best, self.model_note, self.nearest_fit, self.alternatives, self.roomier, self.faster)


@dataclass(frozen=True, kw_only=True, slots=True)
class Suggestion:
    """A pinned field that no layout accepts, and the nearest values that would work with the other pins."""

    field: str  # the planner's name (tp, pp, vpp, micro_batch, zero_stage, ...; global_batch)
    value: object
    valid: tuple


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """Inputs the planner refuses: its one-line message and, for pinned layouts, what would do."""

    message: str
    field: str
    suggestions: tuple[Suggestion, ...] = ()


def compute(values: Mapping[str, object], top: int = TOP_LAYOUTS) -> View | Problem:
    """The plan for a mapping of declared names, or the reason there is none (never raises
    PlannerError). One table is evaluated (or, for pins that fit, their layouts only); everything
    shown is selected from it. ``top`` layouts in all: the best and ``top - 1`` runners-up."""
    from planner.core.options import build_inputs
    from planner.core.plan import evaluate_table, plan_from_table, plan_of_pins

    objective = str(values.get("sort") or "time")
    try:
        x = build_inputs(values)
        top -= 1  # runners-up after the best
        p = plan_of_pins(x.model, x.hardware, x.job, x.gpus, x.pins, objective, top, x.ops)  # pins that fit
        table = evaluate_table(x.model, x.hardware, x.job, x.gpus, x.pins, objective) if p is None else None
    except PlannerError as exc:
        return Problem(message=str(exc), field=exc.field)
    try:
        p = p or plan_from_table(table, x.model, x.hardware, x.job, x.gpus, x.pins, top, x.ops)
    except PlannerError as exc:
        return Problem(message=str(exc), field=exc.field, suggestions=pin_suggestions(table, x))
    r = p.result
    return View(best=p.best, layouts=(p.best, *p.runners_up) if p.best.fits else (p.best,),
                nearest_fit=p.nearest_fit, alternatives=p.alternatives, evaluated=r.evaluated, feasible=r.feasible,
                search_seconds=r.search_seconds, objective=objective, model_note=x.model_note, pinned=p.pinned,
                roomier=p.roomier, faster=p.faster)


# --- pinned layouts that do not divide -----------------------------------------------------------
def _nearest(value: object, valid: set) -> tuple:
    """The closest valid value below and above a number; every valid value for a category."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return tuple(sorted(valid, key=str))
    below = [v for v in valid if v < value]
    above = [v for v in valid if v > value]
    return tuple(v for v in (max(below) if below else None, min(above) if above else None) if v is not None)


def pin_suggestions(table, x) -> tuple[Suggestion, ...]:
    """For each pinned field that is itself the obstacle: the nearest values that make a valid layout
    with the other pins kept (the values of that column among the table's rows that keep them)."""
    import dataclasses

    from planner.core.layout import DIMS
    from planner.core.search import matches

    c = table.candidates  # the rows' order does not matter here
    out = []
    for name, value in x.pins.pinned().items():
        rows = matches(c, dataclasses.replace(x.pins, **{name: None}))
        valid = {DIMS[name].decode(v) for v in np.unique(getattr(c, name)[rows])}
        if valid and value not in valid:
            out.append(Suggestion(field=name, value=value, valid=_nearest(value, valid)))
    g = x.job.global_batch
    if g is not None:
        valid_batches = _valid_global_batches(x, g)
        if valid_batches and g not in valid_batches:
            out.append(Suggestion(field="global_batch", value=g, valid=_nearest(g, valid_batches)))
    return tuple(out)


def _valid_global_batches(x, g: int) -> set[int]:
    """Global batches next to ``g`` that some layout with the pins can split: multiples of one of
    the layouts' batch units (dp*micro_batch, times pp when interleaved)."""
    from planner.core.search import batch_units

    units = batch_units(x.model, x.gpus, x.job, x.pins)
    near = {u * k for u in units for k in (g // u, -(-g // u)) if k >= 1}
    return set(sorted(near, key=lambda v: abs(v - g))[:8])


# --- the plan as a launch config: planner.export.plan.export_plan, shared with `planner export` ------
def export_plan(values: Mapping[str, object], fmt: str, opts, force: bool = False):
    """What `planner export --format fmt` writes for these inputs (planner/export/plan.py)."""
    from planner.export.plan import export_plan as plan_export

    return plan_export(values, fmt, opts, force=force)


def pictures(values: Mapping[str, object], best=None) -> tuple[list, list]:
    """(memory vs micro-batch rows, step-time parts vs GPUs rows) for the plan of these inputs
    (planner.decisions.pictures); empty lists when there is no fitting plan. ``best``: that plan's
    best estimate when the caller has it (``compute(values).best``), else it is planned here."""
    parts = dict(item for step in _picture_steps(values, best) for item in step)
    return parts.get("memory", []), parts.get("time", [])


def pictures_in_progress(values: Mapping[str, object], best=None) -> InProgress:
    """``pictures`` a step at a time (its ``items``: ("memory", rows) and ("time", rows) once done)."""
    return InProgress(_picture_steps(values, best), 2)


def _picture_steps(values: Mapping[str, object], best):
    """``pictures`` in steps of a few milliseconds: yields (("memory", rows),), then () while the
    counts of the step-time picture are searched, then (("time", rows),); nothing without a
    fitting plan."""
    from planner.core.options import build_inputs
    from planner.core.plan import plan
    from planner.decisions import pictures as pic

    try:
        x = build_inputs(values)
        if best is None:
            best = plan(x.model, x.hardware, x.job, x.gpus, x.pins, str(values.get("sort") or "time"), top=0,
                        ops=x.ops).best
    except PlannerError:
        return
    if not best.fits:
        return
    yield (("memory", pic.memory_vs_micro_batch(x, best)),)
    # The free search by time at this count is the plan itself when nothing is pinned.
    free = not x.pins.pinned() and str(values.get("sort") or "time") == "time"
    for rows in pic.breakdown_steps(x, known={x.gpus: best} if free else None):
        yield () if rows is None else (("time", rows),)


# --- figures for the page -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    label: str
    value: str
    help: str = ""


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"


def headline(j: dict) -> tuple[Figure, ...]:
    """The headline figures from an estimate's JSON (the contract of `planner estimate --format json`),
    so the page shows what the CLI says, formatted once, here."""
    m, tr = j["memory"], j["train"]
    return (
        Figure(label="time to train", value=fmt_days(tr["days"]),
               help=f"tokens / (tokens/s), no failures: {tr['days']:,.2f} days"),
        Figure(label="GPU-hours", value=fmt_count(tr["gpu_hours"])),
        Figure(label="cost", value=f"${fmt_count(tr['cost_usd'])}",
               help=f"at ${tr['price_usd_per_gpu_hour']:.2f} per GPU-hour"),
        Figure(label="energy", value=f"{fmt_count(tr['energy_kwh'])} kWh", help=f"GPU power x time x PUE {tr['pue']}"),
        Figure(label="MFU", value=f"{j['mfu']:.1%}", help=f"HFU {j['hfu']:.1%}"),
        Figure(label="tokens/s", value=fmt_count(j["tokens_per_s"]), help="whole job"),
        Figure(label="memory per GPU", value=f"{m['total_bytes'] / GIB:.0f}/{m['capacity_bytes'] / GIB:.0f} GiB",
               help=f"{m['total_bytes'] / GIB:.1f} of {m['capacity_bytes'] / GIB:.0f} GiB, peak on pipeline stage "
                    f"{m['peak_stage']}" + ("" if m["fits"] else "; DOES NOT FIT")),
        Figure(label="bubble", value=_pct(j["bubble_fraction"]), help="pipeline idle share of the step"),
        Figure(label="communication", value=_pct(j["comm_fraction"]), help="exposed share of the step"),
        *operations_figures(j),
    )


def operations_figures(j: dict) -> tuple[Figure, ...]:
    """The whole job: expected time with failures and checkpoints, goodput, the checkpoint interval,
    what trains, and the data feed (the JSON's reliability, checkpoint, data_feed, trainable_params)."""
    r, c, d = j.get("reliability"), j.get("checkpoint"), j.get("data_feed")
    if not (r and c and d):
        return ()
    every = f"{c['interval_steps']} steps" if c["interval_steps"] else "as needed"
    return (
        Figure(label="time with failures", value=fmt_seconds(r["expected_seconds"]),
               help=f"{r['expected_interruptions']:.1f} expected interruptions (Daly 2006); "
                    f"{r['expected_seconds'] / 86400:,.2f} days"),
        Figure(label="goodput", value=f"{r['goodput']:.1%}", help="ideal / expected wall-clock time"),
        Figure(label="checkpoint every", value=every,
               help=f"Young/Daly optimum; {c['bytes_total'] / 1e9:.3g} GB each, {c['save_s']:.1f} s to save"),
        Figure(label="trainable parameters", value=fmt_count(j["trainable_params"]),
               help=f"{j['mode']}: of {fmt_count(j['model']['params'])}"),
        Figure(label="data feed", value=f"{d['bytes_per_s'] / 1e6:.3g} MB/s",
               help=f"{d['token_bytes']}-byte tokens; storage {d['storage_read_bytes_per_s'] / 1e9:.3g} GB/s"
                    + ("" if d["keeps_up"] else "; CANNOT KEEP UP")),
    )


def scenario_rows(a: dict, b: dict) -> list[dict]:
    """Two estimates' JSON side by side: what each runs on, its layout, and the headline figures."""
    def col(j: dict) -> dict:
        figures = {f.label: f.value for f in headline(j)} if j["memory"]["fits"] else {}
        return {"model": f"{j['model']['name']} ({fmt_count(j['model']['params'])})",
                "hardware": f"{j['cluster']['gpus']} x {j['cluster']['gpu']}",
                "layout": layout_text(j["layout"]),
                **{k: figures.get(k, "does not fit") for k in ("time to train", "cost", "MFU", "memory per GPU")}}
    ca, cb = col(a), col(b)
    return [{"": k, "A": ca[k], "B (now)": cb[k]} for k in ca]


def layout_text(lay: dict) -> str:
    """Every layout dimension of a layout's JSON, in the words of the CLI's ``layout`` line
    (planner.core.report.layout_line), shorter: 'dp 4 x tp 4 x pp 8 (v4) x cp 2 (ep 8 of dp*cp) |
    mb 1 x 64 = 2048 seqs | ZeRO-1 | recompute full | SP on | offload optimizer'."""
    pipelined = lay["pp"] > 1
    vpp = f" (v{lay['vpp']})" if lay["vpp"] > 1 and lay.get("schedule", "1f1b") == "1f1b" else ""
    sched = {"gpipe": " GPipe", "dualpipev": " DualPipeV"}.get(lay.get("schedule", "1f1b"), "") if pipelined else ""
    cp = f" x cp {lay['cp']}" if lay.get("cp", 1) > 1 else ""
    ep = f" (ep {lay['ep']} of dp*cp)" if lay.get("ep", 1) > 1 else ""
    hsdp = " | HSDP" if lay.get("sharding", "full") == "hybrid" else ""
    offload = f" | offload {lay['offload']}" if lay.get("offload", "none") != "none" else ""
    return (f"dp {lay['dp']} x tp {lay['tp']} x pp {lay['pp']}{vpp}{sched}{cp}{ep} | mb {lay['micro_batch']} x "
            f"{lay['grad_accum']} = {lay['global_batch']} seqs | ZeRO-{lay['zero_stage']}{hsdp} | "
            f"recompute {lay['recompute']} | SP {'on' if lay['sequence_parallel'] else 'off'}{offload}")


def changed_fields(a: dict, b: dict) -> list[str]:
    """Layout fields (JSON form) that differ between two layouts: 'tp 8 -> 4'."""
    from planner.core.layout import PIN_DIMS  # every declared dimension (cp, offload... as they appear)

    return [f"{d.name} {a.get(d.name)} -> {b.get(d.name)}" for d in PIN_DIMS if a.get(d.name) != b.get(d.name)]


MEMORY_PARTS = (("weights_bytes", "weights"), ("gradients_bytes", "gradients"), ("optimizer_bytes", "optimizer"),
                ("activations_bytes", "activations"), ("other_bytes", "other"))


def memory_rows(j: dict) -> list[dict]:
    """GiB per part, long form for a stacked bar: one bar per reported pipeline stage (first, fullest,
    last; the peak one marked), or one bar when there is no pipeline."""
    m = j["memory"]
    if j["layout"]["pp"] == 1 or not j["memory_by_stage"]:
        return [{"stage": "per GPU", "part": label, "GiB": m[key] / GIB} for key, label in MEMORY_PARTS]
    rows = []
    for s in j["memory_by_stage"]:
        name = f"stage {s['stage']}" + (" (peak)" if s["stage"] == m["peak_stage"] else "")
        rows += [{"stage": name, "part": label, "GiB": s[key] / GIB} for key, label in MEMORY_PARTS]
    return rows


def time_rows(j: dict) -> list[dict]:
    """Seconds per part of the step (the parts add up to the step time)."""
    return [{"part": label, "seconds": j["time"][key], "share": j["time"][key] / j["time"]["step_s"]}
            for key, label in TIME_PARTS]


def layout_rows(layouts: Sequence) -> list[dict]:
    """The ranked layouts as rows of numbers (so the table sorts numerically)."""
    rows = []
    for rank, e in enumerate(layouts, 1):
        lay = e.layout
        rows.append({"rank": rank, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "cp": lay.cp,
                     "ep": lay.ep, "mb": lay.micro_batch,
                     "accum": lay.grad_accum, "global batch": lay.global_batch, "ZeRO": lay.zero_stage,
                     "recompute": lay.recompute, "SP": lay.sequence_parallel,
                     "memory GiB": e.memory.total_bytes / GIB, "step s": e.time.step_s, "MFU %": 100 * e.mfu,
                     "bubble %": 100 * e.bubble_fraction, "comm %": 100 * e.comm_fraction, "days": e.train.days,
                     "cost $": e.train.cost_usd})
    return rows


def bubble_rows(pp: int, vpp: int, micro_batches: int) -> list[dict]:
    """Bubble share of the step against micro-batches per step m, for this pp, without and with its
    interleaving. planner.core.pipeline gives the ideal bubble over the ideal pipeline time, x = (p-1)/(v m)
    (Narayanan et al. 2021 Sec. 2.2); its share of the step is x / (1 + x), what the headline and the
    15% warning use."""
    from planner.core.pipeline import bubble_fraction_ideal

    top = max(64, 2 * micro_batches)
    m = np.unique(np.geomspace(1, top, 40).round().astype(int))
    rows = []
    for v in sorted({1, vpp}):
        x = bubble_fraction_ideal(np.full_like(m, pp), np.full_like(m, v), m)
        rows += [{"micro-batches": int(mi), "bubble": float(xi / (1 + xi)),
                  "schedule": "1F1B" if v == 1 else f"interleaved v={v}"} for mi, xi in zip(m, x)]
    return rows


# --- the same job on other hardware --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareRow:
    profile: str
    gpu: str
    precision: str
    fits: bool
    layout: str
    days: float
    gpu_hours: float
    cost_usd: float
    energy_kwh: float
    mfu: float
    memory_bytes: float
    capacity_bytes: float
    note: str = ""
    checked_runs: int = 0  # measured runs of the stack's family on this profile (planner.evidence)


def _comparison(values: Mapping[str, object], counts: Sequence[int], profiles: Sequence[str] | None):
    """`planner compare` (planner.decisions.decide.compare) for the job of ``values`` on every
    profile, each at its own price per GPU-hour; never raises when nothing fits. The long way:
    ``compare_hardware`` and ``sweep`` give its figures with less work."""
    from planner.decisions.decide import compare

    x, options = _options(values, profiles)
    return compare(x.model, options, tuple(counts), strict=False)


def _options(values: Mapping[str, object], profiles: Sequence[str] | None) -> tuple:
    """(the inputs of ``values``, every profile as a `planner compare` option: its own price, the
    precision it has)."""
    from planner.core.layout import Job
    from planner.core.options import GPU_DEFAULTED, build_inputs, job_fields_given
    from planner.decisions.decide import options_for
    from planner.hardware import get_profile

    x = build_inputs({**values, "gpus": 1})
    hws = [get_profile(name) for name in profiles or _gpu_profile_names()]
    # The job as asked (not as this GPU runs it): each profile fits it to itself, as compare does.
    given = job_fields_given(values)
    job = x.job.replace(price_usd_per_gpu_hour=None,
                        **{k: getattr(Job(), k) for k in GPU_DEFAULTED if k not in given})
    return x, options_for(hws, job, given, ops=[x.ops] * len(hws))


@functools.cache
def profile_names() -> tuple[str, ...]:
    """planner.hardware.profile_names, once per process (it reads every profile file: 40-70 ms;
    the profiles it can name are fixed at the first look-up: planner.hardware._index)."""
    from planner.hardware import profile_names as names

    return tuple(names())


@functools.cache
def _gpu_profile_names() -> tuple[str, ...]:
    """planner.hardware.gpu_profile_names, once per process (it reads every profile file, and the
    profiles it can name are fixed at the first look-up: planner.hardware._index)."""
    from planner.hardware import gpu_profile_names

    return tuple(gpu_profile_names())


def _counts_table(model, option, counts: Sequence[int], tables: dict):
    """The layouts of ``counts`` for an option's job and GPUs per node as one table
    (planner.core.search.counts_table), kept in ``tables`` for the options that share them, and
    the counts where enumerating failed (no valid layout)."""
    from planner.core.search import counts_table

    _enumerated(model, option.job, counts, tables)
    key = (option.job, option.hardware.network.gpus_per_node, tuple(counts))
    if key not in tables:
        tables[key] = counts_table({n: tables[n, option.job] for n in counts if tables[n, option.job] is not None},
                                   key[1])
    return tables[key]


def _enumerated(model, job, counts: Sequence[int], tables: dict) -> None:
    """Each count's layouts for ``job`` (planner.core.search.enumerate_counts) kept in ``tables``
    (None for a count without a valid layout)."""
    from planner.core.search import enumerate_counts

    missing = [n for n in counts if (n, job) not in tables]
    found = enumerate_counts(model, missing, job)
    for n in missing:
        tables[n, job] = found.get(n)


def probes(values: Mapping[str, object], counts: Sequence[int], profiles: Sequence[str] | None = None) -> tuple:
    """(option, planner.decisions.decide.Probe) for every option and count, counts ascending within
    each option: what `planner compare` finds (``_comparison``), each count's best layout found by
    planner.core.bounded.fastest_fitting_bounded (the same layout, with the step time of far fewer
    layouts). A count without a valid layout is probed the long way, for its reason."""
    return tuple((o, p) for step in _probe_steps(values, counts, profiles) for o, p, _ in step)


def _probe_steps(values: Mapping[str, object], counts: Sequence[int], profiles: Sequence[str] | None,
                 rows: bool = False):
    """``probes`` an option at a time: yields each option's (option, probe, row) triples. With
    ``rows``, a count whose best layout fits has its figures in ``row`` (``_best_row``: one
    evaluated row, the estimate's numbers without an Estimate built) and a probe without one;
    else ``row`` is None and the probe has the whole estimate. With ``rows`` at the sweep's
    counts, each option's row comes from the sweep's work for it (``_swept``, kept for the
    sweep), with () yielded between that work's steps."""
    from planner.core.bounded import fastest_fitting_bounded, fastest_fitting_rows, least_memory
    from planner.core.evaluate import usable_memory
    from planner.core.results import estimate_at
    from planner.decisions.decide import Probe, probe
    from planner.units import GIB

    x, options = _options(values, profiles)
    counts = sorted(set(counts))
    tables: dict = {}
    # The sweep's work where it holds these counts for the same job (no token count of its own:
    # planner.app.state.sweep_mapping): done once for both views (``_swept``).
    swept = rows and "tokens" not in values and set(counts) <= set(SWEEP_GPUS)
    for o in options:
        out = []
        hw, cap = o.hardware, usable_memory(o.hardware, o.job)
        if swept:
            found, refused, least, sizes = yield from _swept(x, o, list(SWEEP_GPUS), tables)
            best = {n: r for n, r in found.items() if n in counts}
            if refused:  # the precision, say: every count the long way, for its reason
                least = {}
        else:
            table = _counts_table(x.model, o, counts, tables)
            try:
                find = fastest_fitting_rows if rows else fastest_fitting_bounded
                best = find(x.model, hw, o.job, table) if table[0] else {}
                least = least_memory(x.model, hw, o.job, table) if set(table[0]) - set(best) else {}
            except PlannerError:  # the precision, say: every count the long way, for its reason
                best, least = {}, {}
            sizes = dict(zip(table[0], np.bincount(table[2], minlength=len(table[0])).tolist()))
        for n in counts:
            row = None
            if n in best:
                try:
                    if rows:
                        row = best[n] if swept else _best_row(best[n], x.model, o.job, o.ops)
                        if isinstance(row, PlannerError):
                            raise row
                        p = Probe(gpu=hw.name, gpus=n, best=None, capacity_bytes=cap)
                    else:
                        p = Probe(gpu=hw.name, gpus=n, best=estimate_at(best[n], 0, x.model, hw, o.job, o.ops),
                                  capacity_bytes=cap)
                except PlannerError as exc:  # e.g. an MTBF too short for this many GPUs: this count only
                    row = None
                    p = Probe(gpu=hw.name, gpus=n, best=None, capacity_bytes=cap, why=str(exc), error=exc)
            elif n in least:
                p = Probe(gpu=hw.name, gpus=n, best=None, capacity_bytes=cap, min_bytes=least[n],
                          why=f"does not fit: the leanest of {sizes[n]} layouts needs {least[n] / GIB:.1f} GiB per "
                              f"GPU, {hw.name} has {cap / GIB:.0f} GiB")
            else:  # no valid layout: the search's own reason
                p = probe(x.model, o, n)
            out.append((o, p, row))
        yield tuple(out)


def _best_row(found: tuple, model, job, ops):
    """A count's best layout (``fastest_fitting_rows``: an evaluation and the layout's row) as
    that row alone (planner.core.evaluate.row_of: its figures are the estimate's, to the bit), or
    the PlannerError ``estimate_at`` raises for it (``operations_at``: an MTBF too short for this
    many GPUs)."""
    from planner.core.evaluate import row_of
    from planner.core.results import operations_at

    ev, i = found
    r = row_of(ev, i)
    operations_at(r, model, job, ops)
    return r


def compare_hardware(values: Mapping[str, object], gpus: int,
                     profiles: Sequence[str] | None = None) -> tuple[HardwareRow, ...]:
    """The best fitting layout of the same job on ``gpus`` GPUs of each profile."""
    return tuple(r for step in _compare_steps(values, gpus, profiles) for r in step)


def _compare_steps(values: Mapping[str, object], gpus: int, profiles: Sequence[str] | None):
    """``compare_hardware`` a profile at a time: yields each profile's row (in a tuple)."""
    for step in _probe_steps(values, (gpus,), profiles, rows=True):
        yield tuple(_hardware_row(option, probe, row) for option, probe, row in step)


def _hardware_row(option, probe, row=None) -> HardwareRow:
    """The table's row of a probe, its figures those of ``row`` (``_best_row``) or its estimate."""
    from planner.evidence import for_stack
    from planner.stacks import get_stack

    e = probe.best
    checked = for_stack(get_stack(option.job.stack), probe.gpu).on_gpu
    base = {"profile": probe.gpu, "gpu": option.hardware.gpu.model, "precision": option.job.precision,
            "capacity_bytes": probe.capacity_bytes, "checked_runs": checked}
    if row is not None:  # the estimate's figures (planner.core.results.estimate_at), read off the row
        seconds = float(row.train_seconds)
        return HardwareRow(**base, fits=True, layout=layout_text(row.candidates.layout().to_json()),
                           days=seconds / 86400, gpu_hours=float(row.gpu_hours), cost_usd=float(row.cost_usd),
                           energy_kwh=float(row.energy_kwh), mfu=float(row.mfu), memory_bytes=float(row.memory.total))
    if e is None:
        return HardwareRow(**base, fits=False, layout="", days=math.nan, gpu_hours=math.nan, cost_usd=math.nan,
                           energy_kwh=math.nan, mfu=math.nan,
                           memory_bytes=probe.min_bytes if probe.min_bytes is not None else math.nan,
                           note="no layout fits" if probe.min_bytes is not None else probe.why)
    return HardwareRow(**base, fits=True, layout=layout_text(e.layout.to_json()), days=e.train.days,
                       gpu_hours=e.train.gpu_hours, cost_usd=e.train.cost_usd, energy_kwh=e.train.energy_kwh,
                       mfu=e.mfu, memory_bytes=e.memory.total_bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepPoint:
    profile: str
    precision: str
    gpus: int
    seconds_per_token: float  # of the fastest fitting layout; nan when none fits


def sweep(values: Mapping[str, object], counts: Sequence[int] = SWEEP_GPUS,
          profiles: Sequence[str] | None = None) -> tuple[SweepPoint, ...]:
    """Training seconds per token of the fastest fitting layout, per profile and GPU count. Per token,
    so the result does not depend on the tokens to train (days = tokens x this / 86400).

    The same best layouts as `planner compare` (a free search by time per profile and count), found
    with less work: each count's layouts enumerated once for the profiles that run the same job,
    each profile's counts evaluated together, their memory shared by the profiles that read the
    same of the hardware, and the step time only of the fitting layouts whose floor leaves them a
    chance (planner.core.bounded.fastest_fitting_rows), each best read off its evaluated row."""
    return tuple(p for points in _sweep_steps(values, counts, profiles) for p in points)


def _sweep_steps(values: Mapping[str, object], counts: Sequence[int], profiles: Sequence[str] | None):
    """``sweep`` in steps of a few milliseconds each: yields the points each step adds (one
    profile's, or none while a count's layouts are enumerated or their memory computed)."""
    x, options = _options(values, profiles)
    counts = sorted(set(counts))
    tables: dict = {}
    for o in options:
        found, *_ = yield from _swept(x, o, counts, tables)
        points = []
        for n in counts:
            row = found.get(n)
            # The estimate's train.seconds / train.tokens, read off the row; none where nothing fits
            # or the estimate refuses it (e.g. an MTBF too short for this many GPUs: this count only).
            seconds = math.nan if row is None or isinstance(row, PlannerError) else \
                float(row.train_seconds) / row.train_tokens
            points.append(SweepPoint(profile=o.hardware.name, precision=o.job.precision, gpus=n,
                                     seconds_per_token=seconds))
        yield tuple(points)


# Each (model, job, operations, profile, counts)'s best layouts as the sweep finds them (``_swept``),
# the last SWEPT_KEPT: the comparison table at one of the sweep's counts reads them, and the sweep
# of the same inputs after it (the page advances the table first) finds them done.
_SWEPT: dict = {}
SWEPT_KEPT = 256  # profiles' results (one-row evaluations of scalars: a few KB each)


def _swept(x, o, counts: list[int], tables: dict):
    """({count: its best layout for option ``o`` (``bounded.fastest_fitting_rows``) as its row
    (``_best_row``), or the PlannerError its estimate raises}, counts where nothing fits left out;
    the PlannerError of the search itself, or None (the precision on this GPU, say); {count: the
    least memory per GPU of its layouts}; {count: how many layouts it has}). A generator: yields
    () after each count's enumeration and each block of the layouts' memory, and returns those.
    ``tables``: what the options share (``_counts_table``)."""
    from planner.core.bounded import fastest_fitting_rows, least_memory, least_memory_steps
    from planner.core.memory import hardware_read

    key = (x.model, o.job, o.ops, o.hardware.name, tuple(counts))
    kept = _SWEPT.get(key)
    if kept is not None and (kept[0] is o.hardware or kept[0] == o.hardware):
        return kept[1]
    for n in counts:
        if (n, o.job) not in tables:
            _enumerated(x.model, o.job, [n], tables)
            yield ()
    table = _counts_table(x.model, o, counts, tables)
    if ("memory", o.job, hardware_read(o.hardware)) not in tables and table[0]:  # shared by some profiles
        for _ in least_memory_steps(x.model, o.hardware, o.job, table):  # a block of layouts a step
            yield ()
        tables["memory", o.job, hardware_read(o.hardware)] = least_memory(x.model, o.hardware, o.job, table)
    refused = None
    try:
        best = fastest_fitting_rows(x.model, o.hardware, o.job, table)
    except PlannerError as exc:
        best, refused = {}, exc
    out = {}
    for n, found in best.items():
        try:
            out[n] = _best_row(found, x.model, o.job, o.ops)
        except PlannerError as exc:
            out[n] = exc
    for oldest in list(_SWEPT)[:max(0, len(_SWEPT) + 1 - SWEPT_KEPT)]:  # sessions share it: no iterator held
        _SWEPT.pop(oldest, None)
    least = tables.get(("memory", o.job, hardware_read(o.hardware)), {})
    sizes = dict(zip(table[0], np.bincount(table[2], minlength=len(table[0])).tolist()))
    _SWEPT[key] = (o.hardware, (out, refused, least, sizes))
    return out, refused, least, sizes


class InProgress:
    """A computation made of steps (a generator yielding what each step adds, as a tuple), run a
    few steps at a time so that the page can draw what is done and come back for the rest:
    ``advance`` works until a deadline, ``items`` is what is done."""

    def __init__(self, steps, total: int) -> None:
        import threading

        self._steps = steps
        self._lock = threading.Lock()  # sessions share one: one advances it at a time
        self.items: tuple = ()
        self.done = False
        self.total = total  # profiles, for the page's "k of n so far"
        self.error: Exception | None = None  # what stopped it before its end
        self._longest = 0.0  # the longest step so far, seconds: what a step about to begin may take

    def advance(self, deadline: float, between_steps=None) -> None:
        """Compute until ``time.perf_counter()`` reaches ``deadline`` or it is done; nothing when the
        deadline has passed or another session is advancing it. A step begun runs to its end, so
        one is begun only where a step as long as the longest so far would end by the deadline (the
        first always: each call that works makes progress); the steps (a profile's searches) take
        0-25 ms in no order, and where a step as long as the last one was the rule, a long one
        begun after a short one ran over the deadline by most of its length.
        ``between_steps`` is called after each step before the next begins (the page passes a
        point where Streamlit may stop the run for a newer one: what is done is kept, the next
        call goes on from there)."""
        import time

        if self.done or time.perf_counter() >= deadline or not self._lock.acquire(blocking=False):
            return
        try:
            while not self.done:
                start = time.perf_counter()
                try:
                    self.items += next(self._steps)
                except StopIteration:
                    self.done = True
                except Exception as exc:  # a generator that raised is over: say so, never "done" quietly
                    self.error, self.done = exc, True
                    if not isinstance(exc, PlannerError):
                        raise
                now = time.perf_counter()
                self._longest = max(self._longest, now - start)
                if now + self._longest > deadline:
                    break
                if between_steps is not None and not self.done:
                    between_steps()
        finally:
            self._lock.release()

    @property
    def profiles_done(self) -> int:
        return len({item.profile for item in self.items})


def sweep_in_progress(values: Mapping[str, object], counts: Sequence[int] = SWEEP_GPUS,
                      profiles: Sequence[str] | None = None) -> InProgress:
    """``sweep`` a step at a time (its ``items``: the SweepPoints done)."""
    return InProgress(_sweep_steps(values, counts, profiles), len(profiles or _gpu_profile_names()))


def comparison_in_progress(values: Mapping[str, object], gpus: int,
                           profiles: Sequence[str] | None = None) -> InProgress:
    """``compare_hardware`` a profile at a time (its ``items``: the HardwareRows done)."""
    return InProgress(_compare_steps(values, gpus, profiles), len(profiles or _gpu_profile_names()))


def hardware_table(rows: Sequence[HardwareRow]) -> list[dict]:
    return [{"profile": r.profile, "GPU": r.gpu, "precision": r.precision, "fits": r.fits,
             "days": r.days, "GPU-hours": r.gpu_hours, "cost $": r.cost_usd, "energy kWh": r.energy_kwh,
             "MFU %": 100 * r.mfu, "memory GiB": r.memory_bytes / GIB, "capacity GiB": r.capacity_bytes / GIB,
             "checked runs": r.checked_runs, "best layout": r.layout or r.note} for r in rows]


def sweep_rows(points: Sequence[SweepPoint], tokens: float, precision: str) -> list[dict]:
    """Days to train ``tokens`` per (profile, GPUs), leaving out counts where nothing fits; a profile
    that runs in another precision than ``precision`` says which."""
    return [{"profile": p.profile if p.precision == precision else f"{p.profile} ({p.precision})", "GPUs": p.gpus,
             "days": tokens * p.seconds_per_token / 86400} for p in points if math.isfinite(p.seconds_per_token)]
