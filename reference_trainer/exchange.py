"""Seconds spent in the exchanges that new layout dimensions add, measured by timers around the
collectives themselves: context parallel's K/V gather (and its gradient's reduction) and expert
parallel's all-to-all dispatch and combine.

On gloo (CPU) the collectives are blocking calls on the training thread, so the timer's span is
the time the rank waited for the exchange: exposed communication. On NCCL the calls only enqueue
kernels; the timer synchronises the stream before and after the call so the span again covers
the transfer (the attention or the experts need its result at once, so little overlap is lost).
Each span is also a ``torch.profiler`` mark (``rt:cp_comm``, ``rt:all_to_all``) in traced steps.
"""

from __future__ import annotations

import contextlib
import time

import torch

PARTS = ("cp_comm", "all_to_all")
_seconds = dict.fromkeys(PARTS, 0.0)


@contextlib.contextmanager
def timed(part: str, device: torch.device):
    """Add the seconds of the enclosed collective to ``part``."""
    sync = device.type == "cuda"
    if sync:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.profiler.record_function(f"rt:{part}"):
        yield
    if sync:
        torch.cuda.synchronize(device)
    _seconds[part] += time.perf_counter() - t0


def take() -> dict[str, float]:
    """Seconds per part since the last call (one step's), then reset."""
    out = {f"{part}_s": s for part, s in _seconds.items()}
    for part in PARTS:
        _seconds[part] = 0.0
    return out
