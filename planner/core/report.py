"""Text for people: the estimate report, the ranked table, and CSV rows for machines."""

from __future__ import annotations

from pathlib import Path

from planner.core.layout import CHINCHILLA_TOKENS_PER_PARAM, LAYOUT_DIMS
from planner.core.plan import Plan, crowded, fit_hints
from planner.core.results import Estimate, flat_fields, least_certain
from planner.evidence import calibration_line
from planner.stacks import DEFAULT_STACK, overrides_text, software
from planner.tables import WIDTH, fit_table
from planner.units import GIB, fmt_bytes, fmt_count, fmt_days, fmt_seconds

BAR_WIDTH = 50
BAR_PARTS = (("weights_bytes", "W", "weights"), ("gradients_bytes", "G", "grads"),
             ("optimizer_bytes", "O", "optimizer"), ("activations_bytes", "A", "activations"),
             ("other_bytes", "x", "other"))
TIME_PARTS = (("compute_s", "compute"), ("tp_comm_s", "TP comm"), ("cp_comm_s", "CP comm"), ("ep_comm_s", "EP all-to-all"),
              ("pp_comm_s", "PP comm"),
              ("dp_comm_s", "DP comm"), ("bubble_s", "bubble"), ("optimizer_s", "optimizer"), ("other_s", "other"))


def layout_line(e: Estimate) -> str:
    lay = e.layout
    vpp = f" (interleaved x{lay.vpp})" if lay.vpp > 1 and lay.schedule == "1f1b" else ""
    sched = {"gpipe": " GPipe", "dualpipev": " (DualPipeV: 2 stages per rank in a V)"}.get(lay.schedule, "")
    sched = sched if lay.pp > 1 else ""  # without a pipeline the schedule names nothing that runs
    cp = f" x cp {lay.cp}" if lay.cp > 1 else ""
    cp += f" (ep {lay.ep} of dp*cp)" if lay.ep > 1 else ""
    offload = f" | offload {lay.offload}" if lay.offload != "none" else ""
    offload = (" | hybrid sharding (HSDP)" if lay.sharding == "hybrid" else "") + offload
    return (f"dp {lay.dp} x tp {lay.tp} x pp {lay.pp}{vpp}{sched}{cp} | micro-batch {lay.micro_batch} x "
            f"{lay.grad_accum} accum = global {lay.global_batch} seqs | ZeRO-{lay.zero_stage} | "
            f"recompute {lay.recompute} | SP {'on' if lay.sequence_parallel else 'off'}{offload}")


def memory_bar(e: Estimate) -> str:
    """Parts as letters on a bar whose right end is the GPU's capacity (`|`)."""
    m = e.memory
    scale = BAR_WIDTH / max(m.capacity_bytes, m.total_bytes)
    cells = "".join(ch * round(getattr(m, key) * scale) for key, ch, _ in BAR_PARTS)
    cap = round(m.capacity_bytes * scale)
    cells = (cells + "." * max(0, cap - len(cells)))
    return "[" + cells[:cap] + "|" + cells[cap:] + "]"


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"


def labelled(label: str, lines, width: int) -> list[str]:
    """``lines`` one per line from column ``width``, the first after ``label`` (a report's "checked"
    clauses, indented under their label)."""
    return [f"{label if k == 0 else '':<{width}}{line}" for k, line in enumerate(lines)]


def stack_line(e: Estimate) -> str:
    """The software stack, what it runs, and where its factors come from."""
    s = e.stack_json()
    extras = [x for x, on in (("compiled", s["compile"]), ("async TP", s["async_tp"])) if on]
    default = " (default; --stack to choose)" if e.job.stack == DEFAULT_STACK else ""
    where = Path(s["file"]).name if s["file"] else ""
    return (f"{s['name']}{default}: {s['description']}{', ' + ', '.join(extras) if extras else ''} ({where})"
            + overrides_text(software(e.job).stack))


def offload_line(e: Estimate) -> str:
    """What CPU offload holds in host memory and what it costs in the step."""
    net = e.hardware.network
    on_host = min(e.gpus, net.host_gpus)
    what = ("weights, optimizer states and gradients" if e.layout.offload == "params"
            else "optimizer states and gradients")
    return (f"         offload: {what} in host memory, {e.memory.host_bytes / GIB:.1f} GiB per GPU "
            f"({e.memory.host_bytes * on_host / GIB:.0f} of {net.host_memory_bytes / GIB:.0f} GiB per host)\n"
            f"         it costs the optimizer step on the CPU with its PCIe copies: {e.time.optimizer_s:.3g} s "
            f"of the {e.time.step_s:.3g} s step")


