"""Writing the run record (the contract, its schema and loader, live in planner.calibration.record):
the per-step CSV, the summary of a run's measurements, the troubleshooting flags.

No torch import here (nor in what it imports at module level).
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import time
from pathlib import Path

from planner.calibration.record import (  # noqa: F401  (re-exported: the trainer's callers use them)
    BUBBLE_LIMIT,
    COMM_SHARE_LIMIT,
    CSV_COLUMNS,
    DATA_WAIT_LIMIT,
    MEMORY_HEADROOM,
    OPTIONAL,
    RECORD_JSON,
    SCHEMA,
    SCHEMA_VERSION,
    STEPS_CSV,
    load_record,
    validate_record,
)
from planner.core import step_parts


# --- the per-step CSV -------------------------------------------------------------------------
class StepCsv:
    """Rank 0 appends one row per step (flushed, so a crash keeps what was done). A resumed run
    keeps the rows up to the checkpoint it resumed from, cuts the file after them (dropping rows a
    crashed launch wrote past it, and a half-written last line), and appends: never rewritten."""

    def __init__(self, path: Path, keep_until: int):
        self.path = path
        self.rows: list[dict] = []
        if keep_until > 0 and path.exists():
            self.rows, end = _rows_until(path, keep_until)
            if end:
                os.truncate(path, end)
                return
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(_format_row(r) for r in self.rows)

    def write(self, row: dict) -> None:
        self.rows.append(row)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, CSV_COLUMNS).writerow(_format_row(row))


def _rows_until(path: Path, step: int) -> tuple[list[dict], int]:
    """The CSV's rows up to ``step`` and the byte offset just after them; (rows, 0) if the file
    does not start with the expected header."""
    lines = path.read_bytes().split(b"\n")
    if lines[0].rstrip(b"\r").decode(errors="replace") != ",".join(CSV_COLUMNS):
        return [], 0
    rows, end = [], len(lines[0]) + 1
    for line in lines[1:-1]:  # the last piece follows the final newline: empty, or a half-written row
        values = next(csv.reader([line.rstrip(b"\r").decode(errors="replace")]), [])
        try:
            row = _parse_row(dict(zip(CSV_COLUMNS, values)))
        except ValueError:
            break
        if row["step"] is None or row["step"] > step:
            break
        rows.append(row)
        end += len(line) + 1
    return rows, end


def _format_row(row: dict) -> dict:
    return {k: ("" if row[k] is None else repr(row[k]) if isinstance(row[k], float) else row[k]) for k in CSV_COLUMNS}


def _parse_row(row: dict) -> dict:
    out = {}
    for k in CSV_COLUMNS:
        v = row.get(k, "")
        out[k] = None if v == "" else int(v) if k in ("step", "skipped", "traced") else float(v)
    return out


# --- building the record ----------------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _rank_breakdown(r: dict, sync_wait: float, pp: int) -> dict:
    """One rank's seconds per step: the timers' means over the measured steps; communication
    and idle as the fraction of the forward-backward window the traced steps found; the wait
    for other ranks in the optimizer window's collectives (``sync_wait``, from
    step_parts.sync_waits) booked out of optimizer into bubble (pp > 1) or other."""
    fb, step = r["fwd_bwd_s"], r["step_s"]
    traced = [a for a in r["traced"] if a]
    out = {"step": step, "data_wait": r["data_wait_s"], "optimizer": r["optimizer_s"],
           "other": max(0.0, step - r["data_wait_s"] - fb - r["optimizer_s"])}
    if traced:
        frac = lambda key, base: _mean([a[key] / a[base] for a in traced if a[base] > 0]) or 0.0  # noqa: E731
        out["comm_exposed"] = frac("comm_exposed_s", "fwd_bwd_s") * fb
        out["comm_exposed_tp"] = frac("comm_exposed_tp_s", "fwd_bwd_s") * fb  # functional-collective waits
        out["bubble"] = frac("bubble_s", "fwd_bwd_s") * fb
        out["comm_total"] = frac("comm_total_s", "step_window_s") * step
        # Exposed is a share of the forward-backward window, the total of the whole step's window,
        # each scaled by its own timer: a step whose timers and traced windows differ could book
        # exposed above the total. Exposed communication is part of all of it, whatever the scaling.
        out["comm_total"] = max(out["comm_total"], out["comm_exposed"])
    else:
        out["comm_exposed"] = out["comm_exposed_tp"] = out["bubble"] = out["comm_total"] = None
    # Timers around the exchanges themselves (reference_trainer/exchange.py), on every measured step:
    # the context-parallel K/V gather and its gradient's reduction; expert parallel's all-to-all.
    out["cp_comm"], out["all_to_all"] = r.get("cp_comm_s", 0.0), r.get("all_to_all_s", 0.0)
    out["compute"] = fb - (out["comm_exposed"] or 0.0) - (out["bubble"] or 0.0)
    out = step_parts.book_sync_wait(out, sync_wait, pp)
    out["sync_wait"] = sync_wait
    return out


def _peak(config, env: dict) -> tuple[float | None, str | None]:
    """Peak FLOP/s per device for MFU: profile.peak_tflops, else the named planner hardware
    profile, else the profile whose GPU model is the device found; else None and why."""
    precision = config.training.precision
    if config.profile.peak_tflops:
        return config.profile.peak_tflops * 1e12, "profile.peak_tflops in the run config"
    from planner.hardware import get_profile, profile_names

    name = config.profile.hardware_profile
    if name is None and env["device_kind"] == "cuda":
        for candidate in profile_names():
            if get_profile(candidate).gpu.model.lower() == env["device_name"].lower():
                name = candidate
                break
    if name is None:
        return None, ("no peak FLOP/s known for this device: set profile.hardware_profile or profile.peak_tflops"
                      if env["device_kind"] == "cuda" else
                      "CPU run: no peak FLOP/s (set profile.peak_tflops to get an MFU)")
    hw = get_profile(name)
    peak = hw.gpu.peak_flops.get(precision, 0.0)
    return (peak, f"hardware profile {hw.name} ({precision} dense peak)") if peak > 0 else (
        None, f"hardware profile {hw.name} has no {precision} peak")


BREAKDOWN_KEYS = ("compute", "comm_total", "comm_exposed", "comm_exposed_tp", "cp_comm", "all_to_all", "data_wait",
                  "bubble", "optimizer", "other", "sync_wait")


def build_record(*, config, config_dict: dict, ranks: list[dict], rows: list[dict], start_step: int,
                 warmup_steps: int, status: str, message: str | None, nvml_reason: str | None, env: dict,
                 fault: str | None) -> dict:
    this_launch = [r for r in rows if r["step"] > start_step]
    measured = [r for r in this_launch[warmup_steps:] if not r["traced"]] or this_launch
    times = [r["step_s"] for r in measured]
    median = statistics.median(times)
    waits = step_parts.sync_waits([r.get("sync_steps_s", []) for r in ranks])  # none on a rebuild: 0
    per_rank = [_rank_breakdown(r, w, config.layout.pp) for r, w in zip(ranks, waits)]
    breakdown = _breakdown(per_rank)
    traced_any = breakdown["comm_exposed"] is not None
    nvml = _nvml_summary(ranks)
    rec = {
        **_header(config, config_dict, status, message, env, ranks, fault),
        "steps": {"total": config.training.steps, "completed": rows[-1]["step"] if rows else 0,
                  "resumed_from": start_step, "warmup_excluded": warmup_steps,
                  "traced": [r["step"] for r in this_launch if r["traced"]], "measured": len(measured),
                  "skipped": [r["step"] for r in rows if r["skipped"]]},
        "step_time_s": {"median": median, "p10": _quantile(times, 0.1), "p90": _quantile(times, 0.9),
                        "mean": sum(times) / len(times)},
        **_throughput(config, median, len(ranks), env),
        "breakdown_s": breakdown,
        "breakdown_source": _source(traced_any, config.layout.pp, len(ranks)),
        **_shares(config.layout, breakdown, per_rank, ranks, median),
        "per_rank": [{"rank": r["rank"], "pp_rank": r["pp_rank"], "dp_rank": r["dp_rank"], "cp_rank": r.get("cp_rank", 0),
                      "tp_rank": r["tp_rank"],
                      **{k: b[k] for k in ("step", *BREAKDOWN_KEYS)}} for r, b in zip(ranks, per_rank)],
        "memory": _memory(ranks), "nvml": nvml, "nvml_reason": None if nvml else nvml_reason,
        "cpu": _cpu(ranks, env),
        "checkpoint_s": max(r["checkpoint_s"] for r in ranks),
        "loss": _loss_summary(rows),
        "files": {"steps_csv": STEPS_CSV},
    }
    rec["flags"] = _flags(rec)
    return validate_record(rec)


def _source(traced: bool, pp: int, world: int) -> str:
    """How ``breakdown_s`` was measured, and whose numbers it holds."""
    how = ("timers on every measured step; communication and bubble from torch.profiler on the traced steps, "
           "as fractions of the forward-backward window" if traced else
           "timers only (no traced step: communication and bubble unknown)")
    wait = step_parts.sync_wait_part(pp)
    return (f"{how}; the wait for other ranks in the optimizer window's collectives across stages (sync_wait: "
            f"their time beyond the fastest rank's, step by step) booked as {wait}, not optimizer; means over the "
            f"measured steps and over all {world} ranks (per_rank holds each rank's; steps.csv holds rank 0's "
            f"timers)")


def _header(config, config_dict: dict, status: str, message: str | None, env: dict, ranks: list[dict],
            fault: str | None) -> dict:
    """What ran, where and with what software."""
    from planner import __version__ as planner_version

    world = len(ranks)
    return {
        "schema_version": SCHEMA_VERSION, "run_name": config.run_name,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "status": status, "message": message,
        # Every ModelSpec field (the MoE ones too: experts, top_k, ...), params and active params.
        "model": {**{k: v for k, v in config_dict["model"].items() if k != "attention"},
                  "params": config.spec.params, "active_params": config.spec.active_params},
        "layout": {**config_dict["layout"], "grad_accum": config.layout.grad_accum},
        "precision": config.training.precision, "attention": config.attention,
        "hardware": {"device_kind": env["device_kind"], "device_name": env["device_name"], "device_count": world,
                     "nodes": max(1, world // max(1, env["local_world_size"])),
                     "hostnames": sorted({r["hostname"] for r in ranks}), "cpu_cores": env["cpu_cores"],
                     "device_memory_bytes": env.get("device_memory_bytes")},
        "software": {k: env.get(k) for k in ("python", "torch", "numpy", "platform", "backend", "cuda", "nccl",
                                             "driver")}
        | {"planner": planner_version, "git_commit": _git_commit()},
        "config": config_dict, "fault_injection": fault,
    }


def _throughput(config, median_step_s: float, world: int, env: dict) -> dict:
    """Tokens per second at the median step, the model FLOP/s each device achieved, and MFU."""
    from planner.core.flops import model_flops_per_token

    tokens_per_step = config.layout.global_batch * config.spec.seq_len
    tokens_per_s = tokens_per_step / median_step_s
    flops_per_token = model_flops_per_token(config.spec)
    achieved = flops_per_token * tokens_per_s / world
    peak, peak_source = _peak(config, env)
    return {"tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_s, "model_flops_per_token": flops_per_token,
            "achieved_flops_per_device": achieved, "achieved_tflops_per_device": achieved / 1e12,
            "peak_flops_per_device": peak, "peak_flops_source": peak_source,
            "mfu": achieved / peak if peak else None}


def _breakdown(per_rank: list[dict]) -> dict:
    """The step's parts, means over ranks; communication and bubble None when no step was traced."""
    breakdown = {k: _mean([b[k] for b in per_rank]) for k in BREAKDOWN_KEYS}
    for k in ("compute", "data_wait", "optimizer", "other"):
        breakdown[k] = breakdown[k] or 0.0
    traced_any = breakdown["comm_exposed"] is not None
    breakdown["comm_hidden"] = (max(0.0, breakdown["comm_total"] - breakdown["comm_exposed"]) if traced_any else None)
    return breakdown


