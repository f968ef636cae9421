"""Sharded, atomic checkpoints with ``torch.distributed.checkpoint`` (DCP).

A save of step N:
  1. every rank writes its shards into ``step_0000000N.partial/`` (DCP: model, optimizer, and one
     blob per rank with the loss scaler, the learning-rate position, data position and RNG);
  2. barrier: all shards are on disk;
  3. rank 0 writes ``COMMIT.json`` (step, layout, each file's size), fsyncs, and renames the folder
     to ``step_0000000N/``. The rename is the commit: a crash at any earlier moment leaves a
     ``.partial`` folder that is never loaded, and the previous checkpoint untouched;
  4. rank 0 prunes committed checkpoints beyond ``keep_last``.

``auto_resume`` loads the newest committed checkpoint whose files match COMMIT.json, and skips
(with a warning) one that is truncated or missing files. A shared filesystem is assumed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from reference_trainer import faults

MANIFEST = "COMMIT.json"
PREFIX = "step_"
PARTIAL = ".partial"
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    def __init__(self, root: Path, *, keep_last: int, layout: dict, world_size: int):
        self.root, self.keep_last, self.layout, self.world_size = root, keep_last, layout, world_size
        self.rank = dist.get_rank()

    # --- what is saved -----------------------------------------------------------------
    def _state(self, modules: list, optimizers: list, extra: dict | None) -> dict:
        """One flat DCP state for all model parts of this rank (their FQNs do not overlap: layers
        keep their global index). ``self._parts`` remembers which keys belong to which part."""
        model, optim, self._parts = {}, {}, []
        for module, opt in zip(modules, optimizers):
            m = get_model_state_dict(module, options=OPTIONS)
            o = get_optimizer_state_dict(module, opt, options=OPTIONS)
            self._parts.append((set(m), set(o)))
            model.update(m)
            optim.update(o)
        blob = b""
        if extra is not None:
            buf = io.BytesIO()
            torch.save(extra, buf)
            blob = buf.getvalue()
        return {"model": model, "optim": optim, "extra": {f"rank{self.rank}": blob}}

    # --- save ----------------------------------------------------------------------------
    def save(self, step: int, modules: list, optimizers: list, extra: dict) -> float:
        """Write and commit the checkpoint of ``step``; returns the seconds it took."""
        t0 = time.perf_counter()
        final = self.root / f"{PREFIX}{step:08d}"
        partial = final.with_name(final.name + PARTIAL)
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        dist.barrier()
        dcp.save(self._state(modules, optimizers, extra), checkpoint_id=str(partial))
        faults.maybe_kill("save", step)  # test hook: die after writing, before the commit
        dist.barrier()
        if self.rank == 0:
            files = {p.name: p.stat().st_size for p in sorted(partial.iterdir()) if p.is_file()}
            manifest = {"step": step, "world_size": self.world_size, "layout": self.layout, "files": files,
                        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with open(partial / MANIFEST, "w") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(partial)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(partial, final)
            _fsync_dir(self.root)
            self._prune()
        dist.barrier()
        return time.perf_counter() - t0

    def _prune(self) -> None:
        for path in self.committed()[:-self.keep_last]:
            shutil.rmtree(path, ignore_errors=True)

    # --- find and load -------------------------------------------------------------------
    def committed(self) -> list[Path]:
        """Committed checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
                      and not p.name.endswith(PARTIAL))

    def problem(self, path: Path) -> str | None:
        """Why ``path`` cannot be loaded, or None when it is complete."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError):
            return f"no readable {MANIFEST}"
        for name, size in manifest.get("files", {}).items():
            f = path / name
            if not f.is_file():
                return f"file {name} is missing"
            if f.stat().st_size != size:
                return f"file {name} has {f.stat().st_size} bytes, {MANIFEST} says {size} (truncated?)"
        if manifest.get("world_size") != self.world_size or manifest.get("layout") != self.layout:
            return (f"written by another layout ({manifest.get('layout')}); resuming across layouts is not "
                    "supported: use another run name or checkpoint.dir")
        return None

    def latest(self, log) -> tuple[int, Path] | None:
        """Rank 0 picks the newest complete checkpoint (removing unfinished saves); all ranks
        get the same answer."""
        choice: list[object] = [None]
        if self.rank == 0 and self.root.is_dir():
            for path in self.root.glob(f"{PREFIX}*{PARTIAL}"):
                log(f"removing {path.name}: a save that never committed")
                shutil.rmtree(path, ignore_errors=True)
            for path in reversed(self.committed()):
                why = self.problem(path)
                if why is None:
                    choice[0] = str(path)
                    break
                log(f"warning: skipping checkpoint {path.name}: {why}")
        dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return None
        path = Path(choice[0])
        return int(path.name.removeprefix(PREFIX)), path

    def load(self, path: Path, modules: list, optimizers: list) -> dict:
        """Load model and optimizer state in place; returns this rank's extra state."""
        state = self._state(modules, optimizers, extra=None)
        dcp.load(state, checkpoint_id=str(path))
        model, optim = state["model"], state["optim"]
        for module, opt, (model_keys, optim_keys) in zip(modules, optimizers, self._parts):
            set_model_state_dict(module, {k: model[k] for k in model_keys}, options=OPTIONS)
            set_optimizer_state_dict(module, opt, {k: optim[k] for k in optim_keys}, options=OPTIONS)
        return torch.load(io.BytesIO(state["extra"][f"rank{self.rank}"]), weights_only=False)
