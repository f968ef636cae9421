"""`planner compare` and `planner recommend`: parse, call planner.decisions.decide, format. Nothing else.

matplotlib is imported only inside ``write_plot`` (``compare --plot``), so the CLI starts fast.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from planner.cli import inputs
from planner.core.search import OBJECTIVES
from planner.errors import PlannerError
from planner.schema import MAX_GPUS, MAX_USD
from planner.tables import WIDE_HELP, WIDTH, wrap_lines
from planner.units import parse_count

# --- parsing ------------------------------------------------------------------------------


def parse_names(text: str, field: str) -> tuple[str, ...]:
    """'a100-80g, a6000' -> ('a100-80g', 'a6000'); duplicates dropped, order kept."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise PlannerError(field, text, "a comma-separated list of GPU profile names or files, "
                                        "e.g. a100-80g,a6000,v100-32g (`planner profiles` lists them)")
    return tuple(dict.fromkeys(items))


def parse_counts(text: str, field: str) -> tuple[int, ...]:
    """'64,128,256' -> (64, 128, 256)."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or not all(re.fullmatch(r"[0-9]{1,7}", t) and 0 < int(t) <= MAX_GPUS for t in items):
        raise PlannerError(field, text, f"comma-separated integers from 1 to {MAX_GPUS:,}, e.g. 64,128,256")
    return tuple(sorted(set(int(t) for t in items)))


def parse_money(text: str, field: str) -> float:
    """'2e6', '$2M', '500K', '1.5M USD' -> US dollars (the count syntax of units.parse_count)."""
    bare = re.sub(r"^\s*\$|\s*USD\s*$", "", str(text), flags=re.IGNORECASE)
    try:
        return parse_count(bare, field, hi=MAX_USD)
    except PlannerError:
        raise PlannerError(field, text, f"US dollars greater than zero and at most {MAX_USD:g}, "
                                        "e.g. 2e6, 2M, $500K") from None


# Workstation-class profiles (GDDR memory, PCIe only, no NVLink): left out of the default lists of
# compare and recommend (name them, or --gpu all, to include them).
WORKSTATION_PROFILES = ("a6000", "l40s")


def default_profiles() -> str:
    """Every datacenter GPU profile (no CPU hosts, no workstation-class cards), comma-separated."""
    from planner.hardware import gpu_profile_names

    return ",".join(n for n in gpu_profile_names() if n not in WORKSTATION_PROFILES)


def profiles_flag(text: str | None) -> str:
    """--gpu as given; absent: the datacenter profiles; 'all': every GPU profile."""
    from planner.hardware import gpu_profile_names

    if text is None:
        return default_profiles()
    return ",".join(gpu_profile_names()) if text.strip() == "all" else text


_GPU_HELP = ("profiles (names or files), comma-separated; 'all': every GPU profile (default: every datacenter "
             "profile, i.e. all of `planner profiles` but the CPU hosts and the workstation cards "
             + ", ".join(WORKSTATION_PROFILES) + ")")


# --- parsers ------------------------------------------------------------------------------


def add_parser(sub) -> None:
    from planner.decisions.decide import DEFAULT_MAX_GPUS

    p = sub.add_parser("compare", help="best layout per GPU profile and count: days, GPU-hours, cost, energy, MFU")
    inputs.add_model_args(p)
    inputs.add_hardware_args(p, many=True)
    p.set_defaults(gpu=None)
    for action in p._actions:
        if action.dest == "gpu":
            action.help = _GPU_HELP
    inputs.add_job_args(p)
    inputs.add_layout_args(p)
    p.set_defaults(func=run_compare)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--wide", action="store_true", help=WIDE_HELP)
    p.add_argument("--sort", choices=OBJECTIVES, default="time", help="ranking within each row")
    p.add_argument("--plot", metavar="PATH", help="write days-to-train vs GPUs per profile (PNG, SVG or PDF)")

    p = sub.add_parser("recommend", help="the fewest GPUs per profile that meet a deadline (and budget)")
    inputs.add_model_args(p)
    g = p.add_argument_group("hardware")
    g.add_argument("--gpu", help=_GPU_HELP)
    g.add_argument("--gpus-per-node", type=int, help="override the profiles' GPUs per node")
    g.add_argument("--max-gpus", type=int, default=DEFAULT_MAX_GPUS,
                   help=f"largest GPU count to consider (default {DEFAULT_MAX_GPUS})")
    inputs.add_job_args(p)
    inputs.add_layout_args(p)
    p.set_defaults(func=run_recommend)
    p.add_argument("--deadline", required=True, help="wall-clock time to train, e.g. 30d, 12h, 2w")
    p.add_argument("--budget", help="US dollars at the profiles' (or --price-per-gpu-hour) rate, e.g. 2e6, $500K")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--wide", action="store_true", help=WIDE_HELP)


def _common(a: argparse.Namespace):
    """Model, options (profile + job) and pins from the flags."""
    from planner.core.finetune import trainable_params
    from planner.core.options import job_fields_given
    from planner.decisions.decide import options_for

    model, note = inputs.model_from_args(a)
    profiles = [inputs.hardware_from_args(n, a.gpus_per_node) for n in parse_names(profiles_flag(a.gpu), "gpu")]
    job = inputs.job_from_args(a)
    trainable_params(model, job)  # validates LoRA targets and rank against this model
    ops = [inputs.ops_from_args(a, hw.network.host_gpus) for hw in profiles]
    return model, note, options_for(profiles, job, job_fields_given(vars(a)), ops), inputs.pins_from_args(a)


def run_compare(a: argparse.Namespace) -> int:
    from planner.decisions.decide import compare

    counts = parse_counts(a.gpus, "gpus")
    if a.plot:
        _check_plot_path(a.plot)
    model, note, options, pins = _common(a)
    c = compare(model, options, counts, pins, a.sort)
    if a.plot:
        write_plot(c, a.plot)
    print(json.dumps(compare_json(c, note), indent=2, allow_nan=False) if a.format == "json"
          else compare_text(c, note, None if a.wide else WIDTH))
    if a.plot:
        print(f"wrote {a.plot}", file=sys.stderr)  # stderr: the JSON on stdout stays one document
    return 0


def run_recommend(a: argparse.Namespace) -> int:
    from planner.decisions.decide import recommend
    from planner.units import parse_duration

    deadline = parse_duration(a.deadline, "deadline")
    budget = parse_money(a.budget, "budget") if a.budget is not None else None
    if a.max_gpus < 1:
        raise PlannerError("max_gpus", a.max_gpus, "a positive integer")
    model, note, options, pins = _common(a)
    r = recommend(model, options, deadline, budget, a.max_gpus, pins)
    print(json.dumps(recommend_json(r, note), indent=2, allow_nan=False) if a.format == "json"
          else recommend_text(r, note, None if a.wide else WIDTH))
    return 0 if r.cheapest else 3


# --- text ---------------------------------------------------------------------------------


def compact_layout(e) -> str:
    lay = e.layout
    out = f"dp{lay.dp} tp{lay.tp} pp{lay.pp}" + (f"x{lay.vpp}" if lay.vpp > 1 else "")
    out += f" mb{lay.micro_batch} z{lay.zero_stage}"
    out += f" {lay.recompute}" if lay.recompute != "none" else ""
    out += " sp" if lay.sequence_parallel else ""
    return out + (f" {lay.schedule}" if lay.schedule != "1f1b" else "")


def _table(rows: list[tuple], drop: tuple[str, ...], width: int | None) -> str:
    """Names and layouts left, figures right; within ``width`` by leaving out ``drop``'s columns."""
    from planner.tables import fit_table

    return fit_table(rows, drop=drop, right=[i for i in range(len(rows[0])) if i not in (0, 3)], width=width)


