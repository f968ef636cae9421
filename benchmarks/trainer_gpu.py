"""The GPU runs calibration needs first: a 350M-1B model in bf16 on one GPU, short runs across
micro-batch and recompute. Each run's record lands under --out (``$OUT/runs`` in
benchmarks/gpu_session.sh) the moment the run ends, written there by the trainer itself: a sweep
cut short by a time limit still leaves every record it finished.

    python benchmarks/trainer_gpu.py --out DIR                  # on a machine with an NVIDIA GPU
    python benchmarks/trainer_gpu.py --out DIR --print-configs  # print the configs, run nothing
    python benchmarks/trainer_gpu.py --out DIR --tiny --steps 6 # the same path on a CPU, tiny model

All settings run in one process as a sweep (``python -m reference_trainer --config ... --config
...``), so the start-up is paid once; the configs are written under --out first. Then it prints,
per finished run, the median step time, tokens/s, achieved TFLOP/s, MFU (peak: --gpu, or the
planner profile whose GPU model is the device found) and peak memory, and writes them to
``summary.json`` beside the runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# (name, model, micro_batch, recompute); global batch = 2 micro-batches per step. 350M and 760M
# GPT-3 shapes at 2k tokens: about 5-20 s each for 30 steps on an H100/H200 in bf16.
MODELS = {"350m": {"preset": "gpt3-350m", "seq_len": 2048, "dropout": 0.0},
          "760m": {"preset": "gpt3-760m", "seq_len": 2048, "dropout": 0.0}}
SETTINGS = [("350m-mb4", "350m", 4, "none"), ("350m-mb8-selective", "350m", 8, "selective"),
            ("760m-mb4", "760m", 4, "none"), ("760m-mb8", "760m", 8, "none"),
            ("760m-mb8-selective", "760m", 8, "selective"), ("760m-mb16-full", "760m", 16, "full")]
TINY = {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "dropout": 0.0}


def configs(out: Path, steps: int, tiny: bool, gpu: str | None) -> list[Path]:
    folder = out / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, model, mb, recompute in SETTINGS:
        config = {"run_name": name, "runs_dir": str(out), "model": TINY if tiny else MODELS[model],
                  "layout": {"dp": 1, "micro_batch": mb, "global_batch": 2 * mb, "recompute": recompute},
                  "training": {"steps": steps, "precision": "fp32" if tiny else "bf16", "lr": 3e-4,
                               "warmup_steps": min(10, steps)},
                  "data": {"workers": 0 if tiny else 2},
                  "profile": {"warmup_steps": min(5, steps // 2), "trace_steps": 2 if steps >= 10 else 1,
                              "hardware_profile": gpu, "tensorboard": True}}
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        paths.append(path)
    return paths


def summarise(out: Path, names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        path = out / name / "record.json"
        if not path.exists():
            print(f"{name:20s} no record (not run, or cut short)")
            continue
        rec = json.loads(path.read_text())
        row = {"run": name, "step_s": rec["step_time_s"]["median"], "tokens_per_s": rec["tokens_per_s"],
               "tflops": rec["achieved_tflops_per_device"], "mfu": rec["mfu"],
               "peak_allocated_gib": rec["memory"]["peak_allocated_bytes"] / 2**30,
               "peak_reserved_gib": (rec["memory"]["peak_reserved_bytes"] or 0) / 2**30,
               "alloc_retries": rec["memory"].get("alloc_retries")}
        rows.append(row)
        mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
        retries = "" if row["alloc_retries"] is None else f"  allocator retries {row['alloc_retries']}"
        print(f"{name:20s} step {row['step_s'] * 1e3:8.1f} ms  {row['tokens_per_s']:10,.0f} tok/s  "
              f"{row['tflops']:7.1f} TFLOP/s  MFU {mfu}  peak mem {row['peak_allocated_gib']:.1f} GiB "
              f"(reserved {row['peak_reserved_gib']:.1f}){retries}")
    best = max((r for r in rows if r["mfu"] is not None), key=lambda r: r["mfu"], default=None)
    if best:
        print(f"best MFU: {best['mfu']:.1%} ({best['run']})")
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps({"runs": rows, "best_mfu": best}, indent=1))
    tmp.replace(out / "summary.json")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the configs, the runs and summary.json")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--gpu", help="planner hardware profile for the MFU peak (default: matched by device name)")
    parser.add_argument("--tiny", action="store_true", help="a tiny fp32 model: the same path on a CPU")
    parser.add_argument("--print-configs", action="store_true", help="write and print the configs, run nothing")
    args = parser.parse_args()
    if args.steps < 4:
        print(f"error: --steps={args.steps}: at least 4", file=sys.stderr)
        return 2
    out = Path(args.out)
    paths = configs(out, args.steps, args.tiny, args.gpu)
    if args.print_configs:
        for p in paths:
            print(f"# {p.name}\n{p.read_text()}")
        return 0
    cmd = [sys.executable, "-m", "reference_trainer", *[a for p in paths for a in ("--config", str(p))]]
    rc = subprocess.call(cmd, cwd=ROOT)
    rows = summarise(out, [p.stem for p in paths])
    print(f"records in {out}")
    return rc if rows else (rc or 1)


if __name__ == "__main__":
    sys.exit(main())