def _mfu_basis(fp8: bool, moe: bool) -> str:
    """What MFU is counted against, when it is not the plain convention: " (of the bf16 peak; active
    parameters)" for an fp8 MoE job."""
    said = [s for s, on in (("of the bf16 peak", fp8), ("active parameters", moe)) if on]
    return f" ({'; '.join(said)})" if said else ""


def estimate_report(p: Plan, model_note: str = "", top: int = 5, width: int | None = WIDTH) -> str:
    e = p.best
    m, t, tr, hw = e.memory, e.time, e.train, e.hardware
    net = hw.network
    if net.host_gpus != net.gpus_per_node:  # a rack-scale NVLink domain, and its hosts
        nodes = f"{nodes_text(e.gpus, net.gpus_per_node, 'NVLink domain')}; {nodes_text(e.gpus, net.host_gpus, 'host')}"
    else:
        nodes = nodes_text(e.gpus, net.gpus_per_node)
    job = e.job
    tokens_note = ("--tokens" if job.tokens is not None else
                   f"default: {CHINCHILLA_TOKENS_PER_PARAM} per parameter, Chinchilla; --tokens to set"
                   if job.mode == "pretrain" else "default for fine-tuning, an assumption; --tokens to set")
    batch_note = (f"default: about {fmt_count(job.batch_tokens_target(e.gpus))} tokens" if job.global_batch is None
                  else "--global-batch")
    lines = [
        f"model    {e.model.describe()}",
        *( [f"         {model_note}"] if model_note else []),
        f"cluster  {e.gpus:,} x {hw.name} ({nodes}): {hw.description}",
        f"job      {fmt_count(tr.tokens)} tokens ({tokens_note}); global batch {e.layout.global_batch} seqs = "
        f"{fmt_count(e.layout.global_batch * e.model.seq_len)} tokens ({batch_note}); {job.precision}, "
        f"{job.attention} attention",
        f"stack    {stack_line(e)}",
        *([f"         not modelled: {unmodelled}"] if (unmodelled := software(job).stack.not_modelled) else []),
        *labelled("checked", e.evidence().clauses(), 9),
        *([f"         {calibration_line(hw)}"] if hw.calibration else []),
        f"layout   {layout_line(e)}",
        f"         best of {p.result.feasible} fitting layouts out of {p.result.evaluated} evaluated "
        f"in {p.result.search_seconds * 1e3:.1f} ms (ranked by {p.result.objective})"
        + (f"; pinned: {', '.join(p.pinned)}" if p.pinned else ""),
        "",
        f"memory   {m.total_bytes / GIB:.1f} of {m.capacity_bytes / GIB:.0f} GiB per GPU "
        f"({m.total_bytes / m.capacity_bytes:.0%}, peak on pipeline stage {m.peak_stage})"
        + ("" if m.fits else "  ** DOES NOT FIT **"),
        *([f"         the GPU's {e.hardware.gpu.memory_bytes / GIB:.0f} GiB less the {e.job.memory_headroom:.0%} "
           "kept free (--memory-headroom)"] if e.job.memory_headroom else []),
        *fit_lines(e),
        f"         {memory_bar(e)}",
        "         " + "  ".join(f"{ch} {label} {getattr(m, key) / GIB:.1f}" for key, ch, label in BAR_PARTS) + " GiB",
        (f"         torch would report max_memory_reserved {m.torch_reserved_bytes / GIB:.1f} GiB (the rest is the "
         f"CUDA context{' and NCCL buffers' if e.gpus > 1 else ''}), max_memory_allocated "
         f"{m.torch_allocated_bytes / GIB:.1f} GiB (less the allocator's cached, fragmented blocks)"),
        *([ "         by stage: " + ", ".join(f"stage {sm.stage} {sm.total_bytes / GIB:.1f} GiB"
                                              for sm in e.stage_memory)] if e.layout.pp > 1 else []),
        *([offload_line(e)] if e.layout.offload != "none" else []),
    ]
    if not m.fits:
        return "\n".join(lines + does_not_fit_lines(p))
    lines += [
        "",
        f"step     {t.step_s:.3g} s = " + " + ".join(
            f"{label} {getattr(t, key):.3g}" for key, label in TIME_PARTS if getattr(t, key) > 0.0005 * t.step_s),
        f"         bubble {_pct(e.bubble_fraction)} | communication {_pct(e.comm_fraction)} of step (exposed) | "
        f"MFU {e.mfu:.1%}{_mfu_basis(job.precision == 'fp8', e.model.moe)} | HFU {e.hfu:.1%} | "
        f"{e.model_tflops_per_gpu:.0f} TFLOP/s per GPU | "
        f"{fmt_count(e.tokens_per_s)} tokens/s",
        "",
        f"train    {fmt_days(tr.days)} | {fmt_count(tr.gpu_hours)} GPU-hours | {fmt_count(tr.energy_kwh)} kWh "
        f"(TDP x PUE {tr.pue}) | ${fmt_count(tr.cost_usd)} at ${tr.price_usd_per_gpu_hour:.2f}/GPU-hour",
    ]
    lines += eval_lines(e)
    lines += operations_lines(e)
    if p.runners_up:
        lines += ["", "runners-up:", table(list(p.runners_up)[:top], indent="  ", width=width)]
    lines += faster_lines(e, p.faster, p.result.objective)
    lines += ["", "warnings: " + ("none" if not e.warnings else "")]
    lines += [f"  - {w}" for w in e.warnings]
    note = roomier_note(e, p.roomier, bool(p.pinned), p.result.objective)
    lines += [f"  - {note}"] if note else []
    return "\n".join(lines)