def _header(model, note: str, options) -> list[str]:
    from planner.units import fmt_count

    job = options[0].job
    tokens = job.train_tokens(model)
    default = (" (default: 20 per parameter, Chinchilla)" if job.mode == "pretrain"
               else " (default for fine-tuning, an assumption)") if job.tokens is None else ""
    lines = [f"model  {model.describe()}", f"       {note}",
             f"job    {fmt_count(tokens)} tokens{default}; PUE {job.pue}; price per GPU-hour: "
             + ", ".join(f"{o.hardware.name} ${_price(o):.2f}" for o in options)]
    lines += [f"note   {o.note}" for o in options if o.note]
    return lines + _stack_lines(options)


def _stack_lines(options) -> list[str]:
    """The stack each option is planned for, and the measured runs that check it on these GPUs."""
    from planner.core.report import labelled
    from planner.evidence import for_stack
    from planner.stacks import overrides_text, software

    out = []
    for stack in dict.fromkeys(software(o.job).stack for o in options):  # first-seen order
        gpus = tuple(dict.fromkeys(o.hardware.name for o in options if software(o.job).stack == stack))
        e = for_stack(stack, gpus[0])
        out += [f"stack  {stack.name}: {stack.description}{overrides_text(stack)}",
                *([f"       not modelled: {stack.not_modelled}"] if stack.not_modelled else []),
                *labelled("       checked against", e.clauses(gpus), 23)]
    return out


