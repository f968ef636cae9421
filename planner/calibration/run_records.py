"""Run records for the explorer's Runs tab, on top of `planner validate`'s own pieces.

Loading and pairing are planner.calibration.measured and .validate (what `planner validate` runs), so the
page's table and plot are the CLI's. This module adds what the page needs besides: uploaded records,
one prediction per run (so a run no profile matches is named, not fatal), the `planner validate`
command line, and the per-step CSV of a run in progress.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerError

RECORD_FILE = "record.json"
ROOTS_ENV = "PLANNER_RUNS_ROOTS"  # folders the explorer may read runs from, os.pathsep-separated


def runs_roots() -> list[Path]:
    """Where the explorer's Runs tab may read: $PLANNER_RUNS_ROOTS, else the working directory's
    ``runs/`` and the committed runs (``benchmarks/runs``). A typed path outside is refused, so a
    visitor of a served explorer cannot browse the server's files."""
    configured = os.environ.get(ROOTS_ENV)
    if configured:
        return [Path(p).resolve() for p in configured.split(os.pathsep) if p]
    return [Path("runs").resolve(), Path(__file__).resolve().parents[2] / "benchmarks" / "runs"]


def runs_folder_problem(folder: str | Path) -> str | None:
    """Why the explorer must not read ``folder`` (outside every root, after resolving '..' and
    symbolic links), or None."""
    path, roots = Path(folder).resolve(), runs_roots()
    if any(path == root or root in path.parents for root in roots):
        return None
    return (f"runs folder {str(folder)!r}: the explorer reads runs only under {', '.join(map(str, roots))} "
            f"(set {ROOTS_ENV} to allow other folders)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Loaded:
    runs: tuple  # planner.calibration.measured.Measurement, one per good record
    skipped: tuple[str, ...]  # "where: why", one line per record that did not parse


def load_folder(folder: str | Path) -> Loaded:
    """Every record.json under ``folder`` (completed runs), bad ones named and skipped."""
    from planner.calibration.measured import load_measurements

    if not any(Path(folder).glob(f"**/{RECORD_FILE}")):
        return Loaded(runs=(), skipped=())
    runs, skipped = load_measurements([str(folder)])
    return Loaded(runs=tuple(runs), skipped=tuple(skipped))


def load_uploaded(files: Sequence[tuple[str, bytes]]) -> Loaded:
    """Uploaded records, each through the same loader (from a temporary file)."""
    from planner.calibration.measured import load_measurements

    runs, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, content) in enumerate(files):
            path = Path(tmp) / str(i) / RECORD_FILE
            path.parent.mkdir()
            path.write_bytes(content)
            got, bad = load_measurements([str(path)])
            runs += got
            skipped += [line.replace(str(path), name) for line in bad]
    return Loaded(runs=tuple(runs), skipped=tuple(skipped))


@dataclass(frozen=True, kw_only=True, slots=True)
class Compared:
    points: tuple  # planner.calibration.validate.Point
    unpredicted: tuple[str, ...]  # "run: why" for runs the planner could not predict


def compare(runs: Sequence, profile: str | None) -> Compared:
    """`planner validate`'s comparison, run by run: ``profile`` for all, or (None) the profile each
    run names or whose GPU it ran on."""
    from planner.calibration.validate import compare as validate_compare
    from planner.hardware import get_profile

    override = get_profile(profile) if profile else None
    points, unpredicted = [], []
    for run in runs:
        try:
            points += validate_compare([run], override)
        except PlannerError as exc:
            unpredicted.append(f"{run.label}: {exc}")
    return Compared(points=tuple(points), unpredicted=tuple(unpredicted))


# The committed calibrated CPU profile (hardware_profiles/calibrated/cpu-2core.toml, fitted by
# `planner calibrate` on the runs in benchmarks/runs/cpu-2core): what a CPU run that names no
# profile is predicted on by default (its device, "AMD EPYC" say, is no GPU profile's).
CPU_PROFILE = "cpu-2core"


def default_profile(runs: Sequence, names: Sequence[str] | None = None) -> str | None:
    """The profile the Runs tab predicts on unless the user picks one: ``CPU_PROFILE`` when every
    run is a CPU run (a CPU's name matches no GPU profile, and a probed profile a run names is a
    path relative to where it ran), else None ("as recorded": the profile each run names, or the
    one whose GPU it ran on). ``names``: the profile names, when the caller has them."""
    from planner.hardware import profile_names

    cpu = bool(runs) and all(r.device_kind == "cpu" for r in runs)
    return CPU_PROFILE if cpu and CPU_PROFILE in (profile_names() if names is None else names) else None


def point_rows(points: Sequence) -> list[dict]:
    """The validation table: relative errors for rates and sizes, percentage points for fractions;
    ``judged``: False for a time-shared run's shares (planner.calibration.validate)."""
    from planner.calibration.validate import QUANTITIES

    return [{"run": p.run, "quantity": p.quantity, "predicted": p.predicted, "measured": p.measured,
             "error": f"{p.error:+.1%}" if QUANTITIES[p.quantity][1] else f"{p.error * 100:+.1f}pp",
             "judged": p.judged} for p in points]


def run_rows(runs: Sequence) -> list[dict]:
    """One row per loaded run: what ran, on what."""
    return [{"run": r.label, "model": r.model.name, "params": r.model.params,
             "layout": f"dp {r.layout.dp} x tp {r.layout.tp} x pp {r.layout.pp}, mb {r.layout.micro_batch}, "
                       f"gb {r.layout.global_batch}", "precision": r.job.precision, "device": r.device_name,
             "profile": r.hardware_profile or "", "step s": r.step_s} for r in runs]


def validate_command(folder: str, profile: str | None) -> str:
    return shlex.join(["planner", "validate", folder, *(["--gpu", profile] if profile else []),
                       "--plot", "validate.png"])


def plot_png(points: Sequence) -> bytes:
    """`planner validate --plot` as PNG bytes (matplotlib; a few hundred ms, so the page caches it)."""
    from planner.calibration.validate import plot

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "validate.png"
        plot(list(points), str(path))
        return path.read_bytes()
