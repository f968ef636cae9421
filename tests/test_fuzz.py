"""Fuzz the command line: random flag values (huge, tiny, negative, zero, nan, inf,
garbage text) and random hardware profile files and published CSVs, for every subcommand.

Each case must end in exit 0/3 with finite output (strict JSON where JSON is asked for), or exit 2
with exactly one line on stderr; never a traceback, never a hang (a per-case alarm). The cases
and the checks are benchmarks/fuzz_cli.py's; this runs a bounded sample (a few hundred cases,
well under a minute), the benchmark runs thousands: ``python benchmarks/fuzz_cli.py --cases 2000``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_spec = importlib.util.spec_from_file_location("fuzz_cli", Path(__file__).parent.parent / "benchmarks" / "fuzz_cli.py")
fuzz = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_cli"] = fuzz  # dataclasses look their module up while the file runs
_spec.loader.exec_module(fuzz)

CASES = 400  # ~15-40 ms each on a shared 2-core machine: about 6-20 s in all


@settings(max_examples=CASES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_case_is_a_finite_answer_or_one_line(data):
    case = fuzz.make_case(lambda seq: data.draw(st.sampled_from(list(seq))))
    # A hang is a case that never ends: 120 s is far past the slowest case seen (1 s alone, in 18,000),
    # so a machine whose cores another job holds does not make a slow case look like one.
    outcome = fuzz.run_case(case, seconds=120)
    assert outcome.kind in ("ok", "refused"), f"{outcome.kind}: {outcome.detail}"


def test_the_classifier_catches_what_it_must():
    """The checks themselves can fail: a traceback, nan in text, Infinity in JSON, two lines."""
    assert fuzz.classify(["estimate"], 0, "days: nan\n", "", 0.1).kind == "nonfinite"
    assert fuzz.classify(["estimate"], 0, "goodput inf%\n", "", 0.1).kind == "nonfinite"
    assert fuzz.classify(["estimate", "--format", "json"], 0, '{"x": Infinity}', "", 0.1).kind == "nonfinite"
    assert fuzz.classify(["estimate", "--format=json"], 0, '{"x": [1,', "", 0.1).kind == "bad-json"
    assert fuzz.classify(["estimate"], 2, "", "usage: ...\nplanner: error\n", 0.1).kind == "multi-line"
    assert fuzz.classify(["estimate"], 2, "", "planner estimate: gpus=0: ...\n", 0.1).kind == "refused"
    assert fuzz.classify(["estimate"], 1, "", "boom\n", 0.1).kind == "exit-1"
    assert fuzz.classify(["estimate"], 0, "information: 8 GPUs\n", "", 0.1).kind == "ok"  # 'inf' inside a word
    crash = fuzz.Case("estimate", ["estimate", "--preset", "no-such-preset-\x00"], {})
    assert fuzz.run_case(crash).kind == "refused"


def test_exit_codes_in_a_subprocess(tmp_path):
    """A few generated cases through the real entry point (`python -m planner`): the exit code and
    the output the in-process run classified are what a shell sees, and none hangs."""
    import random
    import subprocess

    rng = random.Random(12)
    for _ in range(6):
        case = fuzz.make_case(rng.choice)
        for name, content in case.files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        argv = [a.replace("{dir}", str(tmp_path)) for a in case.argv]
        r = subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True, text=True, timeout=60,
                           check=False)
        outcome = fuzz.classify(argv, r.returncode, r.stdout, r.stderr, 0.0)
        assert outcome.kind in ("ok", "refused"), f"{outcome.kind}: {outcome.detail}"
        assert "Traceback" not in r.stderr
