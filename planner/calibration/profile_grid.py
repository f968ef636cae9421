"""`planner profile`: a grid of short reference-trainer runs, one run record each.

Each run is `python -m reference_trainer.launch ...` in its own process (its output goes to the
run's log file); a failed run is recorded as failed and the grid goes on. The grid's summary,
grid.json, lists every run with its status.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerError
from planner.files import write_atomic

# Tiny shapes a 2-core CPU trains in milliseconds per step (vocab and seq kept small).
CPU_MODELS = {
    "gpt-s": ["--arch", "gpt", "--layers", "4", "--hidden", "128", "--heads", "4", "--vocab", "512",
              "--seq-len", "128", "--dropout", "0"],
    "llama-m": ["--arch", "llama", "--layers", "4", "--hidden", "256", "--heads", "8", "--kv-heads", "4",
                "--vocab", "1024", "--seq-len", "128"],
    "gpt-l": ["--arch", "gpt", "--layers", "8", "--hidden", "256", "--heads", "8", "--vocab", "1024",
              "--seq-len", "256", "--dropout", "0"],
}
# (model, dp, tp, pp, micro_batch, global_batch, recompute). Ordered in pairs of like runs: the
# first of each pair (even index) is calibrated on, the second (odd index) held out, and both
# halves see every mechanism: one process, dp, tp, pp, two-dimensional mixes with pp, full
# recompute (with tp in one half, with dp in both), and each model shape (gpt-s, llama-m, gpt-l).
# The pairs were chosen by what the runs exercise, before any error was looked at; an earlier
# order put all three full-recompute runs in the held-out half. ``held_out`` finds a run's half
# by its configuration, so records named under that order split the same way.
GRIDS: dict[str, list[tuple[str, int, int, int, int, int, str]]] = {
    "cpu": [
        ("gpt-s", 1, 1, 1, 4, 16, "none"), ("llama-m", 1, 1, 1, 2, 8, "none"),  # one process
        ("llama-m", 2, 1, 1, 4, 16, "none"), ("gpt-s", 2, 1, 1, 2, 16, "none"),  # dp
        ("llama-m", 1, 2, 1, 4, 8, "full"), ("gpt-s", 1, 2, 1, 8, 16, "none"),  # tp
        ("gpt-s", 1, 1, 2, 1, 16, "none"), ("llama-m", 1, 1, 2, 2, 16, "none"),  # pp
        ("gpt-s", 2, 2, 1, 4, 16, "full"), ("gpt-l", 2, 1, 1, 2, 8, "full"),  # dp, full recompute
        ("gpt-l", 1, 2, 2, 2, 8, "none"), ("llama-m", 2, 1, 2, 2, 16, "none"),  # pp with tp or dp (4 processes)
        ("gpt-l", 1, 1, 1, 1, 4, "none"), ("gpt-l", 1, 1, 2, 4, 16, "none"),  # gpt-l alone and in pp
    ],
}
GRIDS["cpu-ci"] = GRIDS["cpu"][:10]
# One GPU: a grid over model size, sequence length, micro-batch and recompute, in bf16.
GPU_MODELS = {
    "gpt3-125m-s1k": ["--preset", "gpt3-125m", "--seq-len", "1024", "--dropout", "0"],
    "gpt3-350m-s2k": ["--preset", "gpt3-350m", "--seq-len", "2048", "--dropout", "0"],
    "llama-1b-s2k": ["--params", "1B", "--seq-len", "2048"],
    "gpt3-760m-s2k": ["--preset", "gpt3-760m", "--seq-len", "2048", "--dropout", "0"],
}
GRIDS["gpu"] = [
    ("gpt3-125m-s1k", 1, 1, 1, 8, 16, "none"), ("gpt3-125m-s1k", 1, 1, 1, 16, 32, "none"),
    ("gpt3-350m-s2k", 1, 1, 1, 4, 8, "none"), ("gpt3-350m-s2k", 1, 1, 1, 8, 16, "selective"),
    ("llama-1b-s2k", 1, 1, 1, 4, 8, "none"), ("llama-1b-s2k", 1, 1, 1, 8, 16, "full"),
    ("gpt3-760m-s2k", 1, 1, 1, 4, 8, "full"), ("gpt3-760m-s2k", 1, 1, 1, 8, 16, "none"),
]
MODELS = {**CPU_MODELS, **GPU_MODELS}


def run_name(i: int, model: str, dp: int, tp: int, pp: int, mb: int, rc: str) -> str:
    return f"{i:02d}-{model}-dp{dp}tp{tp}pp{pp}-mb{mb}-{rc}"


def held_out(label: str, grid: str = "cpu") -> bool:
    """Whether the run named ``label`` (``NN-model-dpXtpYppZ-mbM-recompute``, its folder name) is
    the held-out one of its pair in ``grid``: found by its configuration, not its index."""
    halves = {run_name(i, m, dp, tp, pp, mb, rc).split("-", 1)[1]: i % 2 == 1
              for i, (m, dp, tp, pp, mb, _, rc) in enumerate(GRIDS[grid])}
    key = label.split("-", 1)[-1]
    if key not in halves:
        raise PlannerError("run", label, f"not a run of grid {grid} (NN-model-dpXtpYppZ-mbM-recompute)")
    return halves[key]


@dataclass(frozen=True, kw_only=True, slots=True)
class GridRun:
    name: str
    argv: tuple[str, ...]


def grid_runs(grid: str, steps: int, runs_dir: Path, profile: str | None) -> list[GridRun]:
    if grid not in GRIDS:
        raise PlannerError("grid", grid, f"one of {', '.join(GRIDS)}")
    if steps < 4:
        raise PlannerError("steps", steps, "at least 4 (the first steps are warm-up, left out of the timing)")
    out = []
    for i, (model, dp, tp, pp, mb, gb, rc) in enumerate(GRIDS[grid]):
        name = run_name(i, model, dp, tp, pp, mb, rc)
        precision = "bf16" if grid.startswith("gpu") else "fp32"
        argv = [*MODELS[model], "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--micro-batch", str(mb),
                "--global-batch", str(gb), "--recompute", rc, "--precision", precision, "--steps", str(steps),
                "--profile-warmup-steps", "2", "--checkpoint-interval", "0", "--run-name", name,
                "--runs-dir", str(runs_dir), "--log-every", str(steps)]
        if not grid.startswith("gpu"):
            # Synthetic tokens made in the training process: a loader worker would be one more
            # process importing torch (about 2 s of a 10 s run on 2 cores) and competing with the
            # ranks for the cores, to prefetch what takes microseconds to make.
            argv += ["--workers", "0"]
        if profile:
            argv += ["--gpu", profile]
        out.append(GridRun(name=name, argv=tuple(argv)))
    return out


def _run_logged(cmd: list[str], log: Path, timeout_s: float) -> int:
    """Run ``cmd`` in its own process group, output to ``log``; past the timeout, stop the whole
    group: SIGTERM first (torchrun passes it on to its ranks, which run in sessions of their own),
    SIGKILL after a grace period, so no orphan keeps a core busy. OpenMP's threads wait passively
    (``OMP_WAIT_POLICY=PASSIVE`` unless set): spinning, they took one step from 90 ms to 10 s on a
    loaded 2-core host (tests/trainer/test_calibration_e2e.py)."""
    import os

    env = {**os.environ}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process_group(proc)
            fh.write(f"\nstopped after {timeout_s:g} s\n")
            return -1
        except BaseException:  # Ctrl-C, or SIGTERM to the grid (run_grid): take the run down with it
            stop_process_group(proc)
            raise


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to ``proc``'s process group (started with start_new_session), SIGKILL after ``grace_s``."""
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:  # the group is gone already
        proc.wait()


