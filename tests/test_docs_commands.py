"""Every shell command the docs show runs as written (issue 11: "the first hour of a new user").

The commands are extracted from the fenced blocks of README.md, reference_trainer/README.md and
docs/*.md: every line of a ``bash``/``sh`` block, and every ``$ ``-prefixed line of a transcript
block. The fast planner subcommands run exactly as written; the slow or machine-changing ones are
listed below with the reason, and run with ``--help`` (or ``--dry-run`` for the trainer's
launcher) so that a renamed flag or subcommand still fails here.

The expected exit code is 0, or the one the transcript shows: a transcript whose next line is
``planner <sub>: <message>`` (not a ``note:``) documents a refusal, exit 2; ``$ echo $?`` and the
code on the line after it, later in the same transcript, documents another.

What a transcript shows after a command it runs as written is what the command prints today: each
line appears in its output, in the order shown within stdout and within stderr (a line ending in
``...`` is a cut one: its start does; ``...`` alone stands for lines left out). Only the
milliseconds a search took are masked: counts such as "best of 1886 fitting layouts" are compared.

docs/cli.md is docs/cli_reference.py's output (a test below fails when it is stale), and the
README stays a five-minute read: under 200 lines.
"""

from __future__ import annotations

import glob
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "reference_trainer/README.md", *sorted(str(p.relative_to(ROOT))
                                                               for p in (ROOT / "docs").glob("*.md")))

# Not run at all: what they do is not the planner's, or changes this machine or the repository.
SKIP_PREFIXES = (
    "pip ",  # installs: the environment is already installed (tests/app/test_browser.py checks a fresh one)
    "torchrun ",  # the trainer under torchrun: minutes on 2 cores; tests/trainer covers it
    "python -m reference_trainer",  # the same, one process
    "python -m pytest",  # this very test suite
    "python docs/",  # regenerates committed pages (tests/test_seed_check.py checks them)
    "head ", "grep ", "cat ",  # inspect a file an earlier line wrote
    "echo $?",  # shows the previous command's exit code (checked with that command)
    "bash .ci/",  # CI's scripts: a fresh resolve of the extras (minutes, network); docs/testing.md
)
# Run with --help only: slow (probe, profile grid), serving (app) or reading what an earlier,
# slow line of the same block wrote (a calibrated profile, a run grid).
HELP_ONLY_SUBCOMMANDS = ("probe", "profile", "calibrate", "app")
HELP_ONLY_WHEN = ("my-gpu.toml", "runs/grid", "base.yaml")
# `planner run` (the trainer's launcher) is checked with --dry-run: the config is built and
# validated (layout, batch, schedule) without starting torchrun.
DRY_RUN_SUBCOMMANDS = ("run",)
# Scripts run with --help only: minutes of runs (tests/trainer/test_gpu_session.py runs the session).
HELP_ONLY_SCRIPTS = ("benchmarks/gpu_session.py",)
# Not run: they change the repository or unpack what a GPU session brought back (docs/gpu-session.md).
SKIP_PREFIXES += ("git ", "tar ", "mkdir ")


def _blocks(text: str):
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        yield m.group(1), m.group(2).splitlines()


def doc_commands() -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(where, command, expected exit code, the lines a transcript shows after it) for every
    command line of the docs."""
    out = []
    for doc in DOCS:
        for lang, lines in _blocks((ROOT / doc).read_text()):
            for i, line in enumerate(lines):
                if lang in ("bash", "sh", "shell"):
                    cmd = line.strip()
                elif line.startswith("$ "):
                    cmd = line[2:].strip()
                else:
                    continue
                if not cmd or cmd.startswith("#"):
                    continue
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                refused = (lang == "" and re.match(r"planner \w+: ", nxt) and ": note:" not in nxt)
                code = 2 if refused else 0
                for j in range(i + 1, len(lines) - 1):
                    if lines[j].startswith("$ echo $?"):
                        code = int(lines[j + 1])
                        break
                    if lines[j].startswith("$ "):
                        break
                shown = []
                if lang == "" and line.startswith("$ "):
                    for later in lines[i + 1:]:
                        if later.startswith("$ "):
                            break
                        shown.append(later)
                out.append((f"{doc}: {cmd[:60]}", cmd, code, tuple(shown)))
    return out


COMMANDS = doc_commands()


def _expand(word: str) -> list[str]:
    """A word as bash expands it: braces (``{00,02}``), then a glob matched from the repository root."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if m:
        return [w for alt in m.group(1).split(",") for w in _expand(word[:m.start()] + alt + word[m.end():])]
    if any(c in word for c in "*?["):
        return sorted(glob.glob(word, root_dir=ROOT)) or [word]
    return [word]


