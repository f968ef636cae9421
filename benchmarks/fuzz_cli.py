"""Fuzz the command line: random flag values, random hardware profile files and random run records
(``validate`` and ``calibrate``: huge integers, non-finite and out-of-range values, deep nesting,
profile paths outside the project) for every subcommand, run in process through
``planner.cli.main.main(argv)``; ``planner run --dry-run`` (its flags and config files) through
the launcher's ``main``.

Each case must end in exit 0 or 3 with finite output (no nan/inf in the text, JSON that a strict
parser accepts), or exit 2 with exactly one line on stderr; never a traceback, never a hang (a
per-case alarm). tests/test_fuzz.py runs a bounded sample of the same cases in CI.

    python benchmarks/fuzz_cli.py --cases 2000 --seed 1

prints the counts per outcome and per subcommand, and the first failures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CASE_SECONDS = 20  # a case slower than this is a hang

# --- value pools --------------------------------------------------------------------------

HOSTILE = ["0", "-1", "-8", "1e30", "99999999999999999999", "1e-320", "1e400", "nan", "NaN", "inf", "-inf",
           "Infinity", "1e308", "0.001", "-0", "0x10", "abc", "", " ", "1,5", "1e", "1.5", "2.5e3", "1e400B",
           "1e30T", "3B", "1_000", "١٢", "\x00", "--", "1e-9", "4294967297", "-99999999999999999999",
           "10**6", "1000001", "65537", "1e16", "1e15", "9" * 400, "9" * 5000]
SANE = {"int": ["1", "2", "4", "8", "16", "64", "3"], "float": ["0.5", "1", "1.2", "2", "10", "100", "1e4"],
        "name": ["fuzz", "a-b", "x"],
        "count": ["125M", "1.3B", "7B", "1T", "300B", "2e9"], "gpus": ["8", "16", "64", "8,16", "1"]}
# Inside the documented ranges (planner/core/limits.py FLAGS), at their edges: must give finite answers.
EDGE = {"int": ["1", "3", "1024", "65536", "10000", "1000000", "16777216", "4194304", "262144"],
        "name": ["", " ", "a" * 300, "../x", "{dir}/ckpt"],
        "float": ["1e-6", "0.001", "1", "3", "1e5", "1e6", "1e12"],
        "count": ["1", "1000", "1e15", "1e16", "999999999999999"],
        "gpus": ["1000000", "999983", "720720", "1", "8,1000000"]}

# subcommand -> (base argv that makes it valid, {flag: kind})
PLAN_FLAGS = {"--gpus": "gpus", "--gpus-per-node": "int", "--tokens": "count", "--global-batch": "int",
              "--pue": "float", "--price-per-gpu-hour": "float", "--lora-r": "int", "--lora-alpha": "float",
              "--packing-efficiency": "float", "--mtbf-gpu-hours": "float", "--mtbf-node-hours": "float",
              "--restart-minutes": "float", "--storage-gbps": "float", "--storage-write-gbps": "float",
              "--storage-read-gbps": "float", "--keep-last": "int", "--checkpoint-interval": "int",
              "--epochs": "float", "--token-bytes": "int", "--dp": "int", "--tp": "int", "--pp": "int",
              "--vpp": "int", "--micro-batch": "int", "--zero": "int", "--params": "count", "--layers": "int",
              "--hidden": "int", "--heads": "int", "--kv-heads": "int", "--ffn-hidden": "int", "--vocab": "int",
              "--seq-len": "int", "--cp": "int", "--ep": "int", "--expert-imbalance": "float",
              "--memory-headroom": "float", "--mtp-layers": "int"}
MODEL = ["--preset", "gpt3-1.3b"]
COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "estimate": (["estimate", *MODEL], {**PLAN_FLAGS, "--top": "int"}),
    "search": (["search", *MODEL], {**PLAN_FLAGS, "--top": "int"}),
    "moe": (["estimate", "--preset", "olmoe-1b-7b"], {**PLAN_FLAGS, "--top": "int"}),
    "export": (["export", *MODEL, "--format", "torchrun"], {**PLAN_FLAGS, "--steps": "int"}),
    "compare": (["compare", *MODEL, "--gpu", "a100-80g"], PLAN_FLAGS),
    "recommend": (["recommend", *MODEL, "--gpu", "a100-80g", "--deadline", "30d"],
                  {**{k: v for k, v in PLAN_FLAGS.items() if k != "--gpus"}, "--max-gpus": "gpus",
                   "--deadline": "float", "--budget": "count"}),
    "presets": (["presets"], {}),
    "profiles": (["profiles"], {}),
    "validate": (["validate"], {}),
    "calibrate": (["calibrate"], {}),
    "probe": (["probe"], {"--nprocs": "int"}),
    # `planner run`, checked and printed (--dry-run: nothing launched), in process through the launcher
    "run": (["run", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "512", "--seq-len", "64",
             "--dry-run"],
            {"--nnodes": "int", "--nproc-per-node": "int", "--global-batch": "int", "--micro-batch": "int",
             "--dp": "int", "--tp": "int", "--pp": "int", "--steps": "int", "--lr": "float", "--layers": "int",
             "--keep-last": "int", "--checkpoint-interval": "int", "--dropout": "float", "--seed": "int",
             "--memory-fraction": "float", "--run-name": "name", "--checkpoint-dir": "name"}),
}
FORMATS = {"estimate": ("text", "json", "csv"), "search": ("text", "json", "csv"), "compare": ("text", "json"),
           "recommend": ("text", "json"), "presets": ("text", "json", "csv"), "profiles": ("text", "json", "csv"),
           "validate": ("text", "json", "csv")}

# --- hardware profile files ---------------------------------------------------------------

PROFILE_KEYS = {"gpu": {"memory_gib": 80, "hbm_gb_per_s": 2039, "tdp_w": 400, "bf16_tflops": 312,
                        "fp16_tflops": 312, "fp32_tflops": 19.5},
                "node": {"gpus_per_node": 8, "intra_node_gb_per_s": 300, "inter_node_gbit_per_s": 1600,
                         "intra_node_latency_us": 5, "inter_node_latency_us": 10, "p2p_gb_per_s": 300,
                         "p2p_latency_us": 5},
                "efficiency": {"matmul": 0.7, "memory": 0.8, "intra_node_bw": 0.85, "cuda_context_gib": 0.75,
                               "fragmentation": 0.05, "step_overhead_s": 0.0}}
TOML_VALUES = ["0", "-8", "1e30", "1e-320", "nan", "inf", "-inf", '"lots"', "true", "[1, 2]", "{a = 1}",
               "99999999999999999999", "0.5", "2", "1e308", '"80"', "-0.0", "1.5",
               # inside the schema's ranges, at their edges (planner/hardware.py): finite answers
               "0.001", "1e-4", "0.01", "1024", "1e6", "100000", "1e8", "1", "9" * 400]


def profile_text(pick: Callable[[Sequence], object]) -> str | bytes:
    """A TOML profile with a few keys broken, removed, added or mistyped; or a binary file."""
    kind = pick(["edit", "edit", "edit", "edit", "binary", "latin1", "garbage", "unknown-section", "deep",
                 "zero-peaks", "huge-int"])
    if kind == "deep":  # tomllib recurses once per level
        return 'name = "deep"\n[gpu]\nmemory_gib = ' + "[" * 100_000 + "]" * 100_000 + "\n"
    if kind == "binary":
        return bytes([0x00, 0xFF, 0xFE, 0x80, 0x10]) * 20
    if kind == "latin1":
        return 'name = "caf\xe9"\n'.encode("latin-1")
    if kind == "garbage":
        return "this is [not toml = = ]\n"
    tables = {t: dict(v) for t, v in PROFILE_KEYS.items()}
    if kind == "zero-peaks":  # every precision unsupported: nothing could run
        tables["gpu"].update({k: 0 for k in tables["gpu"] if k.endswith("_tflops")})
    if kind == "huge-int":
        tables[pick(list(tables))][pick(["memory_gib", "gpus_per_node", "tdp_w", "matmul"])] = "9" * 400
    for _ in range(int(pick([1, 1, 2, 3])) if kind in ("edit", "unknown-section") else 0):
        table = tables[pick(list(tables))]
        key = pick(list(table) + ["bogus_key"])
        action = pick(["value", "value", "value", "drop"])
        if action == "drop":
            table.pop(key, None)
        else:
            table[key] = pick(TOML_VALUES)
    lines = ['name = "fuzz-gpu"', f"price_usd_per_gpu_hour = {pick(['2.0', '0', '-1', 'nan', '1e300', '2.0'])}"]
    if kind == "unknown-section":
        lines.append("[gpuu]\nmemory_gib = 80")
    for t, keys in tables.items():
        lines.append(f"[{t}]")
        lines += [f"{k} = {v}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


# The columns planner/calibration/published.py reads (Megatron-LM 2021 Table 1, first row).
_STACK = Path(__file__).resolve().parent.parent / "software_stacks" / "fsdp2.toml"
STACK_VALUES = ['"eager"', '"fused"', "[0, 3]", "[]", '["1f1b"]', "[5]", '""']


def stack_text(pick: Callable[[Sequence], object]) -> str | bytes:
    """A shipped software-stack file (software_stacks/fsdp2.toml) with a few values broken, keys dropped
    or unknown keys added; or a binary file."""
    if pick([False, False, False, False, True]):
        return bytes(range(256))
    lines = _STACK.read_text().splitlines()
    for _ in range(int(pick([1, 1, 2, 3]))):
        i = int(pick([j for j, line in enumerate(lines) if " = " in line and not line.startswith("#")]))
        key = lines[i].split(" = ")[0]
        action = pick(["value", "value", "value", "drop", "unknown"])
        value = pick(TOML_VALUES + STACK_VALUES)
        lines[i] = "" if action == "drop" else f"{key}_x = 1" if action == "unknown" else f"{key} = {value}"
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("params_billion,attention_heads,hidden_size,num_layers,tensor_parallel,pipeline_parallel,num_gpus,"
               "global_batch_size_seqs,seq_len,vocab_size,micro_batch_size,virtual_pipeline_stages,"
               "achieved_tflops_per_gpu")
CSV_ROW = ["1.7", "24", "2304", "24", "1", "1", "32", "512", "2048", "51200", "16", "1", "137"]


def published_csv(pick: Callable[[Sequence], object]) -> str:
    row = list(CSV_ROW)
    for _ in range(int(pick([0, 1, 1, 2, 3]))):
        row[int(pick(range(len(row))))] = str(pick(HOSTILE[:20] + ["1", "2"]))
    return CSV_COLUMNS + "\n" + ",".join(row) + "\n"


# --- run records ---------------------------------------------------------------------------

_SWEEP = Path(__file__).resolve().parent / "runs" / "cpu-2core"  # 14 committed CPU runs of a profiled sweep
_RECORDS = sorted(_SWEEP.glob("*/record.json"))
_PROBED = _SWEEP / "probed.toml"
_RAW = "@@raw@@"  # a placeholder the record's text replaces with raw JSON (numbers json.dumps cannot write)
RECORD_VALUES: list[object] = [0, -1, -1e-9, 1e308, 10**400, 2**63, 2**53 + 1, "text", None, [], {}, True, 1.5,
                               _RAW + "1e400", _RAW + "-1e400", _RAW + "NaN", _RAW + "Infinity",
                               _RAW + "9" * 5000, _RAW + "1e-400", "x" * 2_000_000]
PROFILE_REFS: list[object] = ["probed.toml", "probed.toml", "a100-80g", "/etc/passwd", "../../../../etc/passwd",
                              "no-such.toml", "", None, 5, "hardware_profiles/a100-80g.toml",
                              "benchmarks/runs/cpu-2core/probed.toml", "nul\x00.toml"]


def _leaves(data: object, where: tuple = ()) -> list[tuple]:
    """Every path to a value in a record (keys and list indices)."""
    if isinstance(data, dict):
        return [where] + [p for k, v in data.items() for p in _leaves(v, (*where, k))]
    if isinstance(data, list):
        return [where] + [p for i, v in enumerate(data) for p in _leaves(v, (*where, i))]
    return [where]


def _set(data: object, where: tuple, value: object) -> object:
    if not where:
        return value
    holder = data
    for key in where[:-1]:
        holder = holder[key]
    if value is _DROP and isinstance(holder, dict):
        holder.pop(where[-1], None)
    elif value is not _DROP:
        holder[where[-1]] = value
    return data


_DROP = object()


def clean_record(path: Path) -> str:
    """A committed record as it is, naming its probed profile (beside the run folders)."""
    data = json.loads(path.read_text())
    data["config"]["profile"]["hardware_profile"] = "probed.toml"
    return json.dumps(data)


def record_text(pick: Callable[[Sequence], object]) -> str | bytes:
    """A committed CPU run record with a few values broken (hostile numbers, wrong types, fields
    dropped), its profile reference changed, nested 200,000 deep, truncated, or a binary file."""
    kind = pick(["edit", "edit", "edit", "edit", "edit", "profile", "deep", "truncated", "binary", "clean"])
    text = clean_record(pick(_RECORDS))
    if kind == "binary":
        return bytes(range(256)) * 4
    if kind == "truncated":
        return text[: int(pick([1, 100, len(text) // 2, len(text) - 2]))]
    if kind == "deep":
        return '{"schema_version": ' + "[" * 200_000 + "]" * 200_000 + "}"
    data = json.loads(text)
    if kind == "profile":
        data["config"]["profile"]["hardware_profile"] = pick(PROFILE_REFS)
    leaves = _leaves(data)
    for _ in range(int(pick([1, 1, 2, 3])) if kind == "edit" else 0):
        where = pick(leaves[1:])
        data = _set(data, where, pick(RECORD_VALUES + [_DROP]))
        leaves = _leaves(data)
    out = json.dumps(data)
    for value in RECORD_VALUES:
        if isinstance(value, str) and value.startswith(_RAW):
            out = out.replace(json.dumps(value), value[len(_RAW):])
    return out


# --- cases --------------------------------------------------------------------------------


@dataclass
class Case:
    command: str
    argv: list[str]
    files: dict[str, str | bytes]  # name -> content, written into the case's folder; "{dir}" in argv
    seconds: int = CASE_SECONDS  # slower than this: a hang (a fit of recorded runs gets longer)


def make_case(pick: Callable[[Sequence], object], commands: Sequence[str] | None = None) -> Case:
    command = str(pick(list(commands or COMMANDS)))
    base, flags = COMMANDS[command]
    argv, files = list(base), {}
    if command in FORMATS:
        argv += ["--format", str(pick(FORMATS[command]))]
    names = sorted(flags)
    for _ in range(int(pick([0, 1, 1, 2, 3, 5])) if names else 0):
        flag = str(pick(names))
        kind = flags[flag]
        pools = [SANE[kind], EDGE[kind]] if kind == "name" else [HOSTILE, HOSTILE, SANE[kind], EDGE[kind]]
        value = str(pick(pick(pools)))  # a name is echoed as given (a folder called NaN is a folder)
        argv += [f"{flag}={value}"]
    if command in ("estimate", "search", "export", "compare", "recommend", "calibrate", "validate") \
            and pick([True, False, False]):
        files["gpu.toml"] = profile_text(pick)
        flag = "--base" if command == "calibrate" else "--gpu"
        argv += [flag, "{dir}/gpu.toml"]
    if command in ("estimate", "search", "export", "compare", "recommend") and _STACK.is_file() \
            and pick([True, False, False, False]):
        files["stack.toml"] = stack_text(pick)
        argv += ["--stack", "{dir}/stack.toml"]
    records = command in ("calibrate", "validate") and pick([True, True, False])
    if records:  # a sweep folder: runs/<run>/record.json, the probed profile they name beside them
        most = [1, 3, 8] if command == "calibrate" else [1, 3, 8, 14]  # a fit of 14 runs takes ~10 s of CPU
        for i, path in enumerate(_RECORDS[:int(pick(most))]):
            files[f"runs/r{i}/record.json"] = record_text(pick) if pick([True, False, False]) else clean_record(path)
        files["runs/probed.toml"] = _PROBED.read_text()
        if pick([False, False, False, True]):
            argv += ["--strict"]
    if command == "calibrate":
        runs = "{dir}/runs" if records else str(pick(["{dir}", "{dir}/no-runs"]))
        argv += [runs, "--out", str(pick(["{dir}/out.toml", "{dir}/out.toml", "{dir}"]))]
        if "--base" not in argv:
            argv += ["--base", str(pick(["a100-80g", "{dir}/runs/probed.toml"])) if records else "a100-80g"]
        if records:
            argv += ["--factors", str(pick(["matmul", "matmul,memory"]))]
    elif records:
        argv += ["{dir}/runs"]
    if command == "validate" and (pick([True, False]) or "{dir}/runs" not in argv):
        files["pub.csv"] = published_csv(pick)
        argv += ["--published", "{dir}/pub.csv"]
        if pick([False, False, True]):
            argv += ["--plot", "{dir}"]
    if command == "probe":  # a valid probe would run real benchmarks: keep it to refused values
        argv += ["--out", "{dir}/probe.toml", f"--nprocs={pick(['0', '-1', '1e3', 'nan', '99999999999999999999'])}"]
    if command == "run" and pick([False, False, True]):
        files["run.yaml"] = pick([bytes(range(256)), "layout: [1, 2\n", "- a\n- b\n", "training: {steps: -1}\n",
                                  "model: {layers: " + "9" * 400 + "}\n", "layout: " + "[" * 5000 + "]" * 5000])
        argv += ["--config", "{dir}/run.yaml"]
    if command == "run":
        argv += ["--runs-dir", "{dir}/runs"]
    if command == "compare" and pick([False, False, True]):
        argv += ["--plot", "{dir}"]
    return Case(command, argv, files, 60 if command == "calibrate" and records else CASE_SECONDS)


# --- running ------------------------------------------------------------------------------

_NONFINITE = re.compile(r"(?<![A-Za-z])(nan|inf|infinity)(?![A-Za-z])", re.IGNORECASE)


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@dataclass
class Outcome:
    kind: str  # ok | refused | nonfinite | bad-json | multi-line | traceback | hang | exit-N
    rc: int | None
    seconds: float
    detail: str = ""


def run_case(case: Case, seconds: int = CASE_SECONDS) -> Outcome:
    from planner.cli.main import main
    from planner.hardware import get_profile

    get_profile.cache_clear()  # a fuzz profile file is rewritten under the same path
    with tempfile.TemporaryDirectory() as d:
        for name, content in case.files.items():
            (Path(d) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(d) / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        argv = [a.replace("{dir}", d) for a in case.argv]
        out, err = io.StringIO(), io.StringIO()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(max(seconds, case.seconds))
        start = time.perf_counter()
        rc: int | None = None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if argv[0] == "run":  # the launcher in process (`planner run` starts it as a subprocess)
                    from reference_trainer.launch import main as launch

                    rc = launch(argv[1:])
                else:
                    rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
        except _Hang:
            return Outcome("hang", None, time.perf_counter() - start, " ".join(argv))
        except BaseException:  # noqa: BLE001 - a traceback is the failure being counted
            return Outcome("traceback", None, time.perf_counter() - start,
                           " ".join(argv) + "\n" + traceback.format_exc(limit=-3))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        return classify(argv, rc, out.getvalue(), err.getvalue(), time.perf_counter() - start)


def classify(argv: list[str], rc: int | None, stdout: str, stderr: str, seconds: float) -> Outcome:
    where = " ".join(argv)
    if rc == 2:
        lines = stderr.strip("\n").split("\n")
        if len(lines) == 1 and lines[0].strip() and stdout == "":
            return Outcome("refused", rc, seconds)
        return Outcome("multi-line", rc, seconds, f"{where}\n{stderr[-2000:]}")
    if rc not in (0, 3):
        return Outcome(f"exit-{rc}", rc, seconds, f"{where}\n{stderr[-2000:]}")
    text = stdout
    if "--format=json" in argv or ("--format" in argv and argv[argv.index("--format") + 1] == "json"):
        try:
            data = json.loads(stdout, parse_constant=_reject_constant)
        except ValueError as exc:
            kind = "nonfinite" if "non-finite" in str(exc) else "bad-json"
            return Outcome(kind, rc, seconds, f"{where}\n{exc}")
        text = "\n".join(_output_strings(data))  # what a reader sees, less the quoted input of skipped records
    hit = _NONFINITE.search(text)
    if hit:
        return Outcome("nonfinite", rc, seconds, f"{where}\n...{text[max(0, hit.start() - 200):hit.end() + 50]}")
    return Outcome("ok", rc, seconds)


def _output_strings(data: object) -> list[str]:
    """The strings of a JSON answer, except the "skipped" lines (they quote a rejected record's bad
    value, e.g. 'bad number Infinity'): keys and values."""
    if isinstance(data, dict):
        return [s for k, v in data.items() if k != "skipped" for s in (str(k), *_output_strings(v))]
    if isinstance(data, list):
        return [s for v in data for s in _output_strings(v)]
    return [data] if isinstance(data, str) else []


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite JSON constant {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--show", type=int, default=5, help="failures to print in full")
    p.add_argument("--commands", help="comma-separated subcommands to fuzz (default: all); e.g. validate,calibrate")
    a = p.parse_args(argv)
    commands = a.commands.split(",") if a.commands else None
    rng = random.Random(a.seed)
    kinds: Counter = Counter()
    per_command: dict[str, Counter] = {}
    failures: list[Outcome] = []
    slowest = 0.0
    start = time.perf_counter()
    for _ in range(a.cases):
        case = make_case(rng.choice, commands)
        o = run_case(case)
        kinds[o.kind] += 1
        per_command.setdefault(case.command, Counter())[o.kind] += 1
        slowest = max(slowest, o.seconds)
        if o.kind not in ("ok", "refused"):
            failures.append(o)
    good = kinds["ok"] + kinds["refused"]
    print(f"cases {a.cases}, seed {a.seed}, {time.perf_counter() - start:.0f} s, slowest case {slowest:.2f} s")
    print(f"finite results (exit 0/3) {kinds['ok']}, one-line refusals (exit 2) {kinds['refused']}: "
          f"{100 * good / a.cases:.2f}% good")
    print(f"hangs {kinds['hang']}, tracebacks {kinds['traceback']}, non-finite output {kinds['nonfinite']}, "
          f"invalid JSON {kinds['bad-json']}, multi-line errors {kinds['multi-line']}, "
          f"other exits {sum(v for k, v in kinds.items() if k.startswith('exit-'))}")
    for command, c in sorted(per_command.items()):
        print(f"  {command:10s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    for o in failures[:a.show]:
        print(f"--- {o.kind}\n{o.detail}")
    return 0 if good == a.cases else 1


if __name__ == "__main__":
    sys.exit(main())
