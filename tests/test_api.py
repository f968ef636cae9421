"""The Python API (``planner.estimate``, ``planner.search``) returns what the CLI prints with
``--format json``, and refuses bad keywords with one PlannerError naming the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import planner
from planner.cli.main import main
from planner.errors import PlannerError

# (keywords, the same as flags)
ESTIMATES = [
    ({"params": "33B", "gpus": 128}, ["--params", "33B", "--gpus", "128"]),
    ({"params": "33B", "gpus": 128, "tp": 2, "pp": 2, "dp": 32, "micro_batch": 1, "vpp": 1, "zero": 3,
      "recompute": "selective", "sequence_parallel": True, "global_batch": 1024},
     ["--params", "33B", "--gpus", "128", "--tp", "2", "--pp", "2", "--dp", "32", "--micro-batch", "1", "--vpp", "1",
      "--zero", "3", "--recompute", "selective", "--sequence-parallel", "--global-batch", "1024"]),
    ({"preset": "llama2-7b", "gpus": 16, "gpu": "h100-80g", "stack": "megatron-core", "zero_stage": 1,
      "no_overlap": True, "tokens": "500B", "price_per_gpu_hour": 3.5, "sort": "cost", "top": 2},
     ["--preset", "llama2-7b", "--gpus", "16", "--gpu", "h100-80g", "--stack", "megatron-core", "--zero", "1",
      "--no-overlap", "--tokens", "500B", "--price-per-gpu-hour", "3.5", "--sort", "cost", "--top", "2"]),
    ({"preset": "mixtral-8x7b", "gpus": 64, "ep": 8, "mtbf_gpu_hours": 50000.0, "checkpoint_interval": 500,
      "memory_headroom": 0.05},
     ["--preset", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--mtbf-gpu-hours", "50000",
      "--checkpoint-interval", "500", "--memory-headroom", "0.05"]),
    # A pinned layout that does not fit: the JSON names the nearest fit (exit 3 on the CLI).
    ({"params": "70B", "gpus": 8, "tp": 8, "recompute": "none"},
     ["--params", "70B", "--gpus", "8", "--tp", "8", "--recompute", "none"]),
]


def cli_json(argv: list[str], capsys) -> dict:
    code = main([*argv, "--format", "json"])
    assert code in (0, 3)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("keywords", "flags"), ESTIMATES)
def test_estimate_is_the_cli_json(keywords, flags, capsys):
    assert planner.estimate(**keywords) == cli_json(["estimate", *flags], capsys)


def test_estimate_equals_a_cli_process():
    """The console's own process, not only its ``main``: same keys, same numbers."""
    keywords, flags = ESTIMATES[1]
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", *flags, "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert planner.estimate(**keywords) == json.loads(out)


@pytest.mark.parametrize(("keywords", "flags"), [
    ({"params": "13B", "gpus": 64, "top": 5}, ["--params", "13B", "--gpus", "64", "--top", "5"]),
    ({"preset": "llama2-7b", "gpus": 8, "all": True, "top": 7, "sort": "memory"},
     ["--preset", "llama2-7b", "--gpus", "8", "--all", "--top", "7", "--sort", "memory"]),
])
def test_search_is_the_cli_json(keywords, flags, capsys):
    api, cli = planner.search(**keywords), cli_json(["search", *flags], capsys)
    assert set(api) == set(cli) == {"evaluated", "feasible", "search_seconds", "results"}
    api.pop("search_seconds"), cli.pop("search_seconds")  # wall time of each run
    assert api == cli
    assert len(api["results"]) == min(keywords["top"], api["evaluated"] if keywords.get("all") else api["feasible"])


def test_both_spellings_of_a_flag_mean_one_thing():
    """A destination (zero_stage, overlap_grad_reduce) and its flag (zero, no_overlap) alike."""
    base = {"preset": "llama2-7b", "gpus": 16, "stack": "megatron-core"}
    a = planner.estimate(**base, zero_stage=1, overlap_grad_reduce=False)
    b = planner.estimate(**base, zero=1, no_overlap=True)
    assert a == b
    assert a["layout"]["zero_stage"] == 1
    assert a != planner.estimate(**base, zero=1)  # the overlap changes the step time


