"""One evaluation path: `planner compare`, `planner recommend`, `planner export` and the explorer
give exactly `planner estimate`'s figures (step time, memory, days, layout) for the same inputs
and pins, on every GPU, precision and stack drawn (issue 37 item 4).

The V100 case is the regression: compare planned it with FlashAttention (196 days, 24.6 GiB)
while estimate turned FlashAttention off on a pre-Ampere GPU (201 days); pinning compare's layout
in estimate gave 37.9 of 32 GiB. Both now fit the job to the GPU in one function
(planner.core.options.fit_job_to_gpu).
"""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli.main import main
from planner.core.layout import PIN_DIMS
from planner.errors import PlannerError

GPUS = ("v100-32g", "a100-80g", "h100-80g", "a6000", "mi300x")
STACKS = ("fsdp2", "megatron-core", "deepspeed-zero", "reference", "megatron-2021")
FIGURES = ("days", "step_s", "memory_bytes", "capacity_bytes", "precision")


def cli_json(capsys, *argv) -> dict | None:
    """The JSON a subcommand prints, or None when it refuses (exit 2) or nothing fits (exit 3)."""
    code = main([*argv, "--format", "json"])
    out, _ = capsys.readouterr()
    return json.loads(out) if code == 0 else None


def figures_of_estimate(j: dict) -> dict:
    """The decision figures from `planner estimate --format json` (the contract)."""
    return {"days": j["train"]["days"], "step_s": j["time"]["step_s"], "memory_bytes": j["memory"]["total_bytes"],
            "capacity_bytes": j["memory"]["capacity_bytes"], "precision": j["layout"]["precision"],
            "layout": {d.name: j["layout"][d.name] for d in PIN_DIMS}}


def figures_of_row(r: dict) -> dict:
    """The same figures from a compare / recommend row (planner.decisions.decide.summary)."""
    return {**{k: r[k] for k in FIGURES}, "layout": {d.name: r["layout"][d.name] for d in PIN_DIMS}}


def figures_of(e) -> dict:
    """The same figures from an Estimate (the explorer's and export's objects)."""
    return figures_of_estimate(e.to_json())


def pin_flags(layout: dict) -> list[str]:
    """Every layout dimension as its `planner estimate` flag, so the layout is the one evaluated."""
    out = []
    for d in PIN_DIMS:
        flags, kwargs = d.argparse_spec()
        value = layout[d.name]
        if isinstance(value, bool):
            out += [flags[0]] if value else [next(f for f in flags if f.startswith("--no-"))] if len(flags) > 1 else []
            continue
        out += [flags[0], str(value)]
    return out


case = st.fixed_dictionaries({
    "preset": st.sampled_from(("llama-7b", "gpt3-1.3b", "llama2-13b")),
    "gpu": st.sampled_from(GPUS),
    "gpus": st.sampled_from((8, 32)),
    "precision": st.sampled_from((None, "fp16", "bf16")),
    "stack": st.sampled_from(STACKS),
})


def argv_of(c: dict, count: bool = True) -> list[str]:
    argv = ["--preset", c["preset"], "--gpu", c["gpu"], "--stack", c["stack"]]
    argv += ["--gpus", str(c["gpus"])] if count else []
    return argv + (["--precision", c["precision"]] if c["precision"] else [])


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(c=case)
def test_compare_recommend_and_the_pinned_estimate_are_the_estimate(capsys, c):
    est = cli_json(capsys, "estimate", *argv_of(c))
    cmp = cli_json(capsys, "compare", *argv_of(c))
    if est is None or not est["memory"]["fits"]:  # refused (bf16 asked on a V100) or nothing fits: both say so
        assert cmp is None or not cmp["rows"][0]["fits"]
        return
    want = figures_of_estimate(est)
    assert figures_of_row(cmp["rows"][0]) == want
    # The layout compare names, pinned in estimate, is the same plan (the V100 row: 37.9 of 32 GiB before).
    pinned = cli_json(capsys, "estimate", *argv_of(c), *pin_flags(est["layout"]))
    assert figures_of_estimate(pinned) == want
    # recommend at one count (the ladder capped there) picks estimate's plan of that count.
    rec = cli_json(capsys, "recommend", *argv_of(c, count=False), "--deadline", "1000w", "--max-gpus", str(c["gpus"]))
    pick = rec["answers"][0]["pick"]
    if pick["gpus"] == c["gpus"]:
        assert figures_of_row(pick) == want
    else:  # fewer GPUs met the deadline: that count's estimate
        fewer = cli_json(capsys, "estimate", *argv_of({**c, "gpus": pick["gpus"]}))
        assert figures_of_row(pick) == figures_of_estimate(fewer)


