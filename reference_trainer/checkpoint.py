"""Sharded, atomic, checksummed checkpoints with ``torch.distributed.checkpoint`` (DCP).

A save of step N:
  1. every rank writes its shards into ``step_0000000N.partial/``: DCP for the model and optimizer
     tensors, and ``state_rankR.json`` for everything else of rank R (the optimizer's non-tensor
     settings, the loss scaler, the RNG state as hex bytes, the non-finite guard);
  2. barrier: all shards are on disk;
  3. rank 0 writes ``COMMIT.json`` (step, layout, each file's size and sha256) last, fsyncs, and
     renames the folder to ``step_0000000N/``. The rename is the commit: a crash at any earlier
     moment leaves a ``.partial`` folder that is never loaded, and the previous checkpoint untouched;
  4. rank 0 prunes committed checkpoints beyond ``keep_last``, never the newest good one.

``auto_resume`` loads the newest committed checkpoint whose files match COMMIT.json (sizes and
sha256, checked before anything is read), and moves one that does not aside (``step_N.bad/``,
with a line saying why) to fall back on the previous one. A checkpoint of another layout stops
the run (exit 2). A shared filesystem is assumed.

No pickle is ever loaded as code. The checksums detect damage, not a forger (who rewrites
COMMIT.json), so the format itself is inert: tensors are read by DCP with
``torch.load(weights_only=True)``; DCP's ``.metadata`` pickle through an unpickler that admits
only DCP's metadata classes and torch's dtypes; any pickled (bytes) item, which DCP's default
load planner would ``torch.load(weights_only=False)``, is refused before reading (one line, exit
2), and again by the load planner; the rest is JSON. See docs/safety.md.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import pickle
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from reference_trainer import faults, manifest as manifests
from reference_trainer.config import ConfigError
from reference_trainer.manifest import COMMITTED, MANIFEST, PREFIX  # noqa: F401 (re-exported)

PARTIAL = ".partial"
BAD = ".bad"
CHUNK_BYTES = 1 << 20
STATE_JSON = "state_rank{rank}.json"  # a rank's non-tensor state
MAX_STATE_BYTES = 64 << 20
# dtypes a tensor in the JSON state may have (the RNG states are uint8)
JSON_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.uint8, torch.int64, torch.float32, torch.float64)}


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


def _to_json(value):
    """``value`` as JSON: tensors as {"__tensor__": dtype, shape, hex bytes}, tuples tagged."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if str(t.dtype).removeprefix("torch.") not in JSON_DTYPES:
            raise TypeError(f"checkpoint state: a {t.dtype} tensor cannot go in the JSON state")
        return {"__tensor__": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "hex": bytes(t.view(torch.uint8).flatten().tolist()).hex()}
    if isinstance(value, tuple):
        return {"__tuple__": [_to_json(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"checkpoint state: a mapping with non-string keys ({list(value)[:3]})")
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"checkpoint state: a {type(value).__name__} cannot go in the JSON state")


def _from_json(value):
    """The inverse of ``_to_json``: builds tensors, tuples, dicts, lists and scalars, nothing else."""
    if isinstance(value, dict):
        if "__tensor__" in value:
            dtype = JSON_DTYPES.get(value["__tensor__"])
            if dtype is None:
                raise ValueError(f"tensor of dtype {value['__tensor__']!r} (allowed: {', '.join(JSON_DTYPES)})")
            flat = torch.tensor(list(bytes.fromhex(value["hex"])), dtype=torch.uint8)
            return flat.view(dtype).reshape([int(n) for n in value["shape"]]).clone()
        if "__tuple__" in value:
            return tuple(_from_json(v) for v in value["__tuple__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


@functools.cache
def _tensor_only_planner() -> type:
    """DCP's default load planner, except that a pickled (bytes) item is refused: DCP's own
    ``load_bytes`` would ``torch.load(weights_only=False)`` it, running whatever it names."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class _TensorOnlyLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            raise ConfigError(f"checkpoint item {read_item.dest_index.fqn!r} is a pickle: refused "
                              "(this trainer's checkpoints hold tensors and JSON only)")

    return _TensorOnlyLoadPlanner


def pickled_items(metadata) -> list[str]:
    """The keys of a DCP checkpoint's metadata that are pickled objects rather than tensors."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    return sorted(k for k, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata))


class Checkpointer:
    def __init__(self, root: Path, *, keep_last: int, layout: dict, world_size: int):
        self.root, self.keep_last, self.layout, self.world_size = root, keep_last, layout, world_size
        self.rank = dist.get_rank()
        self.good: Path | None = None  # the newest checkpoint known good (loaded or written here)

    # --- what is saved -----------------------------------------------------------------
    def _state(self, modules: list, optimizers: list) -> tuple[dict, dict]:
        """One flat DCP state of tensors for all model parts of this rank (their FQNs do not overlap:
        layers keep their global index), and the rest (the optimizer's settings) as a mapping that
        goes to JSON. ``self._parts`` remembers which keys belong to which part."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        options = _options()
        model, optim, self._parts = {}, {}, []
        for module, opt in zip(modules, optimizers):
            m = get_model_state_dict(module, options=options)
            o = get_optimizer_state_dict(module, opt, options=options)
            self._parts.append((set(m), set(o)))
            model.update(m)
            optim.update(o)
        plain = {f"{section}/{k}": v for section, part in (("model", model), ("optim", optim))
                 for k, v in part.items() if not isinstance(v, torch.Tensor)}
        tensors = {section: {k: v for k, v in part.items() if isinstance(v, torch.Tensor)}
                   for section, part in (("model", model), ("optim", optim))}
        return tensors, plain

    def _write_json_state(self, folder: Path, plain: dict, extra: dict) -> None:
        path = folder / STATE_JSON.format(rank=self.rank)
        with open(path, "w") as f:
            json.dump({"plain": _to_json(plain), "extra": _to_json(extra)}, f)
            f.flush()
            os.fsync(f.fileno())

    def _read_json_state(self, path: Path) -> tuple[dict, dict]:
        """This rank's JSON state (the optimizer's settings, and the extra state), checked for shape."""
        f = path / STATE_JSON.format(rank=self.rank)
        try:
            if f.stat().st_size > MAX_STATE_BYTES:
                raise ValueError(f"over {MAX_STATE_BYTES} bytes")
            data = json.loads(f.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("plain"), dict) or \
                    not isinstance(data.get("extra"), dict):
                raise ValueError("expected an object with 'plain' and 'extra' mappings")
            return _from_json(data["plain"]), _from_json(data["extra"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RuntimeError, RecursionError) as exc:
            raise ConfigError(f"checkpoint {path}: {f.name} is unreadable ({exc}); written by an older version? "
                              "use another checkpoint.dir") from None

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
        tensors, plain = self._state(modules, optimizers)
        self._write_json_state(partial, plain, extra)
        _dcp().save(tensors, checkpoint_id=str(partial))
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
        return manifests.committed(self.root)

    def manifest(self, path: Path) -> dict | None:
        return manifests.read(path)

    def other_layout(self, manifest: dict) -> str | None:
        """Why a readable checkpoint of this run cannot be resumed by this layout, or None."""
        return manifests.other_layout(self.root, manifest, self.layout, self.world_size)

    def problem(self, path: Path, manifest: dict | None) -> str | None:
        """Why ``path`` cannot be loaded (missing, truncated or changed bytes), or None."""
        if manifest is None:
            return f"no readable {MANIFEST}"
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return f"{MANIFEST} lists no files"
        for name, want in files.items():
            f = path / name
            if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
                return f"{MANIFEST} lists {name!r}, not a file name"
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
        tensors, _ = self._state(modules, optimizers)
        plain, extra = self._read_json_state(path)
        reader = _safe_reader()(str(path))
        try:
            pickled = pickled_items(reader.read_metadata())
        except (pickle.UnpicklingError, OSError, EOFError, AttributeError, ValueError) as exc:
            raise ConfigError(f"checkpoint {path}: its DCP metadata is refused ({exc})") from None
        if pickled:  # DCP would unpickle these as code: none of this trainer's checkpoints has one
            raise ConfigError(f"checkpoint {path} holds {len(pickled)} pickled item(s) ({', '.join(pickled[:3])}): "
                              "refused (this trainer's checkpoints hold tensors and JSON only); use another "
                              "checkpoint.dir")
        _dcp().load(tensors, storage_reader=_safe_reader()(str(path)), planner=_tensor_only_planner()())
        model = {**tensors["model"], **{k.split("/", 1)[1]: v for k, v in plain.items() if k.startswith("model/")}}
        optim = {**tensors["optim"], **{k.split("/", 1)[1]: v for k, v in plain.items() if k.startswith("optim/")}}
        for module, opt, (model_keys, optim_keys) in zip(modules, optimizers, self._parts):
            missing = [k for k in (*model_keys, *optim_keys) if k not in model and k not in optim]
            if missing:
                raise ConfigError(f"checkpoint {path}: {STATE_JSON.format(rank=self.rank)} lacks {missing[:3]}")
            set_model_state_dict(module, {k: model[k] for k in model_keys}, options=options)
            set_optimizer_state_dict(module, opt, {k: optim[k] for k in optim_keys}, options=options)
        return extra
