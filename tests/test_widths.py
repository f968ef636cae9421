"""Every command's default output fits 100 columns (issue 37: tables 160-350 characters wide
wrapped on a terminal); ``--wide`` shows every column. planner.tables' two rules, by hand."""

from __future__ import annotations

import contextlib
import io

import pytest

from planner.cli.main import main
from planner.tables import fit_table, wrap_lines

COMMANDS = [
    ("presets",), ("profiles",), ("stacks",),
    ("search", "--params", "33B", "--gpus", "128"),
    ("estimate", "--params", "33B", "--gpus", "128"),
    ("estimate", "--preset", "deepseek-v3", "--gpu", "h800", "--gpus", "2048"),
    ("estimate", "--preset", "gpt3-175b", "--gpus", "8", "--tp", "1", "--pp", "1"),  # does not fit: nearest fits
    ("estimate", "--preset", "llama2-7b", "--mode", "full-finetune", "--gpus", "1", "--gpu", "a6000"),
    ("compare", "--params", "33B", "--gpus", "128"),
    ("recommend", "--params", "33B", "--tokens", "1T", "--deadline", "60d"),
    ("validate", "benchmarks/runs/cpu-2core"),
    ("validate", "--published", "torchtitan"),
]


def run(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c[:3]) for c in COMMANDS])
def test_default_output_fits_100_columns(argv, monkeypatch):
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    code, text = run(*argv)
    assert code in (0, 3), text
    wide = [line for line in text.splitlines() if len(line) > 100]
    assert not wide, f"{len(wide)} lines over 100 columns, e.g. {wide[0]!r}"


def test_wide_shows_every_column():
    _, narrow = run("stacks")
    _, wide = run("stacks", "--wide")
    header = wide.splitlines()[0].split()
    assert {"ZeRO-3", "interleaved", "description"} <= set(header)
    assert "interleaved" not in narrow.splitlines()[0] and max(map(len, wide.splitlines())) > 100


def test_a_table_drops_columns_in_the_order_given_until_it_fits():
    rows = [("name", "a", "b", "c"), ("x" * 10, "1" * 10, "2" * 10, "3" * 10)]
    # 4 columns of 10 + 3 separators of 2 = 46 wide; 34 without one column; 22 without two.
    assert max(map(len, fit_table(rows, width=46).splitlines())) == 46
    text = fit_table(rows, drop=("b", "a", "c"), width=40)
    assert text.splitlines()[0].split() == ["name", "a", "c"]  # b went first, and that was enough
    text = fit_table(rows, drop=("b", "a"), width=30)
    assert text.splitlines()[0].split() == ["name", "c"]
    assert fit_table(rows, drop=("b",), width=None).splitlines()[0].split() == ["name", "a", "b", "c"]


def test_a_text_column_wraps_beside_its_row_or_goes_below_it():
    rows = [("name", "description"), ("fsdp2", "torchtitan FSDP2, eager kernels, FlashAttention-2")]
    beside = fit_table(rows, wrap="description", right=(), width=40).splitlines()
    # name column 5 wide + 2: 33 columns left for the text (32 of them fit), wrapped at a space.
    assert beside[1] == "fsdp2  torchtitan FSDP2, eager kernels," and beside[2] == "       FlashAttention-2"
    below = fit_table([("name", "description"), ("x" * 20, "a b c d e f g h i j k l")], wrap="description",
                      right=(), width=40).splitlines()
    assert below == ["name", "x" * 20, "    a b c d e f g h i j k l"]  # 18 columns left: under 30, so below


def test_a_long_line_wraps_under_its_label():
    text = wrap_lines("step     " + "word " * 30, 40)
    lines = text.splitlines()
    assert all(len(x) <= 40 for x in lines) and lines[0].startswith("step     word")
    assert all(x.startswith(" " * 9 + "word") for x in lines[1:])
    assert wrap_lines("short", 40) == "short"
    assert wrap_lines("  - a warning " + "x " * 30, 30).splitlines()[1].startswith("    x")


def test_a_line_of_fields_breaks_after_a_bar():
    # "layout   " is the label; each "|"-separated field is kept whole and a line ends on its "|".
    assert wrap_lines("layout   aa bb | cc dd | ee ff", 20).splitlines() == [
        "layout   aa bb |", "         cc dd |", "         ee ff"]