@pytest.mark.parametrize(("keywords", "field", "says"), [
    ({"params": "33B", "gpus": 128, "tensor_parallel": 2}, "tensor_parallel", "not a keyword of planner.estimate"),
    ({"params": "33B", "gpus": 128, "recompute": "some"}, "recompute", "one of none, selective, full, half"),
    ({"params": "33B", "gpus": "many"}, "gpus", "an integer"),
    ({"params": "33B", "gpus": 128.5}, "gpus", "an integer"),
    ({"params": "33B", "gpus": 0}, "gpus", "from 1"),
    ({"params": "33B", "gpus": 128, "tp": 3}, "tp", "must divide"),
    ({"params": "33B", "gpus": 128, "compile": "yes"}, "compile", "True or False"),
    ({"params": "33B", "gpus": 128, "format": "json"}, "format", "not a keyword"),
    ({"params": "a lot"}, "params", ""),
    ({"params": "33B", "gpus": 128, "pue": -1.0}, "pue", ""),
])
def test_bad_keywords_raise_one_planner_error(keywords, field, says):
    with pytest.raises(PlannerError) as err:
        planner.estimate(**keywords)
    assert err.value.field == field
    assert says in str(err.value)
    assert repr(keywords[field]) in str(err.value)


def test_of_two_bad_keywords_the_one_the_cli_names_is_named(capsys):
    """The API checks only the values its keywords set, in the order they came; when two are bad,
    the error names the one the CLI names (the first in the parser's order), whatever the order of
    the keywords, in a first call and in one that reuses a setup."""
    assert main(["estimate", "--preset", "llama3-8b", "--gpus", "8", "--pue", "5", "--gpus-per-node", "0"]) == 2
    cli = capsys.readouterr().err.strip().removeprefix("planner estimate: ")
    assert cli.startswith("gpus_per_node=0")
    for keywords in ({"preset": "llama3-8b", "gpus": 8, "pue": 5.0, "gpus_per_node": 0},
                     {"gpus_per_node": 0, "pue": 5.0, "preset": "llama3-8b", "gpus": 8}):
        with pytest.raises(PlannerError) as err:
            planner.estimate(**keywords)
        assert str(err.value) == cli
    planner.estimate(preset="llama3-8b", gpus=8, tp=2)  # a setup kept; the pins alone checked next
    with pytest.raises(PlannerError) as err:
        planner.estimate(preset="llama3-8b", gpus=8, tp=3, pp=0)
    assert err.value.field == "pp"  # out of its range, checked before tp's later rule (it must divide the heads)
    main(["estimate", "--preset", "llama3-8b", "--gpus", "8", "--tp", "3", "--pp", "0"])
    assert capsys.readouterr().err.strip().removeprefix("planner estimate: ") == str(err.value)


def test_inputs_kept_between_calls_change_nothing(capsys):
    """A sweep over layouts reuses the first call's inputs: each answer is still the CLI's, and a bad
    pin or a changed setting is still seen."""
    from planner.cli import api

    api.clear_cache()
    base = {"params": "33B", "gpus": 128, "global_batch": 1024}
    flags = ["--params", "33B", "--gpus", "128", "--global-batch", "1024"]
    for tp, pp in ((2, 2), (4, 2), (1, 4)):
        got = planner.estimate(**base, tp=tp, pp=pp)
        assert got == cli_json(["estimate", *flags, "--tp", str(tp), "--pp", str(pp)], capsys)
        assert (got["layout"]["tp"], got["layout"]["pp"]) == (tp, pp)
    assert len(api._SETUP) == 1
    with pytest.raises(PlannerError, match="tp=0"):
        planner.estimate(**base, tp=0)
    with pytest.raises(PlannerError, match="micro_batch=-1"):
        planner.estimate(**base, micro_batch=-1)
    other = planner.estimate(**{**base, "global_batch": 2048}, tp=2, pp=2)
    assert other["layout"]["global_batch"] == 2048


