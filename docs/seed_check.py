"""The seed articles' numbers, checked: writes docs/seed-check.md from docs/seed_claims.toml.

Every figure on the page comes from the planner's API (plan, search, evaluate, compare,
recommend, export); the claims, their quotes and the few figures from other publications come
from seed_claims.toml. tests/test_seed_check.py regenerates the page and fails when it is stale.

    python docs/seed_check.py            # rewrite docs/seed-check.md
    python docs/seed_check.py --out X    # write elsewhere
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository, when run as a script

from planner.core.evaluate import evaluate  # noqa: E402
from planner.core.layout import Candidates, Job, Layout  # noqa: E402
from planner.core.model import ModelSpec  # noqa: E402
from planner.core.plan import plan  # noqa: E402
from planner.core.presets import get_preset, resolve_params  # noqa: E402
from planner.core.search import Pins, search  # noqa: E402
from planner.decisions.decide import compare, options_for, recommend  # noqa: E402
from planner.export.formats import problems  # noqa: E402
from planner.hardware import get_profile  # noqa: E402
from planner.units import GIB, fmt_count  # noqa: E402

CLAIMS = HERE / "seed_claims.toml"
PAGE = HERE / "seed-check.md"
DAY = 86400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    verdict: str  # agrees | partly agrees | disagrees | cannot be checked
    why: str
    computed: tuple[str, ...]  # markdown lines: tables and sentences
    assumptions: tuple[str, ...]


def table(header: tuple, rows: list[tuple]) -> list[str]:
    out = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def pct(x: float) -> str:
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"


# --- the checks, one per claim ----------------------------------------------------------------


def check_33b_128_a100_14_days(c: dict) -> Check:
    model, note = resolve_params(c["params"])
    hw = get_profile(c["gpu"])
    rows, runs = [], []
    for label, tokens in (("Chinchilla, 20 per parameter (planner default)", None),
                          ("LLaMA-33B's 1.4T", c["llama_tokens"])):
        e = plan(model, hw, Job(tokens=tokens), c["gpus"]).best
        runs.append(e)
        rows.append((label, fmt_count(e.train.tokens), f"{e.train.days:.1f}",
                     f"{e.reliability.expected_seconds / DAY:.1f}", pct(e.mfu), f"{e.model_tflops_per_gpu:.0f}"))
    e = runs[0]
    in_claim = e.tokens_per_s * c["claimed_days"] * DAY * e.reliability.goodput
    needed_mfu = e.mfu * e.reliability.expected_seconds / (c["claimed_days"] * DAY)
    header = ("token budget", "tokens", "days (ideal)", "days (with failures)", "MFU", "TFLOP/s per GPU")
    computed = (*table(header, rows),
                "", f"Best layout: {layout_text(e)}. In {c['claimed_days']} days this run trains "
                f"**{fmt_count(in_claim)} tokens** ({in_claim / model.params:.1f} per parameter); "
                f"{fmt_count(e.train.tokens)} tokens in {c['claimed_days']} days would need an MFU of "
                f"{pct(needed_mfu)}.")
    agrees = e.reliability.expected_seconds <= 1.25 * c["claimed_days"] * DAY
    why = ("the planner trains a Chinchilla-sized run in about the claimed time" if agrees else
           f"{c['claimed_days']} days on {c['gpus']} A100s train {fmt_count(in_claim)} tokens at the planner's "
           f"{pct(e.mfu)} MFU, {pct(in_claim / e.train.tokens)} of a compute-optimal (Chinchilla) run for this "
           "model; the article states no token count, and its '3.2x faster than traditional architecture' has "
           "no baseline to check")
    return Check(verdict="agrees" if agrees else "disagrees", why=why, computed=computed, assumptions=(
        f"Model: {model.describe()} ({note}).",
        f"Hardware: {c['gpus']} x {hw.name} ({hw.description}); bf16, flash attention, about 4M tokens per step.",
        "Tokens: the article gives none; two common choices are shown. Failures: the planner's default MTBF "
        "(Llama 3's measured interruption rate)."))


def max_batch(model: ModelSpec, gpu: str, job: Job, limit: int) -> tuple[int, np.ndarray, object]:
    """The largest micro-batch that fits on one GPU (no parallelism, no recompute), by evaluating
    every batch 1..limit as one vectorised pass."""
    batches = list(range(1, limit + 1))
    c = Candidates.from_layouts([Layout(dp=1, micro_batch=b, global_batch=b) for b in batches])
    ev = evaluate(model, get_profile(gpu), job, c, 1)
    fits = np.flatnonzero(ev.fits)
    return (batches[fits.max()] if fits.size else 0), np.asarray(batches), ev


def check_fp16_halves_memory(c: dict) -> Check:
    model = get_preset(c["preset"]).replace(seq_len=c["seq_len"])
    b32, b16 = c["claimed_batch_fp32"], c["claimed_batch_fp16"]
    rows, found = [], {}
    for prec in ("fp32", "fp16"):
        job = Job(precision=prec, attention="standard")
        top, _, ev = max_batch(model, c["gpu"], job, c["max_batch"])
        i = b32 - 1
        states = float(ev.memory.weights[i] + ev.memory.gradients[i] + ev.memory.optimizer[i])
        found[prec] = (top, float(ev.memory.total[i]), float(ev.memory.activations[i]), states)
        rows.append((prec, top, f"{ev.memory.total[i] / GIB:.1f}", f"{ev.memory.activations[i] / GIB:.1f}",
                     f"{states / model.params:.0f}"))
    saving = 1 - found["fp16"][1] / found["fp32"][1]
    act_saving = 1 - found["fp16"][2] / found["fp32"][2]
    ratio = found["fp16"][0] / found["fp32"][0]
    computed = (*table(("precision", f"largest batch on one {c['gpu']}", f"memory at batch {b32}, GiB",
                        "of which activations, GiB", "model-state bytes per parameter"), rows), "",
                f"At batch {b32}, fp16 saves **{pct(saving)}** of the memory ({pct(act_saving)} of the activations); "
                f"the largest batch grows **{ratio:.2f}x** (claimed {b32} -> {b16}, {b16 / b32:.2f}x).")
    why = (f"mixed precision keeps an fp32 master copy and fp32 Adam states, so model states stay "
           f"{found['fp16'][3] / model.params:.0f} bytes per parameter either way; only activations shrink, and by "
           "less "
           f"than half (masks stay 1 byte, the loss keeps fp32 logits): {pct(saving)} saved here, not 50%. If "
           f"activations did halve, the batch could at most double: {b16 / b32:.2f}x is more than halving allows")
    verdict = "agrees" if saving >= 0.4 and 0.8 <= ratio / (b16 / b32) <= 1.25 else "disagrees"
    return Check(verdict=verdict, why=why, computed=computed, assumptions=(
        f"Model: the {c['preset']} shape (12 layers, hidden 768, 12 heads) with a {c['seq_len']}-token context "
        "(BERT-base's; the article gives none).",
        f"One {c['gpu']}, no parallelism, no recompute, standard attention (FlashAttention does not run on V100), "
        "AdamW; fp16 = mixed precision with fp32 master weights (the article's own description)."))


def check_checkpointing(c: dict) -> Check:
    model = get_preset(c["preset"]).replace(seq_len=c["seq_len"])
    rows, verdict_rows = [], []
    for attention in ("standard", "flash"):
        job = Job(precision=c["precision"], attention=attention)
        hw = get_profile(c["gpu"])
        batches = list(range(1, 65))
        kinds = ("none", "selective", "full") if attention == "standard" else ("none", "full")
        ev = {rc: evaluate(model, hw, job, Candidates.from_layouts(
            [Layout(dp=1, micro_batch=b, global_batch=b, recompute=rc) for b in batches]), 1) for rc in kinds}
        i = int(np.argmin(np.abs(ev["none"].memory.total / GIB - c["claimed_before_gib"])))
        none, full = ev["none"].memory, ev["full"].memory
        # Checkpointing a fraction r of the layers: those layers' activations drop to the full-recompute level.
        part = float(none.total[i] - c["checkpoint_ratio"] * (none.activations[i] - full.activations[i]))
        sel = f"{ev['selective'].memory.total[i] / GIB:.1f}" if "selective" in ev else "= none (flash)"
        rows.append((attention, batches[i], f"{none.total[i] / GIB:.1f}", f"{part / GIB:.1f}", sel,
                     f"{full.total[i] / GIB:.1f}"))
        verdict_rows.append((float(full.total[i]) / GIB, part / GIB))
    lo, hi = min(r[0] for r in verdict_rows), max(r[1] for r in verdict_rows)
    inside = lo <= c["claimed_after_gib"] <= hi
    computed = (*table(("attention", "batch", "no checkpointing, GiB", f"{c['checkpoint_ratio']:g} of the layers, GiB",
                        "selective, GiB", "every layer, GiB"), rows), "",
                f"The batch is the one whose memory without checkpointing is closest to {c['claimed_before_gib']} GiB. "
                f"The claimed {c['claimed_after_gib']} GiB lies "
                f"{'inside' if inside else 'outside'} the planner's range {lo:.1f}-{hi:.1f} GiB.")
    why = ("the reduction is of the size the planner computes, between checkpointing every layer and half of them; "
           "the batch, the sequence length and what `checkpoint_ratio` means are not given (`GradientCheckpointing` "
           "is not a PyTorch API), so only the magnitude can be checked") if inside else (
           "the planner's range for the same starting memory does not contain the claimed value")
    return Check(verdict="agrees" if inside else "disagrees", why=why, computed=computed, assumptions=(
        f"Model: the {c['preset']} shape (24 layers, hidden 1024, 16 heads) with a {c['seq_len']}-token context; "
        f"{c['precision']} mixed precision, AdamW, one GPU.",
        "The batch is chosen so that memory without checkpointing matches the claim; GB read as GiB.",
        f"`checkpoint_ratio={c['checkpoint_ratio']:g}` read as checkpointing that fraction of the layers (the "
        "planner computes none, selective and every layer; the fraction is interpolated from them)."))


def check_bubble(c: dict) -> Check:
    model = get_preset(c["preset"])
    hw = get_profile(c["gpu"])
    ms = np.arange(1, 129)
    frac = {}
    for p in c["stages"]:
        cands = Candidates.from_layouts([Layout(dp=1, pp=p, micro_batch=1, global_batch=int(m)) for m in ms])
        frac[p] = evaluate(model, hw, Job(), cands, p).bubble_fraction
    rows = [(p, *(pct(float(frac[p][m - 1])) for m in c["micro_batches"])) for p in c["stages"]]
    limit, k = c["claimed_bubble"], c["claimed_stages"]
    holds = [int(m) for j, m in enumerate(ms) if all((frac[p][j] <= limit) == (p <= k) for p in c["stages"])]
    span = f"{holds[0]}-{holds[-1]}" if holds else "none"
    computed = (*table(("stages", *(f"m = {m}" for m in c["micro_batches"])), rows), "",
                f"Bubble as a share of the step, 1F1B, by pipeline stages and micro-batches per step m. The rule "
                f"(at most {k} stages keeps the bubble under {limit:.0%}, more exceeds it) holds only for "
                f"m = **{span}**.")
    m_hi, m_lo = max(c["micro_batches"]), c["micro_batches"][1]
    p_ok = max(p for p in c["stages"] if frac[p][m_hi - 1] <= limit)
    p_bad = min((p for p in c["stages"] if frac[p][m_lo - 1] > limit), default=None)
    why = (f"the bubble is (p-1)/(v*m) of the pipeline's work (Narayanan et al. 2021): it is set by the "
           f"micro-batches per step as much as by the stages. With m = {m_hi}, {p_ok} stages stay under {limit:.0%}"
           + (f"; with m = {m_lo}, {p_bad} stages already exceed it" if p_bad else "")
           + f". The rule is right only for m = {span}; interleaving (--vpp) divides the bubble further")
    return Check(verdict="partly agrees" if holds else "disagrees", why=why, computed=computed, assumptions=(
        f"Model {model.name} ({model.layers} layers) on {hw.name}, micro-batch 1, no interleaving (vpp 1), "
        "so m = global batch; the planner's bubble includes pipeline sends (the bubble's share of the step "
        "is the idle time over the whole step).",))


def layout_text(e) -> str:
    lay = e.layout
    return (f"dp {lay.dp} x tp {lay.tp} x pp {lay.pp}" + (f" (vpp {lay.vpp})" if lay.vpp > 1 else "")
            + f", micro-batch {lay.micro_batch}, ZeRO-{lay.zero_stage}, recompute {lay.recompute}"
            + (", SP" if lay.sequence_parallel else ""))


def check_3d_on_64(c: dict) -> Check:
    model, note = resolve_params(c["params"])
    hw = get_profile(c["gpu"])
    pinned = plan(model, hw, Job(), c["gpus"], Pins(dp=c["dp"], tp=c["tp"], pp=c["pp"])).best
    r = search(model, hw, Job(), c["gpus"])
    ev = r.evaluation
    cand = ev.candidates
    match = np.flatnonzero((cand.dp == c["dp"]) & (cand.tp == c["tp"]) & (cand.pp == c["pp"]) & ev.fits)
    best_days = float(ev.train_seconds[0]) / DAY
    rank = int(match[0]) + 1 if match.size else None
    ds = problems("deepspeed", pinned)
    mg = problems("megatron", pinned)
    rows = [("DP 8 x TP 4 x PP 2 (best of its kind)", layout_text(pinned), f"{pinned.memory.total_bytes / GIB:.1f}",
             f"{pinned.train.days:.1f}", pct(pinned.mfu), f"{rank} of {r.feasible}"),
            ("planner's best", layout_text(plan(model, hw, Job(), c["gpus"]).best),
             f"{float(ev.memory.total[0]) / GIB:.1f}", f"{best_days:.1f}", pct(float(ev.mfu[0])), "1")]
    computed = (*table(("layout", "detail", "GiB per GPU", "days", "MFU", "rank"), rows), "",
                f"`planner export --format deepspeed` for it: {ds[0] if ds else 'expressible'}. "
                f"`--format megatron`: {mg[0] if mg else 'expressible (all of DP/TP/PP are Megatron-LM flags)'}.")
    slower = pinned.train.days / best_days - 1
    why = (f"8 x 4 x 2 = 64 and the layout fits ({pinned.memory.total_bytes / GIB:.0f} GiB per GPU), "
           f"{pct(slower)} slower than the best layout for this model; but the command is not DeepSpeed's: its "
           "launcher has no --data_parallel_size, --tensor_parallel_size or --pipeline_parallel_size (parallel "
           "degrees belong to the training script, e.g. Megatron-DeepSpeed's --tensor-model-parallel-size), "
           "and --num_gpus counts GPUs per node, so 64 needs --num_nodes 8 --num_gpus 8 or a hostfile")
    return Check(verdict="partly agrees", why=why, computed=computed, assumptions=(
        f"Model: {model.describe()} ({note}); the article names no model for this configuration.",
        f"{c['gpus']} x {hw.name}, bf16, default tokens and batch; the other layout fields (vpp, micro-batch, "
        "ZeRO, recompute, SP) are the planner's best for DP 8 x TP 4 x PP 2."))


def check_gpu_table(c: dict) -> Check:
    rows = []
    for name, mem, tf, sparse in zip(c["profiles"], c["claimed_memory_gb"], c["claimed_fp16_tflops"],
                                     c["datasheet_sparse_tflops"]):
        hw = get_profile(name)
        dense = hw.gpu.peak_flops["fp16"] / 1e12
        rows.append((name, mem, f"{hw.gpu.memory_bytes / GIB:.0f}", tf, f"{dense:g}", f"{sparse:g}" if sparse else "-",
                     f"{tf / dense:.1f}x"))
    opts = options_for([get_profile(n) for n in c["profiles"]], Job())
    cmp = compare(get_preset(c["compare_preset"]), opts, tuple(c["compare_gpus"]))
    base = {p.gpus: p.best.model_tflops_per_gpu for p in cmp.rows if p.gpu == c["profiles"][-1] and p.fits}
    run_rows = [(p.gpu, p.gpus, p.best.job.precision, f"{p.best.train.days:.1f}", f"{p.best.model_tflops_per_gpu:.0f}",
                 f"{p.best.model_tflops_per_gpu / base[p.gpus]:.2f}x") for p in cmp.rows if p.fits]
    a100, a6000, v100 = c["claimed_fp16_tflops"]
    dense = [get_profile(n).gpu.peak_flops["fp16"] / 1e12 for n in c["profiles"]]
    dense_ratio = dense[0] / dense[-1]
    computed = (*table(("profile", "claimed GB", "planner GiB", "claimed TFLOPS", "dense FP16", "datasheet sparse",
                        "claimed / dense"), rows), "",
                f"What the difference means on a real job ({c['compare_preset']}, Chinchilla tokens, "
                "`planner compare`):", "",
                *table(("profile", "GPUs", "precision", "days", "achieved TFLOP/s per GPU", f"vs {c['profiles'][-1]}"),
                       run_rows))
    a6000_run = [float(r[5].rstrip("x")) for r in run_rows if r[0] == c["profiles"][1]]
    why = (f"the memory column agrees; the TFLOPS column mixes units: A100's {a100} and A6000's {a6000} are the 2:4 "
           f"structured-sparsity figures (dense: {dense[0]:g} and {dense[1]:g}), V100's {v100} is dense. The table "
           f"makes the A100 {a100 / v100:.0f}x a V100; dense it is {dense_ratio:.1f}x, and on a real job the A6000 "
           f"(PCIe, no NVLink switch) runs {min(a6000_run):.2f}-{max(a6000_run):.2f}x a V100, not the "
           f"{a6000 / v100:.1f}x the table suggests")
    return Check(verdict="partly agrees", why=why, computed=computed, assumptions=(
        "Planner figures are the profiles' datasheet values (hardware_profiles/*.toml, dense rates only).",
        "The job comparison uses each profile's default node and network; V100 runs fp16 (no bf16)."))


def check_weak_scaling(c: dict) -> Check:
    hw = get_profile(c["gpu"]).with_gpus_per_node(c["gpus_per_node"])
    net = dataclasses.replace(hw.network, inter_bytes_per_s=c["inter_node_gbit_per_s"] * 1e9 / 8 / c["gpus_per_node"])
    hw = dataclasses.replace(hw, network=net)
    paper = c["paper_aggregate_pflops"] * 1e3 / (c["paper_gpus"] * c["paper_baseline_tflops"])
    rows, eff = [], {}
    for overlap in (False, True):
        base = None
        for name, hidden, heads, layers, tp in c["shapes"]:
            model = ModelSpec(name=f"megatron-2019-{name}", arch=c["arch"], layers=layers, hidden=hidden, heads=heads,
                              vocab=c["vocab"], seq_len=c["seq_len"])
            for dp in (1, c["data_parallel"]):
                job = Job(precision=c["precision"], attention=c["attention"], overlap_grad_reduce=overlap,
                          global_batch=c["micro_batch"] * dp)
                pins = Pins(dp=dp, tp=tp, pp=1, micro_batch=c["micro_batch"], zero_stage=c["zero"],
                            recompute=c["recompute"])
                e = plan(model, hw, job, tp * dp, pins).best
                achieved = e.hfu * hw.gpu.peak_flops[c["precision"]] / 1e12  # hardware FLOP/s per GPU
                base = base or achieved
                eff[(overlap, tp * dp)] = achieved / base
                if dp > 1 or tp == 1:
                    rows.append(("overlapped" if overlap else "after backward", name, tp * dp,
                                 f"{achieved:.1f}", f"{achieved * tp * dp / 1e3:.2f}", pct(achieved / base)))
    n = c["paper_gpus"]
    lo, hi = eff[(False, n)], eff[(True, n)]
    header = ("DP gradient all-reduce", "model", "GPUs", "TFLOP/s per GPU", "PFLOP/s", "weak-scaling efficiency")
    computed = (*table(header, rows), "",
                f"Paper: {c['paper_aggregate_pflops']} PFLOP/s on {n} GPUs against a {c['paper_baseline_tflops']} "
                f"TFLOP/s single-GPU baseline = **{pct(paper)}**. Planner on the same configuration: **{pct(lo)}** "
                f"(gradients reduced after the backward pass, as Megatron-LM did in 2019) to **{pct(hi)}** "
                "(overlapped with it).")
    why = (f"the {pct(c['claimed_efficiency'])} is Megatron-LM's 8.3B-parameter model on {n} V100s (8-way tensor x "
           "64-way data parallel) against a 1.2B single-GPU baseline (Shoeybi et al. 2019), not a 345M model, "
           "which fits on one GPU and needs no model parallelism. For the real configuration the planner brackets "
           f"the figure ({pct(lo)}-{pct(hi)}); its single-GPU baseline is higher than the paper's "
           f"{c['paper_baseline_tflops']} TFLOP/s because the V100's efficiency factors are uncalibrated "
           "(only the A100's are fitted)")
    return Check(verdict="partly agrees", why=why, computed=computed, assumptions=(
        f"Shapes of Shoeybi et al. 2019 Table 1 (GPT-2 style, vocabulary {c['vocab']}, sequence {c['seq_len']}), "
        f"batch {c['micro_batch']} per model-parallel group, {c['data_parallel']}-way data parallelism.",
        f"{c['gpu']} with {c['gpus_per_node']} GPUs per node and {c['inter_node_gbit_per_s']} Gb/s per node "
        f"(DGX-2H); {c['precision']}, standard attention, recompute {c['recompute']}, ZeRO-{c['zero']}.",
        "Efficiency = hardware FLOP/s per GPU (recompute included, as the paper counts) over the 1-GPU baseline's."))


def check_gpt3(c: dict) -> Check:
    model = get_preset(c["preset"])
    hw = get_profile(c["gpu"])
    rows, energy = [], []
    for n in c["gpus"]:
        e = plan(model, hw, Job(tokens=c["tokens"]), n).best
        energy.append(e.train.energy_kwh)
        rows.append((n, f"{e.train.days:.1f}", f"{e.train.days / 7:.1f}", pct(e.mfu),
                     f"{e.train.energy_kwh / 1e3:,.0f}", f"{e.train.energy_kwh / c['household_kwh_per_year']:.0f}"))
    published = c["published_energy_mwh"] * 1e3 / c["household_kwh_per_year"]
    computed = (*table(("A100s", "days", "weeks", "MFU", "GPU energy, MWh", "US households for a year"), rows), "",
                f"The published estimate for the original run (V100s, 2020): {c['published_energy_mwh']:,} MWh = "
                f"**{published:.0f} households**.")
    why = (f"'thousands of A100s for weeks' agrees ({c['gpus'][0]}-{c['gpus'][1]} A100s: "
           f"{rows[1][2]}-{rows[0][2]} weeks). '{c['claimed_households']} households' is the published figure for "
           f"GPT-3's actual V100 run; on A100s, as the sentence says, the planner puts the GPUs' energy at "
           f"{energy[0] / 1e3:,.0f}-{energy[-1] / 1e3:,.0f} MWh, about "
           f"{energy[0] / c['household_kwh_per_year']:.0f} households (GPUs only, at TDP x PUE 1.2)")
    return Check(verdict="partly agrees", why=why, computed=computed, assumptions=(
        f"{model.describe()}; {fmt_count(c['tokens'])} tokens (Brown et al. 2020); bf16, flash attention.",
        f"A household: {c['household_kwh_per_year']:,} kWh a year (U.S. EIA, 2020).",
        "Energy counts the GPUs at TDP times PUE 1.2, not CPUs, network or storage (the Llama 2 paper's accounting)."))


def check_10b_servers(c: dict) -> Check:
    model = get_preset(c["preset"])
    hw = get_profile(c["gpu"])
    opts = options_for([hw], Job())
    rows, fit = [], None
    for days in c["deadlines_days"]:
        a = recommend(model, opts, days * DAY).answers[0]
        fit = a.min_fit
        rows.append((f"{days} days", a.pick.gpus if a.pick else "-", f"{a.pick.gpus / hw.network.gpus_per_node:.0f}"
                     if a.pick else "-", layout_text(a.pick.best) if a.pick else a.why))
    servers = c["claimed_servers"] * hw.network.gpus_per_node
    e = plan(model, hw, Job(), servers).best
    computed = (*table(("deadline", "fewest GPUs (`planner recommend`)", "servers", "layout"), rows), "",
                f"{model.name} fits at all on **{fit.gpus} GPUs**; {c['claimed_servers']} servers ({servers} GPUs) "
                f"train it on Chinchilla tokens in **{e.train.days:.1f} days**.")
    why = ("a server count is an answer to a deadline, not to a parameter count: the model fits on "
           f"{fit.gpus} GPUs, and {c['claimed_servers']} servers match a deadline of about {e.train.days:.0f} days")
    return Check(verdict="partly agrees", why=why, computed=computed, assumptions=(
        f"Model {model.describe()} as a 'more than 10B' example; Chinchilla tokens (20 per parameter).",
        f"Servers of {hw.network.gpus_per_node} x {hw.name}; deadlines are wall-clock, with the default failure rate."))


def check_gpt3_params(c: dict) -> Check:
    model = get_preset(c["preset"])
    close = abs(model.params / c["claimed_params"] - 1)
    return Check(verdict="agrees" if close < 0.01 else "disagrees",
                 why=f"the exact count for GPT-3's published shape is {model.params / 1e9:.1f}B ({pct(close)} off)",
                 computed=(f"{model.describe()}: **{model.params:,}** parameters.",),
                 assumptions=("Shape of Brown et al. 2020, Table 2.1, with tied embeddings and learned positions.",))


CHECKS = {"33b-128-a100-14-days": check_33b_128_a100_14_days, "fp16-halves-memory": check_fp16_halves_memory,
          "checkpointing-18-to-11-gb": check_checkpointing, "four-stages-bubble-15": check_bubble,
          "dp8-tp4-pp2-on-64": check_3d_on_64, "gpu-table": check_gpu_table,
          "megatron-76-weak-scaling": check_weak_scaling, "gpt3-a100-weeks-households": check_gpt3,
          "10b-needs-8-servers": check_10b_servers, "gpt3-175b-parameters": check_gpt3_params}


# --- the page ---------------------------------------------------------------------------------


def render(data: dict) -> str:
    articles = data["articles"]
    results = [(claim, CHECKS[claim["id"]](claim)) for claim in data["claim"]]
    out = ["# The seed's numbers, checked", "",
           "<!-- Generated by `python docs/seed_check.py` from docs/seed_claims.toml: do not edit by hand. "
           "tests/test_seed_check.py fails when this page is stale. -->", "",
           "Each quantitative claim of the two seed articles, what the planner computes for it, the assumptions it "
           "had to make (the articles rarely say which model, how many tokens or what sequence length), and a "
           "verdict. Every number below comes from the planner's API; the quotes are the articles' own words.", "",
           "Articles: " + "; ".join(f"**{k}**: {a['title']}" for k, a in articles.items()) + ".", ""]
    out += table(("#", "claim", "verdict"), [(i, claim["title"], check.verdict)
                                             for i, (claim, check) in enumerate(results, 1)])
    for i, (claim, check) in enumerate(results, 1):
        out += ["", f"## {i}. {claim['title']}", "", f"> {claim['quote']}", f"> (article {claim['article']})", "",
                f"**Verdict: {check.verdict}**: {check.why}.", "", "What the planner computes:", "", *check.computed,
                "", "Assumptions:", "", *(f"- {a}" for a in check.assumptions)]
    out += ["", "## Numbers the planner does not check", ""]
    out += table(("quote", "article", "why not"), [(u["quote"], u["article"], u["why"]) for u in data["unchecked"]])
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from planner.files import write_atomic

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(PAGE), help=f"where to write the page (default {PAGE})")
    a = p.parse_args(argv)
    data = tomllib.loads(CLAIMS.read_text(encoding="utf-8"))
    write_atomic(a.out, render(data))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
