"""The run-record contract: one JSON file per run plus a per-step CSV, its schema, validator and
loader. The reference trainer writes records to this contract (reference_trainer/record.py);
calibration and validation read them. No torch here: reading a record is cheap.

reference_trainer/README.md documents every field; ``SCHEMA`` below is the same list as the
validator sees it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

# The troubleshooting thresholds a record's flags use are the planner's own (planner.core.checks).
from planner.core.checks import BUBBLE_LIMIT, COMM_SHARE_LIMIT, DATA_WAIT_LIMIT, MEMORY_HEADROOM  # noqa: F401
from planner.core.layout import LAYOUT_DIMS, Layout

SCHEMA_VERSION = 1
RECORD_JSON = "record.json"
STEPS_CSV = "steps.csv"
CSV_COLUMNS = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped", "step_s", "data_wait_s", "fwd_bwd_s",
               "optimizer_s", "sync_wait_s", "tokens_per_s", "traced", "gpu_util_percent", "power_w")

NUM, INT, STR, BOOL, DICT, LIST = "number", "integer", "string", "boolean", "object", "array"
OPT = "?"  # suffix: the field may be null

SCHEMA: dict[str, object] = {
    "schema_version": INT, "run_name": STR, "created_utc": STR, "status": STR, "message": STR + OPT,
    "model": {"name": STR, "arch": STR, "layers": INT, "hidden": INT, "heads": INT, "kv_heads": INT,
              "ffn_hidden": INT, "vocab": INT, "seq_len": INT, "tied_embeddings": BOOL, "params": INT,
              "dropout": NUM},
    # Every layout dimension by its declared name and type (planner.core.layout.LAYOUT_DIMS), and grad_accum.
    "layout": {**{d.name: {int: INT, str: STR, bool: BOOL}[d.type] for d in LAYOUT_DIMS}, "grad_accum": INT},
    "precision": STR, "attention": STR,
    "hardware": {"device_kind": STR, "device_name": STR, "device_count": INT, "nodes": INT, "hostnames": LIST,
                 "cpu_cores": INT, "device_memory_bytes": INT + OPT},
    "software": {"python": STR, "torch": STR, "numpy": STR, "platform": STR, "backend": STR, "cuda": STR + OPT,
                 "nccl": STR + OPT, "planner": STR, "git_commit": STR + OPT},
    "config": DICT, "fault_injection": STR + OPT,
    "steps": {"total": INT, "completed": INT, "resumed_from": INT, "warmup_excluded": INT, "traced": LIST,
              "measured": INT, "skipped": LIST},
    "step_time_s": {"median": NUM, "p10": NUM, "p90": NUM, "mean": NUM},
    "tokens_per_step": INT, "tokens_per_s": NUM, "model_flops_per_token": NUM,
    "achieved_flops_per_device": NUM, "achieved_tflops_per_device": NUM,
    "peak_flops_per_device": NUM + OPT, "peak_flops_source": STR + OPT, "mfu": NUM + OPT,
    "breakdown_s": {"compute": NUM, "comm_total": NUM + OPT, "comm_exposed": NUM + OPT, "comm_hidden": NUM + OPT,
                    "data_wait": NUM, "bubble": NUM + OPT, "optimizer": NUM, "other": NUM},
    "breakdown_source": STR,
    "bubble_fraction": NUM + OPT, "bubble_fraction_ideal": NUM, "comm_share": NUM + OPT, "data_wait_share": NUM,
    "per_stage": LIST,
    "memory": {"kind": STR, "peak_allocated_bytes": INT, "peak_reserved_bytes": INT + OPT,
               "capacity_bytes": INT + OPT, "per_rank_peak_bytes": LIST},
    "nvml": DICT + OPT, "nvml_reason": STR + OPT,
    "cpu": {"processes": INT, "cores": INT, "process_cpu_s": NUM, "wall_s": NUM, "utilization_cores": NUM},
    "checkpoint_s": NUM,
    "loss": {"first": NUM + OPT, "last": NUM + OPT, "min": NUM + OPT, "nonfinite_steps": INT, "any_nonfinite": BOOL,
             "final_loss_scale": NUM + OPT},
    "flags": LIST,
    "files": {"steps_csv": STR},
}

# Fields a record may lack (added after schema version 1 was first written); checked when present.
# A dotted name is a field of an object (``breakdown_s.sync_wait``: records before it booked the
# wait for other ranks in the optimizer window's collectives as optimizer; ``breakdown_s.cp_comm``,
# ``all_to_all`` and ``comm_exposed_tp``: the trainer's timed exchanges and tensor-parallel waits).
OPTIONAL: dict[str, str] = {"per_rank": LIST, "breakdown_s.sync_wait": NUM, "memory.alloc_retries": INT + OPT,
                            "software.driver": STR + OPT, "breakdown_s.cp_comm": NUM, "breakdown_s.all_to_all": NUM,
                            "breakdown_s.comm_exposed_tp": NUM + OPT}


def _nested(fields: dict[str, str]) -> dict[str, dict[str, str]]:
    """The dotted fields of ``fields`` as a schema of objects (``_check_ranges``'): one level."""
    out: dict[str, dict[str, str]] = {}
    for name, kind in fields.items():
        if "." in name:
            outer, key = name.split(".")
            out.setdefault(outer, {})[key] = kind
    return out


_OPTIONAL_NESTED = _nested(OPTIONAL)
_TYPES = {NUM: (int, float), INT: (int,), STR: (str,), BOOL: (bool,), DICT: (dict,), LIST: (list,)}


def _check(data: object, schema: dict, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'record'}: expected an object")
    for key, kind in schema.items():
        name = f"{where}.{key}" if where else key
        if key not in data:
            raise ValueError(f"run record: field '{name}' is missing")
        value = data[key]
        if isinstance(kind, dict):
            _check(value, kind, name)
            continue
        nullable = kind.endswith(OPT)
        base = kind.rstrip(OPT)
        if value is None:
            if not nullable:
                raise ValueError(f"run record: field '{name}' is null, expected {base}")
            continue
        ok = isinstance(value, _TYPES[base]) and not (base in (NUM, INT) and isinstance(value, bool))
        if not ok:
            raise ValueError(f"run record: field '{name}' has type {type(value).__name__}, expected {base}")


# The layout dimensions schema version 1 was written with; a dimension declared since (context
# parallel) takes its declared default in an older record (cp = 1: the run did not use it).
V1_LAYOUT = ("dp", "tp", "pp", "vpp", "micro_batch", "global_batch", "zero_stage", "recompute",
             "sequence_parallel", "schedule")
ADDED_LAYOUT = {f.name: f.default for f in dataclasses.fields(Layout) if f.name not in V1_LAYOUT}


# Sizes and ranges every record is held to (the explorer's uploads, `planner validate` and
# `calibrate`, the trainer's own records and its rebuilds): a record is a few kB to a few MB.
MAX_RECORD_BYTES = 64 << 20
MAX_DEPTH = 32  # the deepest real record is 4 levels; json itself recurses on each level
MAX_STRING = 1 << 20
MAX_INT = 2**53  # an integer beyond exact float range is not a count this planner can use
MAX_STEP_S = 1e6  # eleven days for one step: beyond it, a unit slip or garbage
MAX_BYTES = 2.0**60  # memory of one device (an exbibyte)
# Fields held to finiteness only: a diverging run's loss (and its loss scale) may be any finite value.
SIGNED = frozenset({"loss.first", "loss.last", "loss.min", "loss.final_loss_scale"})
# Numeric fields with their own limits: (lowest, highest), both inclusive; the rest: [0, MAX_INT].
RANGES: dict[str, tuple[float, float]] = {
    **{f"step_time_s.{k}": (1e-9, MAX_STEP_S) for k in ("median", "p10", "p90", "mean")},
    "hardware.device_count": (1, 2**24), "hardware.nodes": (1, 2**24), "hardware.cpu_cores": (0, 2**20),
    "memory.peak_allocated_bytes": (0, MAX_BYTES), "memory.peak_reserved_bytes": (0, MAX_BYTES),
    "memory.capacity_bytes": (0, MAX_BYTES), "hardware.device_memory_bytes": (0, MAX_BYTES),
    "tokens_per_s": (0, 1e18), "achieved_flops_per_device": (0, 1e21), "peak_flops_per_device": (0, 1e21),
    "achieved_tflops_per_device": (0, 1e9), "model_flops_per_token": (0, 1e21),
    "bubble_fraction_ideal": (0, 1), "checkpoint_s": (0, 1e9), "cpu.process_cpu_s": (0, 1e12),
    "cpu.wall_s": (0, 1e12), "cpu.utilization_cores": (0, 2**24),
    # the trainer's booking may leave a part a rounding below zero (compute = window - comm - bubble)
    **{f"breakdown_s.{k}": (-MAX_STEP_S, MAX_STEP_S) for k in ("compute", "comm_total", "comm_exposed", "comm_hidden",
                                                     "data_wait", "bubble", "optimizer", "other", "sync_wait")},
    # timed spans (the trainer's exchanges) and a share of one: never below zero
    **{f"breakdown_s.{k}": (0, MAX_STEP_S) for k in ("cp_comm", "all_to_all", "comm_exposed_tp")},
}


def check_values(data: object, what: str = "run record") -> None:
    """Every value anywhere in a parsed record: nesting at most MAX_DEPTH, numbers finite and
    integers within MAX_INT, strings within MAX_STRING. Iterative: a hostile depth cannot
    exhaust the stack."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{what}: nested deeper than {MAX_DEPTH} levels at '{where}'")
        if isinstance(value, dict):
            stack += [(v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_INT:
                raise ValueError(f"{what}: field '{where}' is an integer of {len(str(abs(value)))} digits; "
                                 f"expected at most {MAX_INT} in magnitude")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"{what}: field '{where}'={value} out of range: expected a finite number")
        elif isinstance(value, str):
            if len(value) > MAX_STRING:
                raise ValueError(f"{what}: field '{where}' is a string of {len(value)} characters; "
                                 f"expected at most {MAX_STRING}")


def _check_ranges(data: dict, schema: dict, where: str) -> None:
    """Each numeric field of the schema within its range (RANGES, else [0, MAX_INT])."""
    for key, kind in schema.items():
        name = f"{where}.{key}" if where else key
        value = data.get(key)
        if isinstance(kind, dict):
            if isinstance(value, dict):
                _check_ranges(value, kind, name)
            continue
        if kind.rstrip(OPT) not in (NUM, INT) or value is None or name in SIGNED:
            continue
        lo, hi = RANGES.get(name, (0, MAX_INT))
        if not lo <= value <= hi:
            raise ValueError(f"run record: field '{name}'={value!r} out of range: expected {lo:g} to {hi:g}")


def validate_record(data: dict) -> dict:
    """Raise ValueError naming the first missing or bad field; return ``data``."""
    check_values(data)
    if isinstance(data, dict) and isinstance(data.get("layout"), dict):
        for name, default in ADDED_LAYOUT.items():
            data["layout"].setdefault(name, default)
    _check(data, SCHEMA, "")
    for name, kind in OPTIONAL.items():
        *outer, key = name.split(".")
        holder = data
        for part in outer:
            holder = holder[part]
        if key in holder:
            _check(holder, {key: kind}, ".".join(outer))
    _check_ranges(data, {**SCHEMA, **{k: v for k, v in OPTIONAL.items() if "." not in k}}, "")
    _check_ranges(data, _OPTIONAL_NESTED, "")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"run record: field 'schema_version' is {data['schema_version']}, expected {SCHEMA_VERSION}")
    if not data["step_time_s"]["median"] > 0:
        raise ValueError("run record: field 'step_time_s.median' must be > 0")
    b = data["breakdown_s"]
    if b.get("comm_exposed") is not None and b.get("comm_total") is not None \
            and b["comm_exposed"] > b["comm_total"] * (1 + 1e-9):  # the exposed part of it cannot exceed it
        raise ValueError(f"run record: field 'breakdown_s.comm_exposed'={b['comm_exposed']} is more than "
                         f"'breakdown_s.comm_total'={b['comm_total']}")
    # A CPU's "peak" is the probe's fitted matmul rate, measured at another moment on cores other
    # processes share: a run may beat it, so its MFU has no upper bound here.
    cpu = (data.get("hardware") or {}).get("device_kind") == "cpu"
    for key in ("bubble_fraction", "comm_share", "data_wait_share", "mfu"):
        v = data[key]
        high = (math.inf if cpu else 1.5) if key == "mfu" else 1.0
        if v is not None and not (0.0 <= v <= high and math.isfinite(v)):
            raise ValueError(f"run record: field '{key}'={v} out of range")
    return data


def load_record(path: str | os.PathLike) -> dict:
    """Read and validate a run record (record.json, or the run folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_JSON
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise ValueError(f"run record {path}: {path.stat().st_size} bytes; expected at most {MAX_RECORD_BYTES}")
        data = parse_json(path.read_bytes(), f"run record {path}")
    except OSError as exc:
        raise ValueError(f"run record {path}: cannot read ({exc.strerror})") from None
    return validate_record(data)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} (expected a finite number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} (expected a finite number)")
    return value


def parse_json(raw: bytes, what: str) -> object:
    """Strict JSON: UTF-8, no NaN/Infinity, no number that overflows a float, no nesting deep
    enough to exhaust the parser's stack; one ValueError naming ``what`` otherwise."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ValueError(f"{what}: nested too deeply (at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: not JSON ({exc})") from None
    except ValueError as exc:  # a non-finite constant, or an integer of more than 4300 digits
        raise ValueError(f"{what}: bad number {str(exc).splitlines()[0]}") from None