def _argv(cmd: str, tmp_path: Path) -> list[str] | None:
    """The command as argv to run (None: skipped), with the comment and output redirection cut."""
    for part in cmd.split("&&"):
        if part.strip().startswith("planner "):
            cmd = part.strip()  # `pip install . && planner estimate ...`: the planner part
    if cmd.startswith(SKIP_PREFIXES):
        return None
    words = [w for word in shlex.split(cmd, comments=True) for w in _expand(word)]
    if "..." in words:
        return None  # a placeholder ("planner run ... --dry-run"): shows a flag, not a command
    if words[0] in ("python", "python3") and len(words) > 1 and words[1] in HELP_ONLY_SCRIPTS:
        return [words[0], words[1], "--help"]
    if ">" in words:
        words = words[:words.index(">")]
    for flag in ("--plot", "--out"):  # files the command writes go to a temporary folder, not the checkout
        if flag in words and words.index(flag) + 1 < len(words):
            i = words.index(flag) + 1
            words[i] = str(tmp_path / Path(words[i]).name)
    assert words[0] == "planner", f"a command the test does not know how to run: {cmd!r}"
    if words[1] in HELP_ONLY_SUBCOMMANDS or any(w in cmd for w in HELP_ONLY_WHEN):
        return [*words[:2], "--help"]
    if words[1] in DRY_RUN_SUBCOMMANDS:
        return [*words, "--dry-run", "--runs-dir", str(tmp_path / "runs")]
    return words


def test_the_docs_show_commands():
    subs = {c.split()[1] for _, c, _, _ in COMMANDS if c.startswith("planner ")}
    assert {"estimate", "compare", "recommend", "export", "run", "app"} <= subs


@pytest.mark.parametrize("where,cmd,code,shown", COMMANDS, ids=[w for w, _, _, _ in COMMANDS])
def test_doc_command_runs_as_written(where, cmd, code, shown, tmp_path):
    argv = _argv(cmd, tmp_path)
    if argv is None:
        pytest.skip("not run here (see SKIP_PREFIXES)")
    script = argv[0] in ("python", "python3")
    r = subprocess.run([sys.executable, *([] if script else ["-m", "planner"]), *argv[1:]], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, check=False)
    expected = 0 if "--help" in argv else code
    assert r.returncode == expected, f"{where}\n$ {' '.join(argv)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr
    written = [w for word in shlex.split(cmd, comments=True) for w in _expand(word)]
    if argv[1:] != written[1:len(argv)] or len(argv) == 2 and argv[1] == "--help" or script:
        return  # run as a stand-in (--help, --dry-run): what the docs show is not what this prints
    stale = shown_but_not_printed(shown, r.stdout, r.stderr)
    assert stale is None, f"{where}: stale (or out of order): {stale}"


MS = re.compile(r"in [\d.]+ ms")  # how long a search took: the one figure a transcript may not pin


def _same(shown: str, printed: str) -> bool:
    shown, printed = MS.sub("in <ms>", shown), MS.sub("in <ms>", printed)
    return printed.startswith(shown[:-3].rstrip()) if shown.endswith("...") else printed == shown


def shown_but_not_printed(shown, stdout: str, stderr: str) -> str | None:
    """The first shown line that the output does not print after the lines matched before it in
    the same stream (stdout or stderr: a transcript may interleave them), or None."""
    streams = [[x.rstrip() for x in text.splitlines()] for text in (stdout, stderr)]
    at = [0, 0]
    for line in shown:
        line = line.rstrip()
        if line.strip() in ("", "...", "$ echo $?") or line.strip().isdigit():
            continue
        for k, lines in enumerate(streams):
            hit = next((i for i in range(at[k], len(lines)) if _same(line, lines[i])), None)
            if hit is not None:
                at[k] = hit + 1
                break
        else:
            return line
    return None


