"""Test hooks that inject faults, read from the environment variable REFERENCE_TRAINER_FAULT.

Comma-separated specs, each ``kind:key=value:...``:
  kill:rank=R:step=N:at=step   rank R sends itself SIGKILL in the middle of step N (after backward)
  kill:rank=R:step=N:at=save   rank R sends itself SIGKILL while saving step N's checkpoint
                               (its shards written, the checkpoint not yet committed)
  overflow:step=N              the loss of step N is multiplied by inf (an fp16 overflow)
  overflow:from=N              every step from N on (repeated non-finite losses)
Any spec may add ``run=NAME`` to apply only to the run of that name (in a sweep). Steps count
from 1, as in the logs and the CSV. Unset in normal runs; the run record stores the value.
"""

from __future__ import annotations

import os
import signal

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
        if s["kind"] == "kill" and int(s["rank"]) == rank and int(s["step"]) == step and s.get("at", "step") == where:
            os.kill(os.getpid(), signal.SIGKILL)


def overflow(step: int) -> bool:
    for s in _specs():
        if s["kind"] == "overflow" and (("step" in s and int(s["step"]) == step)
                                        or ("from" in s and step >= int(s["from"]))):
            return True
    return False