def eval_lines(e: Estimate) -> list[str]:
    """The evaluations' share of the time to train (in it, and in GPU-hours, energy and cost)."""
    job, tr = e.job, e.train
    if not job.evaluates:
        return []
    every = (f"every {fmt_count(job.eval_every)} tokens" if job.eval_every is not None
             else f"every {job.eval_every_steps:,} steps")
    return [f"eval     {tr.evaluations:,} evaluations ({every}, {fmt_count(job.eval_tokens)} tokens each, forward "
            f"only): {fmt_seconds(tr.eval_seconds)} of the {fmt_days(tr.days)} "
            f"({tr.eval_seconds / tr.seconds:.1%}), included above"]


def fit_lines(e: Estimate) -> list[str]:
    """The verdict with the stack's measured memory band, where the band comes from, and the parts
    least certain."""
    m, band = e.memory, e.band()
    whose = band.source + (f" ({band.inherited}: no memory measured on {software(e.job).stack.name})"
                           if band.inherited else "")
    parts = ", ".join(f"{name} {b / GIB:.1f} GiB" for name, b in least_certain(m))
    return [f"fit      {m.fit.upper()}: fits up to {m.fits_below_bytes / GIB:.1f} GiB (-{band.under:.1%}), tight up to "
            f"{m.tight_below_bytes / GIB:.1f} GiB (+{band.over:.1%}), does not fit above",
            f"         the band: worst memory errors of {whose}",
            f"         least certain: {parts} (modelled; weights, gradients and optimizer states are counted)"]


def faster_lines(e: Estimate, faster: tuple[Estimate, ...], objective: str = "time") -> list[str]:
    """The layouts above the plan's memory line that the objective ranks better, and by how much."""
    if not faster:
        return []
    line = e.memory.safe_line_bytes / e.memory.capacity_bytes
    what = "cheaper" if objective == "cost" else "faster"
    out = ["", f"{what} above the plan's memory line ({line:.1%} of capacity; --memory-headroom 0 plans up to "
                 "capacity):"]
    for f in faster:
        gain = (e.train.cost_usd / f.train.cost_usd if objective == "cost" else e.train.seconds / f.train.seconds) - 1
        out.append(f"  {layout_line(f)}: {f.memory.total_bytes / GIB:.1f} GiB "
                   f"({f.memory.total_bytes / f.memory.capacity_bytes:.0%}, {f.memory.fit}), {gain:.1%} {what}")
    return out


