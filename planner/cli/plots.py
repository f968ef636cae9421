"""`planner estimate --plot FILE.png|svg|pdf`: the explorer's pictures as one figure (matplotlib,
imported only here, only when --plot is given): the pipeline schedule of the chosen layout, memory
against micro-batch size with the capacity line, the step-time breakdown against GPU count. The
data comes from planner.decisions.pictures; the file is written atomically (planner.files)."""

from __future__ import annotations

import io
from pathlib import Path

from planner.core.pipeline import schedule_name
from planner.decisions.pictures import TIME_COLOURS


def write_estimate_plot(x, p, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from planner.decisions import pictures as pic
    from planner.files import write_atomic

    lay = p.best.layout
    fig, (ax_t, ax_m, ax_s) = plt.subplots(3, 1, figsize=(9, 11), gridspec_kw={"height_ratios": [1.2, 1, 1]})
    try:
        rows = pic.timeline_rows(lay.pp, lay.vpp, lay.grad_accum, lay.schedule)
        for r in rows:
            colour = "#9ecae9" if r["kind"] == "forward" else "#4c78a8"
            ax_t.barh(r["rank"], r["end"] - r["start"], left=r["start"], color=colour, edgecolor="white", height=0.8)
        ax_t.set_yticks(range(lay.pp), [f"rank {i}" for i in range(lay.pp)])
        ax_t.invert_yaxis()
        sched = schedule_name(lay.schedule, lay.vpp)
        ax_t.set_title(f"pipeline schedule: {sched}, pp {lay.pp}, vpp {lay.vpp}, m {lay.grad_accum} "
                       f"(bubble {pic.bubble_of(rows, lay.pp):.0%}; light forward, dark backward)")
        ax_t.set_xlabel("time (one full forward of a micro-batch = 1)")
        mem = pic.memory_vs_micro_batch(x, p.best)
        if mem:
            ax_m.plot([r["micro_batch"] for r in mem], [r["GiB"] for r in mem], marker="o")
            ax_m.axhline(mem[0]["capacity_GiB"], color="red", linestyle="--", label="capacity")
            ax_m.set_xscale("log", base=2)
            ax_m.legend()
        ax_m.set_xlabel("micro-batch (sequences)")
        ax_m.set_ylabel("GiB per GPU (peak)")
        ax_m.set_title("memory vs micro-batch (this layout)")
        parts = pic.breakdown_vs_gpus(x)
        counts = sorted({r["GPUs"] for r in parts})
        bottom = [0.0] * len(counts)
        for part, colour in TIME_COLOURS.items():
            ys = [sum(r["seconds"] for r in parts if r["GPUs"] == n and r["part"] == part) for n in counts]
            if any(ys):
                ax_s.bar([str(n) for n in counts], ys, bottom=bottom, color=colour, label=part)
                bottom = [b + y for b, y in zip(bottom, ys)]
        ax_s.set_xlabel("GPUs")
        ax_s.set_ylabel("seconds per step")
        ax_s.set_title("step time vs GPUs (best layout at each count)")
        if parts:
            ax_s.legend(fontsize=8, ncol=4)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=Path(path).suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    write_atomic(path, buf.getvalue(), field="plot")