def _shares(lay, breakdown: dict, per_rank: list[dict], ranks: list[dict], median_step_s: float) -> dict:
    """Bubble, communication and data wait as shares of the mean step; the bubble per pipeline stage."""
    step_mean = _mean([b["step"] for b in per_rank]) or median_step_s

    def share(v: float | None) -> float | None:
        return None if v is None else min(1.0, max(0.0, v / step_mean))

    per_stage = []
    for stage in range(lay.pp):
        mine = [b for b, r in zip(per_rank, ranks) if r["pp_rank"] == stage]
        bubble = _mean([b["bubble"] for b in mine])
        per_stage.append({"pp_rank": stage, "bubble_s": bubble, "compute_s": _mean([b["compute"] for b in mine]),
                          "bubble_fraction": share(bubble)})
    return {"bubble_fraction": share(breakdown["bubble"]),
            # (p-1)/(v*m) of the ideal step (Narayanan et al. 2021, Sec. 2.2.2)
            "bubble_fraction_ideal": (lay.pp - 1) / (lay.vpp * lay.grad_accum) if lay.pp > 1 else 0.0,
            "comm_share": share(breakdown["comm_exposed"]), "data_wait_share": share(breakdown["data_wait"]) or 0.0,
            "per_stage": per_stage}


def _memory(ranks: list[dict]) -> dict:
    memories = [r["memory"] for r in ranks]
    return {"kind": memories[0]["kind"], "peak_allocated_bytes": max(m["peak_allocated_bytes"] for m in memories),
            "peak_reserved_bytes": (max(m["peak_reserved_bytes"] for m in memories)
                                    if memories[0]["peak_reserved_bytes"] is not None else None),
            "capacity_bytes": memories[0]["capacity_bytes"],
            "per_rank_peak_bytes": [m["peak_allocated_bytes"] for m in memories],
            # the most any rank's caching allocator retried (None on a CPU)
            "alloc_retries": (max(m["alloc_retries"] for m in memories)
                              if memories[0].get("alloc_retries") is not None else None)}