def _price(o) -> float:
    p = o.job.price_usd_per_gpu_hour
    return p if p is not None else o.hardware.price_usd_per_gpu_hour


def probe_cells(p) -> tuple:
    from planner.decisions.decide import headroom
    from planner.units import GIB, fmt_count, fmt_days

    if not p.fits:
        return (p.gpu, p.gpus, "-", "(no layout: see below)", "", "", "", "", "", "", "", "")
    e = p.best
    t = e.train
    return (p.gpu, p.gpus, e.job.precision, compact_layout(e), fmt_days(t.days), fmt_days(p.days),
            fmt_count(t.gpu_hours), f"${fmt_count(t.cost_usd)}", f"{t.energy_kwh / 1e3:,.1f}", f"{e.mfu:.1%}",
            f"{e.memory.total_bytes / GIB:.1f}/{e.memory.capacity_bytes / GIB:.0f}", f"{headroom(e):.0%}")


PROBE_HEADER = ("gpu", "GPUs", "prec", "best layout", "time", "wall", "GPU-h", "cost", "MWh", "MFU", "GiB", "free")


def compare_text(c, note: str, width: int | None = WIDTH) -> str:
    lines = _header(c.model, note, c.options) + [""]
    lines.append(_table([PROBE_HEADER, *(probe_cells(p) for p in c.rows)], ("wall", "MWh", "prec", "GPU-h"), width))
    lines += [f"{p.gpus} x {p.gpu}: {p.why}" for p in c.rows if not p.fits]
    lines += ["", "time: ideal time to train; wall: expected time with failures and checkpoints; GPU-h, cost, MWh "
                  "(GPU energy x PUE): of the ideal time;",
              "GiB: peak memory per GPU / capacity; free: memory headroom; "
              "layout: dp tp pp(xvpp) micro-batch ZeRO-stage [recompute] [sp]"]
    return wrap_lines("\n".join(lines), width)


def recommend_text(r, note: str, width: int | None = WIDTH) -> str:
    from planner.units import fmt_count, fmt_days

    budget = f", budget ${fmt_count(r.budget_usd)}" if r.budget_usd is not None else ""
    lines = _header(r.model, note, [a.option for a in r.answers])
    lines += [f"ask    train within {r.deadline_s / 86400:g} days{budget} (wall-clock, with expected failures "
              f"and checkpoints); GPU counts up to {r.max_gpus}", ""]
    rows = [("profile", "fits from", "meets the ask with", "layout", "wall-clock", "cost", "MFU")]
    for a in r.answers:
        fit = f"{a.min_fit.gpus} GPUs" if a.min_fit else "never"
        if a.pick:
            e = a.pick.best
            rows.append((a.name, fit, f"{a.pick.gpus} GPUs", compact_layout(e), fmt_days(a.pick.days),
                         f"${fmt_count(a.pick.cost_usd)}", f"{e.mfu:.1%}"))
        else:
            rows.append((a.name, fit, "-", "", "", "", ""))
    lines.append(_table(rows, ("fits from", "MFU"), width))
    lines.append("")
    best, fit = r.cheapest, r.min_fit
    if best:
        e = best.pick.best
        lines.append(f"cheapest: {best.pick.gpus:,} x {best.name} ({fmt_days(best.pick.days)} wall-clock, "
                     f"${fmt_count(best.pick.cost_usd)}; ideal {fmt_days(e.train.days)}, "
                     f"{fmt_count(e.train.gpu_hours)} GPU-hours)")
    else:
        lines.append("no option meets the ask")
    if fit:
        lines.append(f"fits at all on as few as: {fit.min_fit.gpus} x {fit.name} "
                     f"({fit.min_fit.best.memory.total_bytes / 2**30:.1f} GiB per GPU of "
                     f"{fit.min_fit.best.memory.capacity_bytes / 2**30:.0f})")
    for a in r.answers:
        if a.why:
            lines.append(f"{a.name}: {a.why}")
    return wrap_lines("\n".join(lines), width)


