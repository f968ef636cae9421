"""End to end on this machine: probe, profile a grid of runs, calibrate on half, validate on the rest.

Run: python benchmarks/calibration_cpu.py [--grid cpu] [--out runs/calibration-cpu] [--reuse]
         [--factors matmul,layer_overhead_s,...]
Prints, for the held-out runs: the step-time error with the probed profile (before) and with the
calibrated one (after), for a fit on the step time alone and for a fit on the parts of the step
(``planner calibrate --parts``); and each part's share error in percentage points (compute,
exposed TP / DP communication, bubble, optimizer; planner.core.step_parts). Targets (issue 13):
step time <= 10% mean after calibration; compute, TP communication and bubble each within 10
points of the measured share. The figures move with machine load: run it on a quiet machine.
``--reuse`` keeps an existing probe and grid under --out and only refits; ``--parts`` prints the
fit on the parts only.

``--mechanism`` measures what the tensor-parallel and optimizer terms stand on, on this machine
(torch needed): the optimizer window's host cost per parameter tensor, plain and as DTensors
(``optimizer_tensor_overhead_s``, the stack's ``dtensor_optimizer_ratio``);
the training thread's host time per TP collective (the same tiny GPT eager and under DTensor TP
on a one-rank mesh, so the collectives cost nothing and DTensor's dispatch and redistribute
remain; the planner books this cost, ``tp_collective_overhead_s``, as compute, where the trace
sees it), and, over two gloo processes, the all-reduces of one micro-batch's forward and backward
with recompute none and full, with and without torch's checkpoint early stop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from planner.calibration.calibrate import calibrate, describe_fit, predict_step_s
from planner.calibration.measured import load_measurements
from planner.calibration.profile_grid import held_out
from planner.calibration.validate import compare
from planner.hardware import load_profile_file

SHARES = ("compute_share", "tp_comm_share", "dp_comm_share", "bubble_fraction", "comm_fraction", "optimizer_share")


def planner(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "planner", *args], check=True)


def split(runs, grid: str = "cpu"):
    """The first run of each pair of like runs: calibrate on it; the second: held out (found by
    the run's configuration, planner.calibration.profile_grid.held_out)."""
    return [r for r in runs if not held_out(r.label, grid)], [r for r in runs if held_out(r.label, grid)]


def share_errors(runs, profile) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Share -> the held-out runs' errors in fractions of the step (predicted - measured): of the
    runs whose shares ``planner validate`` judges, and of the time-shared ones (shown, not judged)."""
    judged: dict[str, list[float]] = {q: [] for q in SHARES}
    left: dict[str, list[float]] = {q: [] for q in SHARES}
    for p in compare(runs, profile):
        if p.quantity in judged:
            (judged if p.judged else left)[p.quantity].append(p.error)
    return judged, left


def report(name, test, base, calibrated) -> None:
    measured = np.array([r.step_s for r in test])
    before = predict_step_s(test, base) / measured - 1
    after = predict_step_s(test, calibrated) / measured - 1
    print(f"\n{name}: held out ({len(test)} runs)    before    after")
    for r, b, c in zip(test, before, after):
        print(f"{r.label[:32]:<32} {b:+8.1%} {c:+8.1%}")
    print(f"held-out step-time error: mean {np.mean(np.abs(before)):.1%} before calibration, "
          f"{np.mean(np.abs(after)):.1%} after (worst {np.max(np.abs(after)):.1%}); target <= 10%")
    (shares_before, _), (shares_after, shared) = share_errors(test, base), share_errors(test, calibrated)
    for q in SHARES:
        b, a = np.abs(shares_before[q]), np.abs(shares_after[q])
        if a.size:
            print(f"  {q:<16} {a.size:>2} runs: |error| mean {a.mean() * 100:5.1f}pp, worst {a.max() * 100:5.1f}pp "
                  f"after (before: mean {b.mean() * 100:5.1f}pp, worst {b.max() * 100:5.1f}pp)")
    if any(shared.values()):
        print("  time-shared runs (more processes than cores: shown, not judged), after: "
              + ", ".join(f"{q} {', '.join(f'{e * 100:+.1f}pp' for e in errs)}" for q, errs in shared.items() if errs))


TINY = {"name": "tiny", "arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 16,
        "dropout": 0.0}
SHAPES = {"gpt-s": {"name": "gpt-s", "arch": "gpt", "layers": 4, "hidden": 128, "heads": 4, "vocab": 512,
                    "seq_len": 128, "dropout": 0.0},
          "llama-m": {"name": "llama-m", "arch": "llama", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4,
                      "vocab": 1024, "seq_len": 128}}


def host_cost_per_collective(repeats: int = 5, iters: int = 30) -> None:
    """Forward + backward of a tiny GPT, eager vs DTensor TP on a one-rank mesh (one thread)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from planner.core.model import ModelSpec
    from reference_trainer.model import GPT
    from reference_trainer.parallel import apply_tp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    spec = ModelSpec(**TINY)
    eager, tp = GPT(spec), GPT(spec)
    eager.init_weights(0)
    tp.init_weights(0)
    apply_tp(tp, init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)), False)
    x = torch.randint(0, spec.vocab, (1, spec.seq_len))

    def median_s(m) -> float:
        times = []
        for _ in range(iters + 5):
            t = time.perf_counter()
            m(x).float().sum().backward()
            times.append(time.perf_counter() - t)
        return statistics.median(times[5:])

    optimizer_host_cost(init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)))
    runs = [(median_s(eager), median_s(tp)) for _ in range(repeats)]
    e, d = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    calls = 4 * spec.layers + 3  # 2 forward + 2 backward per GPT layer; embedding, head gather, head grad
    print(f"host time per TP collective: eager {e * 1e3:.2f} ms, DTensor TP {d * 1e3:.2f} ms per step of "
          f"{calls} collectives -> {(d - e) / calls * 1e3:.2f} ms each (booked as compute by the trace)")
    dist.destroy_process_group()


