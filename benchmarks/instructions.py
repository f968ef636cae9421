"""Instructions per pinned estimate, counted by valgrind: the planner's and llm-analysis's, on
the same problem as benchmarks/peers.py, a figure no other job on the machine moves.

CPU time on a shared machine moves from minute to minute; the count of machine instructions a
call executes does not (the same interpreter, the same inputs, the same hash seed). Each figure
is the difference between two runs of one process under ``valgrind --tool=callgrind`` (no cache
simulation), one making N calls and one making none after the same imports and warm-up, divided
by N. It is not a time: instructions per second differ
between the two programs, so ``benchmarks/peers.py``'s CPU times stay the figures the targets read;
this one says how much work each call does, and whether a change of the code made it less.

Rows: the planner warm (the same call again), with its caches cleared before each call (every
computed value computed again: peers.py's "caches cleared"; the clearing is counted apart, in a
process that clears and does not call, and taken off: that process's caches are empty when it
clears them, so freeing the last call's values stays in the row, which peers.py's timer leaves
out), and
a sweep (a new layout or global batch each call, the model, stack and profile as before), a sweep
over models (a new model each call: the vocabulary 128 tokens larger, so every value that depends
on the model is computed anew; the stack and profile as before), against llm-analysis's
``train()`` warm.
OpenBLAS is held to one thread (its idle pool threads would be scheduled by valgrind and counted).

    python benchmarks/instructions.py            # about two minutes on 2 cores
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # (the problem, the peer's environment and the planner's caches: one definition)

MODES = {"planner": ("warm", "cleared", "sweep", "models", "clear"), "llm-analysis": ("warm",)}


def worker(tool: str, mode: str, calls: int) -> None:
    """Imports, one warm-up call of every input used, then ``calls`` calls in ``mode``."""
    if tool == "llm-analysis":
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from llm_analysis.analysis import train
            train(**peers.THEIRS)
        for _ in range(calls):
            train(**peers.THEIRS)
        return
    import planner

    layouts = [dict(peers.OURS, tp=tp, pp=pp, dp=128 // (tp * pp), micro_batch=mb)
               for tp in (2, 4) for pp in (1, 2, 4) for mb in (1, 2)]
    for flags in (peers.OURS, *layouts):
        planner.estimate(**flags)
    caches = peers._core_caches()
    for i in range(calls):
        if mode in ("cleared", "clear"):  # ("clear": the clearing alone, taken off "cleared")
            peers.clear(caches)
            if mode == "cleared":
                planner.estimate(**peers.OURS)
        elif mode == "sweep":  # each layout in turn, the global batch new each round
            planner.estimate(**dict(layouts[i % len(layouts)], global_batch=1024 * (2 + i // len(layouts))))
        elif mode == "models":  # a new model each call: its vocabulary 128 tokens larger
            planner.estimate(**dict(peers.OURS, vocab=32128 + 128 * i))
        else:
            planner.estimate(**peers.OURS)


def counted(python: Path, tool: str, mode: str, calls: int) -> int:
    """Instructions one process executes (callgrind's total)."""
    env = {**peers.worker_env(tool), "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", str(python),
                          str(Path(__file__).resolve()), "--worker", tool, mode, str(calls)],
                         capture_output=True, text=True, env=env, check=True, timeout=1800)
    match = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if not match:
        raise SystemExit(f"valgrind printed no count for {tool} {mode}: {out.stderr[-500:]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls counted per row (default 200)")
    parser.add_argument("--worker", nargs=3, metavar=("TOOL", "MODE", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return
    if args.calls < 1:
        parser.error(f"--calls {args.calls}: must be at least 1")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind); nothing counted")
    pythons = {"planner": Path(sys.executable), "llm-analysis": peers.peer_python()}
    for tool, python in pythons.items():  # once, not counted: each tool's bytecode cache written
        peers.run_worker(python, tool, 1)
    jobs = [(tool, mode, n) for tool, modes in MODES.items() for mode in modes for n in (0, args.calls)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        totals = dict(zip(jobs, pool.map(lambda j: counted(pythons[j[0]], *j), jobs)))
    per_call = {(tool, mode): (totals[tool, mode, args.calls] - totals[tool, mode, 0]) / args.calls
                for tool, modes in MODES.items() for mode in modes}
    per_call["planner", "cleared"] -= per_call.pop(("planner", "clear"))
    peer = per_call["llm-analysis", "warm"]
    print(f"instructions per pinned estimate (valgrind, {args.calls} calls counted per row):")
    for (tool, mode), n in per_call.items():
        versus = "" if tool != "planner" else f"   {n / peer:.2f} of llm-analysis warm"
        print(f"  {tool:12s} {mode:8s} {n / 1e6:6.3f} M{versus}")


if __name__ == "__main__":
    main()
