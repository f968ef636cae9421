"""One prepared GPU run for issue 3's target: a 350M-1B model in bf16 on one GPU, a few hundred
steps, across micro-batch and recompute settings; the run records land in
``benchmarks/runs/<gpu>/`` as calibration data.

    python benchmarks/trainer_gpu.py                     # on a machine with one NVIDIA GPU
    python benchmarks/trainer_gpu.py --dry-run           # print the configs, run nothing
    python benchmarks/trainer_gpu.py --tiny --steps 4    # the same path on a CPU, tiny model (a smoke test)

All settings run in one process as a sweep (``python -m reference_trainer --config ... --config
...``), so the start-up is paid once. It prints, per setting, the median step time, tokens/s,
achieved TFLOP/s and MFU from the record (peak: the planner profile whose GPU model is the
device found, or --gpu).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# (name, micro_batch, recompute); global batch = 2 micro-batches per step.
SETTINGS = [("mb4", 4, "none"), ("mb8", 8, "none"), ("mb8-selective", 8, "selective"), ("mb16-full", 16, "full")]
MODEL = {"preset": "gpt3-760m", "seq_len": 2048, "dropout": 0.0}
TINY = {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "dropout": 0.0}


def configs(folder: Path, steps: int, tiny: bool, gpu: str | None) -> list[Path]:
    paths = []
    for name, mb, recompute in SETTINGS:
        config = {"run_name": name, "runs_dir": str(folder), "model": TINY if tiny else MODEL,
                  "layout": {"dp": 1, "micro_batch": mb, "global_batch": 2 * mb, "recompute": recompute},
                  "training": {"steps": steps, "precision": "fp32" if tiny else "bf16", "lr": 3e-4,
                               "warmup_steps": min(20, steps)},
                  "data": {"workers": 2 if not tiny else 0},
                  "profile": {"warmup_steps": min(10, steps // 2), "trace_steps": 2 if steps > 8 else 0,
                              "hardware_profile": gpu}}
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        paths.append(path)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--gpu", help="planner hardware profile for the MFU peak (default: matched by device name)")
    parser.add_argument("--out", help="where the records go (default: benchmarks/runs/<gpu>)")
    parser.add_argument("--tiny", action="store_true", help="a tiny fp32 model: the same path on a CPU")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = configs(folder, args.steps, args.tiny, args.gpu)
        if args.dry_run:
            for p in paths:
                print(f"# {p.name}\n{p.read_text()}")
            return 0
        cmd = [sys.executable, "-m", "reference_trainer", *[a for p in paths for a in ("--config", str(p))]]
        rc = subprocess.call(cmd, cwd=ROOT)
        records = {p.stem: json.loads((folder / p.stem / "record.json").read_text())
                   for p in paths if (folder / p.stem / "record.json").exists()}
        if not records:
            return rc or 1
        device = next(iter(records.values()))["hardware"]["device_name"]
        out = Path(args.out) if args.out else ROOT / "benchmarks" / "runs" / re.sub(r"[^a-z0-9]+", "-", device.lower())
        for name, rec in records.items():
            (out / name).mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / name / "record.json", out / name / "record.json")
            shutil.copy(folder / name / "steps.csv", out / name / "steps.csv")
            mfu = "n/a" if rec["mfu"] is None else f"{rec['mfu']:.1%}"
            print(f"{name:14s} step {rec['step_time_s']['median'] * 1e3:8.1f} ms  {rec['tokens_per_s']:10,.0f} tok/s  "
                  f"{rec['achieved_tflops_per_device']:7.1f} TFLOP/s  MFU {mfu}  peak mem "
                  f"{rec['memory']['peak_allocated_bytes'] / 2**30:.1f} GiB")
        print(f"records in {out}")
        return rc


if __name__ == "__main__":
    sys.exit(main())