def optimizer_window_s(model, iters: int = 20) -> float:
    """Median seconds of the trainer's optimizer window on ``model`` (reference_trainer/step.py:
    the gradient norm's foreach kernel, clipping's foreach multiply, torch.optim.AdamW, whose CPU
    default is its single-tensor loop, zero_grad), gradients set beforehand."""
    import torch

    from reference_trainer.parallel import local_tensor

    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    times = []
    for _ in range(iters + 3):
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        t = time.perf_counter()
        grads = [local_tensor(p.grad) for p in params]
        torch.stack(torch._foreach_norm(grads, 2.0)).double().pow(2).sum()
        torch._foreach_mul_(grads, 0.9)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times[3:])


def optimizer_host_cost(mesh) -> None:
    """Host cost per parameter tensor of the optimizer window (planner: optimizer_tensor_overhead_s
    and the stack's dtensor_optimizer_ratio): two GPTs with the same 52 tensors and 0.24M / 3.3M
    parameters give the per-parameter slope; the small one's remainder, per tensor, is the
    per-tensor cost, plain and as DTensors (tensor parallel on a one-rank mesh), one thread."""
    from planner.core.model import ModelSpec
    from reference_trainer.model import GPT
    from reference_trainer.parallel import apply_tp

    def built(hidden: int, tp: bool):
        spec = ModelSpec(**{**TINY, "hidden": hidden, "seq_len": 128, "vocab": 512})
        model = GPT(spec)
        model.init_weights(0)
        if tp:
            apply_tp(model, mesh, False)
        return model, len(list(model.parameters())), sum(p.numel() for p in model.parameters())

    costs = {}
    for tp in (False, True):
        (small, n, p_small), (large, _, p_large) = built(64, tp), built(256, tp)
        t_small, t_large = optimizer_window_s(small), optimizer_window_s(large)
        per_param = (t_large - t_small) / (p_large - p_small)
        costs[tp] = (t_small - per_param * p_small) / n
        print(f"optimizer window, {'DTensor' if tp else 'plain'} parameters: {t_small * 1e3:.2f} ms ({n} tensors, "
              f"{p_small / 1e6:.2f}M params), {t_large * 1e3:.2f} ms ({p_large / 1e6:.2f}M) -> "
              f"{costs[tp] * 1e6:.1f} us per tensor + {per_param * 1e9:.2f} ns per parameter")
    print(f"DTensor / plain per-tensor cost: {costs[True] / max(costs[False], 1e-9):.1f}x (dtensor_optimizer_ratio)")


