"""Faults: what the trainer does about them, and test hooks that inject them.

Defences: ``die_with_parent`` (a rank or torchrun dies with its launcher: Linux's parent-death
signal), ``RunLock`` (one live run per run folder; a dead job's lock is taken over, said in one
line) and ``CheckpointLock`` (the same for the checkpoint folder, which another run name may share).

Test hooks, read from the environment variable REFERENCE_TRAINER_FAULT.

Comma-separated specs, each ``kind:key=value:...``:
  kill:rank=R:step=N:at=step   rank R sends itself SIGKILL in the middle of step N (after backward)
  kill:rank=R:step=N:at=save   rank R sends itself SIGKILL while saving step N's checkpoint
                               (its shards written, the checkpoint not yet committed)
  stall:rank=R:step=N:at=save:seconds=S
                               rank R prints "fault: stalling in save of step N" and sleeps S
                               seconds there (a window for a test to kill the job mid-save)
  overflow:step=N              the loss of step N is multiplied by inf (an fp16 overflow)
  overflow:from=N              every step from N on (repeated non-finite losses)
Any spec may add ``run=NAME`` to apply only to the run of that name (in a sweep). Steps count
from 1, as in the logs and the CSV. Unset in normal runs; the run record stores the value.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

# `planner run` names a file here; a run refused once running (a ConfigError) writes its one line
# there and exits 0, and the launcher prints it and exits 2 (train.refused_to_launcher)
REFUSED_ENV = "PLANNER_RUN_REFUSED_FILE"

ENV = "REFERENCE_TRAINER_FAULT"


_RUN: list[str] = [""]  # the run in progress, set by the trainer


def set_run(name: str) -> None:
    _RUN[0] = name


def _specs() -> list[dict[str, str]]:
    out = []
    for spec in filter(None, os.environ.get(ENV, "").split(",")):
        kind, *pairs = spec.strip().split(":")
        fields = {"kind": kind, **dict(p.split("=", 1) for p in pairs)}
        if fields.get("run", _RUN[0]) == _RUN[0]:
            out.append(fields)
    return out


def active() -> str | None:
    return os.environ.get(ENV) or None


def maybe_kill(where: str, step: int) -> None:
    rank = int(os.environ.get("RANK", "0"))
    for s in _specs():
        if s["kind"] in ("kill", "stall") and int(s["rank"]) == rank and int(s["step"]) == step and (
                s.get("at", "step") == where):
            if s["kind"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            print(f"fault: stalling in {where} of step {step}", flush=True)
            time.sleep(float(s.get("seconds", "60")))


def overflow(step: int) -> bool:
    for s in _specs():
        if s["kind"] == "overflow" and (("step" in s and int(s["step"]) == step)
                                        or ("from" in s and step >= int(s["from"]))):
            return True
    return False


# --- defences ---------------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(expected_parent: int | None = None) -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (prctl(PR_SET_PDEATHSIG)); torchrun
    starts ranks in their own sessions, so killing the launcher's process group would otherwise
    leave them training. If the parent is already gone (or is not ``expected_parent``), exit now.
    Returns False where the signal is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    before = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != (expected_parent or before):  # the parent died before the signal was armed
        os._exit(1)
    return True


class RunLock:
    """One live run per run folder: a POSIX lock (``lockf``) on ``run.lock``, released by the kernel
    when the holder dies however it dies; the file names the holder (pid, host, start), so a lock
    left by a dead job is recognised and taken over with one line. Not held by the loader's workers
    (spawned; the file is opened close-on-exec). On a shared filesystem it relies on the filesystem's
    locks (NFS: lockd)."""

    NAME = "run.lock"
    WHAT, REMEDY = "run folder", "use another run_name"

    def __init__(self, folder: Path):
        self.folder, self.path, self.fd = Path(folder), self._path(Path(folder)), None

    def _path(self, folder: Path) -> Path:
        return folder / self.NAME

    def _busy(self, fd: int) -> str:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown holder"
        return f"{self.WHAT} {self.folder} is in use by a live run ({holder}); wait for it, stop it, or {self.REMEDY}"

    def acquire(self, log=None) -> str | None:
        """Take the lock; returns why not (a live run holds it), or None when held."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            busy = self._busy(fd)
            os.close(fd)
            return busy
        previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if previous and log is not None:
            log(f"taking over the lock of {self.folder}: its holder ({previous}) is no longer running")
        mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        os.ftruncate(fd, 0)
        os.pwrite(fd, mine.encode() + b"\n", 0)
        os.fsync(fd)
        self.fd = fd
        return None

    def release(self) -> None:
        """Clear the holder and unlock (a clean end: the next run takes it over silently)."""
        if self.fd is None:
            return
        import fcntl

        os.ftruncate(self.fd, 0)
        fcntl.lockf(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def probe(self) -> str | None:
        """Why the folder is busy (a live run holds the lock), or None; holds nothing afterwards."""
        if not self.path.exists():
            return None
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return self._busy(fd)
        finally:
            os.close(fd)  # closing any descriptor drops this process's lockf locks on the file
        return None


class CheckpointLock(RunLock):
    """One live run per checkpoint folder (``checkpoint.dir`` may be shared by run names): the same
    lock on ``<folder>.lock`` beside the folder, so the folder holds only checkpoints."""

    WHAT, REMEDY = "checkpoint folder", "use another checkpoint.dir"

    def _path(self, folder: Path) -> Path:
        return folder.with_name(folder.name + ".lock")