def test_the_comparison_fails_on_drift():
    # The drift the README once had: a count off by one; and a line shown before one printed first.
    out = "layout   dp 128\n         best of 1886 fitting layouts out of 4314 evaluated in 138.4 ms\nwarnings: none\n"
    assert shown_but_not_printed(["         best of 1886 fitting layouts out of 4314 evaluated in 8.0 ms"], out, "") is None
    assert shown_but_not_printed(["         best of 1887 fitting layouts out of 4314 evaluated in 8.0 ms"], out, "")
    assert shown_but_not_printed(["warnings: none", "layout   dp 128"], out, "") == "layout   dp 128"
    assert shown_but_not_printed(["layout   dp 1 ...", "...", "warnings: none"], out, "") is None
    assert shown_but_not_printed(["note: x", "layout   dp 128"], out, "note: x\n") is None


def test_the_cli_reference_is_current():
    proc = subprocess.run([sys.executable, "docs/cli_reference.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail to docs/"


def _estimate_json(*flags: str) -> dict:
    import contextlib
    import io
    import json

    from planner.cli.main import main as planner_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert planner_main(["estimate", "--params", "33B", "--gpus", "128", *flags, "--format", "json"]) == 0
    return json.loads(buf.getvalue())


def test_the_sentences_about_the_headline_plan_say_what_it_prints():
    # Figures docs/estimate.md states in prose next to the headline transcript (the transcript itself
    # is compared above): the MFU, the share of the capacity the plan fills, and what
    # --memory-headroom 0.15 changes. Each is read back from the page and compared with the
    # estimate, so an update of the model that moves them fails here until the prose follows.
    text = " ".join((ROOT / "docs" / "estimate.md").read_text().split())
    plain, kept = _estimate_json(), _estimate_json("--memory-headroom", "0.15")
    mem, gib = plain["memory"], 2**30
    m = re.search(r"(\d+)% MFU for 33B on 128 A100s", text)
    assert m and int(m.group(1)) == round(100 * plain["mfu"]), m
    m = re.search(r"the one above uses (\d+)% of it", text)
    assert m and int(m.group(1)) == round(100 * mem["total_bytes"] / mem["capacity_bytes"]), m
    m = re.search(r"judged against the rest \((\d+) GiB here\)", text)
    assert m and int(m.group(1)) == round(0.85 * mem["capacity_bytes"] / gib), m
    m = re.search(r"the plan becomes dp (\d+) x tp (\d+) x pp (\d+) at ([\d.]+) GiB and ([\d.]+)% MFU", text)
    lay = kept["layout"]
    assert m and (int(m.group(1)), int(m.group(2)), int(m.group(3))) == (lay["dp"], lay["tp"], lay["pp"]), m
    assert lay["vpp"] == 1
    assert float(m.group(4)) == round(kept["memory"]["total_bytes"] / gib, 1)
    assert float(m.group(5)) == round(100 * kept["mfu"], 1)
    m = re.search(r"now filling (\d+)% of the smaller capacity", text)
    assert m and int(m.group(1)) == round(100 * kept["memory"]["total_bytes"] / kept["memory"]["capacity_bytes"]), m


def test_ci_runs_the_readmes_test_command_with_the_lock():
    # The Quickstart's second command is what .ci/run runs, verbatim, and it installs at the versions
    # constraints.txt pins (docs/testing.md); torch is pinned there without a CUDA build's label.
    blocks = [lines for lang, lines in _blocks((ROOT / "README.md").read_text()) if lang == "bash"]
    command = blocks[1][0]
    assert "-c constraints.txt" in command and command.endswith("python -m pytest -q")
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
    pins = dict(line.split("==", 1) for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["torch"] == "2.13.0" and command.startswith("pip install torch==2.13.0 ")
    assert {"pytest", "pytest-xdist", "numpy"} <= set(pins) and not any(k.startswith("nvidia-cu") for k in pins)