def test_a_sweep_over_models_keeps_the_job_and_one_over_jobs_the_model(capsys):
    """The inputs' two parts are kept apart: a new model with the same other flags reuses the kept
    job and hardware objects (and a new job the kept model), and every answer is still the CLI's;
    a bad model flag is still refused with the kept job."""
    from planner.cli import api

    api.clear_cache()
    base = {"params": "33B", "gpus": 128, "tp": 2, "pp": 2, "global_batch": 1024}
    flags = ["--params", "33B", "--gpus", "128", "--tp", "2", "--pp", "2", "--global-batch", "1024"]
    xs = []
    for vocab in (32000, 32128, 50304):
        got = planner.estimate(**base, vocab=vocab)
        assert got == cli_json(["estimate", *flags, "--vocab", str(vocab)], capsys)
        assert got["model"]["vocab"] == vocab
        xs.append(api._PREPARED[next(reversed(api._PREPARED))][1])
    assert len({id(x.model) for x in xs}) == 3
    assert xs[0].job is xs[1].job is xs[2].job and xs[0].hardware is xs[2].hardware
    fp8 = planner.estimate(**base, vocab=32128, gpu="h100-80g", precision="fp8")
    assert fp8 == cli_json(["estimate", *flags, "--vocab", "32128", "--gpu", "h100-80g", "--precision", "fp8"], capsys)
    x = api._PREPARED[next(reversed(api._PREPARED))][1]
    assert x.model is xs[1].model and x.job is not xs[1].job and x.job.precision == "fp8"
    with pytest.raises(PlannerError, match="heads=5: must divide hidden=6656"):  # the model's own check
        planner.estimate(**base, vocab=32128, heads=5)


def test_of_two_bad_values_the_same_is_named_whatever_was_kept(capsys):
    """LoRA targets the model lacks and an unknown stack key: the LoRA targets are named first (as
    before the inputs were kept in parts), by the CLI, by the API with nothing kept, and with the
    model kept from an earlier call."""
    from planner.cli import api

    bad = {"preset": "gpt3-125m", "gpus": 8, "mode": "lora", "lora_targets": "gate_proj", "stack_set": "nokey=1"}
    main(["estimate", "--preset", "gpt3-125m", "--gpus", "8", "--mode", "lora", "--lora-targets", "gate_proj",
          "--set", "nokey=1"])
    cli = capsys.readouterr().err.strip().removeprefix("planner estimate: ")
    assert cli.startswith("lora_targets='gate_proj'")
    api.clear_cache()
    with pytest.raises(PlannerError) as err:
        planner.estimate(**bad)
    assert str(err.value) == cli
    planner.estimate(preset="gpt3-125m", gpus=8)  # the model kept (a setup whose stack is bad is never kept)
    assert ("model", ("preset", "gpt3-125m")) in api._PARTS
    with pytest.raises(PlannerError) as err:
        planner.estimate(**bad)
    assert str(err.value) == cli


def test_a_repeated_call_is_answered_anew_and_checked_by_type():
    """The same flags again skip their checks (the prepared inputs are kept), not the plan: each
    answer is a new dict equal to the first, and a value equal to a kept one but of another type
    (True == 1 in Python) is still refused as the flag refuses it."""
    from planner.cli import api

    api.clear_cache()
    flags = {"params": "7B", "gpus": 8, "tp": 1, "pp": 1, "micro_batch": 1}
    first, again = planner.estimate(**flags), planner.estimate(**flags)
    assert again == first and again is not first and again["layout"] is not first["layout"]
    with pytest.raises(PlannerError, match="tp=True"):
        planner.estimate(**{**flags, "tp": True})
    with pytest.raises(PlannerError, match="micro_batch"):
        planner.estimate(**{**flags, "micro_batch": 1.5})


def test_a_misspelt_keyword_gets_suggestions():
    with pytest.raises(PlannerError, match="did you mean micro_batch"):
        planner.search(params="7B", micro_batches=2)


def test_import_planner_stays_light():
    code = ("import sys, planner; planner.PlannerError; "
            "heavy = [m for m in ('numpy', 'torch', 'streamlit', 'matplotlib', 'argparse') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_api_pages_examples_run():
    """Every ```python block of docs/api.md runs, and the values its comments show are printed."""
    import contextlib
    import io
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 3
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, "docs/api.md", "exec"), {})
        printed = out.getvalue()
        for shown in re.findall(r"# (.+)$", block, re.MULTILINE):
            shown = shown.split(" ...")[0]
            assert shown in printed, f"docs/api.md shows {shown!r}; printed:\n{printed}"
