"""How long the trainer takes to read one traced step's events: torch.profiler's ``prof.events()``
against the raw read the trainer uses (reference_trainer.profiler.traced_events), on a small
model's forward and backward traced on this CPU (or a GPU: ``--device cuda``, its kernels traced
too), and whether both book the step the same (exit 1 where they do not).

    python benchmarks/trace_read_speed.py [--layers 40] [--steps 20] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from reference_trainer import profiler


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=40, help="linear layers of the traced model")
    p.add_argument("--steps", type=int, default=20, help="forward-backward passes in the trace")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("trace_read_speed: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(a.layers)]).to(a.device)
    x = torch.randn(64, 128, device=a.device)
    model(x).sum().backward()  # warm-up, outside the trace
    with profiler.tracer(a.device) as prof, profiler.mark(profiler.STEP_MARK), profiler.mark(profiler.FWD_BWD_MARK):
        for _ in range(a.steps):
            model(x).sum().backward()
    t0 = time.perf_counter()
    raw = profiler.traced_events(prof)
    t1 = time.perf_counter()
    full = prof.events()
    t2 = time.perf_counter()
    same = profiler.analyse(raw, a.device) == profiler.analyse(full, a.device)
    print(f"{a.device}: {len(full):,} events: prof.events() {t2 - t1:.3f} s, raw read {t1 - t0:.3f} s "
          f"({(t2 - t1) / max(t1 - t0, 1e-9):.0f}x); the same booking: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
