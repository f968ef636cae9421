"""One pinned training estimate, the planner beside llm-analysis (and Calculon), measured in one interleaved loop.

Run: python benchmarks/peers.py [--rounds 7] [--calls 300]

The same problem for both: a LLaMA-30B/33B shape (60 layers, hidden 6656, 52 heads, vocab 32000,
sequence 2048) on 128 A100 80GB, every layout field pinned: tp 2, pp 2, dp 32, micro-batch 1,
global batch 1024, ZeRO-3, selective recompute (llm-analysis: attention-only recomputation, level
1), sequence parallel over the TP group, flash attention, bf16. The planner is called through its
Python API (``planner.estimate(...)``, the whole `planner estimate --format json` dict);
llm-analysis through its ``llm_analysis.analysis.train(...)`` with its log at CRITICAL (its default
INFO log formats and prints a report on every call, which is not the estimate's cost).

llm-analysis is installed from PyPI into its own virtual environment (created on first use under
``$PLANNER_PEERS_DIR``, default ``~/.cache/planner-peers``); the planner runs from this checkout.
Each round starts one fresh process per tool, in alternating order (``--rounds``, default 7), and
each process reports:
- cold: the CPU and wall seconds of its import, and of its first call (a fresh process);
- warm: the median CPU and wall seconds of ``--calls`` further calls;
- the planner also with its computed-value caches (``functools`` caches of planner.core, every
  cache of planner.memo, and the inputs ``planner.estimate`` keeps between calls) cleared before
  each call (the clearing not timed); the files it read (profiles, stacks, presets) stay loaded,
  as llm-analysis's do, and so does what depends on them alone: the dense presets' parameter
  counts that '--params' is matched against (``dense_by_count``; cleared before 2026-12-07, so
  that row's earlier figures also counted 28 presets again on every call).
Both run from byte-compiled modules (a bytecode cache under the peers folder, written by one
unmeasured process per tool first), as installed packages do. The figures printed are medians over
rounds, from this run only, and the planner/peer CPU ratios: warm, first call, import + first call,
and the planner with its caches cleared against the peer warm; each ratio also as the median of
the rounds' own ratios (a round's two processes run one after the other, so a slow minute of the
machine falls on both).

Calculon (github.com/calculon-ai/calculon, not on PyPI) is measured too when a checkout of its
repository is given (``--calculon PATH`` or ``$PLANNER_CALCULON_REPO``): it is installed from that
copy into its own environment and called as its ``calculon llm`` command does (``Llm(app, log)``,
``compile``, ``run``, ``get_stats_json``) on its own A100 80GB system file, with the nearest problem
it can state: a GPT block (a two-matrix MLP 26880 wide, 1.5 x 17920: the parameters and FLOPs of
the SwiGLU MLP), 16-bit (its A100 file has float16 only), ZeRO-1 (its optimizer sharding; it has
no ZeRO-3), attention-only recompute and sequence parallel. Without a checkout it is left out, and
not cited.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LLM_ANALYSIS = "llm-analysis==0.2.2"  # the newest release on PyPI when this was written
ROOT = Path(__file__).resolve().parent.parent

OURS = dict(params="33B", gpus=128, gpu="a100-80g", tp=2, pp=2, dp=32, cp=1, ep=1, vpp=1, micro_batch=1,
            global_batch=1024, zero_stage=3, recompute="selective", sequence_parallel=True, schedule="1f1b",
            sharding="full", offload="none", precision="bf16", attention="flash")
THEIRS = dict(model_name="decapoda-research_llama-30b-hf", gpu_name="a100-sxm-80gb", dtype_name="w16a16e16",
              total_num_gpus=128, tp_size=2, pp_size=2, dp_size=32, sp_size=2, ds_zero=3, batch_size_per_gpu=1,
              global_batch_size=1024, seq_len=2048, activation_recomputation=1, flash_attn=True,
              mlp_gated_linear_units=True, total_num_tokens=1e12, flops_efficiency=0.5, log_level="CRITICAL")


# Calculon's inputs (its JSON schema: calculon/llm/llm.py, Llm.Application and Llm.Execution).
CALCULON_APP = dict(hidden=6656, feedforward=26880, seq_size=2048, attn_heads=52, attn_size=128, num_blocks=60)
CALCULON_EXE = dict(num_procs=128, tensor_par=2, pipeline_par=2, data_par=32, tensor_par_net=0, pipeline_par_net=1,
                    data_par_net=1, batch_size=1024, microbatch_size=1, datatype="float16", fused_activation=True,
                    attention_type="multihead", activation_recompute="attn_only", pipeline_interleaving=1,
                    optimizer_sharding=True, tensor_par_comm_type="rs_ag", tensor_par_overlap="none",
                    seq_par_ag_redo=False, data_par_overlap=True, weight_offload=False, activations_offload=False,
                    optimizer_offload=False, training=True)


def calculon_python(repo: Path) -> Path:
    """Calculon's interpreter, its environment created from the checkout ``repo`` if missing."""
    env = peers_dir() / "calculon"
    python = env / "bin" / "python"
    if not python.exists():
        print(f"installing Calculon from {repo} into {env} (once)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        # Its setup.py declares no requirements; its modules import numpy, pandas and psutil.
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(repo), "numpy", "pandas", "psutil"],
                       check=True)
    return python


