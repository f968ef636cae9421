"""`planner`: the command line. Parses, calls the core, formats; nothing else lives here.

Exit codes: 0 ok, 2 bad input (one line on stderr), 3 the layout asked for does not fit.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import textwrap

from planner.errors import PlannerError

EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3

# Subcommands that live in their own modules. Each module has ``add_parser(sub)``, which adds its
# parser and sets ``func`` (a function of the parsed args returning the exit code) with
# ``set_defaults``. They are imported when the parser is built: keep their imports light.
EXTENSIONS: tuple[str, ...] = ("planner.cli.calibrate", "planner.cli.decide", "planner.cli.export", "planner.cli.app")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag, the value and what is allowed, and
    numbers are read strictly (planner.numbers: no 1_0, no 1e400 read as infinity)."""

    def __init__(self, *args, **kwargs) -> None:
        from planner.numbers import strict

        kwargs.setdefault("allow_abbrev", False)  # `recommend --gpus 7` is not --gpus-per-node 7
        super().__init__(*args, **kwargs)
        strict(self)

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _formats(p: argparse.ArgumentParser) -> None:
    from planner.tables import WIDE_HELP

    p.add_argument("--format", choices=("text", "json", "csv"), default="text")
    p.add_argument("--wide", action="store_true", help=WIDE_HELP)


def _width(a: argparse.Namespace) -> int | None:
    from planner.tables import WIDTH

    return None if a.wide else WIDTH


def _plan_args(p: argparse.ArgumentParser, top: int, top_help: str) -> None:
    from planner.cli import inputs
    from planner.core.search import OBJECTIVES

    inputs.add_plan_args(p)
    _formats(p)
    p.add_argument("--sort", choices=OBJECTIVES, default="time", help="ranking objective")
    p.add_argument("--top", type=int, default=top, help=top_help)


def _estimate_args(p: argparse.ArgumentParser) -> None:
    _plan_args(p, 5, "runners-up to show")
    p.add_argument("--plot", metavar="FILE", help="also write the pictures (pipeline schedule, memory vs "
                                                  "micro-batch, step time vs GPUs) as .png, .svg or .pdf")


def _search_args(p: argparse.ArgumentParser) -> None:
    _plan_args(p, 20, "rows to print (0: all fitting)")
    p.add_argument("--all", action="store_true", help="include layouts that do not fit")


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand from the registries: ``SUBCOMMANDS`` (here) and ``EXTENSIONS`` (their modules)."""
    import importlib

    parser = _Parser(prog="planner", description="Plan LLM training: layout, memory, step time, days and cost.")
    parser.add_argument("--version", action="version", version="planner 0.1.0")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, add_args, func) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        add_args(p)
        p.set_defaults(func=func)
    sub.add_parser("run", help="train with the reference trainer under torchrun (see `planner run --help`)",
                   add_help=False)
    for name in EXTENSIONS:
        importlib.import_module(name).add_parser(sub)
    for p in sub.choices.values():
        _show_defaults(p)
    return parser


def _show_defaults(p: argparse.ArgumentParser) -> None:
    """Every flag's default in its --help line, unless the help already says it (or there is none)."""
    # Defaults that depend on the GPU (planner.core.options.fit_job_to_gpu) are said in words.
    gpu_dependent = {"precision": "bf16; fp16 on a GPU without bf16 (V100)",
                     "attention": "flash; standard on a GPU older than Ampere (V100)"}
    for action in p._actions:
        d = action.default
        if action.dest in gpu_dependent and "default" not in (action.help or ""):
            action.help = f"{action.help or ''} (default: {gpu_dependent[action.dest]})".strip()
            continue
        if d in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction) or d == ():
            continue
        text = action.help or ""
        if "default" in text.lower() or text == argparse.SUPPRESS:
            continue
        shown = ",".join(map(str, d)) if isinstance(d, (tuple, list)) else str(d).replace("%", "%%")
        action.help = f"{text} (default: {shown})".strip()


