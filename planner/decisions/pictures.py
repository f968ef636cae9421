"""The data behind the pictures (explorer charts and `planner estimate --plot`): a pipeline
schedule timeline, memory against micro-batch size, and the step-time breakdown against GPU count.
Pure functions returning rows; the explorer draws them with Vega-Lite (planner/app/charts.py), the
CLI with matplotlib (planner/cli/plots.py).
"""

from __future__ import annotations

import dataclasses

from planner.core.pipeline import virtual_stage
from planner.errors import PlannerError

# One colour per part of the step (planner.core.report.TIME_PARTS' labels, in that order), for the
# explorer's charts and the CLI's --plot alike; tests/test_pictures.py checks every part has one.
TIME_COLOURS = {"compute": "#4c78a8", "TP comm": "#e45756", "CP comm": "#9d755d", "EP all-to-all": "#eeca3b",
                "PP comm": "#ff9da6", "DP comm": "#b279a2", "bubble": "#f58518", "optimizer": "#54a24b",
                "other": "#bab0ac"}
MAX_DRAWN_MICRO_BATCHES = 24  # a timeline of more micro-batches is drawn with this many (said in the caption)
FORWARD, BACKWARD = 1.0, 2.0  # a backward pass costs twice a forward (Narayanan et al. 2021, Sec. 3)


def _rank_order(schedule: str, pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) order one pipeline rank runs. GPipe: every forward, then every
    backward (Huang et al. 2019). 1F1B: pp - rank - 1 warm-up forwards, then one forward one
    backward, then the remaining backwards (Narayanan et al. 2021, Fig. 4 top). Interleaved: the
    same with vpp model chunks per rank, micro-batches taken in groups of pp per chunk and
    (pp - rank - 1) * 2 + (vpp - 1) * pp warm-up forwards (Narayanan et al. 2021, Fig. 4 bottom;
    Megatron-LM schedules.py)."""
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]
    if vpp == 1:
        fwd = [("F", i, 0) for i in range(m)]
        bwd = [("B", i, 0) for i in range(m)]
        warm = min(m, pp - rank - 1)
    else:
        groups = [range(g, min(g + pp, m)) for g in range(0, m, pp)]
        fwd = [("F", i, c) for grp in groups for c in range(vpp) for i in grp]
        bwd = [("B", i, c) for grp in groups for c in reversed(range(vpp)) for i in grp]
        warm = min(len(fwd), (pp - rank - 1) * 2 + (vpp - 1) * pp)
    order = fwd[:warm]
    rest_f, rest_b = fwd[warm:], list(bwd)
    while rest_f:
        order.append(rest_f.pop(0))
        order.append(rest_b.pop(0))
    return order + rest_b


def _dualpipev_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """DualPipeV's order on one rank (DeepSeek's DualPipe cut in half, as torch's
    ScheduleDualPipeV runs it): chunk 0 is stage ``rank`` on the way down the V, chunk 1 stage
    2 pp - 1 - rank on the way back. Eight phases: forwards of chunk 0 to fill the V, forwards of
    both chunks, chunk 1's backwards each followed by a forward, the steady state (forward 0,
    backward 1, forward 1, backward 0; torch runs each pair one after the other), the drain of chunk
    1 and then chunk 0, and deferred weight gradients in the bubbles at the end. "I" is the
    input-gradient half of a backward whose weight-gradient half "W" runs later (zero bubble)."""
    nxt: dict[tuple[str, int], int] = {}
    waiting: list[tuple[int, int]] = []
    order: list[tuple[str, int, int]] = []

    def add(kind: str, chunk: int) -> None:
        key = ("F" if kind == "F" else "B", chunk)
        i = nxt.get(key, 0)
        nxt[key] = i + 1
        order.append((kind, i, chunk))
        if kind == "I":
            waiting.append((i, chunk))

    def weight() -> None:
        if waiting:
            i, chunk = waiting.pop(0)
            order.append(("W", i, chunk))

    p, r = pp, rank
    for _ in range(2 * (p - r - 1)):
        add("F", 0)
    for _ in range(r + 1):
        add("F", 0)
        add("F", 1)
    for _ in range(p - r - 1):
        add("I", 1)
        weight()
        add("F", 1)
    for _ in range(m - 2 * p + r + 1):
        for kind, chunk in (("F", 0), ("B", 1), ("F", 1), ("B", 0)):
            add(kind, chunk)
    for _ in range(p - r - 1):
        for kind, chunk in (("B", 1), ("F", 1), ("B", 0)):
            add(kind, chunk)
    split = False  # the second half of the drain splits its backwards, the weights filling the tail
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        add("I" if split else "B", 1)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        add("I" if split else "B", 0)
    for _ in range(p - r - 1):
        weight()
        add("I" if split else "B", 0)
    while waiting:
        weight()
    return order


def drawn_micro_batches(pp: int, micro_batches: int, schedule: str) -> int:
    """How many of a step's micro-batches the timeline draws: at most MAX_DRAWN_MICRO_BATCHES, but
    DualPipeV's order needs 2 pp of them."""
    cap = max(MAX_DRAWN_MICRO_BATCHES, 2 * pp) if schedule == "dualpipev" else MAX_DRAWN_MICRO_BATCHES
    return min(micro_batches, cap)


DUALPIPE_NOTE = ("DualPipeV is drawn as torch's ScheduleDualPipeV orders it, each pair run one after the other and "
                 "a weight gradient half a backward; the estimate's bubble is DeepSeek's published "
                 "(PP/2 - 1)(F&B + B - 3W), which such a drawing comes in under.")


_DONE_AS = {"F": "F", "B": "B", "I": "B", "W": "W"}  # an input-gradient half lets the previous stage's backward go


