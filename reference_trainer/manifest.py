"""What a checkpoint folder holds, read without torch: its committed checkpoints, each one's
``COMMIT.json``, and whether they were written by another layout. The trainer (checkpoint.py) and
the launcher (launch.py: refuse before torchrun starts, without overwriting config.yaml) share it."""

from __future__ import annotations

import json
import re
from pathlib import Path

MANIFEST = "COMMIT.json"
PREFIX = "step_"
COMMITTED = re.compile(PREFIX + r"\d{8}")  # step_00000012: a committed checkpoint folder
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists one line per file; a bigger one is not ours


def committed(root: Path) -> list[Path]:
    """Committed checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and COMMITTED.fullmatch(p.name))


def read(path: Path) -> dict | None:
    """The checkpoint's COMMIT.json as a mapping, or None when missing, oversized or not a JSON object."""
    try:
        f = path / MANIFEST
        if f.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        manifest = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def other_layout(root: Path, manifest: dict, layout: dict, world_size: int) -> str | None:
    """Why a readable checkpoint in ``root`` cannot be resumed by this layout, or None."""
    if manifest.get("world_size") != world_size or manifest.get("layout") != layout:
        return (f"checkpoint step {manifest.get('step')} in {root} was written by another layout "
                f"({manifest.get('layout')}, world {manifest.get('world_size')}); resuming across layouts is "
                "not supported: use another run_name or checkpoint.dir")
    return None


def layout_problem(root: Path, layout: dict, world_size: int) -> str | None:
    """The first committed checkpoint in ``root`` of another layout, said in one line, or None."""
    for path in committed(root):
        manifest = read(path)
        if manifest is not None and (why := other_layout(root, manifest, layout, world_size)):
            return why
    return None
