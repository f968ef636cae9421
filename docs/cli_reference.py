"""Write docs/cli.md, the command-line reference, from the parser itself (planner/cli/main.py).

    python docs/cli_reference.py          # rewrite docs/cli.md
    python docs/cli_reference.py --check  # exit 1 when docs/cli.md differs from what it would write

Each subcommand's flags come from its argparse actions (not from ``--help``'s text, whose layout
changes with the terminal and the Python version); a group of flags shared with an earlier
subcommand (the model, hardware, job, operations and layout inputs of estimate, search, compare,
recommend and export) is written once. The Limits tables are planner.schema.limits_markdown's and
planner.hardware.profile_limits_markdown's. tests/test_docs_commands.py fails when the page is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "cli.md"

INTRO = """# Command-line reference

Generated from the parser by `python docs/cli_reference.py` (tests/test_docs_commands.py fails
when this page is stale); `planner SUBCOMMAND --help` prints the same. Exit codes: 0 ok; 2 bad
input (one line naming the field, the value and what is allowed); 3 the layout asked for does not
fit (the report then names the nearest layouts that do), or, for `recommend`, no option meets the
ask. `--format json` and `--format csv` give machine-readable output where a subcommand has them.
"""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(action: argparse.Action) -> str:
    if action.choices and not isinstance(action.choices, dict):
        return "|".join(map(str, action.choices))
    if action.nargs == 0:
        return ""
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return f"{metavar} ..." if action.nargs in ("+", "*") else str(metavar)


def _row(action: argparse.Action) -> str:
    formatter = argparse.HelpFormatter("planner")
    flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
    help_text = formatter._expand_help(action) if action.help else ""
    return f"| {flags} | {_cell(_value(action))} | {_cell(help_text)} |"


def _visible(group) -> list[argparse.Action]:
    return [a for a in group._group_actions
            if a.help != argparse.SUPPRESS and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def render() -> str:
    from planner.cli.main import build_parser
    from planner.hardware import profile_limits_markdown
    from planner.core.limits import FLAGS
    from planner.schema import limits_markdown

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = [INTRO, "| subcommand | what it does |", "| --- | --- |"]
    out += [f"| [`planner {name}`](#planner-{name}) | {_cell(helps.get(name, ''))} |" for name in sub.choices]
    written: dict[tuple, str] = {}  # a shared group's (title, flags) -> the subcommand that shows it
    for name, p in sub.choices.items():
        out += ["", f"## planner {name}", ""]
        if helps.get(name):
            out += [helps[name][0].upper() + helps[name][1:] + ".", ""]
        if name == "run":
            out += ["The reference trainer's launcher: its flags are the trainer's config keys, documented in",
                    "[reference_trainer/README.md](../reference_trainer/README.md) (`planner run --help` lists them)."]
            continue
        shared = []
        for group in p._action_groups:
            actions = _visible(group)
            if not actions:
                continue
            key = (group.title, tuple(a.dest for a in actions))
            if group.title not in ("options", "positional arguments") and key in written:
                shared.append(group.title.split(" (")[0])
                continue
            written.setdefault(key, name)
            title = {"options": "", "positional arguments": "arguments"}.get(group.title, group.title)
            if title:
                out += [f"**{title}**", ""]
            out += ["| flag | value | what it does |", "| --- | --- | --- |", *map(_row, actions), ""]
        if shared:
            first = written[next(k for k in written if k[0].split(" (")[0] == shared[0])]
            out += [f"Also the {', '.join(shared)} flags, as for [`planner {first}`](#planner-{first}).", ""]
    out += ["", "## Limits", "",
            "Every number that enters must be finite and inside its range; the error names the field, the",
            "value and the range. Flags, by the field name errors use:", "", limits_markdown(FLAGS), "",
            "Hardware profile files (UTF-8 TOML; an unknown key is named with the allowed ones):", "",
            profile_limits_markdown(), ""]
    return "\n".join(line.rstrip() for line in "\n".join(out).splitlines()).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python docs/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
