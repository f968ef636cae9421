"""What a pipeline rank allocates over one step under torch's Schedule1F1B and
ScheduleInterleaved1F1B, measured on this CPU, beside the micro-batches in flight the planner
counts (planner.core.pipeline.in_flight).

Four ranks (gloo), 16 blocks with full activation checkpointing, 4 micro-batches (torchtitan's
default: as many as pipeline ranks), each rank's stages either wrapped in FSDP2 as torchtitan wraps
them under pipelining (per block and per stage, ``reshard_after_forward=False``, bf16 parameters,
fp32 reduction; one rank per shard group) or plain bf16 modules. The figure per rank is the peak
of torch.profiler's allocator events (``profile_memory``: every allocation and free, FSDP2's
resized parameter storages included) over the second step, above what was live when it began, in
units of one micro-batch's kept activations through the rank's layers (its blocks' bf16 inputs).

Question it answers: does today's torch hold more under 1F1B than under interleaved 1F1B (the
published 405B rows of torchtitan's December 2024 benchmark measured 82.5 GiB for 1F1B and 72.7 for
interleaved; docs/validation.md)? About a minute on 2 cores:

    python benchmarks/pp_schedule_memory.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RANKS, BLOCKS, MICRO_BATCHES, HIDDEN, TOKENS = 4, 16, 4, 256, 1024


def worker(schedule: str, fsdp: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
    from torch.profiler import ProfilerActivity, profile

    h = HIDDEN

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(h, 4 * h, bias=False), nn.Linear(4 * h, h, bias=False)

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(x)))

    class Stage(nn.Module):
        def __init__(self, n: int):
            super().__init__()
            self.layers = nn.ModuleList([checkpoint_wrapper(Block()) for _ in range(n)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    dist.init_process_group("gloo")
    rank, pp = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (pp, 1), mesh_dim_names=("pp", "dp"))
    v = 2 if schedule == "interleaved" else 1
    stages_total = pp * v
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    stages, modules = [], []
    for index in (rank + s * pp for s in range(v)):
        module = Stage(BLOCKS // stages_total)
        if fsdp:
            for block in module.layers:
                fully_shard(block, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
            fully_shard(module, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
        else:
            module = module.to(torch.bfloat16)
        modules.append(module)
        stages.append(PipelineStage(module, index, stages_total, torch.device("cpu"), group=mesh["pp"].get_group()))

    def loss_fn(out, _):
        return out.float().square().mean()

    sched = (Schedule1F1B(stages[0], n_microbatches=MICRO_BATCHES, loss_fn=loss_fn) if v == 1 else
             ScheduleInterleaved1F1B(stages, n_microbatches=MICRO_BATCHES, loss_fn=loss_fn))
    x = torch.randn(MICRO_BATCHES, TOKENS, h, dtype=torch.bfloat16)
    y = torch.zeros(MICRO_BATCHES)
    for _ in range(2):  # the first step builds the stages' buffers; the second is measured
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            if rank == 0:
                sched.step(x, target=y)
            elif rank == pp - 1:
                sched.step(target=y)
            else:
                sched.step()
        for module in modules:
            for p in module.parameters():
                p.grad = None
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    gathered: list = [None] * pp
    dist.all_gather_object(gathered, peak)
    if rank == 0:
        print(" ".join(str(g) for g in gathered), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import numpy as np

    from planner.core.pipeline import in_flight

    unit = (BLOCKS // RANKS) * TOKENS * HIDDEN * 2  # one micro-batch's kept block inputs on one rank
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    measured = {}
    for fsdp in (True, False):
        for schedule in ("1f1b", "interleaved"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
                   __file__, "--worker", schedule, str(int(fsdp))]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
            if proc.returncode != 0:
                print(f"{schedule} (fsdp {fsdp}) failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            measured[fsdp, schedule] = [int(b) / unit for b in proc.stdout.split()[-RANKS:]]
    pp, m, ranks = np.int64(RANKS), np.int64(MICRO_BATCHES), np.arange(RANKS)
    planned = {s: in_flight(pp, np.int64(v), m, np.int64(0), ranks) for s, v in (("1f1b", 1), ("interleaved", 2))}
    print(f"{RANKS} ranks, {BLOCKS} blocks (full recompute), {MICRO_BATCHES} micro-batches of {TOKENS} tokens, "
          f"hidden {HIDDEN}; unit: one micro-batch's kept activations on a rank = {unit / 2**20:.1f} MiB")
    print(f"{'rank':>4} | {'FSDP2 1F1B':>10} {'interleaved':>11} {'diff':>6} | {'plain 1F1B':>10} {'interleaved':>11} "
          f"{'diff':>6} | planner in flight 1F1B / interleaved / diff")
    for r in range(RANKS):
        f1, fi = measured[True, "1f1b"][r], measured[True, "interleaved"][r]
        p1, pi = measured[False, "1f1b"][r], measured[False, "interleaved"][r]
        a, b = float(planned["1f1b"][r]), float(planned["interleaved"][r])
        print(f"{r:>4} | {f1:>10.2f} {fi:>11.2f} {fi - f1:>+6.2f} | {p1:>10.2f} {pi:>11.2f} {pi - p1:>+6.2f} | "
              f"{a:.2f} / {b:.2f} / {b - a:+.2f}")
    more = [r for r in range(RANKS) if measured[True, "1f1b"][r] > measured[True, "interleaved"][r] + 0.5]
    print("1F1B holds more than interleaved (by over half a unit) on FSDP2 ranks: "
          + (", ".join(map(str, more)) if more else "none"))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] == "1")
    else:
        raise SystemExit(main())
