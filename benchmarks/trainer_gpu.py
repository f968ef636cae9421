"""The GPU runs calibration needs first: a 350M-1B model in bf16 on one GPU, short runs across
micro-batch and recompute. Each run's record lands under --out (``$OUT/runs`` in
benchmarks/gpu_session.py) the moment the run ends, written there by the trainer itself: a sweep
cut short by a time limit still leaves every record it finished.

    python benchmarks/trainer_gpu.py --out DIR                  # on a machine with an NVIDIA GPU
    python benchmarks/trainer_gpu.py --out DIR --print-configs  # print the configs, run nothing
    python benchmarks/trainer_gpu.py --out DIR --tiny --steps 6 # the same path on a CPU, tiny model

All settings run in one process as a sweep (``python -m reference_trainer --config ... --config
...``), so the start-up is paid once; the configs are written under --out first. Then it prints,
per finished run, the median step time, tokens/s, achieved TFLOP/s, MFU (peak: --gpu, or the
planner profile whose GPU model is the device found) and peak memory, and writes them to
``summary.json`` beside the runs.

    python benchmarks/trainer_gpu.py --out DIR --ceiling RUN_DIR   # RUN_DIR: one of these runs, finished

reruns that setting twice under a memory cap (the trainer's ``profile.memory_fraction``): at the run's
reserved peak, and at its allocated peak + 2%, so that the caching allocator must release its cache
and retry (``memory.alloc_retries``) to stay under it; it prints each one's step time against the
uncapped run's. This measures what a run pressed against its memory ceiling loses (issue 14: the
torchtitan rows near 84 GiB of an H100 96GB). On a CPU there is no cap: the same path, uncapped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from planner.calibration.record import validate_record  # noqa: E402

# (name, model, micro_batch, recompute); global batch = 2 micro-batches per step. 350M and 760M
# GPT-3 shapes at 2k tokens: about 5-20 s each for 30 steps on an H100/H200 in bf16. In pairs:
# benchmarks/gpu_session.py calibrates on the first of each (even index) and holds out the second;
# each half has both models, no recompute and some recompute, and micro-batches 2 to 16; 6 runs to
# calibrate on: more than the 4 factors one GPU's runs exercise, for the leave-one-out figures. The
# last pair recomputes a share of the layers (quarter: every fourth block, half: every second), so
# the held-out half run checks that mechanism; last, so a slot cut short loses it first.
MODELS = {"350m": {"preset": "gpt3-350m", "seq_len": 2048, "dropout": 0.0},
          "760m": {"preset": "gpt3-760m", "seq_len": 2048, "dropout": 0.0}}
SETTINGS = [("350m-mb4", "350m", 4, "none"), ("350m-mb8-selective", "350m", 8, "selective"),
            ("760m-mb4", "760m", 4, "none"), ("760m-mb8", "760m", 8, "none"),
            ("760m-mb8-selective", "760m", 8, "selective"), ("760m-mb16-full", "760m", 16, "full"),
            ("350m-mb16-full", "350m", 16, "full"), ("350m-mb2", "350m", 2, "none"),
            ("350m-mb8", "350m", 8, "none"), ("760m-mb2", "760m", 2, "none"),
            ("350m-mb8-quarter", "350m", 8, "quarter"), ("760m-mb8-half", "760m", 8, "half")]
TINY = {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64, "dropout": 0.0}


def config_for(setting: tuple, out: Path, steps: int, tiny: bool, gpu: str | None, run_name: str | None = None,
               memory_fraction: float | None = None) -> Path:
    """One setting's trainer config, written under ``out/configs``; its path."""
    name, model, mb, recompute = setting
    run_name = run_name or name
    config = {"run_name": run_name, "runs_dir": str(out), "model": TINY if tiny else MODELS[model],
              "layout": {"dp": 1, "micro_batch": mb, "global_batch": 2 * mb, "recompute": recompute},
              "training": {"steps": steps, "precision": "fp32" if tiny else "bf16", "lr": 3e-4,
                           "warmup_steps": min(10, steps)},
              "data": {"workers": 0 if tiny else 2},
              "profile": {"warmup_steps": min(5, steps // 2), "trace_steps": 2 if steps >= 10 else 1,
                          "hardware_profile": gpu, "tensorboard": True, "memory_fraction": memory_fraction}}
    folder = out / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run_name}.json"  # JSON is YAML too, and needs no PyYAML (the GPU image may lack it)
    path.write_text(json.dumps(config, indent=1))
    return path


