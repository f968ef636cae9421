"""Writing files so that nothing is left half-written: a temporary file beside the target,
then an atomic rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from planner.errors import PlannerError


def check_target(path: str | Path, field: str = "out") -> None:
    """Refuse a folder or a device node as the file to write (call it before the work, too)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise PlannerError(field, str(path), "a file to write, not a folder or a device")
    if not path.parent.is_dir():  # never created silently: a typo would scatter files
        raise PlannerError(field, str(path), f"its folder {path.parent} does not exist; create it first")


def write_atomic(path: str | Path, data: str | bytes, *, field: str = "out", make_parents: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename. Refuses a folder or a
    device at ``path`` and a missing folder (unless ``make_parents``: for a tool's own folders)."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    check_target(path, field)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
