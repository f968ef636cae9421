"""The parts of a training step, defined once: what the planner predicts (``StepTime``), what the
reference trainer's run record measures (``breakdown_s``), and what ``planner validate`` and
``planner calibrate`` compare, all use these names and definitions.

Each part is seconds per optimizer step on the critical path of the slowest rank; the parts add
up to the step. "Exposed" communication is the time a rank waits for a transfer with nothing to
compute; communication hidden behind compute is not a part (the record keeps it as
``comm_hidden``).

Two parts cannot be told apart in a measurement, and the comparison merges them (``COMPARED``):
- pipeline point-to-point transfer and the bubble: a receive lasts until its peer has sent, so a
  trace sees one wait (neither gloo nor NCCL separates the transfer from the waiting for it);
- tensor- and data-parallel communication when both run and the trace cannot attribute every
  collective (on a GPU, NCCL kernels carry no process group): compared as their sum then.

A rank that finishes backward before the others waits in the first collective across stages
after it, inside the optimizer's timer: that wait is bubble (pp > 1: the drain) or other
(stragglers), never optimizer (``sync_waits``, ``book_sync_wait``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Part:
    name: str
    definition: str
    communication: bool


PARTS: tuple[Part, ...] = (
    Part(name="compute", communication=False,
         definition="forward, backward and recompute work (matmuls, attention, element-wise kernels)"),
    Part(name="tp_comm", communication=True,
         definition="exposed tensor-parallel collectives (all-reduce; reduce-scatter + all-gather with SP)"),
    Part(name="cp_comm", communication=True,
         definition="exposed context-parallel exchange of keys and values (and their gradients)"),
    Part(name="ep_comm", communication=True,
         definition="exposed expert-parallel all-to-all: tokens dispatched to their experts and combined back"),
    Part(name="pp_comm", communication=True,
         definition="exposed pipeline point-to-point transfer of activations and their gradients"),
    Part(name="dp_comm", communication=True,
         definition="exposed data-parallel gradient reduction and ZeRO parameter gathers"),
    Part(name="bubble", communication=False,
         definition="pipeline idle: a stage waiting for its neighbour at fill, drain and between micro-batches"),
    Part(name="optimizer", communication=False,
         definition="after backward: gradient norm and clipping (their all-reduce's own cost) and AdamW"),
    Part(name="data_wait", communication=False,
         definition="waiting for the next batch from the data loader"),
    Part(name="other", communication=False,
         definition="the rest: per-step and per-micro-batch host overheads, launch latency, stragglers"),
)
NAMES: tuple[str, ...] = tuple(p.name for p in PARTS)
COMMUNICATION: tuple[str, ...] = tuple(p.name for p in PARTS if p.communication)

# planner.core.steptime.StepTime field -> part. The planner predicts no data wait (a loader that
# keeps up is assumed; the record measures it).
STEPTIME_FIELDS: dict[str, str] = {"compute": "compute", "tp_comm": "tp_comm", "cp_comm": "cp_comm",
                                   "ep_comm": "ep_comm", "pp_comm": "pp_comm",
                                   "dp_comm": "dp_comm", "bubble": "bubble", "optimizer": "optimizer",
                                   "other": "other"}
NOT_PREDICTED: tuple[str, ...] = ("data_wait",)

# What validate compares: a label -> the parts it sums (see the module docstring).
COMPARED: dict[str, tuple[str, ...]] = {
    "compute": ("compute",), "tp_comm": ("tp_comm",), "cp_comm": ("cp_comm",), "ep_comm": ("ep_comm",),
    "dp_comm": ("dp_comm",),
    "comm": ("tp_comm", "cp_comm", "ep_comm", "dp_comm"),
    "bubble": ("bubble", "pp_comm"), "optimizer": ("optimizer",), "data_wait": ("data_wait",),
    "other": ("other",),
}


def sync_waits(sync_s: Sequence[Sequence[float]]) -> list[float]:
    """Per rank, the mean seconds per step it waited for other ranks after backward.

    ``sync_s[rank][step]``: the time each rank spent in the optimizer window's collectives across
    pipeline stages (reference_trainer/step.py times them), over the same steps on every rank.
    Beyond their own cost it is waiting for the slowest rank; the rank that arrives last waits
    for no one, so its time is that cost: each step's smallest over ranks (on a pipeline, the
    first stage's, which runs the last backward). Steps past the shortest list are left out."""
    steps = min((len(s) for s in sync_s), default=0)
    if steps == 0:
        return [0.0] * len(sync_s)
    waits = [0.0] * len(sync_s)
    for i in range(steps):
        floor = min(s[i] for s in sync_s)
        for r, s in enumerate(sync_s):
            waits[r] += (s[i] - floor) / steps
    return waits


