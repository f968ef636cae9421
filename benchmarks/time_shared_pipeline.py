"""Why the CPU grid's run 11 (llama-m dp2 x pp2: 4 processes on 2 cores) books twice the bubble the
planner predicts: the pipeline's shares under two models of a time-shared host, beside the runs.

    python benchmarks/time_shared_pipeline.py [RUN_DIR ...]

Two replicas of a 2-stage 1F1B pipeline (m micro-batches, backward = 2 x forward) share 2 cores,
one thread per process. "sharing": every runnable process gets cores/runnable of a core at every
instant (processor sharing: what planner.core.steptime assumes for a CPU host, with the fill and
drain at the unshared pace). "to completion": a runnable process waits in a first-in first-out
queue for a free core and keeps it until its forward or backward is done. Both give the same step
(the cores never idle); they split it differently. A rank's time is booked as the trainer's trace
books it: blocked on its peer is bubble, running or waiting for a core inside its own work is
compute. The measured shares are the records' (``breakdown_s``) of the run folders given (default:
the committed run 11); a folder without a readable record is one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_f_one_b(stage: int, m: int) -> list[tuple[str, int]]:
    """The order of a stage's forwards and backwards in a 2-stage 1F1B schedule."""
    if stage == 1:
        return [op for i in range(m) for op in (("F", i), ("B", i))]
    ops, f = [("F", 0), ("F", 1)][:m], min(2, m)
    for b in range(m):
        ops.append(("B", b))
        if f < m:
            ops.append(("F", f))
            f += 1
    return ops


def simulate(m: int, to_completion: bool, cores: int = 2, replicas: int = 2, dt: float = 1e-3) -> tuple[float, float]:
    """(bubble share, compute share) of the step, mean over ranks, in units of one forward = 1."""
    procs = [{"stage": s, "ops": one_f_one_b(s, m), "i": 0, "left": None, "blocked": 0.0, "done": None}
             for _ in range(replicas) for s in (0, 1)]
    ready: dict[tuple[int, str, int], float] = {}  # (replica, kind, micro-batch) -> time its input arrived
    queue: list[int] = []
    running: list[int] = []
    t = 0.0

    def can_run(k: int) -> bool:
        p = procs[k]
        if p["i"] >= len(p["ops"]):
            return False
        kind, mb = p["ops"][p["i"]]
        needs = {(1, "F"): "F", (0, "B"): "B"}.get((p["stage"], kind))
        return p["left"] is not None or needs is None or (k // 2, needs, mb) in ready

    while any(p["done"] is None for p in procs):
        runnable = [k for k in range(len(procs)) if can_run(k)]
        for k in runnable:
            if k not in queue and k not in running:
                queue.append(k)
        if to_completion:
            running = [k for k in running if k in runnable]
            while len(running) < cores and queue:
                running.append(queue.pop(0))
            share = {k: 1.0 for k in running}
        else:
            queue, running = [], runnable
            share = {k: min(1.0, cores / len(runnable)) for k in runnable} if runnable else {}
        for k, p in enumerate(procs):
            if p["done"] is None and k not in runnable:
                p["blocked"] += dt
        for k, speed in share.items():
            p = procs[k]
            kind, mb = p["ops"][p["i"]]
            if p["left"] is None:
                p["left"] = 1.0 if kind == "F" else 2.0
            p["left"] -= speed * dt
            if p["left"] <= 1e-9:
                p["left"], p["i"] = None, p["i"] + 1
                if (p["stage"], kind) in ((0, "F"), (1, "B")):
                    ready[(k // 2, kind, mb)] = t
                if p["i"] >= len(p["ops"]):
                    p["done"] = t + dt
        t += dt
    step = max(p["done"] for p in procs)
    bubble = sum(p["blocked"] + step - p["done"] for p in procs) / len(procs) / step
    return bubble, 1.0 - bubble


def _refuse(why: str) -> None:
    print(f"time_shared_pipeline: {why}", file=sys.stderr)
    raise SystemExit(2)


def measured(paths: list[Path]) -> list[tuple[str, float, float]]:
    from planner.calibration.record import validate_record

    out = []
    for path in paths:
        try:
            record = validate_record(json.loads((path / "record.json").read_text()))
        except (OSError, ValueError) as exc:
            _refuse(f"{path}: no readable run record ({exc})")
        b, step = record["breakdown_s"], record["step_time_s"]["mean"]
        if b["bubble"] is None:
            _refuse(f"{path}: the run traced no step (no bubble measured)")
        out.append((path.name, b["bubble"] / step, b["compute"] / step))
    return out


def main() -> int:
    args = [Path(a) for a in sys.argv[1:]] or [ROOT / "benchmarks/runs/cpu-2core/11-llama-m-dp2tp1pp2-mb2-none"]
    rows = measured(args)  # the records first: a bad one is refused before any output
    print("2 replicas x 2-stage 1F1B on 2 cores, m = 4 micro-batches")
    for name, completion in (("processor sharing (the planner)", False), ("run to completion, FIFO", True)):
        bubble, compute = simulate(4, completion)
        print(f"  {name:<32} bubble {bubble:6.1%}  compute {compute:6.1%}")
    for name, bubble, compute in rows:
        print(f"  measured {name:<40} bubble {bubble:6.1%}  compute {compute:6.1%}")
    if rows:
        print(f"  measured mean of {len(rows)}{'':<30} bubble {sum(r[1] for r in rows) / len(rows):6.1%}  "
              f"compute {sum(r[2] for r in rows) / len(rows):6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
