"""How fast is the search? Prints in-process search times and the CLI's end-to-end time.

Run: python benchmarks/search_speed.py
Targets (issue 2): 33B on 128 GPUs < 50 ms in process; >= 1M layouts/s on a large space;
`planner estimate --params 33B --gpus 128` < 1 s end to end.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from planner.core.layout import Job
from planner.core.presets import get_preset, resolve_params
from planner.core.search import Pins, search
from planner.hardware import get_profile


def timed_search(model, gpus, job=Job(), pins=Pins(), repeat=7):
    hw = get_profile("a100-80g")
    search(model, hw, job, gpus, pins)  # warm caches (profile files, numpy)
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = search(model, hw, job, gpus, pins)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    model, _ = resolve_params(33e9)
    t, r = timed_search(model, 128)
    print(f"33B on 128 GPUs: {r.evaluated} layouts, {r.feasible} fit, median {t * 1e3:.1f} ms per full search")
    for name, gpus, job in (("megatron-1t", 3072, Job()),
                            ("megatron-1t", 3072, Job(attention="standard")),
                            ("llama3-405b", 16384, Job(attention="standard"))):
        t, r = timed_search(get_preset(name), gpus, job, repeat=3)
        print(f"{name} on {gpus} GPUs ({job.attention} attention): {r.evaluated} layouts in {t * 1e3:.1f} ms = "
              f"{r.evaluated / t / 1e6:.2f} M layouts/s")
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "planner", "estimate", "--params", "33B", "--gpus", "128"],
                       check=True, capture_output=True)
        runs.append(time.perf_counter() - t0)
    print(f"`planner estimate --params 33B --gpus 128` end to end: median {statistics.median(runs):.3f} s "
          f"(min {min(runs):.3f} s) over {len(runs)} runs")


if __name__ == "__main__":
    main()