class Terminated(SystemExit):
    """SIGTERM reached the grid: the run in flight is stopped, then the grid exits (128 + 15)."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated(143)


LAUNCHER = ("-m", "reference_trainer.launch")


def run_grid(runs: list[GridRun], runs_dir: Path, timeout_s: float = 600.0,
             launcher: tuple[str, ...] = LAUNCHER) -> list[dict]:
    """Run each in turn (``sys.executable`` + ``launcher`` + the run's flags); one progress line per
    run on stderr; grid.json at the end (and after each). A SIGTERM to this process stops the run
    in flight (its whole process group), then ends the grid with exit code 143: no orphan."""
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return _run_all(runs, runs_dir, timeout_s, launcher)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _run_all(runs: list[GridRun], runs_dir: Path, timeout_s: float, launcher: tuple[str, ...]) -> list[dict]:
    runs_dir.mkdir(parents=True, exist_ok=True)
    summary: list[dict] = []
    for i, run in enumerate(runs, 1):
        log = runs_dir / f"{run.name}.log"
        start = time.perf_counter()
        print(f"[{i:>2}/{len(runs)}] {run.name:<40}", end="", file=sys.stderr, flush=True)
        rc = _run_logged([sys.executable, *launcher, *run.argv], log, timeout_s)
        seconds = time.perf_counter() - start
        record = runs_dir / run.name / "record.json"
        entry = {"name": run.name, "argv": list(run.argv), "exit_code": rc, "seconds": seconds, "log": str(log),
                 "record": str(record) if record.exists() else None}
        if rc == 0 and record.exists():
            rec = json.loads(record.read_text())
            entry["status"] = "ok"
            print(f" ok   {seconds:5.1f} s  (step {rec['step_time_s']['median'] * 1e3:.1f} ms)", file=sys.stderr)
        else:
            entry["status"] = "failed"
            tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            print(f" FAILED (exit {rc}) {seconds:5.1f} s: {tail[0][:80] if tail else ''}", file=sys.stderr)
        summary.append(entry)
        write_atomic(runs_dir / "grid.json", json.dumps(summary, indent=1))
    return summary