# --- JSON ---------------------------------------------------------------------------------


def _probe_json(p) -> dict:
    from planner.decisions.decide import summary

    out = {"gpu": p.gpu, "gpus": p.gpus, "fits": p.fits}
    if p.fits:
        return out | summary(p.best)
    return out | {"fit": "does not fit", "reason": p.why, "min_memory_bytes": p.min_bytes,
                  "capacity_bytes": p.capacity_bytes}


def _model_json(model, note: str) -> dict:
    return {"name": model.name, "params": model.params, "layers": model.layers, "hidden": model.hidden,
            "heads": model.heads, "seq_len": model.seq_len, "note": note}


def compare_json(c, note: str) -> dict:
    return {"model": _model_json(c.model, note), "tokens": c.options[0].job.train_tokens(c.model),
            "notes": [o.note for o in c.options if o.note], "rows": [_probe_json(p) for p in c.rows]}


def recommend_json(r, note: str) -> dict:
    answers = []
    for a in r.answers:
        answers.append({"gpu": a.name, "precision": a.option.job.precision, "note": a.option.note,
                        "meets": a.pick is not None, "reason": a.why,
                        "min_fit": _probe_json(a.min_fit) if a.min_fit else None,
                        "pick": _probe_json(a.pick) if a.pick else None,
                        "fastest": _probe_json(a.fastest) if a.fastest else None,
                        "probes": [{"gpus": p.gpus, "fits": p.fits, "wall_days": p.days if p.fits else None}
                                   for p in a.probes]})
    return {"model": _model_json(r.model, note), "tokens": r.answers[0].option.job.train_tokens(r.model),
            "deadline_s": r.deadline_s, "budget_usd": r.budget_usd, "max_gpus": r.max_gpus,
            "cheapest": r.cheapest.name if r.cheapest else None,
            "min_fit": {"gpu": r.min_fit.name, "gpus": r.min_fit.min_fit.gpus} if r.min_fit else None,
            "answers": answers}


# --- plot ---------------------------------------------------------------------------------

PLOT_FORMATS = ("png", "svg", "pdf")


def _check_plot_path(path: str) -> None:
    """Fail before the work when the plot cannot be written."""
    from pathlib import Path

    p = Path(path)
    suffix = p.suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise PlannerError("plot", path, f"a file ending in .{', .'.join(PLOT_FORMATS)}")
    if not p.resolve().parent.is_dir():
        raise PlannerError("plot", path, "its folder does not exist")
    from planner.extras import need
    from planner.files import check_target

    check_target(p, "plot")  # a folder named x.png, or a device
    need("matplotlib", "plot", path)


def write_plot(c, path: str) -> None:
    """Expected days to train vs GPUs, one line per profile (log-log). Rendered in memory, then
    written atomically (planner.files), so a failure never leaves a half-written plot."""
    import io
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from planner.files import write_atomic
    from planner.units import fmt_count

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for o in c.options:
            pts = [(p.gpus, p.days) for p in c.rows if p.gpu == o.hardware.name and p.fits]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=f"{o.hardware.name} ({o.job.precision})")
        counts = sorted({p.gpus for p in c.rows})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.set_ylabel("days to train (expected, with failures)")
        tokens = fmt_count(c.options[0].job.train_tokens(c.model))
        ax.set_title(f"{c.model.name}: {tokens} tokens, best layout at each point")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=Path(path).suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    write_atomic(path, buf.getvalue())
