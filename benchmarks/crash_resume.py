"""Crash and resume: kill the reference trainer at random points, relaunch, and check that every
restart resumes from the newest good checkpoint and continues bitwise identically.

    python benchmarks/crash_resume.py [--kills 20] [--seed 0] [--steps 20]

One uninterrupted reference run (dp=2 under torchrun, dropout and a loader worker, so RNG and data
position matter; a checkpoint every 2 steps, keep_last 2), then the same run killed ``--kills``
times, alternating the two ways a job dies:
- *whole job*: SIGKILL to the launcher's process group and to every rank (they run in their own
  sessions);
- *launcher alone*: SIGKILL to torchrun only; the ranks must die with it (parent-death signal),
  which is checked: no process of the job may be alive 10 s later.
Kill points are random: after a random step of this launch (plus 0-50 ms), or mid-save (a
``stall`` fault holds rank 0 inside the save of a random checkpoint step, after its shards are
written and before the commit). Before each relaunch the newest committed checkpoint is noted;
the relaunch must say it resumed from exactly that one. At the end the newest checkpoint's bytes
are corrupted (same size) and record.json removed: the last relaunch must skip it, fall back to
the previous one and rebuild the record. The losses, learning rates and gradient norms of
steps.csv must equal the reference's bitwise (their repr). Prints the figures; exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "dropout": 0.1}
COLUMNS = ("step", "loss", "lr", "grad_norm", "skipped")
COMMITTED = re.compile(r"step_(\d{8})")
JOB_TIMEOUT_S = 180


def write_config(folder: Path, steps: int) -> Path:
    config = {"run_name": "crash", "runs_dir": str(folder / "runs"), "seed": 1234, "model": MODEL,
              "layout": {"dp": 2, "micro_batch": 2, "global_batch": 8},
              "training": {"steps": steps, "lr": 1e-3, "warmup_steps": 2}, "data": {"workers": 1},
              "checkpoint": {"interval": 2, "keep_last": 2, "auto_resume": True},
              "profile": {"warmup_steps": 1, "trace_steps": 0}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "crash.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start(config: Path, log: Path, fault: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "REFERENCE_TRAINER_FAULT")}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env["REFERENCE_TRAINER_FAULT"] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "reference_trainer", "--config", str(config)]
    with open(log, "w") as out:  # the launcher leads its own process group (killpg below spares us)
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc: ranks and their loader workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(log: Path, proc: subprocess.Popen, pattern: re.Pattern) -> bool:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        if pattern.search(log.read_text(errors="replace")):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def kill(proc: subprocess.Popen, whole: bool) -> list[int]:
    """SIGKILL the whole job or the launcher alone; returns the job's processes alive 10 s later."""
    job = descendants(proc.pid)
    if whole:
        with contextlib.suppress(ProcessLookupError):  # the launcher may have exited on its own
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in job:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    else:
        proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in job):
        time.sleep(0.05)
    return [p for p in job if alive(p)]


def newest_committed(run: Path) -> int:
    folder = run / "checkpoints"
    steps = [int(m.group(1)) for p in folder.iterdir() if (m := COMMITTED.fullmatch(p.name))] if folder.is_dir() else []
    return max(steps, default=0)


def resumed_from(text: str) -> int:
    m = re.search(r"resumed from step_\d{8} \(step (\d+)\)", text)
    return int(m.group(1)) if m else 0


def csv_rows(run: Path) -> list[tuple[str, ...]]:
    import csv

    with open(run / "steps.csv", newline="") as f:
        return [tuple(row[c] for c in COLUMNS) for row in csv.DictReader(f)]


def corrupt_newest(run: Path) -> str:
    """Flip bytes in the middle of the newest checkpoint's largest shard, keeping its size."""
    newest = run / "checkpoints" / f"step_{newest_committed(run):08d}"
    shard = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    return newest.name


