"""Data: a memory-mapped token file or a seeded synthetic stream, read by a prefetching loader.

The samples of optimizer step ``t`` are a pure function of (seed, t): a resumed run, or a run with
another layout, sees exactly the same data. Within a step the global batch is laid out as
``dp`` contiguous blocks of ``m * micro_batch`` samples; data-parallel rank d takes block d, and
its micro-batch k is the k-th slice of ``micro_batch`` samples of that block.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

SYNTHETIC_NOISE = 0.1  # fraction of synthetic tokens replaced by uniform noise
# Loader workers are spawned (a fresh interpreter that imports this module and torch), not forked
# from the training process. By the time the loader starts, that process has other threads
# (torch.distributed, gloo); on CPython before 3.11.10 a fork while one of them holds the
# interpreter's thread-state lock leaves the worker deadlocked in PyOS_AfterFork_Child (cpython
# gh-112275), and the run hangs on its first batch (seen here: 2 of 59 tp2 runs under load). Not a
# fork server either: its workers are the server's children, so when the training process is
# killed they outlive it (torch's worker watchdog watches the parent's pid) and keep its stdout
# open. A spawned worker's parent is the training process. Costs about a second.
WORKER_START = "spawn"


class TokenSource:
    """Samples of ``seq_len + 1`` tokens (inputs and next-token targets)."""

    def __init__(self, *, seed: int, vocab: int, seq_len: int, path: str | None = None, dtype: str = "uint16"):
        self.seed, self.vocab, self.seq_len, self.path, self.dtype = seed, vocab, seq_len, path, dtype
        self._tokens = None
        if path is None:
            self.num_samples = 2**40  # synthetic: no epochs
        else:
            itemsize = np.dtype(dtype).itemsize
            import os

            self.num_samples = (os.path.getsize(path) // itemsize - 1) // seq_len  # non-overlapping windows

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}  # a worker maps the file itself: never pickle the mapping

    def tokens(self) -> np.memmap:
        if self._tokens is None:  # opened lazily: each loader worker maps the file itself
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def sample(self, index: int) -> np.ndarray:
        """Sample ``index`` as int64 (seq_len + 1,)."""
        n = self.seq_len + 1
        if self.path is None:
            # An arithmetic sequence mod vocab with a per-sample start and stride, plus noise:
            # learnable in context (loss falls well below log(vocab)), cheap, and reproducible.
            rng = np.random.default_rng([self.seed, index])
            start, stride = rng.integers(self.vocab), rng.integers(1, 8)
            out = (start + stride * np.arange(n)) % self.vocab
            noise = rng.random(n) < SYNTHETIC_NOISE
            out[noise] = rng.integers(self.vocab, size=int(noise.sum()))
            return out.astype(np.int64)
        offset = index * self.seq_len
        out = np.asarray(self.tokens()[offset:offset + n], dtype=np.int64)
        if out.max(initial=0) >= self.vocab:
            raise ValueError(f"data.path={self.path!r}: token id {int(out.max())} >= model vocab={self.vocab}")
        return out


@functools.lru_cache(maxsize=2)
def _permutation(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(num_samples)


def sample_ids(seed: int, step: int, global_batch: int, num_samples: int) -> np.ndarray:
    """The sample indices of the global batch of ``step`` (a fresh permutation per epoch)."""
    positions = step * global_batch + np.arange(global_batch, dtype=np.int64)
    if num_samples >= 2**40:
        return positions
    epochs, offsets = np.divmod(positions, num_samples)
    return np.array([_permutation(seed, int(e), num_samples)[o] for e, o in zip(epochs, offsets)])


class StepBatches(Dataset):
    """Item t: this data-parallel rank's samples of step t, int64 (m * micro_batch, T + 1): its
    m micro-batches stacked (one item per step keeps the loader's per-item cost off the step)."""

    def __init__(self, source: TokenSource, *, global_batch: int, micro_batch: int, micro_batches: int,
                 dp_rank: int):
        self.source, self.global_batch, self.mb, self.m, self.dp_rank = (source, global_batch, micro_batch,
                                                                        micro_batches, dp_rank)

    def __len__(self) -> int:
        return 2**62

    def __getitem__(self, step: int) -> np.ndarray:
        ids = sample_ids(self.source.seed, step, self.global_batch, self.source.num_samples)
        first = self.dp_rank * self.m * self.mb
        return np.stack([self.source.sample(int(j)) for j in ids[first:first + self.m * self.mb]])


def _as_tensor(batch: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(batch)


def _unchanged(batch: np.ndarray) -> np.ndarray:
    return batch


def split(batch: torch.Tensor, micro_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A step's batch (m * mb, T + 1) as m (inputs (mb, T), targets (mb, T)) views."""
    return [(b[:, :-1], b[:, 1:]) for b in batch.chunk(micro_batches)]


def make_loader(source: TokenSource, *, start_step: int, global_batch: int, micro_batch: int,
                micro_batches: int, dp_rank: int, workers: int, prefetch_samples: int, pin_memory: bool):
    """An iterator over this rank's step batches from ``start_step`` on. With workers, at least
    ``prefetch_samples`` samples are loaded ahead (whole steps: ceil(prefetch_samples / (m * mb))
    steps in flight across the workers, at least one each)."""
    data = StepBatches(source, global_batch=global_batch, micro_batch=micro_batch, micro_batches=micro_batches,
                       dp_rank=dp_rank)
    sampler = range(start_step, 2**62)
    extra = {}
    if workers > 0:
        per_step = micro_batch * micro_batches
        extra = {"prefetch_factor": max(1, -(-prefetch_samples // (per_step * workers))), "persistent_workers": False}
    # Its own generator: creating the loader must not draw from the global RNG, which dropout
    # uses and checkpoints restore (a resumed run creates its loader at another moment).
    gen = torch.Generator().manual_seed(source.seed)
    # Workers send numpy arrays: for batches of token ids (kilobytes) a pickle through the
    # worker's pipe costs far less than handing over a tensor in shared memory.
    collate = _unchanged if workers > 0 and not pin_memory else _as_tensor
    if workers > 0:
        extra["multiprocessing_context"] = WORKER_START
    loader = DataLoader(data, batch_size=None, sampler=sampler, num_workers=workers, pin_memory=pin_memory,
                        generator=gen, collate_fn=collate, **extra)
    return (torch.as_tensor(b) for b in loader)