def timeline_rows(pp: int, vpp: int, micro_batches: int, schedule: str = "1f1b") -> list[dict]:
    """One row per forward or backward of a micro-batch on a rank: start and end in units of one
    full-model forward per micro-batch split over the stages (a chunk's forward is 1/vpp of a
    stage's), from a simulation that runs each rank's order as soon as its inputs exist. The idle
    gaps between the rows are the bubble. DualPipeV (vpp 2) is drawn with at least the 2 pp
    micro-batches it needs; its split backwards are two rows, input gradients then weights."""
    m = drawn_micro_batches(pp, micro_batches, schedule)
    if schedule == "dualpipev":
        orders = [_dualpipev_order(pp, m, r) for r in range(pp)]
    else:
        orders = [_rank_order(schedule, pp, vpp, m, r) for r in range(pp)]
    chunks = pp * vpp
    cost = {"F": FORWARD / vpp, "B": BACKWARD / vpp, "I": BACKWARD / 2 / vpp, "W": BACKWARD / 2 / vpp}
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, virtual stage) -> end time
    free = [0.0] * pp
    nxt = [0] * pp
    rows: list[dict] = []
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while nxt[r] < len(orders[r]):
                kind, i, c = orders[r][nxt[r]]
                vs = virtual_stage(r, c, pp, schedule)
                if kind == "F":
                    dep = done.get(("F", i, vs - 1)) if vs > 0 else 0.0
                elif kind == "W":  # after its own input gradient
                    dep = done.get(("B", i, vs))
                else:  # a backward (whole or its input half) after the next stage's
                    dep = done.get(("B", i, vs + 1)) if vs < chunks - 1 else done.get(("F", i, vs))
                if dep is None:
                    break
                start = max(free[r], dep)
                end = start + cost[kind]
                done[(_DONE_AS[kind], i, vs)] = end
                free[r] = end
                rows.append({"rank": r, "kind": "forward" if kind == "F" else "backward", "micro_batch": i,
                             "chunk": c, "start": start, "end": end})
                nxt[r] += 1
                progress = True
    return rows


def bubble_of(rows: list[dict], pp: int) -> float:
    """Idle share of the ranks' time in a timeline (what the picture shows as gaps)."""
    span = max(r["end"] for r in rows)
    busy = sum(r["end"] - r["start"] for r in rows)
    return 1 - busy / (span * pp)


def memory_vs_micro_batch(x, best, sizes=(1, 2, 4, 8, 16, 32)) -> list[dict]:
    """Peak memory per GPU of the chosen layout with each micro-batch size (the rest pinned), and
    the GPU's capacity: the micro-batches that divide the batch per replica."""
    from planner.core.search import Pins, search

    lay = best.layout
    pins = {d: getattr(lay, d) for d in ("dp", "tp", "pp", "vpp", "zero_stage", "recompute", "sequence_parallel")}
    if hasattr(lay, "cp"):
        pins["cp"] = lay.cp
    rows = []
    for mb in sizes:
        try:
            r = search(x.model, x.hardware, x.job.replace(global_batch=lay.global_batch), x.gpus,
                       dataclasses.replace(Pins(), **pins, micro_batch=mb), "time")
        except PlannerError:  # a micro-batch the batch does not split into: left out
            continue
        if r.evaluated:
            rows.append({"micro_batch": mb, "GiB": float(r.ranked([0]).memory.total[0]) / 2**30,
                         "capacity_GiB": r.partial_table.capacity_bytes / 2**30,
                         "chosen": mb == lay.micro_batch})
    return rows


def breakdown_vs_gpus(x, counts=None, known=None) -> list[dict]:
    """The step-time parts of the best layout at GPU counts around the plan's (halving and doubling),
    layout searched freely at each count; the global batch is the plan's. ``known``: {GPU count: the
    best estimate of that free search (by time)} a caller already has. The other counts are searched
    together (planner.core.bounded.fastest_fitting_bounded: each count's first layout of a free
    search by time, when it fits, with the step time of only the layouts that could rank first)."""
    *_, rows = breakdown_steps(x, counts, known)
    return rows


def breakdown_steps(x, counts=None, known=None):
    """``breakdown_vs_gpus`` in steps of a few milliseconds (a count's layouts enumerated, a block
    of their memory, the search among them): yields None after each, and its rows last."""
    from planner.core.bounded import fastest_fitting_bounded, least_memory_steps
    from planner.core.report import TIME_PARTS
    from planner.core.results import estimate_at
    from planner.core.search import counts_table, enumerate_counts

    g = x.gpus
    counts = counts or sorted({max(1, g // 4), max(1, g // 2), g, g * 2, g * 4})
    known = dict(known or {})
    tables = {}
    for n in (n for n in counts if n not in known):
        tables.update(enumerate_counts(x.model, [n], x.job))
        yield None
    if tables:
        table = counts_table(tables, x.hardware.network.gpus_per_node)
        for _ in least_memory_steps(x.model, x.hardware, x.job, table):  # kept in the table for the search
            yield None
        try:
            found = fastest_fitting_bounded(x.model, x.hardware, x.job, table)
        except PlannerError:  # the precision on this GPU, say: no count has a plan
            found = {}
        for n, ev in found.items():
            known[n] = estimate_at(ev, 0, x.model, x.hardware, x.job, x.ops)
    rows = []
    for n in counts:
        best = known.get(n)
        if best is None or not best.fits:
            continue
        t = best.time
        rows += [{"GPUs": n, "part": label, "seconds": getattr(t, key)} for key, label in TIME_PARTS
                 if getattr(t, key, 0) > 0]
    yield rows