def values_of(c: dict, **more) -> dict:
    """The mapping of declared names the CLI's parser makes (and the explorer's state gives)."""
    return {"preset": c["preset"], "gpu": c["gpu"], "gpus": c["gpus"], "stack": c["stack"],
            "precision": c["precision"], **more}


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(c=case)
def test_the_explorer_and_export_are_the_estimate(capsys, c):
    from planner.app import explore
    from planner.export.plan import ExportRefused, export_plan
    from planner.export.render import ExportOptions

    est = cli_json(capsys, "estimate", *argv_of(c))
    view = explore.compute(values_of(c))
    if est is None:
        assert isinstance(view, explore.Problem)
        return
    assert view.to_json() == est  # the page's figures are the CLI's JSON, key for key
    want = figures_of_estimate(est)
    assert figures_of(view.best) == want
    if not est["memory"]["fits"]:
        return
    # The Hardware tab's row for this GPU: the free search of the same job (its fastest layout).
    [row] = explore.compare_hardware(values_of(c), c["gpus"], [c["gpu"]])
    assert (row.days, row.memory_bytes, row.precision) == (want["days"], want["memory_bytes"], want["precision"])
    # Export with every dimension pinned to estimate's layout, on the same stack: the same estimate.
    pins = {d.name: est["layout"][d.name] for d in PIN_DIMS}
    try:
        out = export_plan(values_of(c, **pins), "torchrun", ExportOptions(), force=True)
    except (ExportRefused, PlannerError):
        return  # a layout torchrun cannot express (its own tests cover the refusals)
    assert figures_of(out.chosen) == want


def test_the_v100_row_has_one_answer(capsys):
    """docs/decide.md's row: compare and estimate agree on a V100 (fp16, standard attention)."""
    argv = ["--params", "33B", "--gpus", "128", "--gpu", "v100-32g"]
    est = cli_json(capsys, "estimate", *argv)
    cmp = cli_json(capsys, "compare", *argv)
    assert est["layout"]["attention"] == "standard" and est["layout"]["precision"] == "fp16"
    assert figures_of_row(cmp["rows"][0]) == figures_of_estimate(est)
    assert cmp["notes"] and "standard attention" in cmp["notes"][0]


def test_a_precision_typed_is_kept_everywhere(capsys):
    """`--precision bf16` on a V100 is refused by estimate and compare alike (one line, exit 2);
    left out, both fall back to fp16."""
    for cmd in ("estimate", "compare"):
        assert main([cmd, "--preset", "llama-7b", "--gpus", "8", "--gpu", "v100-32g", "--precision", "bf16"]) == 2
        err = capsys.readouterr().err
        assert "precision='bf16'" in err and len(err.strip().splitlines()) == 1


def test_the_explorer_leaves_a_gpu_dependent_default_to_the_gpu():
    from planner.app.state import defaults, mapping_from_state

    m = mapping_from_state({**defaults(), "gpu": "v100-32g"})
    assert "precision" not in m and "attention" not in m  # at their defaults: the GPU's (fp16, standard)
    m = mapping_from_state({**defaults(), "gpu": "v100-32g", "precision": "fp32"})
    assert m["precision"] == "fp32"

