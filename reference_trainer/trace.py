"""Recorded traces: a Chrome trace written by torch.profiler's ``export_chrome_trace`` or Kineto,
booked step by step (``ProfilerStep#N``) by the live profiler's rules (reference_trainer/profiler.py:
``classify``, ``book``, and ``launching_op`` for the op that launched an NCCL kernel, so that a
send-receive kernel of an all-to-all is a collective, not pipeline traffic). No torch import:
``python -m reference_trainer trace FILE`` starts without it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from reference_trainer.profiler import COMM_OPS, FWD_BWD_MARK, STEP_MARK, Span, book, classify, launching_op

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
PROFILER_STEP = "ProfilerStep#"


class TraceError(ValueError):
    """A file that is not a Chrome trace this reader can book (one line: the file and why)."""


def load_trace(path) -> list[dict]:
    """The events of a Chrome trace JSON (``.json`` or ``.json.gz``), as torch.profiler's
    ``export_chrome_trace`` and Kineto write it: ``{"traceEvents": [...]}`` or a bare list."""
    path = Path(path)
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: cannot read a JSON trace ({type(exc).__name__}: {exc})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no 'traceEvents' list (a Chrome trace from torch.profiler is expected)")
    return [e for e in events if isinstance(e, dict)]


def _complete(events: list[dict]) -> list[dict]:
    """Complete events with a name, numeric times and args as a dict; without the GPU-timeline
    copies of CPU annotations (gpu_user_annotation), which would duplicate the marks."""
    return [{**e, "args": e["args"] if isinstance(e.get("args"), dict) else {}} for e in events
            if e.get("ph") == "X" and isinstance(e.get("name"), str) and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur", 0), (int, float)) and e.get("cat") != "gpu_user_annotation"]


def trace_spans(events: list[dict]) -> list[Span]:
    """Complete events ("ph": "X"; "ts"/"dur" in microseconds) as spans: GPU work (categories
    kernel, gpu_memcpy, gpu_memset) on the GPU, the rest (cpu_op, user_annotation, cuda_runtime,
    ...) not. An NCCL kernel's launcher is Kineto's ``Collective name`` when written, else the
    innermost communication op around its launch (``launching_op`` at the cuda_runtime event with
    the kernel's correlation id, among the ops of that process and thread)."""
    xs = _complete(events)
    launches = {e["args"]["correlation"]: e for e in xs if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]}
    comm: dict[tuple, list[tuple[str, float, float]]] = {}
    for e in xs:
        if e["name"].startswith(COMM_OPS) and e.get("cat") not in GPU_CATEGORIES:
            comm.setdefault((e.get("pid"), e.get("tid")), []).append(
                (e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))

    def launcher(kernel: dict) -> str | None:
        args = kernel["args"]
        if args.get("Collective name"):
            return str(args["Collective name"])
        run = launches.get(args.get("correlation"))
        return None if run is None else launching_op(comm.get((run.get("pid"), run.get("tid")), []), float(run["ts"]))

    out = []
    for e in xs:
        gpu = e.get("cat") in GPU_CATEGORIES
        who = launcher(e) if gpu and "nccl" in e["name"].lower() else None
        out.append(Span(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), gpu, who))
    return out


def trace_steps(events: list[dict]) -> dict[str, tuple[float, float]]:
    """Each ``ProfilerStep#N`` annotation (what ``torch.profiler.profile.step()`` writes) -> its
    window: the span on the GPU of the work launched inside it (kernels, copies and fills whose
    cuda_runtime launch, matched by correlation id, starts within the annotation on any thread
    of its process), as HolisticTraceAnalysis assigns kernels to iterations; the annotation's own
    span when it launched no GPU work (a CPU trace)."""
    xs = _complete(events)
    gpu_by_corr = {}
    for e in xs:
        if e.get("cat") in GPU_CATEGORIES and "correlation" in e["args"]:
            gpu_by_corr.setdefault(e["args"]["correlation"], []).append(e)
    runs = [e for e in xs if e.get("cat") == "cuda_runtime" and e["args"].get("correlation") in gpu_by_corr]
    steps = {}
    for m in (e for e in xs if e["name"].startswith(PROFILER_STEP)):
        lo, hi = float(m["ts"]), float(m["ts"]) + float(m.get("dur", 0))
        work = [k for r in runs if r.get("pid") == m.get("pid") and lo <= r["ts"] < hi
                for k in gpu_by_corr[r["args"]["correlation"]]]
        steps[m["name"]] = ((min(k["ts"] for k in work), max(k["ts"] + k.get("dur", 0) for k in work))
                            if work else (lo, hi))
    return steps


def analyse_trace(events: list[dict], step: str | None = None) -> dict[str, dict[str, float]]:
    """Seconds of each step of a recorded trace (or of ``step`` alone, e.g. "ProfilerStep#5"),
    booked by the same ``classify``/``book`` rules as the live profiler. Windows: the trainer's
    own marks (rt:step, rt:fwd_bwd) when the trace has them (a trace of this trainer; one step,
    named by rt:step); otherwise each ProfilerStep#N's window (``trace_steps``) serves as both the
    step and the forward-backward window, since a recorded trace does not say where forward-
    backward ends: the optimizer's and other work's time then counts as forward-backward too."""
    sp = trace_spans(events)
    c = classify(sp, "cuda" if any(s.gpu for s in sp) else "cpu")
    if STEP_MARK in c["marks"] and FWD_BWD_MARK in c["marks"]:
        windows = {STEP_MARK: (c["marks"][STEP_MARK], c["marks"][FWD_BWD_MARK])}
    else:
        windows = {name: (w, w) for name, w in trace_steps(events).items()}
    if step is not None:
        if step not in windows:
            raise TraceError(f"step {step!r} not in the trace (steps found: {', '.join(windows) or 'none'})")
        windows = {step: windows[step]}
    if not windows:
        raise TraceError("no step in the trace: neither ProfilerStep#N annotations nor the marks rt:step, rt:fwd_bwd")
    return {name: book(c, w_step, w_fb) for name, (w_step, w_fb) in windows.items()}