def count_collectives() -> None:
    """Under torchrun, 2 processes: gloo all-reduces per micro-batch, forward and backward."""
    import collections
    import contextlib
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.checkpoint import set_checkpoint_early_stop

    from planner.core.model import ModelSpec
    from reference_trainer.model import GPT
    from reference_trainer.parallel import apply_recompute, apply_tp

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    for name, shape in SHAPES.items():
        spec = ModelSpec(**shape)
        for recompute, early in (("none", True), ("full", True), ("full", False)):
            model = GPT(spec)
            model.init_weights(0)
            apply_tp(model, mesh, False)
            apply_recompute(model, recompute)
            x = torch.randint(0, spec.vocab, (2, spec.seq_len))
            with set_checkpoint_early_stop(False) if not early else contextlib.nullcontext():
                with torch.profiler.profile() as forward:
                    loss = model(x).float().logsumexp(-1).mean()
                with torch.profiler.profile() as backward:
                    loss.backward()
            counted = [collections.Counter(e.name for e in p.events())["gloo:all_reduce"] for p in (forward, backward)]
            if dist.get_rank() == 0:
                print(f"{name:8} recompute {recompute:4} early stop {'on ' if early else 'off'}: all-reduces "
                      f"forward {counted[0]}, backward {counted[1]} ({spec.layers} layers)")
            del model
    gc.collect()
    dist.destroy_process_group()


def mechanism() -> None:
    host_cost_per_collective()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    __file__, "--count-collectives"], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def check_run_count(grid: str, factors: tuple[str, ...] | None) -> None:
    """Before minutes of runs: the grid's calibrating half must hold at least as many runs as the
    factors they exercise (planner.calibration.calibrate.default_factors, either fit); else one line
    naming the minimum, exit 2."""
    from types import SimpleNamespace

    from planner.calibration.calibrate import check_factors, default_factors
    from planner.calibration.profile_grid import GRIDS
    from planner.core.layout import Job, Layout
    from planner.errors import PlannerError

    train = [SimpleNamespace(layout=Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, global_batch=gb), gpus=dp * tp * pp,
                             job=Job())
             for i, (_, dp, tp, pp, mb, gb, _) in enumerate(GRIDS[grid]) if i % 2 == 0]
    host = SimpleNamespace(network=SimpleNamespace(compute_slots=len(os.sched_getaffinity(0))))
    wanted = factors or max((default_factors(train, host, parts) for parts in (False, True)), key=len)
    try:
        check_factors(wanted, len(train))
    except PlannerError:
        enough = [g for g in GRIDS if g != grid and not g.startswith("gpu") and (len(GRIDS[g]) + 1) // 2 >= len(wanted)]
        print(f"calibration_cpu: --grid {grid} calibrates on {len(train)} runs; fitting {len(wanted)} factors "
              f"({', '.join(wanted)}) needs at least {len(wanted)}: use --grid {' or '.join(enough) or 'cpu'}, or "
              f"--factors with at most {len(train)}", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="cpu")
    ap.add_argument("--out", default="runs/calibration-cpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--factors", help="comma-separated factors (default: those the runs exercise)")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--parts", action="store_true", help="only the fit on the parts of the step")
    ap.add_argument("--mechanism", action="store_true", help="measure the TP host cost and collective counts")
    ap.add_argument("--count-collectives", action="store_true", help=argparse.SUPPRESS)  # torchrun's workers
    a = ap.parse_args()
    if a.count_collectives:
        return count_collectives()
    if a.mechanism:
        return mechanism()
    from planner.calibration.profile_grid import GRIDS

    if a.grid not in GRIDS:
        ap.error(f"--grid {a.grid}: one of {', '.join(GRIDS)}")
    factors = tuple(a.factors.split(",")) if a.factors else None
    check_run_count(a.grid, factors)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    probe, grid = out / "probed.toml", out / "grid"
    start = time.perf_counter()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start ({os.cpu_count()} cores): "
          "other work on the cores slows the runs, two-thread ones most")
    if not (a.reuse and probe.exists()):
        planner("probe", "--out", str(probe), "--nprocs", "2")
    if not (a.reuse and grid.exists()):
        planner("profile", "--grid", a.grid, "--out", str(grid), "--gpu", str(probe), "--steps", str(a.steps))
    base = load_profile_file(probe)
    runs, skipped = load_measurements([str(grid)])
    for line in skipped:
        print("skipped", line)
    train, test = split(runs, a.grid)
    fits = (("fit on step time", False), ("fit on the parts of the step", True))
    for name, parts in fits[1:] if a.parts else fits:
        fit = calibrate(train, base, factors, parts=parts)
        print(f"\n== {name}: calibrated on {len(train)} runs")
        print(describe_fit(fit, train))
        report(name, test, base, base.with_efficiency(fit.efficiency))
    load = os.getloadavg()
    print(f"total {time.perf_counter() - start:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