def _nvml_summary(ranks: list[dict]) -> dict | None:
    """The NVML samplers' figures over ranks; None where no rank sampled."""
    summaries = [r["nvml"] for r in ranks if r["nvml"]]
    if not summaries:
        return None
    energies = [s["energy_j"] for s in summaries if s["energy_j"] is not None]
    return {"per_rank": summaries, "gpu_util_mean_percent": _mean([s["gpu_util_mean_percent"] for s in summaries]),
            "power_mean_w": _mean([s["power_mean_w"] for s in summaries]),
            "memory_used_max_bytes": max((s["memory_used_max_bytes"] or 0) for s in summaries),
            "energy_j_total": sum(energies) if energies else None}


def _cpu(ranks: list[dict], env: dict) -> dict:
    world = len(ranks)
    wall = max(r["wall_s"] for r in ranks)
    cpu_s = sum(r["cpu_s"] for r in ranks)
    return {"processes": world, "cores": env["cpu_cores"], "process_cpu_s": cpu_s, "wall_s": wall,
            "utilization_cores": cpu_s / wall / max(1, world // max(1, env["local_world_size"]))}


def _loss_summary(rows: list[dict]) -> dict:
    """First, last and lowest loss, the non-finite steps, the last loss scale; non-finite values as None."""
    losses = [r["loss"] for r in rows]
    finite = [x for x in losses if x is not None and math.isfinite(x)]
    nonfinite = len(losses) - len(finite)
    scales = [r["loss_scale"] for r in rows if r["loss_scale"] is not None]
    loss = {"first": losses[0] if losses and finite else None, "last": losses[-1] if losses else None,
            "min": min(finite) if finite else None, "nonfinite_steps": nonfinite, "any_nonfinite": nonfinite > 0,
            "final_loss_scale": scales[-1] if scales else None}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in loss.items()}


def _flags(rec: dict) -> list[dict]:
    """The troubleshooting checks, each with its likely fix."""
    out = []
    checks = [("comm_share", COMM_SHARE_LIMIT, "communication over 15% of the step: keep tp inside a node, "
                                               "raise micro_batch or grad accumulation, overlap DP reduction"),
              ("bubble_fraction", BUBBLE_LIMIT, "pipeline bubble over 15%: more micro-batches per step, "
                                                "interleaving (vpp), or fewer pipeline stages"),
              ("data_wait_share", DATA_WAIT_LIMIT, "data wait over 10% of the step: more loader workers, "
                                                   "a deeper prefetch, or faster storage")]
    for key, limit, advice in checks:
        if rec[key] is not None and rec[key] > limit:
            out.append({"check": key, "value": rec[key], "limit": limit, "advice": advice})
    if rec["loss"]["any_nonfinite"]:
        out.append({"check": "nonfinite_loss", "value": rec["loss"]["nonfinite_steps"], "limit": 0,
                    "advice": "non-finite loss: lower lr, keep clipping on, prefer bf16 to fp16"})
    mem = rec["memory"]
    if mem["capacity_bytes"] and mem["peak_reserved_bytes"] and \
            mem["peak_reserved_bytes"] > (1 - MEMORY_HEADROOM) * mem["capacity_bytes"]:
        out.append({"check": "memory_headroom", "value": mem["peak_reserved_bytes"] / mem["capacity_bytes"],
                    "limit": 1 - MEMORY_HEADROOM, "advice": "memory within 5% of capacity: recompute, ZeRO, "
                                                            "smaller micro_batch, or more tp/pp"})
    if mem.get("alloc_retries"):
        out.append({"check": "alloc_retries", "value": mem["alloc_retries"], "limit": 0,
                    "advice": "the caching allocator ran out of free blocks and released its cache to retry "
                              "(each retry synchronises the device): steps slow down and peak_reserved_bytes "
                              "is the ceiling it hit; leave headroom (recompute, a smaller micro_batch, ZeRO) "
                              "or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"})
    return out


def _git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def write_record(run_dir: Path, rec: dict) -> Path:
    """Written aside, then renamed: a reader never sees half a record."""
    path = Path(run_dir) / RECORD_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def summary(rec: dict) -> str:
    """A few lines for the console: the measured figures and any troubleshooting flags."""
    b = rec["breakdown_s"]
    fmt = lambda v: "n/a" if v is None else f"{v * 1e3:.1f} ms"  # noqa: E731
    pct = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    mfu = "n/a" if rec["mfu"] is None else f"{rec['mfu']:.1%}"
    lines = [f"status {rec['status']}: {rec['steps']['completed']}/{rec['steps']['total']} steps; "
             f"loss {rec['loss']['first']} -> {rec['loss']['last']}",
             f"step {rec['step_time_s']['median'] * 1e3:.1f} ms median (p10 {rec['step_time_s']['p10'] * 1e3:.1f}, "
             f"p90 {rec['step_time_s']['p90'] * 1e3:.1f}); {rec['tokens_per_s']:,.0f} tok/s; "
             f"{rec['achieved_tflops_per_device']:.3g} TFLOP/s per device; MFU {mfu}",
             f"compute {fmt(b['compute'])}, comm exposed {fmt(b['comm_exposed'])} of {fmt(b['comm_total'])}, "
             f"bubble {fmt(b['bubble'])}, data {fmt(b['data_wait'])}, optimizer {fmt(b['optimizer'])}, "
             f"other {fmt(b['other'])}; bubble {pct(rec['bubble_fraction'])}, comm {pct(rec['comm_share'])}",
             f"waiting for other ranks after backward {fmt(b.get('sync_wait'))} (mean over ranks), booked as "
             f"{step_parts.sync_wait_part(rec['layout']['pp'])}",
             f"peak memory {rec['memory']['peak_allocated_bytes'] / 2**20:.0f} MiB ({rec['memory']['kind']})"]
    lines += [f"check {f['check']}: {f['value']:.3g} > {f['limit']}: {f['advice']}" for f in rec["flags"]]
    return "\n".join(lines)