def run_trainer(argv: list[str]) -> int:
    """`planner run`: the reference trainer's launcher, in its own process. The planner never
    imports the trainer (the trainer imports the planner's core), so it is started by module name."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("reference_trainer") is None or importlib.util.find_spec("torch") is None:
        print("planner run: the reference trainer needs torch; "
              "pip install torch==2.13.0 && pip install -e '.[trainer]'", file=sys.stderr)
        return 2
    import os

    # The launcher arms a parent-death signal against this pid, so stopping `planner run` stops the run.
    # Unbuffered children: the launcher's lines and the ranks' appear in the order they happen.
    env = {**os.environ, "PLANNER_RUN_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    sys.stdout.flush()
    return subprocess.call([sys.executable, "-m", "reference_trainer.launch", *argv], env=env)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # the trainer's launcher owns its flags
        return run_trainer(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from planner.core.limits import check_flags

        check_flags(vars(args))  # every number in its documented range (planner/core/limits.py)
        return args.func(args)
    except PlannerError as exc:
        print(f"planner {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `planner search | head`
        return 0


def estimate_plan(a: argparse.Namespace, x=None):
    """`planner estimate`'s work on its parsed flags: (the inputs, the plan). The CLI and the Python
    API (``planner.estimate``) both call it, so their JSON is one. ``x``: the inputs, when the
    caller has built them from these flags (the API, which keeps them between calls)."""
    if a.plot:
        from planner.cli.decide import _check_plot_path

        _check_plot_path(a.plot)  # before the work: a bad path fails in one line, nothing computed
    if x is None:
        from planner.cli.inputs import inputs_from_args

        x = inputs_from_args(a)
    p = _plan()(x.model, x.hardware, x.job, x.gpus, x.pins, a.sort, top=a.top, ops=x.ops)
    if a.plot:
        from planner.cli.plots import write_estimate_plot

        write_estimate_plot(x, p, a.plot)
    return x, p


@functools.cache
def _plan():
    """``planner.core.plan.plan``, imported once (the model loads on the first command that needs it)."""
    from planner.core.plan import plan

    return plan


def cmd_estimate(a: argparse.Namespace) -> int:
    from planner.core.report import CSV_COLUMNS, csv_row, estimate_report

    x, p = estimate_plan(a)
    if a.format == "json":
        print(json.dumps(p.to_json(x.model_note), indent=2, allow_nan=False))
    elif a.format == "csv":
        _print_csv([CSV_COLUMNS, csv_row(p.best)])
    else:
        from planner.tables import wrap_lines

        report = estimate_report(p, f"chosen for {_model_flag(a)}: {x.model_note}", top=a.top, width=_width(a))
        print(wrap_lines(report, _width(a)))
    if a.plot:
        print(f"wrote {a.plot}", file=sys.stderr)  # stderr: the JSON or CSV on stdout stays whole
    return 0 if p.fits else EXIT_DOES_NOT_FIT


def search_listing(a: argparse.Namespace, x=None):
    """`planner search`'s work on its parsed flags: (the inputs, the search, the estimates of the
    rows listed, in rank order, each made as it is read). Shared with ``planner.search``."""
    import numpy as np

    from planner.cli.inputs import inputs_from_args
    from planner.core.plan import searched_fields
    from planner.core.results import estimate_at
    from planner.core.search import search

    x = inputs_from_args(a) if x is None else x
    r = search(x.model, x.hardware, x.job, x.gpus, x.pins, a.sort)
    limit = r.evaluated if a.all else r.feasible
    if a.top:
        limit = min(limit, a.top)
    ev = r.ranked(np.arange(limit))  # only the rows listed are put in rank order
    # Each row's estimate is made as it is written: a listing of every layout (--all) holds one at a time.
    # The first is the search's best: its warnings as `planner estimate` gives them (the fields it chose).
    searched = searched_fields(x.pins)
    return x, r, (estimate_at(ev, i, x.model, x.hardware, x.job, searched=searched if i == 0 else frozenset())
                  for i in range(limit))


def search_head(r) -> dict:
    """The keys of `planner search --format json` before its ``results``."""
    return {"evaluated": r.evaluated, "feasible": r.feasible, "search_seconds": r.search_seconds}


def cmd_search(a: argparse.Namespace) -> int:
    from planner.core.report import CSV_COLUMNS, csv_row, table

    x, r, rows = search_listing(a)
    if a.format == "json":
        _print_json_listing(search_head(r), "results", (e.to_json() for e in rows))
    elif a.format == "csv":
        _print_csv(itertools.chain([CSV_COLUMNS], (csv_row(e) for e in rows)))
    else:
        from planner.tables import wrap_lines

        rows = list(rows)
        print(wrap_lines(f"{x.model.describe()} on {x.gpus} x {x.hardware.name}: {r.feasible} of {r.evaluated} "
                         f"layouts fit ({r.search_seconds * 1e3:.1f} ms); top {len(rows)} by {a.sort}", _width(a)))
        print(table(rows, width=_width(a)))
    return 0 if r.feasible else EXIT_DOES_NOT_FIT


def cmd_presets(a: argparse.Namespace) -> int:
    from planner.core.presets import preset_source, presets
    from planner.units import fmt_params

    table = presets()
    if a.format == "json":
        print(json.dumps({n: {"params": s.params, "active_params": s.active_params, "experts": s.experts,
                              "top_k": s.top_k, "arch": s.arch, "layers": s.layers, "hidden": s.hidden,
                              "heads": s.heads, "kv_heads": s.kv_heads, "ffn_hidden": s.ffn_hidden, "vocab": s.vocab,
                              "seq_len": s.seq_len, "source": preset_source(n)} for n, s in table.items()},
                         indent=2, allow_nan=False))
        return 0
    rows = [("name", "params", "active", "experts", "arch", "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq")]
    rows += [(n, fmt_params(s.params), fmt_params(s.active_params), f"{s.top_k}/{s.experts}" if s.moe else "-",
              s.arch, s.layers, s.hidden, s.heads, s.kv_heads, s.ffn_hidden, s.vocab, s.seq_len)
             for n, s in table.items()]
    _print_rows(rows, a, drop=("vocab", "seq", "kv"))
    return 0


def cmd_profiles(a: argparse.Namespace) -> int:
    from planner.hardware import get_profile, profile_names

    profiles = [get_profile(n) for n in profile_names()]
    if a.format == "json":
        print(json.dumps({p.name: {"gpu": p.gpu.model, "memory_bytes": p.gpu.memory_bytes,
                                   "hbm_bytes_per_s": p.gpu.hbm_bytes_per_s, "tdp_watts": p.gpu.tdp_watts,
                                   "peak_flops": p.gpu.peak_flops, "gpus_per_node": p.network.gpus_per_node,
                                   "gpus_per_host": p.network.host_gpus,
                                   "intra_node_bytes_per_s": p.network.intra_bytes_per_s,
                                   "inter_node_bytes_per_s": p.network.inter_bytes_per_s,
                                   "calibrated": p.calibrated, "path": p.path} for p in profiles}, indent=2,
                         allow_nan=False))
        return 0
    rows = [("name", "GPU", "mem GiB", "HBM GB/s", "bf16 TF", "fp16 TF", "fp8 TF", "TDP W", "GPUs/node",
             "intra GB/s", "inter GB/s/GPU", "calibrated")]
    for p in profiles:
        pk = p.gpu.peak_flops
        rows.append((p.name, p.gpu.model, f"{p.gpu.memory_bytes / 2**30:.0f}", f"{p.gpu.hbm_bytes_per_s / 1e9:.0f}",
                     f"{pk['bf16'] / 1e12:.4g}" if pk["bf16"] else "-",
                     f"{pk['fp16'] / 1e12:.4g}" if pk["fp16"] else "-",
                     f"{pk['fp8'] / 1e12:.4g}" if pk["fp8"] else "-", f"{p.gpu.tdp_watts:.0f}",
                     p.network.gpus_per_node, f"{p.network.intra_bytes_per_s / 1e9:.0f}",
                     f"{p.network.inter_bytes_per_s / 1e9:.1f}", "yes" if p.calibrated else "no"))
    _print_rows(rows, a, drop=("fp16 TF", "TDP W", "HBM GB/s", "GPU"))
    return 0


def _stacks_args(p: argparse.ArgumentParser) -> None:
    _formats(p)
    p.add_argument("--keys", action="store_true", help="list the keys a stack file (and --set) takes, with "
                                                       "what each allows")


def cmd_stacks(a: argparse.Namespace) -> int:
    import dataclasses

    from planner.evidence import for_stack, memory_band
    from planner.stacks import DEFAULT_STACK, get_stack, stack_names

    if getattr(a, "keys", False):  # what a stack file and --set TABLE.KEY=VALUE take
        from planner.stacks import stack_keys

        listing = argparse.Namespace(format="text" if a.format == "json" else a.format, wide=a.wide)
        _print_rows([("key", "allowed"), *stack_keys()], listing, wrap="allowed")
        return 0
    stacks = [get_stack(n) for n in stack_names()]
    checked = {s.name: for_stack(s, "") for s in stacks}  # the measured runs of each stack's family
    if a.format == "json":
        print(json.dumps({s.name: {**dataclasses.asdict(s), "checked_against": checked[s.name].to_json(),
                                   "memory_band": memory_band(s).to_json()}
                          for s in stacks}, indent=2, allow_nan=False))
        return 0
    rows = [("name", "element-wise", "attention", "ZeRO", "DP overlap", "ZeRO-3 overlap", "TP overlap (async)",
             "interleaved", "compile", "fp8", "checked (runs, mean time error)", "memory band", "description")]
    for s in stacks:
        e = checked[s.name]
        rows.append((s.name + (" (default)" if s.name == DEFAULT_STACK else ""), s.elementwise, s.attention_kernel,
                     ",".join(map(str, s.zero_stages)), f"{s.dp_overlap:g}", f"{s.zero3_overlap:g}",
                     f"{s.tp_overlap:g} ({s.tp_overlap_async:g})", "yes" if s.interleaved else "no",
                     "yes" if s.compiles else "no", s.fp8_recipe,
                     f"{e.runs}, {e.time_mean_abs_error:.1%}" if e.runs else "none",
                     f"-{(b := memory_band(s)).under:.1%}/+{b.over:.1%}" + (" (default)" if b.inherited else ""),
                     s.description))
    _print_rows(rows, a, drop=("ZeRO-3 overlap", "interleaved", "compile", "DP overlap", "TP overlap (async)",
                               "attention", "memory band"), wrap="description")
    return 0


def _model_flag(a: argparse.Namespace) -> str:
    if getattr(a, "hf_config", None):
        return f"--hf-config {a.hf_config}"
    return f"--params {a.params}" if a.params else f"--preset {a.preset}" if a.preset else "shape flags"


def _print_rows(rows: list[tuple], a: argparse.Namespace, drop: tuple[str, ...] = (), wrap: str | None = None) -> None:
    """A listing: CSV, or a table within 100 columns (``drop``'s columns left out in that order,
    ``wrap`` wrapped) unless --wide."""
    from planner.tables import fit_table

    if a.format == "csv":
        _print_csv(rows)
        return
    print(fit_table(rows, drop=drop, wrap=wrap, right=(), width=_width(a)))


def _print_json_listing(head: dict, key: str, items) -> None:
    """Print ``json.dumps({**head, key: list(items)}, indent=2)``'s text, each item encoded and
    written as it comes: a listing of 20,000 layouts holds one at a time, not every one with the
    encoder's pieces of all (1.1 GB there)."""
    out = sys.stdout
    out.write("{\n")
    for k, v in head.items():
        out.write(f"  {json.dumps(k)}: {json.dumps(v, allow_nan=False)},\n")
    first = True
    for item in items:
        out.write(f"  {json.dumps(key)}: [\n" if first else ",\n")
        first = False
        out.write(textwrap.indent(json.dumps(item, indent=2, allow_nan=False), "    "))
    out.write(f"  {json.dumps(key)}: []\n}}\n" if first else "\n  ]\n}\n")


def _print_csv(rows) -> None:
    import csv

    csv.writer(sys.stdout, lineterminator="\n").writerows(rows)


# Subcommands defined here: name -> (help, flags, what runs it and returns the exit code).
SUBCOMMANDS = {
    "estimate": ("the best layout (fields you pin are kept) and its full report", _estimate_args, cmd_estimate),
    "search": ("every valid layout, ranked", _search_args, cmd_search),
    "presets": ("list the model presets", _formats, cmd_presets),
    "profiles": ("list the hardware profiles", _formats, cmd_profiles),
    "stacks": ("list the software stacks (--stack): kernels, overlaps, sharding, fp8", _stacks_args, cmd_stacks),
}


if __name__ == "__main__":
    sys.exit(main())
