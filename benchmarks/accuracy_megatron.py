"""Predicted vs measured step time for the Megatron-LM 2021 runs, with the default A100 factors.

Run: python benchmarks/accuracy_megatron.py
Table 1 (in sample: the defaults were fitted to it by benchmarks/fit_megatron.py), then Table 2
out of sample: the PTD rows, and the DeepSpeed ZeRO-3 rows (the deepspeed-zero stack: flat rings).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.calibration.measured import from_published, published_measurements
from planner.calibration.published import load_table2
from planner.calibration.validate import compare

DATA = Path(__file__).parent / "data"


def show(title: str, runs) -> None:
    points = [p for p in compare(runs) if p.quantity == "step_s"]
    print(f"\n{title}\n{'run':>16} {'GPUs':>5} {'layout':<28} {'meas. s':>9} {'pred. s':>9} {'error':>7}")
    for r, p in zip(runs, points):
        lay = r.layout
        shape = f"dp{lay.dp} tp{lay.tp} pp{lay.pp} v{lay.vpp} mb{lay.micro_batch} z{lay.zero_stage}"
        print(f"{r.label:>16} {r.gpus:>5} {shape:<28} {p.measured:9.2f} {p.predicted:9.2f} {p.error:+7.1%}")
    e = np.abs([p.error for p in points])
    print(f"mean |error| {e.mean():.1%}, worst {e.max():.1%}")


def main() -> None:
    show("Megatron-LM 2021 Table 1 (fp16, full recompute, interleaved 1F1B; targets <= 5% mean, <= 10% worst)",
         published_measurements(str(DATA / "megatron2021_table1.csv")))
    ptd, zero = load_table2(DATA / "megatron2021_other.csv")
    show("Table 2, PTD parallelism (out of sample; 175B split assumed t=8, p=12)", from_published(ptd, "table2"))
    show("Table 2, DeepSpeed ZeRO-3 without model parallelism (out of sample; deepspeed-zero stack)",
         from_published(zero, "table2"))


if __name__ == "__main__":
    main()