def roomier_note(e: Estimate, r: Estimate | None, pinned: bool, objective: str = "time") -> str:
    """For a plan above ROOMY_SHARE of what it may fill: the best layout by ``objective`` with its
    pins under that share (``r``, planner.core.plan.Plan.roomier) and how its training time
    compares, or that none fits there; else ''."""
    if not crowded(e):
        return ""
    pins = " with these pins" if pinned else ""
    share = e.memory.safe_line_bytes / e.memory.capacity_bytes
    line = f"{share:.0%}" if abs(share * 100 - round(share * 100)) < 1e-6 else f"{share:.1%}"
    if r is None:
        return f"no layout{pins} fits under {line} of the memory"
    best = {"time": "fastest", "cost": "cheapest", "memory": "leanest"}.get(objective, "best")
    ratio = r.train.seconds / e.train.seconds - 1
    than = f"{ratio:.1%} slower" if ratio > 0 else f"{-ratio:.1%} faster" if ratio < 0 else "as fast"
    return (f"the {best} layout{pins} under {line} of the memory: {layout_line(r)}: "
            f"{r.memory.total_bytes / GIB:.1f} GiB ({r.memory.total_bytes / r.memory.capacity_bytes:.0%}), {than}")


def nodes_text(gpus: int, per_node: int, unit: str = "node") -> str:
    """'16 nodes x 8'; '13 nodes x 8, the last with 4 GPUs' when the count is not a multiple
    (``unit``: what a node is called, an NVLink domain or a host)."""
    nodes, rest = -(-gpus // per_node), gpus % per_node
    text = f"{nodes:,} {unit}{'s' if nodes > 1 else ''} x {per_node}"
    if rest and nodes > 1:
        text += f", the last with {rest} GPU{'s' if rest > 1 else ''}"
    elif rest:
        text = f"1 {unit}, {gpus} of its {per_node} GPUs"
    return text


def does_not_fit_lines(p: Plan) -> list[str]:
    """The 'nothing fits' state: by how much, the nearest layouts that fit (fewest pinned fields
    changed, fastest first) or, when none fits at all, what would make one fit."""
    e = p.best
    m = e.memory
    over = m.total_bytes - m.capacity_bytes
    lines = ["", f"DOES NOT FIT: {over / GIB:,.1f} GiB over the {m.capacity_bytes / GIB:.0f} GiB per GPU "
                 "(step time and days are not shown for a layout that cannot run)"]
    near = [n for n in (p.nearest_fit, *p.alternatives) if n is not None]
    if near:
        lines += ["", "nearest layouts that fit (fewest pinned fields changed, then fastest):"]
        for i, n in enumerate(near, 1):
            changed = [d for d in p.pinned if getattr(n.layout, d, None) != getattr(e.layout, d, None)]
            what = ", ".join(f"{d} {getattr(e.layout, d)} -> {getattr(n.layout, d)}" for d in changed)
            lines += [f"  {i}. change {what or 'nothing pinned'}",
                      f"     {layout_line(n)}",
                      f"     {n.memory.total_bytes / GIB:.1f} of {n.memory.capacity_bytes / GIB:.0f} GiB, "
                      f"step {n.time.step_s:.3g} s, {fmt_days(n.train.days)}, MFU {n.mfu:.1%}"]
    else:
        lines += ["", f"no layout fits on {e.gpus:,} x {e.hardware.name}, even with ZeRO-3 and full recompute. "
                      "What would make it fit:"] + [f"  - {h}" for h in fit_hints(e)]
    return lines


def operations_lines(e: Estimate) -> list[str]:
    """Fine-tuning mode, failures and checkpoints, the data feed."""
    out = []
    job = e.job
    if job.mode != "pretrain":
        what = (f"lora (r {job.lora_r}, alpha {job.lora_alpha:g}, {','.join(job.lora_targets)})"
                if job.lora else job.mode)
        out.append(f"mode     {what}: {e.trainable_params:,} trainable of {e.model.params:,} parameters "
                   f"({e.trainable_params / e.model.params:.2%})")
    r, c, d = e.reliability, e.checkpoint, e.data_feed
    if r is not None and c is not None:
        every = (f"checkpoint every {c.interval_steps} steps ({fmt_seconds(c.interval_s)}, "
                 f"{'Young/Daly optimum' if r.mtbf_job_hours != float('inf') else 'as set'})"
                 if c.interval_steps else "no failures assumed: checkpoint only as you need")
        mtbf = "no failures" if r.mtbf_job_hours == float("inf") else f"job MTBF {r.mtbf_job_hours:,.0f} h"
        out += [f"expected {fmt_seconds(r.expected_seconds)} with failures and checkpoints "
                f"(goodput {r.goodput:.1%}; ideal {fmt_seconds(r.ideal_seconds)}): "
                f"{r.expected_interruptions:.1f} interruptions ({mtbf})",
                f"         {every}; {fmt_bytes(c.bytes_total)} each ({fmt_bytes(c.bytes_per_gpu)} per GPU), "
                f"{c.save_s:.1f} s to save, {c.load_s:.1f} s to load, {fmt_bytes(c.storage_bytes)} kept"]
    if d is not None:
        out.append(f"data     {fmt_bytes(d.bytes_per_s)}/s of {d.token_bytes}-byte tokens from storage "
                   f"({fmt_bytes(d.storage_read_bytes_per_s)}/s available); dataset {fmt_bytes(d.dataset_bytes)}; "
                   f"prefetch {d.prefetch_samples_per_rank} samples ({fmt_bytes(d.prefetch_bytes_per_rank)}) per rank")
    return [""] + out if out else []


TABLE_HEADER = ("#", "dp", "tp", "pp", "vpp", "cp", "ep", "mb", "accum", "zero", "shard", "recompute", "sp", "offload",
                "mem GiB", "fit", "step s", "MFU", "bubble", "comm", "time")
# Columns left out when every row holds their default (a dense model has ep 1 everywhere; the fit
# verdict is said only where some row is tight).
_QUIET = {"ep": 1, "shard": "full", "offload": "none", "fit": "fits"}


def table_rows(estimates: list[Estimate]) -> list[tuple]:
    rows = []
    for i, e in enumerate(estimates, 1):
        lay = e.layout
        rows.append((i, lay.dp, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.micro_batch, lay.grad_accum, lay.zero_stage,
                     lay.sharding, lay.recompute, "on" if lay.sequence_parallel else "off", lay.offload,
                     f"{e.memory.total_bytes / GIB:.1f}", e.memory.fit, f"{e.time.step_s:.3g}", f"{e.mfu:.1%}",
                     _pct(e.bubble_fraction), _pct(e.comm_fraction), fmt_days(e.train.days)))
    return rows


def table(estimates: list[Estimate], indent: str = "", width: int | None = WIDTH) -> str:
    """The layouts, one row each; within ``width`` by leaving out the least needed columns first
    (accumulation follows from the batch, bubble and comm are in each estimate's report)."""
    rows = [TABLE_HEADER, *table_rows(estimates)]
    keep = [i for i, name in enumerate(TABLE_HEADER)
            if name not in _QUIET or any(r[i] != _QUIET[name] for r in rows[1:])]
    rows = [tuple(r[i] for i in keep) for r in rows]
    return fit_table(rows, drop=("accum", "bubble", "comm", "step s"), width=width, indent=indent)


# The layout's columns are its dimensions, by their declared names (planner.core.layout.LAYOUT_DIMS).
CSV_COLUMNS = ("model", "params", "gpu", "gpus", *(d.name for d in LAYOUT_DIMS), "grad_accum", "precision",
               "fits", "fit", "total_bytes",
               "capacity_bytes", "step_s", "compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s",
               "bubble_s",
               "optimizer_s", "other_s", "bubble_fraction", "comm_fraction", "tokens_per_s", "mfu", "hfu",
               "train_days", "gpu_hours", "energy_kwh", "cost_usd")


def csv_row(e: Estimate) -> list:
    flat = {**e.layout.to_json(), "precision": e.job.precision, **flat_fields(e.memory), **flat_fields(e.time),
            "model": e.model.name, "params": e.model.params,
            "gpu": e.hardware.name, "gpus": e.gpus, "bubble_fraction": e.bubble_fraction,
            "comm_fraction": e.comm_fraction, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "hfu": e.hfu,
            "train_days": e.train.days, "gpu_hours": e.train.gpu_hours, "energy_kwh": e.train.energy_kwh,
            "cost_usd": e.train.cost_usd}
    return [flat[c] for c in CSV_COLUMNS]
