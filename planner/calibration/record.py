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
# wait for other ranks in the optimizer window's collectives as optimizer).
OPTIONAL: dict[str, str] = {"per_rank": LIST, "breakdown_s.sync_wait": NUM, "memory.alloc_retries": INT + OPT,
                            "software.driver": STR + OPT}

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


def validate_record(data: dict) -> dict:
    """Raise ValueError naming the first missing or bad field; return ``data``."""
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
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"run record {path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"run record {path}: not JSON ({exc})") from None
    return validate_record(data)
