"""Builders for the trainer tests: tiny configs, launching the trainer, reading what it wrote."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import yaml

# Tiny shapes (a few hundred thousand parameters): a step takes milliseconds on a CPU.
TINY_GPT = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "dropout": 0.0}
TINY_LLAMA = {"arch": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
              "vocab": 512, "seq_len": 64}
RUN_TIMEOUT_S = 240


def write_config(folder: Path, name: str, model: dict, layout: dict, **sections: dict) -> Path:
    """A run config ``folder/name.yaml`` writing its run under ``folder/runs/name``: 6 steps of
    lr 1e-3 on the synthetic stream, global batch 8 of micro-batch 2 unless overridden."""
    config = {"run_name": name, "runs_dir": str(folder / "runs"), "seed": 1234, "model": dict(model),
              "layout": {"micro_batch": 2, "global_batch": 8, **layout},
              "training": {"steps": 6, "lr": 1e-3, "warmup_steps": 2},
              "data": {"workers": 0}, "profile": {"warmup_steps": 2, "trace_steps": 1}}
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "REFERENCE_TRAINER_FAULT")}
    env["OMP_NUM_THREADS"] = "1"  # 2 cores shared by up to 4 processes
    env.update(extra or {})
    return env


def run_trainer(configs: list[Path], nproc: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m reference_trainer --config ...`` alone (one process) or under torchrun."""
    args = [a for c in configs for a in ("--config", str(c))]
    if nproc == 1:
        cmd = [sys.executable, "-m", "reference_trainer", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "reference_trainer", *args]
    return subprocess.run(cmd, env=trainer_env(env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def steps(run_dir: Path) -> list[dict]:
    with open(run_dir / "steps.csv", newline="") as f:
        return [{k: (float(v) if v else None) for k, v in row.items()} for row in csv.DictReader(f)]


def column(run_dir: Path, name: str) -> list[float]:
    return [row[name] for row in steps(run_dir)]


def explain(proc: subprocess.CompletedProcess) -> str:
    """The end of a failed run's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