def sync_wait_part(pp: int) -> str:
    """Where that wait belongs. With pp > 1 the stages that finished backward early wait for the
    first stage's drain: pipeline idle, the bubble the planner predicts ((p-1)/v micro-batches,
    planner.core.steptime). Otherwise it is waiting for a slower rank: the stragglers of other."""
    return "bubble" if pp > 1 else "other"


def book_sync_wait(parts: Mapping[str, float | None], wait_s: float, pp: int) -> dict[str, float | None]:
    """One rank's parts with ``wait_s`` moved out of optimizer (its timer spans the wait) into
    ``sync_wait_part(pp)``; the sum is unchanged. An unmeasured bubble (None: no traced step)
    stays None, and the wait leaves the optimizer all the same (the record keeps it as sync_wait)."""
    out = dict(parts)
    wait_s = min(wait_s, out["optimizer"] or 0.0)  # never more than the window it was timed in
    out["optimizer"] = (out["optimizer"] or 0.0) - wait_s
    target = sync_wait_part(pp)
    if out.get(target) is not None:
        out[target] += wait_s
    return out


def predicted_parts(step_time, index: int = 0, step_overhead_s: float | None = None) -> dict[str, float]:
    """Seconds per part of candidate ``index`` of a ``StepTime`` (planner.core.steptime).

    With ``step_overhead_s`` (the profile's per-step overhead), StepTime's ``other`` beyond it
    (the per-layer framework overhead of eager kernels' dispatch) moves to compute: it runs on
    the compute thread between kernels, where a trace books it."""
    out = {part: float(getattr(step_time, field)[index]) for field, part in STEPTIME_FIELDS.items()}
    if step_overhead_s is not None:
        per_layer = max(0.0, out["other"] - step_overhead_s)
        out["compute"] += per_layer
        out["other"] -= per_layer
    out.update({part: 0.0 for part in NOT_PREDICTED})
    return out


def measured_parts(breakdown: Mapping[str, float | None], tp: int, dp: int,
                   device_kind: str = "cpu") -> dict[str, float | None]:
    """Seconds per part from a run record's ``breakdown_s`` and its layout (None: not measured).

    The record books pipeline point-to-point waits in ``bubble`` (pp_comm None: merged), and the
    exposed collectives of the forward-backward window in ``comm_exposed``; its tensor-parallel
    share ``comm_exposed_tp`` comes from functional-collective waits, which block the thread on a
    CPU only. With one kind of parallelism the whole exposed time is that kind's. Its optimizer
    and bubble (or other) hold the wait for other ranks after backward as ``book_sync_wait``
    books it; a record without ``sync_wait`` (written before) kept that wait in optimizer."""
    exposed = breakdown.get("comm_exposed")
    if exposed is None:  # no traced step: compute still holds the communication; only timers known
        return {**{p: None for p in NAMES}, "_comm": None, "optimizer": breakdown.get("optimizer"),
                "data_wait": breakdown.get("data_wait"), "other": breakdown.get("other")}
    tp_part = dp_part = None
    if tp == 1:
        tp_part, dp_part = 0.0, exposed if dp > 1 else 0.0
    elif dp == 1:
        tp_part, dp_part = exposed, 0.0
    elif device_kind == "cpu" and breakdown.get("comm_exposed_tp") is not None:
        tp_part = min(exposed, breakdown["comm_exposed_tp"])
        dp_part = exposed - tp_part
    # The context-parallel exchange and the all-to-all are timed spans of their own (zero when the
    # layout has none), inside the exposed total: not data- or tensor-parallel time.
    own = (breakdown.get("cp_comm") or 0.0) + (breakdown.get("all_to_all") or 0.0)
    if tp == 1 and dp_part:
        dp_part = max(0.0, dp_part - own)
    elif dp == 1 and tp_part:
        tp_part = max(0.0, tp_part - own)
    return {"compute": breakdown.get("compute"), "tp_comm": tp_part, "cp_comm": breakdown.get("cp_comm") or 0.0,
            "ep_comm": breakdown.get("all_to_all") or 0.0, "pp_comm": None,
            "dp_comm": dp_part,
            "bubble": breakdown.get("bubble"), "optimizer": breakdown.get("optimizer"),
            "data_wait": breakdown.get("data_wait"), "other": breakdown.get("other"),
            "_comm": exposed}


def compared(predicted: Mapping[str, float], measured: Mapping[str, float | None]) -> dict[str, tuple[float, float]]:
    """label -> (predicted s, measured s) for every ``COMPARED`` label the measurement covers.
    A label is left out when one of its parts was not measured, except that pp_comm is merged
    into the bubble and the communication total uses the record's exposed total."""
    out = {}
    for label, parts in COMPARED.items():
        if label == "comm":
            m = measured.get("_comm")
        elif label == "bubble":
            m = measured.get("bubble")
        else:
            values = [measured.get(p) for p in parts]
            m = None if any(v is None for v in values) else sum(values)
        if m is not None:
            out[label] = (sum(predicted[p] for p in parts), float(m))
    return out
