"""Sharded, atomic, checksummed checkpoints with ``torch.distributed.checkpoint`` (DCP).

A save of step N:
  1. every rank writes its shards into ``step_0000000N.partial/`` (DCP: model, optimizer, and one
     blob per rank with the loss scaler, the learning-rate position, data position and RNG);
  2. barrier: all shards are on disk;
  3. rank 0 writes ``COMMIT.json`` (step, layout, each file's size and sha256) last, fsyncs, and
     renames the folder to ``step_0000000N/``. The rename is the commit: a crash at any earlier
     moment leaves a ``.partial`` folder that is never loaded, and the previous checkpoint untouched;
  4. rank 0 prunes committed checkpoints beyond ``keep_last``, never the newest good one.

``auto_resume`` loads the newest committed checkpoint whose files match COMMIT.json (sizes and
sha256, checked before anything is read), and moves one that does not aside (``step_N.bad/``,
with a line saying why) to fall back on the previous one. A checkpoint of another layout stops
the run (exit 2). A shared filesystem is assumed.

Trust: the per-rank blob is read with ``torch.load(weights_only=True)`` and DCP's ``.metadata``
pickle with an unpickler that admits only DCP's metadata classes and torch's dtypes; still, load
only run folders this tool wrote (the checksums detect damage, not a forger who rewrites them).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from reference_trainer import faults
from reference_trainer.config import ConfigError

MANIFEST = "COMMIT.json"
PREFIX = "step_"
PARTIAL = ".partial"
BAD = ".bad"
COMMITTED = re.compile(PREFIX + r"\d{8}")  # step_00000012: a committed checkpoint folder
CHUNK_BYTES = 1 << 20


def _dcp():
    """torch.distributed.checkpoint, imported on first use: a run that never saves or resumes does
    not pay its import (about 0.6 s a process on a CPU, DTensor's included)."""
    import torch.distributed.checkpoint as dcp

    return dcp


@functools.cache
def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` is a pickle: admit only what it holds (DCP's metadata dataclasses and
    enums, torch sizes and dtypes, paths), so a crafted file cannot call anything else."""

    SAFE_MODULES = ("torch.distributed.checkpoint.",)
    SAFE = frozenset({("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                      ("pathlib", "WindowsPath"), ("collections", "OrderedDict")})

    def find_class(self, module: str, name: str):
        known = module in ("torch", "pathlib", "collections") or module.startswith("torch.")
        found = super().find_class(module, name) if known else None  # (imports only what torch already has)
        if (module, name) in self.SAFE or isinstance(found, torch.dtype):
            return found
        if module.startswith(self.SAFE_MODULES) and isinstance(found, type) and (
                dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
            return found
        raise pickle.UnpicklingError(f"checkpoint metadata names {module}.{name}, which is not allowed")


@functools.cache
def _safe_reader() -> type:
    """DCP's file reader whose metadata unpickler admits only what a checkpoint holds (the class,
    defined once DCP is imported: ``_dcp``)."""
    class _SafeReader(_dcp().FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            from torch.distributed.checkpoint.metadata import StorageMeta

            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _SafeReader


class Checkpointer:
    def __init__(self, root: Path, *, keep_last: int, layout: dict, world_size: int):
        self.root, self.keep_last, self.layout, self.world_size = root, keep_last, layout, world_size
        self.rank = dist.get_rank()
        self.good: Path | None = None  # the newest checkpoint known good (loaded or written here)

    # --- what is saved -----------------------------------------------------------------
    def _state(self, modules: list, optimizers: list, extra: dict | None) -> dict:
        """One flat DCP state for all model parts of this rank (their FQNs do not overlap: layers
        keep their global index). ``self._parts`` remembers which keys belong to which part."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        options = _options()
        model, optim, self._parts = {}, {}, []
        for module, opt in zip(modules, optimizers):
            m = get_model_state_dict(module, options=options)
            o = get_optimizer_state_dict(module, opt, options=options)
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
        _dcp().save(self._state(modules, optimizers, extra), checkpoint_id=str(partial))
        faults.maybe_kill("save", step)  # test hook: die after writing, before the commit
        dist.barrier()
        if self.rank == 0:
            files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
                     for p in sorted(partial.iterdir()) if p.is_file()}
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
            self.good = final
            self._prune()
        dist.barrier()
        return time.perf_counter() - t0

    def _prune(self) -> None:
        """Remove committed checkpoints beyond the newest ``keep_last``; never the newest good one."""
        for path in self.committed()[:-self.keep_last]:
            if path != self.good:
                shutil.rmtree(path, ignore_errors=True)

    # --- find and load -------------------------------------------------------------------
    def committed(self) -> list[Path]:
        """Committed checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and COMMITTED.fullmatch(p.name))

    def manifest(self, path: Path) -> dict | None:
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def other_layout(self, manifest: dict) -> str | None:
        """Why a readable checkpoint of this run cannot be resumed by this layout, or None."""
        if manifest.get("world_size") != self.world_size or manifest.get("layout") != self.layout:
            return (f"checkpoint step {manifest.get('step')} in {self.root} was written by another layout "
                    f"({manifest.get('layout')}, world {manifest.get('world_size')}); resuming across layouts is "
                    "not supported: use another run_name or checkpoint.dir")
        return None

    def problem(self, path: Path, manifest: dict | None) -> str | None:
        """Why ``path`` cannot be loaded (missing, truncated or changed bytes), or None."""
        if manifest is None:
            return f"no readable {MANIFEST}"
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return f"{MANIFEST} lists no files"
        for name, want in files.items():
            f = path / name
            if not isinstance(want, dict) or "sha256" not in want:
                return f"{MANIFEST} has no checksum for {name} (written by an older version)"
            if not f.is_file():
                return f"file {name} is missing"
            if f.stat().st_size != want["bytes"]:
                return f"file {name} has {f.stat().st_size} bytes, {MANIFEST} says {want['bytes']} (truncated?)"
            if sha256(f) != want["sha256"]:
                return f"file {name} does not match its sha256 in {MANIFEST} (corrupted)"
        return None

    def latest(self, log) -> tuple[int, Path] | None:
        """Rank 0 picks the newest good checkpoint (removing unfinished saves, moving bad ones
        aside); all ranks get the same answer. A checkpoint of another layout raises ConfigError."""
        choice: list[object] = [None, None]  # the path, or the error
        if self.rank == 0 and self.root.is_dir():
            choice = self._choose(log)
        dist.broadcast_object_list(choice, src=0)
        if choice[1] is not None:
            raise ConfigError(str(choice[1]))
        if choice[0] is None:
            return None
        path = Path(choice[0])
        self.good = path
        return int(path.name.removeprefix(PREFIX)), path

    def _choose(self, log) -> list[object]:
        for path in self.root.glob(f"{PREFIX}*{PARTIAL}"):
            log(f"removing {path.name}: a save that never committed")
            shutil.rmtree(path, ignore_errors=True)
        found = [(path, self.manifest(path)) for path in self.committed()]
        for _, manifest in found:
            if manifest is not None and (why := self.other_layout(manifest)):
                return [None, why]
        for path, manifest in reversed(found):
            why = self.problem(path, manifest)
            if why is None:
                return [str(path), None]
            aside = path.with_name(path.name + BAD)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(path, aside)
            log(f"warning: skipping checkpoint {path.name}: {why}; moved to {aside.name}, using the previous one")
        return [None, None]

    def load(self, path: Path, modules: list, optimizers: list) -> dict:
        """Load model and optimizer state in place; returns this rank's extra state."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        options = _options()
        state = self._state(modules, optimizers, extra=None)
        _dcp().load(state, storage_reader=_safe_reader()(str(path)))
        model, optim = state["model"], state["optim"]
        for module, opt, (model_keys, optim_keys) in zip(modules, optimizers, self._parts):
            set_model_state_dict(module, {k: model[k] for k in model_keys}, options=options)
            set_optimizer_state_dict(module, opt, {k: optim[k] for k in optim_keys}, options=options)
        return torch.load(io.BytesIO(state["extra"][f"rank{self.rank}"]), weights_only=True)
