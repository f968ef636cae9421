"""Speed of this tree against another commit, on one machine, the two run in turns.

    python benchmarks/ab_speed.py REV [--pairs 5]

A shared machine's speed wanders (twofold within minutes, CPU time with it, was seen on the 2-core
development machine): figures measured minutes apart do not compare code. This script extracts REV
(`git archive`) and copies this tree as it is on disk into one temporary folder, as siblings, and
times them in turns, each in a fresh process, ``--pairs`` times. Each process prints the minimum
over its repeats of: a large search (Mixtral 8x22B on 4,096 H100s, 69,471 layouts), the full
evaluation of 33B on 128 A100s and of DeepSeek-V3 on 2,048 H100s (``search(...).table``: every
layout's memory and step time, ranked), a free plan (33B on 128 A100s, what `planner estimate
--params 33B --gpus 128` computes) and one pinned estimate (that plan's layout pinned, and
DeepSeek-V3's). The last lines give, per figure, the median of each tree's minima and their ratio (REV / this tree:
above 1, this tree is faster), and the median of the ratios within each pair (the two run a few
seconds apart: less moved by the machine's slow minutes, which can fall on either tree's runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a fresh process with the tree's root as its first argument: public entry points only, so
# that any commit of the planner since the search took Pins runs it.
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import planner
assert planner.__file__.startswith(sys.argv[1]), planner.__file__
from planner.core.layout import Job
from planner.core.plan import plan
from planner.core.presets import get_preset, resolve_params
from planner.core.search import Pins, search
from planner.hardware import get_profile

def least(f, repeat):
    f()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
    return best

h100, a100 = get_profile("h100-80g"), get_profile("a100-80g")
mixtral, job = get_preset("mixtral-8x22b"), Job(attention="standard", global_batch=8192)
m33 = resolve_params(33e9)[0]
lay = plan(m33, a100, Job(), 128).best.layout
pins = Pins(**{n: getattr(lay, n) for n in Pins.__slots__})
v3 = get_preset("deepseek-v3")
lay3 = plan(v3, h100, Job(), 2048).best.layout
pins3 = Pins(**{n: getattr(lay3, n) for n in Pins.__slots__})
print(json.dumps({
    "large search, Mixtral 8x22B on 4,096 GPUs (ms)": 1e3 * least(lambda: search(mixtral, h100, job, 4096), 10),
    "full evaluation, 33B on 128 A100 (ms)": 1e3 * least(lambda: search(m33, a100, Job(), 128).table, 20),
    "full evaluation, DeepSeek-V3 on 2,048 H100 (ms)": 1e3 * least(lambda: search(v3, h100, Job(), 2048).table, 20),
    "free plan, 33B on 128 A100 (ms)": 1e3 * least(lambda: plan(m33, a100, Job(), 128), 20),
    "pinned estimate, 33B on 128 A100 (ms)": 1e3 * least(lambda: plan(m33, a100, Job(), 128, pins), 100),
    "pinned estimate, DeepSeek-V3 on 2,048 H100 (ms)": 1e3 * least(lambda: plan(v3, h100, Job(), 2048, pins3), 100),
}))
"""


def extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (as git stores it) in ``into``/rev."""
    archive = into / "rev.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=out, check=True)
    tree = into / "rev"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def copy_worktree(into: Path) -> Path:
    """This tree as it is on disk (tracked files, and untracked ones git does not ignore) in
    ``into``/cur: both trees then run from folders of the same depth and name length. Where a tree
    lies moved the same code's large search from 45 to 55 ms while its pages were mapped afresh
    each search (docs/speed.md, "Temporaries on pages already mapped")."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    tree = into / "cur"
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file():  # (a tracked file deleted on disk is left out, as it is in this tree)
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    return tree


def measure(tree: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree)], capture_output=True, text=True, check=True,
                         cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rev", help="the commit to compare with (e.g. HEAD~3, a tag, a hash)")
    p.add_argument("--pairs", type=int, default=5, help="turns of (REV, this tree) (default: 5)")
    a = p.parse_args()
    if a.pairs < 1:
        print(f"ab_speed: --pairs {a.pairs}: must be at least 1", file=sys.stderr)
        return 2
    try:
        label = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.rev], capture_output=True,
                               text=True, check=True).stdout.strip()
    except subprocess.CalledProcessError:
        print(f"ab_speed: rev {a.rev!r}: not a commit of this repository", file=sys.stderr)
        return 2
    runs: dict[str, list[dict[str, float]]] = {label: [], "this tree": []}
    with tempfile.TemporaryDirectory() as tmp:
        base, current = extract(a.rev, Path(tmp)), copy_worktree(Path(tmp))
        for k in range(a.pairs):
            for name, tree in ((label, base), ("this tree", current)):
                r = measure(tree)
                runs[name].append(r)
                print(f"pair {k + 1} {name:>10}: " + "; ".join(f"{key} {v:.2f}" for key, v in r.items()), flush=True)
    print()
    for key in runs["this tree"][0]:
        old = statistics.median(r[key] for r in runs[label])
        new = statistics.median(r[key] for r in runs["this tree"])
        pairs = statistics.median(a[key] / b[key] for a, b in zip(runs[label], runs["this tree"]))
        print(f"{key}: {label} {old:.2f}, this tree {new:.2f}; ratio {old / new:.2f} (median of the pairs' "
              f"ratios {pairs:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
