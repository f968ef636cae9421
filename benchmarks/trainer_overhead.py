"""The reference trainer's overhead over a plain single-process training loop, same tiny model.

    python benchmarks/trainer_overhead.py [--steps 40] [--repeats 3] [--threads 2]
    python benchmarks/trainer_overhead.py --launch [--repeats 5]

Both sides train the same GPT (reference_trainer/model.py) on the same synthetic samples with
AdamW, gradient accumulation over the same micro-batches, global-norm clipping and the same
learning-rate schedule. The plain loop is what one would write by hand: no process group, no
loader process, no timers, no record. The trainer is ``python -m reference_trainer`` (one
process: gloo group of one, DataLoader, step timers, profiler marks, NVML probe, per-step CSV,
run record); its median step time is read from its run record (warm-up and traced steps left
out, as always). The plain loop's median leaves out the same warm-up steps. Each side runs in
its own fresh process, alternating, ``--repeats`` times; the figure is the ratio of the medians
of the per-run medians. Target (issue 3): overhead below 10% of the step time.

``--launch``: what a launch costs before and after its steps. The wall time of ``planner run`` for
two steps of a tiny model on two ranks (dp 2; the test suite launches dozens of these), beside
the floor no launcher goes below: torchrun starting two processes that only import torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "dropout": 0.0}
LAYOUT = {"dp": 1, "micro_batch": 2, "global_batch": 8}
TRAINING = {"lr": 1e-3, "warmup_steps": 2}
WARMUP_STEPS = 2  # the trainer's default profile.warmup_steps


def plain_loop(steps: int, threads: int) -> float:
    """Median seconds per step of a hand-written loop (after the same warm-up steps)."""
    import torch

    from planner.core.model import ModelSpec
    from reference_trainer.config import TrainingConfig
    from reference_trainer.data import TokenSource, sample_ids
    from reference_trainer.model import GPT, loss_fn
    from reference_trainer.step import lr_at

    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    spec = ModelSpec(**MODEL)
    model = GPT(spec)
    model.init_weights(1234)
    tr = TrainingConfig(steps=steps, **TRAINING)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tr.weight_decay}, {"params": other, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tr.lr, betas=tr.betas, eps=tr.eps)
    source = TokenSource(seed=1234, vocab=spec.vocab, seq_len=spec.seq_len)
    mb, gb = LAYOUT["micro_batch"], LAYOUT["global_batch"]
    m = gb // mb
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        ids = sample_ids(1234, step, gb, source.num_samples)
        batch = torch.from_numpy(__import__("numpy").stack([source.sample(int(i)) for i in ids]))
        for k in range(m):
            x = batch[k * mb:(k + 1) * mb]
            (loss_fn(model(x[:, :-1]), x[:, 1:]) / m).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.grad_clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tr)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP_STEPS:])


def trainer_run(steps: int, threads: int, folder: Path, index: int) -> float:
    import yaml

    name = f"overhead-{index}"
    config = {"run_name": name, "runs_dir": str(folder), "model": MODEL, "layout": LAYOUT,
              "training": {"steps": steps, **TRAINING}, "data": {"workers": 1}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-m", "reference_trainer", "--config", str(path)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    record = json.loads((folder / name / "record.json").read_text())
    return record["step_time_s"]["median"]


def launch_times(repeats: int) -> tuple[float, float]:
    """(median wall seconds of a tiny two-rank ``planner run``, of torchrun with two ranks that
    only import torch), alternating, each ``repeats`` times."""
    run, floor = [], []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "import_torch.py"
        script.write_text("import torch\n")
        flags = ["--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn-hidden", "256",
                 "--vocab", "256", "--seq-len", "32", "--dp", "2", "--micro-batch", "1", "--global-batch", "2",
                 "--steps", "2", "--no-auto-resume"]
        for i in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "planner", "run", *flags, "--runs-dir", str(Path(tmp) / str(i))],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
            run.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            str(script)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
            floor.append(time.perf_counter() - t0)
            print(f"launch {i + 1}: planner run {run[-1]:.2f} s, torchrun importing torch only {floor[-1]:.2f} s")
    return statistics.median(run), statistics.median(floor)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on each side (default 1: steady)")
    parser.add_argument("--launch", action="store_true", help="time a tiny two-rank launch instead (see above)")
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # internal: one plain run
    args = parser.parse_args()
    if args.launch:
        run, floor = launch_times(max(1, args.repeats))
        print(f"planner run, 2 ranks, 2 steps of a 2-layer model: {run:.2f} s median wall; torchrun with 2 ranks "
              f"that only import torch: {floor:.2f} s; the trainer's own share: {run - floor:.2f} s")
        return 0
    if args.plain:
        print(plain_loop(args.steps, args.threads))
        return 0
    plain, trainer = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            out = subprocess.run([sys.executable, __file__, "--plain", "--steps", str(args.steps), "--threads",
                                  str(args.threads)], capture_output=True, text=True, check=True, cwd=ROOT)
            plain.append(float(out.stdout.strip()))
            trainer.append(trainer_run(args.steps, args.threads, Path(tmp), i))
            print(f"run {i + 1}: plain {plain[-1] * 1e3:.2f} ms/step, trainer {trainer[-1] * 1e3:.2f} ms/step")
    p, t = statistics.median(plain), statistics.median(trainer)
    overhead = t / p - 1
    print(f"model {MODEL['layers']} layers x {MODEL['hidden']} hidden, global batch {LAYOUT['global_batch']} x "
          f"seq {MODEL['seq_len']} ({LAYOUT['global_batch'] // LAYOUT['micro_batch']} micro-batches), "
          f"{args.threads} threads, {args.steps} steps x {args.repeats} runs")
    print(f"plain loop: {p * 1e3:.2f} ms/step (median of run medians)")
    print(f"trainer   : {t * 1e3:.2f} ms/step")
    print(f"overhead  : {overhead:+.1%} of the plain step ({(t - p) * 1e3:+.2f} ms); target < 10%: "
          f"{'met' if overhead < 0.10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