def crash_series(folder: Path, kills: int, steps: int, seed: int, say=print) -> dict:
    """The reference run, ``kills`` killed launches, then the corrupted-checkpoint relaunch.
    Returns the figures; ``failures`` lists what went wrong (empty: all good)."""
    rng = random.Random(seed)
    failures: list[str] = []
    ref_cfg = write_config(folder / "reference", steps)
    log = folder / "reference.log"
    proc = start(ref_cfg, log, None)
    if proc.wait(timeout=JOB_TIMEOUT_S) != 0:
        return {"failures": [f"reference run failed:\n{log.read_text()[-3000:]}"]}
    reference = csv_rows(folder / "reference" / "runs" / "crash")
    config = write_config(folder / "crashed", steps)
    run = folder / "crashed" / "runs" / "crash"
    figures = {"kills": 0, "whole_job": 0, "launcher_only": 0, "mid_save": 0, "resumes": 0,
               "resumed_from_newest": 0, "orphans": 0}
    for i in range(kills):
        expected = newest_committed(run) if run.exists() else 0
        whole = i % 2 == 0
        saves = [s for s in range(expected + 2, steps + 1, 2)]
        mid_save = bool(saves) and rng.random() < 0.4
        log = folder / f"kill{i:02d}.log"
        if mid_save:
            target = rng.choice(saves)
            proc = start(config, log, f"stall:rank=0:step={target}:at=save:seconds=60")
            hit = wait_for(log, proc, re.compile(rf"fault: stalling in save of step {target}\b"))
        else:
            target = rng.randint(expected + 1, steps - 1) if expected + 1 <= steps - 1 else steps
            proc = start(config, log, None)
            hit = wait_for(log, proc, re.compile(rf"step {target}/{steps}\b"))
            time.sleep(rng.uniform(0, 0.05))
        orphans = kill(proc, whole)
        text = log.read_text(errors="replace")
        got = resumed_from(text)
        figures["kills"] += 1
        figures["whole_job" if whole else "launcher_only"] += 1
        figures["mid_save"] += int(mid_save and hit)
        figures["resumes"] += int(expected > 0)
        figures["orphans"] += len(orphans)
        if got == expected:
            figures["resumed_from_newest"] += 1
        else:
            failures.append(f"kill {i}: resumed from step {got}, newest committed was {expected}")
        if orphans:
            failures.append(f"kill {i} ({'whole job' if whole else 'launcher alone'}): processes {orphans} survived")
        if not hit:
            failures.append(f"kill {i}: never reached its kill point ({'save' if mid_save else 'step'} {target}):\n"
                            + text[-2000:])
        say(f"kill {i + 1}/{kills}: {'whole job' if whole else 'launcher alone'} "
            f"{'mid-save of step' if mid_save else 'after step'} {target}; this launch resumed from step {got} "
            f"(newest committed {expected}); {len(orphans)} processes left")
    # Run to the end, then corrupt the newest checkpoint (same size), drop the record, relaunch.
    for name, fault in (("finish", None), ("corrupted", "corrupt")):
        expected = newest_committed(run)
        bad = ""
        if fault:
            bad = corrupt_newest(run)
            (run / "record.json").unlink(missing_ok=True)
            expected = max((int(m.group(1)) for p in (run / "checkpoints").iterdir()
                            if (m := COMMITTED.fullmatch(p.name)) and p.name != bad), default=0)
        log = folder / f"{name}.log"
        proc = start(config, log, None)
        rc = proc.wait(timeout=JOB_TIMEOUT_S)
        text = log.read_text(errors="replace")
        figures["resumes"] += int(expected > 0)
        if rc != 0:
            failures.append(f"{name} launch exited {rc}:\n{text[-3000:]}")
        got = resumed_from(text)
        if got == expected:
            figures["resumed_from_newest"] += 1
        else:
            failures.append(f"{name} launch: resumed from step {got}, newest good was {expected}")
        if fault and f"warning: skipping checkpoint {bad}" not in text:
            failures.append(f"corrupted {bad} was not skipped:\n{text[-3000:]}")
        if not (run / "record.json").exists():
            failures.append(f"{name} launch left no record.json")
        say(f"{name}: resumed from step {got} (expected {expected})" + (f"; {bad} corrupted and skipped" if bad else ""))
    got_rows = csv_rows(run)
    figures["identical"] = got_rows == reference
    if not figures["identical"]:
        diff = [(a, b) for a, b in zip(got_rows, reference) if a != b][:3]
        failures.append(f"steps.csv differs from the reference ({len(got_rows)} vs {len(reference)} rows): {diff}")
    figures["launches"] = kills + 2
    figures["failures"] = failures
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        f = crash_series(Path(tmp), a.kills, a.steps, a.seed)
    print(f"\n{f.get('kills', 0)} kills ({f.get('whole_job', 0)} whole job, {f.get('launcher_only', 0)} launcher "
          f"alone, {f.get('mid_save', 0)} mid-save) + finish + corrupted-checkpoint relaunch: "
          f"{f.get('resumed_from_newest', 0)}/{f.get('launches', 0)} launches resumed from the newest good "
          f"checkpoint ({f.get('resumes', 0)} resumes); orphaned processes {f.get('orphans', 0)}; steps.csv "
          f"bitwise equal to the uninterrupted run: {f.get('identical')}; {time.perf_counter() - t0:.0f} s")
    for line in f["failures"]:
        print(f"FAIL: {line}")
    return 1 if f["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