def peer_python() -> Path:
    """llm-analysis's interpreter, its environment created (python -m venv; pip install) if missing."""
    env = peers_dir() / LLM_ANALYSIS.replace("==", "-")
    python = env / "bin" / "python"
    if not python.exists():
        print(f"installing {LLM_ANALYSIS} into {env} (once)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LLM_ANALYSIS], check=True)
    return python


# ---- the worker: one fresh process of one tool ------------------------------------------------


def _clocks() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    cpu, wall = _clocks()
    return cpu - start[0], wall - start[1]


def worker(tool: str, calls: int) -> None:
    start = _clocks()
    if tool == "llm-analysis":
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from llm_analysis.analysis import train  # transformers says on import that torch is missing
        imported = _since(start)

        def call() -> dict:
            return train(**THEIRS)
        caches_of = None
    elif tool == "calculon":
        import logging

        import calculon
        from calculon.llm import Llm

        imported = _since(start)
        log = logging.getLogger("calculon-bench")
        log.setLevel(logging.CRITICAL)
        system = calculon.System(calculon.read_json_file(os.path.join(os.environ["CALCULON_REPO"], "systems",
                                                                       "a100_80g.json")))
        app, exe = Llm.Application(CALCULON_APP), Llm.Execution.from_json(CALCULON_EXE)

        def call() -> dict:
            m = Llm(app, log)
            m.compile(system, exe)
            m.run(system)
            return m.get_stats_json(False)
        caches_of = None
    else:
        import planner

        imported = _since(start)

        def call() -> dict:
            return planner.estimate(**OURS)
        caches_of = _core_caches
    start = _clocks()
    out = call()
    first = _since(start)
    warm = [_timed(call) for _ in range(calls)]
    report = {"tool": tool, "import": imported, "first": first, "warm": _medians(warm),
              "answer": _answer(tool, out)}
    if caches_of is not None:
        caches = caches_of()
        report["cleared"] = _medians([_timed(call, caches) for _ in range(calls)])
    print(json.dumps(report), flush=True)


def clear(caches) -> None:
    """Empty each of ``_core_caches()``: a dict, or a cache with ``cache_clear``."""
    for c in caches:
        c.clear() if isinstance(c, dict) else c.cache_clear()


def _timed(call, caches=()) -> tuple[float, float]:
    clear(caches)
    start = _clocks()
    call()
    return _since(start)


def _medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def _core_caches() -> list:
    """The inputs the API keeps between calls, and the functools caches of the planner's model
    (planner.core.*): values it computes from what a call asks, not the files it read nor what
    depends on them alone (the preset table: ``planner.core.presets._raw`` and ``presets``, and
    ``dense_by_count``, its dense presets' parameter counts)."""
    import types

    import planner.cli.api
    import planner.memo

    files = {("planner.core.presets", "_raw"), ("planner.core.presets", "presets"),
             ("planner.core.presets", "dense_by_count")}
    return [planner.cli.api._SETUP, planner.cli.api._PARTS, planner.cli.api._PREPARED,
            types.SimpleNamespace(cache_clear=planner.memo.clear_all),  # the identity caches, all of them
            *(f for name, m in list(sys.modules.items()) if name.startswith("planner.core")
              for key, f in vars(m).items() if callable(getattr(f, "cache_clear", None))
              and getattr(f, "__module__", "") == name and (name, key) not in files)]  # defined there, not imported


def _answer(tool: str, out: dict) -> dict:
    """Step time and peak memory each tool gives: the same problem, not the same answer."""
    if tool == "calculon":
        return {"step_s": out["total_time"], "memory_gib": out["proc_mem_tier1_cap_req"] / 2**30}
    if tool == "llm-analysis":
        memory = out["(weight+op_state+grad+act)_memory_per_gpu"]
        return {"step_s": out["latency_per_iter"], "memory_gib": memory / 2**30}
    return {"step_s": out["time"]["step_s"], "memory_gib": out["memory"]["total_bytes"] / 2**30}


# ---- the loop ----------------------------------------------------------------------------------


def peers_dir() -> Path:
    return Path(os.environ.get("PLANNER_PEERS_DIR", Path.home() / ".cache" / "planner-peers"))


def worker_env(tool: str) -> dict:
    """Both tools from byte-compiled modules, as an installed package runs (pip compiles them): a
    bytecode cache under the peers folder, whatever PYTHONDONTWRITEBYTECODE says (with it set, this
    checkout would be compiled from source in every fresh process)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(peers_dir() / "pycache")
    env["PYTHONPATH"] = str(ROOT) if tool == "planner" else ""
    if tool == "calculon":
        env["CALCULON_REPO"] = str(_calculon_repo())
    return env


def _calculon_repo() -> Path | None:
    repo = os.environ.get("PLANNER_CALCULON_REPO")
    return Path(repo).resolve() if repo else None


def run_worker(python: Path, tool: str, calls: int) -> dict:
    env = worker_env(tool)
    out = subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", tool, "--calls", str(calls)],
                         capture_output=True, text=True, env=env, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="fresh processes per tool")
    parser.add_argument("--calls", type=int, default=300, help="warm calls per process")
    parser.add_argument("--calculon", metavar="PATH", help="a checkout of github.com/calculon-ai/calculon: "
                        "measure it too (default: $PLANNER_CALCULON_REPO; none: left out)")
    parser.add_argument("--worker", choices=("planner", "llm-analysis", "calculon"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    for flag, value in (("--rounds", args.rounds), ("--calls", args.calls)):
        if value < 1:
            parser.error(f"{flag} {value}: must be at least 1")
    if args.worker:
        worker(args.worker, args.calls)
        return
    tools = {"planner": Path(sys.executable), "llm-analysis": peer_python()}
    if args.calculon:
        os.environ["PLANNER_CALCULON_REPO"] = args.calculon
    repo = _calculon_repo()
    if repo is not None:
        if not (repo / "calculon" / "llm" / "llm.py").is_file():
            parser.error(f"--calculon {repo}: not a checkout of calculon-ai/calculon (no calculon/llm/llm.py)")
        tools["calculon"] = calculon_python(repo)
    for tool, python in tools.items():  # once, not measured: writes each tool's bytecode cache
        run_worker(python, tool, 1)
    reports: dict[str, list[dict]] = {t: [] for t in tools}
    for r in range(args.rounds):
        for tool in (list(tools) if r % 2 == 0 else list(tools)[::-1]):  # alternate who goes first
            reports[tool].append(run_worker(tools[tool], tool, args.calls))
    print(f"one pinned estimate, {args.rounds} fresh processes per tool, interleaved; medians over them "
          f"(CPU time / wall time):")
    for tool, rs in reports.items():
        med = lambda key, k: statistics.median(x[key][k] for x in rs)  # noqa: E731
        ans = rs[0]["answer"]
        print(f"  {tool:12s} import {med('import', 0) * 1e3:7.1f} / {med('import', 1) * 1e3:7.1f} ms;"
              f" first call {med('first', 0) * 1e3:7.2f} / {med('first', 1) * 1e3:7.2f} ms;"
              f" import + first {(med('import', 0) + med('first', 0)) * 1e3:7.1f} ms CPU;"
              f" warm {med('warm', 0) * 1e3:.3f} / {med('warm', 1) * 1e3:.3f} ms"
              + (f"; caches cleared {med('cleared', 0) * 1e3:.3f} / {med('cleared', 1) * 1e3:.3f} ms"
                 if "cleared" in rs[0] else "")
              + f"  (its answer: step {ans['step_s']:.2f} s, {ans['memory_gib']:.1f} GiB)")
    ours = reports["planner"]
    for peer in [t for t in tools if t != "planner"]:
        theirs = reports[peer]
        warm, first = (lambda x: x["warm"][0]), (lambda x: x["first"][0])
        cpu = {"warm": (warm, warm), "first call": (first, first),
               "import + first call": ((lambda x: x["import"][0] + x["first"][0]),) * 2,
               # the planner with every computed value computed again, the peer as it runs warm
               "caches cleared (the planner's), warm (the peer's)": ((lambda x: x["cleared"][0]), warm)}
        for label, (of, of_peer) in cpu.items():
            a, b = statistics.median(map(of, ours)), statistics.median(map(of_peer, theirs))
            # Each round's two processes ran one after the other: their ratio is less moved by the
            # machine's slow seconds, which can fall on either tool's processes.
            pairs = statistics.median(of(x) / of_peer(y) for x, y in zip(ours, theirs))
            print(f"  {label}: planner / {peer} CPU = {a / b:.2f} ({'planner' if a < b else peer} lower); "
                  f"median of the rounds' ratios {pairs:.2f}")


if __name__ == "__main__":
    main()