def configs(out: Path, steps: int, tiny: bool, gpu: str | None) -> list[Path]:
    return [config_for(setting, out, steps, tiny, gpu) for setting in SETTINGS]


def _refuse(why: str) -> None:
    print(f"error: {why}", file=sys.stderr)
    raise SystemExit(2)


def ceiling_configs(run_dir: Path, out: Path, steps: int, tiny: bool, gpu: str | None) -> tuple[dict, list[Path]]:
    """The capped reruns of the finished run in ``run_dir`` (a setting of this script): its record
    and the two configs (cap at its reserved peak; at its allocated peak + 2%)."""
    setting = next((s for s in SETTINGS if s[0] == run_dir.name), None)
    if setting is None:
        _refuse(f"--ceiling {run_dir}: not a run of this script (one of {', '.join(s[0] for s in SETTINGS)})")
    try:  # a complete record (planner's schema: a step time above 0, the memory section)
        record = validate_record(json.loads((run_dir / "record.json").read_text()))
    except (OSError, ValueError) as exc:
        _refuse(f"--ceiling {run_dir}: no readable run record there ({exc})")
    memory, capacity = record["memory"], record["memory"]["capacity_bytes"]
    peaks = {"reserved": memory["peak_reserved_bytes"], "tight": memory["peak_allocated_bytes"] * 1.02}
    paths = []
    for label, limit in peaks.items():
        fraction = min(1.0, limit / capacity) if capacity and limit else None  # a CPU: no cap
        paths.append(config_for(setting, out, steps, tiny, gpu, f"{run_dir.name}-cap-{label}", fraction))
    return record, paths


def compare_ceiling(record: dict, out: Path, names: list[str]) -> None:
    """Each capped run's step time and allocator retries against the uncapped run's."""
    base = record["step_time_s"]["median"]
    for name in names:
        path = out / name / "record.json"
        if not path.exists():  # the trainer writes no record for a run that died (out of memory under the cap?)
            print(f"{name}: no record: the run did not finish under its cap (the log says why)")
            continue
        rec = json.loads(path.read_text())
        cap = rec["config"]["profile"].get("memory_fraction")
        where = "no cap (a CPU)" if cap is None else f"cap {cap:.4f} of the GPU"
        print(f"{name}: {where}: step {rec['step_time_s']['median'] / base:.3f} x the uncapped run's, "
              f"allocator retries {rec['memory'].get('alloc_retries')}")


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
    parser.add_argument("--ceiling", metavar="RUN_DIR",
                        help="rerun this finished run of the script under two memory caps (its reserved peak; "
                             "its allocated peak + 2%%) and compare their step times with it")
    args = parser.parse_args()
    if args.steps < 4:
        print(f"error: --steps={args.steps}: at least 4", file=sys.stderr)
        return 2
    out = Path(args.out)
    if args.ceiling:
        record, paths = ceiling_configs(Path(args.ceiling), out, args.steps, args.tiny, args.gpu)
    else:
        paths = configs(out, args.steps, args.tiny, args.gpu)
    if args.print_configs:
        for p in paths:
            print(f"# {p.name}\n{p.read_text()}")
        return 0
    cmd = [sys.executable, "-m", "reference_trainer", *[a for p in paths for a in ("--config", str(p))]]
    rc = subprocess.call(cmd, cwd=ROOT)
    rows = summarise(out, [p.stem for p in paths])
    if args.ceiling:
        compare_ceiling(record, out, [p.stem for p in paths])
    print(f"records in {out}")
    return rc if rows else (rc or 1)


if __name__ == "__main__":
    sys.exit(main())
