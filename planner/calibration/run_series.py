"""A run's measured figures as the reference trainer writes them, step by step, read while the
run goes (the explorer's live view, planner.app.live, draws them). No torch, no tensorboard.

- TensorBoard event files, ``<run>/tensorboard/events.out.tfevents.*`` (``profile.tensorboard:
  true``), parsed here directly: a file is a sequence of TFRecords (uint64 length, uint32 masked
  CRC of the length, the payload, uint32 masked CRC of the payload;
  tensorflow/core/lib/io/record_writer.cc), each payload an ``Event`` protobuf
  (tensorflow/core/util/event.proto: 1 wall_time double, 2 step int64, 5 summary) whose
  ``Summary.Value`` (tensorflow/core/framework/summary.proto: 1 tag, 2 simple_value float,
  8 tensor) carries one scalar. A record still being written is left out; CRCs are not checked.
- Otherwise ``<run>/steps.csv`` (always written), under the same tags.
"""

from __future__ import annotations

import csv
import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EVENTS_DIR = "tensorboard"
EVENTS_GLOB = "events.out.tfevents.*"
STEPS_FILE = "steps.csv"

Series = dict[str, list[tuple[int, float]]]  # tag -> [(step, value)], sorted by step


# --- TensorBoard event files: TFRecord framing + Event protobufs ---------------------------------
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of a protobuf message: int for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def records(data: bytes) -> Iterator[bytes]:
    """The payloads of a TFRecord stream; stops at a record not completely written yet."""
    i = 0
    while i + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        if i + 12 + n + 4 > len(data):
            return
        yield data[i + 12:i + 12 + n]
        i += 12 + n + 4


def _tensor_scalar(buf: bytes) -> float | None:
    """The first value of a TensorProto (tensorflow/core/framework/tensor.proto): float_val (5),
    double_val (6), int_val (7), int64_val (10), or tensor_content (4) by dtype (1: float, 2: double)."""
    dtype, content = 1, None
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4:
            content = value
        elif number == 5:
            return struct.unpack_from("<f", value)[0]
        elif number == 6:
            return struct.unpack_from("<d", value)[0]
        elif number in (7, 10):
            return float(value if wire == 0 else _varint(value, 0)[0])
    if content:
        if dtype == 1 and len(content) >= 4:
            return struct.unpack_from("<f", content)[0]
        if dtype == 2 and len(content) >= 8:
            return struct.unpack_from("<d", content)[0]
    return None


def event_scalars(payload: bytes) -> tuple[int, float, list[tuple[str, float]]]:
    """(step, wall time, [(tag, value)]) of one Event; no scalars for other events."""
    step, wall, found = 0, 0.0, []
    for number, _, value in _fields(payload):
        if number == 1:
            wall = struct.unpack("<d", value)[0]
        elif number == 2:
            step = value
        elif number == 5:
            for n, _, v in _fields(value):
                if n != 1:
                    continue
                tag, scalar = None, None
                for vn, _, vv in _fields(v):
                    if vn == 1:
                        tag = vv.decode("utf-8", "replace")
                    elif vn == 2:
                        scalar = struct.unpack("<f", vv)[0]
                    elif vn == 8 and scalar is None:
                        scalar = _tensor_scalar(vv)
                if tag is not None and scalar is not None:
                    found.append((tag, float(scalar)))
    return step, wall, found


@functools.lru_cache(maxsize=64)
def _file_scalars(path: str, mtime_ns: int, size: int) -> tuple[tuple[int, float, tuple[tuple[str, float], ...]], ...]:
    """One event file's scalar events, remembered while the file is unchanged (mtime, size)."""
    out = []
    with open(path, "rb") as fh:
        data = fh.read(size)
    for payload in records(data):
        try:
            step, wall, scalars = event_scalars(payload)
        except (ValueError, struct.error, UnicodeDecodeError):
            continue  # not an event we can read: skipped, never fatal for a live view
        if scalars:
            out.append((step, wall, tuple(scalars)))
    return tuple(out)


def read_events(folder: str | Path) -> tuple[Series, float | None]:
    """Every scalar in a folder's event files, and the newest event's wall time. Files are read
    oldest first, so after a resume the later value of a step wins."""
    by_tag: dict[str, dict[int, float]] = {}
    newest = None
    for path in sorted(Path(folder).glob(EVENTS_GLOB)):
        st = path.stat()
        for step, wall, scalars in _file_scalars(str(path), st.st_mtime_ns, st.st_size):
            for tag, value in scalars:
                by_tag.setdefault(tag, {})[step] = value
            newest = wall if newest is None else max(newest, wall)
    return {tag: sorted(points.items()) for tag, points in by_tag.items()}, newest


# --- the per-step CSV, as the same tags ----------------------------------------------------------
CSV_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "step_s": "step_time_s/measured",
            "tokens_per_s": "throughput/tokens_per_s", "data_wait_s": "timers_s/data_wait",
            "fwd_bwd_s": "timers_s/fwd_bwd", "optimizer_s": "timers_s/optimizer",
            "gpu_util_percent": "gpu/util_percent", "power_w": "gpu/power_w"}


def read_csv(path: str | Path) -> Series:
    """steps.csv's columns under the event files' tags; a line still being written is left out."""
    out: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if "step" not in header:
            return {}
        for row in reader:
            if len(row) != len(header):
                continue
            try:
                step = int(float(row[header.index("step")]))
                values = {CSV_TAGS[h]: float(v) for h, v in zip(header, row) if h in CSV_TAGS and v.strip()}
            except ValueError:
                continue
            for tag, value in values.items():
                out.setdefault(tag, []).append((step, value))
    return out


# --- which runs, and what they measured --------------------------------------------------------
def live_runs(runs_dir: str | Path) -> list[str]:
    """Run folders with event files or a per-step CSV (running or finished), newest first."""
    found: dict[Path, float] = {}
    for pattern in (f"*/{EVENTS_DIR}/{EVENTS_GLOB}", f"*/{STEPS_FILE}"):
        for p in Path(runs_dir).glob(pattern):
            run = p.parent.parent if p.parent.name == EVENTS_DIR else p.parent
            found[run] = max(found.get(run, 0.0), p.stat().st_mtime)
    return [p.name for p in sorted(found, key=found.get, reverse=True)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    source: str  # the folder or file read
    series: Series
    newest_wall_s: float | None  # the last event's wall time (event files only)


def read_run(run: str | Path) -> Measured | None:
    """The event files when they hold scalars, else steps.csv; None when neither exists yet."""
    run = Path(run)
    events = run / EVENTS_DIR
    if events.is_dir():
        series, newest = read_events(events)
        if series:
            return Measured(source=str(events), series=series, newest_wall_s=newest)
    if (run / STEPS_FILE).is_file():
        return Measured(source=str(run / STEPS_FILE), series=read_csv(run / STEPS_FILE), newest_wall_s=None)
    return None
