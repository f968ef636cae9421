"""The estimate's "checked" line: which measured runs check its stack, and how well (planner/evidence.py)."""

import json

from planner.cli.main import main
from planner.evidence import EVIDENCE_FILE, evidence_for, family, records, summarise

RUNS = (  # made-up records: the summary is worked out by hand below
    {"source": "published A", "run": "a1", "stack": "fsdp2-2024", "gpu": "h100-80g", "time_error": 0.10,
     "memory_error": -0.05, "fitted": True},
    {"source": "published A", "run": "a2", "stack": "fsdp2-2025", "gpu": "h200", "time_error": -0.20,
     "memory_error": None, "fitted": False},
    {"source": "published B", "run": "b1", "stack": "megatron-2021", "gpu": "a100-80g", "time_error": 0.02,
     "memory_error": None, "fitted": False},
)


def test_a_stack_is_checked_by_the_runs_of_its_family():
    e = summarise("fsdp2", "h100-80g", RUNS)
    assert (e.runs, e.on_gpu, e.gpus, e.sources) == (2, 1, ("h100-80g", "h200"), ("published A",))
    assert abs(e.time_mean_abs_error - 0.15) < 1e-12 and e.time_worst_abs_error == 0.20
    assert (e.memory_runs, e.memory_mean_abs_error, e.memory_worst_abs_error) == (1, 0.05, 0.05)
    assert e.line() == ("2 published A runs (h100-80g, h200; 1 on h100-80g (10.0% mean)): time 15.0% mean error, worst 20% "
                        "(1 of 2 in sample); memory (1 run) 5.0%, worst 5%, predicted below measured; docs/validation.md")
    assert summarise("megatron-2021", "a100-80g", RUNS).line() == (
        "1 published B run (all on a100-80g): time 2.0% mean error, worst 2% (out of sample); docs/validation.md")
    assert "none on a100-80g" in summarise("fsdp2-2025", "a100-80g", RUNS).line()


def test_a_stack_without_runs_or_a_users_file_claims_nothing():
    assert summarise("megatron-core", "h100-80g", RUNS).line().startswith("no measured run checks megatron-core")
    own = summarise("fsdp2", "h100-80g", RUNS, own_file=True)
    assert own.runs == 0 and own.line().startswith("no measured run checks your stack file")
    assert family("megatron-core") == ("megatron-core",) and "fsdp2-2024" in family("fsdp2")


def test_the_committed_records_are_the_published_rows():
    """One record per compared run: Megatron-LM 2021 Table 1 (10) and Table 2 (6 PTD, 6 ZeRO-3), every
    row of torchtitan_performance.csv (31), the 7 held-out CPU runs; each error finite and signed."""
    by = {}
    for r in records():
        by[r["source"]] = by.get(r["source"], 0) + 1
        assert abs(r["time_error"]) < 1 and (r["memory_error"] is None or abs(r["memory_error"]) < 1), r
    assert by == {"published Megatron-LM 2021": 16, "published DeepSpeed ZeRO-3 (Megatron-LM 2021)": 6,
                  "published torchtitan": 31, "reference-trainer CPU (held-out)": 7}
    # In sample: the 10 Table 1 runs (the A100's factors) and torchtitan's rows (the 500 W clock, the
    # per-block overhead, cp_overlap); Table 2 and the held-out CPU runs are out of sample.
    fitted = {}
    for r in records():
        fitted[r["source"]] = fitted.get(r["source"], 0) + (r["fitted"] is True)
    assert fitted == {"published Megatron-LM 2021": 10, "published DeepSpeed ZeRO-3 (Megatron-LM 2021)": 0,
                      "published torchtitan": 31, "reference-trainer CPU (held-out)": 0}
    assert json.loads(EVIDENCE_FILE.read_text())["generated_by"] == "python docs/validation.py"


def test_the_estimate_names_what_checks_it(capsys):
    assert main(["estimate", "--params", "33B", "--gpus", "128", "--wide"]) == 0  # each clause on one line
    out = capsys.readouterr().out.splitlines()
    at = next(k for k, x in enumerate(out) if x.startswith("checked  "))
    line = out[at]
    assert line.startswith("checked  31 published torchtitan runs (") and "on a100-80g" in line
    # One clause per line, the rest indented under the first, the page named last: the same clauses
    # as the one-line form (compare's header, the explorer, the JSON summary).
    shown = [line[9:]]
    for x in out[at + 1:]:
        if not x.startswith(" " * 9) or x.startswith(" " * 10):
            break
        shown.append(x[9:])
    assert shown[1].startswith("memory (") and shown[-1].endswith("; docs/validation.md")
    assert main(["estimate", "--params", "33B", "--gpus", "128", "--format", "json"]) == 0
    assert "; ".join(shown) == json.loads(capsys.readouterr().out)["stack"]["checked_against"]["summary"]
    assert main(["estimate", "--params", "33B", "--gpus", "128", "--stack", "megatron-core", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)["stack"]["checked_against"]
    assert got["runs"] == 0 and got["time_mean_abs_error"] is None
    assert got["summary"].startswith("no measured run checks megatron-core")


def test_several_gpus_are_counted_each(capsys):
    """compare names the stack and, for each GPU compared, how many runs checked it: the A100 rows of
    torchtitan_performance.csv, counted here from the file."""
    import csv
    from pathlib import Path

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "torchtitan_performance.csv"
    a100 = sum(1 for row in csv.DictReader(data.read_text().splitlines()) if row["gpu"] == "a100-80g")
    assert main(["compare", "--params", "13B", "--gpus", "64", "--gpu", "a100-80g,h100-80g", "--wide"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(x.startswith("stack  fsdp2: ") for x in out)
    assert any(x.startswith("       checked against 31 published torchtitan runs (") and
               f"; {a100} on a100-80g (" in x and "% mean), none on h100-80g)" in x for x in out), out[:8]
    e = summarise("fsdp2", "a100-80g", RUNS)
    assert "(h100-80g, h200; 1 on h100-80g (10.0% mean), 1 on h200 (20.0% mean), none on the other 3)" in e.line(
        ("h100-80g", "h200", "a100-80g", "b200", "mi300x"))


def test_missing_or_broken_records_are_said_not_claimed(tmp_path, monkeypatch):
    import planner.evidence as ev

    for text in (None, "{not json", '{"runs": [{"source": "x", "stack": "fsdp2", "gpu": "h200", "time_error": "big"}]}'):
        path = tmp_path / "evidence.json"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(ev, "EVIDENCE_FILE", path)
        ev.records.cache_clear()
        ev.evidence_for.cache_clear()
        got = ev.evidence_for("fsdp2", "h200")
        if text is None or text.startswith("{not"):
            assert got.line() == "the records of measured runs (evidence.json) are missing from this install"
        else:  # a record whose error is not a number is left out
            assert got.runs == 0 and got.line().startswith("no measured run checks fsdp2")
    ev.records.cache_clear()
    ev.evidence_for.cache_clear()


def test_a_calibrated_profile_says_its_own_fit(capsys, tmp_path):
    """A profile `planner calibrate` wrote carries its fit in [provenance]: the estimate prints how
    many runs it was fitted to and its errors, read here from the file itself."""
    import tomllib
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "hardware_profiles" / "calibrated" / "cpu-2core.toml"
    prov = tomllib.loads(path.read_text())["provenance"]
    argv = ["estimate", "--params", "1B", "--gpus", "2", "--gpu", str(path), "--stack", "reference"]
    assert main([*argv]) == 0
    out = capsys.readouterr().out
    assert (f"         profile cpu-2core calibrated on {len(prov['runs'])} runs: {prov['fit_mean_abs_error']:.1%} "
            f"mean error in sample, {prov['loo_mean_abs_error']:.1%} leave-one-out") in out.splitlines()
    assert main([*argv, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)["stack"]["checked_against"]["profile_calibration"]
    assert got == {"runs": len(prov["runs"]), "fit_mean_abs_error": prov["fit_mean_abs_error"],
                   "loo_mean_abs_error": prov["loo_mean_abs_error"]}
    # A datasheet profile has none; a provenance with a non-number error keeps the rest.
    assert main(["estimate", "--params", "1B", "--gpus", "2", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"]["checked_against"]["profile_calibration"] is None
    odd = tmp_path / "odd.toml"
    odd.write_text(path.read_text().replace(f"fit_mean_abs_error = {prov['fit_mean_abs_error']!r}",
                                            'fit_mean_abs_error = "small"'))
    from planner.hardware import load_profile_file

    assert load_profile_file(odd).calibration == (len(prov["runs"]), None, prov["loo_mean_abs_error"])


def test_stacks_lists_what_checks_each(capsys):
    assert main(["stacks", "--format", "json"]) == 0
    got = {name: s["checked_against"] for name, s in json.loads(capsys.readouterr().out).items()}
    assert got["megatron-2021"]["runs"] == 16 and got["deepspeed-zero"]["runs"] == 6
    assert got["megatron-core"]["runs"] == 0 and got["megatron-core"]["time_mean_abs_error"] is None
    assert got["fsdp2"]["runs"] == got["fsdp2-2024"]["runs"] == 31  # one family
    assert main(["stacks", "--wide"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "checked (runs, mean time error)" in rows[0]
    assert any(r.startswith("megatron-core ") and "  none  " in r for r in rows)


def test_the_report_says_what_torch_would_log(capsys):
    """max_memory_reserved is the total less what lies outside torch's allocator (the profile's
    CUDA context, and NCCL's buffers when there is more than one GPU); max_memory_allocated is below
    it; a torchtitan row's reserved figure is the one its comparison uses."""
    from planner.hardware import get_profile

    eff = get_profile("a100-80g").efficiency
    for params, gpus, outside in (("7B", 128, eff.cuda_context_bytes + eff.comm_buffer_bytes),
                                  ("1B", 1, eff.cuda_context_bytes)):
        assert main(["estimate", "--params", params, "--gpus", str(gpus), "--format", "json"]) == 0
        m = json.loads(capsys.readouterr().out)["memory"]
        assert abs(m["torch_reserved_bytes"] - (m["total_bytes"] - outside)) < 1.0
        assert 0 < m["torch_allocated_bytes"] < m["torch_reserved_bytes"]
    assert main(["estimate", "--params", "7B", "--gpus", "128"]) == 0
    assert any(x.startswith("         torch would report max_memory_reserved ") for x in capsys.readouterr().out.splitlines())


def test_the_runs_like_the_plan_are_summarised_on_their_own(capsys):
    runs = (
        {"source": "A", "run": "1", "stack": "fsdp2", "gpu": "h100-80g", "time_error": 0.30, "cp": 4, "pp": 1},
        {"source": "A", "run": "2", "stack": "fsdp2", "gpu": "h100-80g", "time_error": -0.10, "cp": 2, "pp": 8},
        {"source": "A", "run": "3", "stack": "fsdp2", "gpu": "h100-80g", "time_error": 0.02, "cp": 1, "pp": 8},
    )
    cp = summarise("fsdp2", "h100-80g", runs, like=("cp",))
    assert (cp.like_runs, cp.like_worst_abs_error) == (2, 0.30) and abs(cp.like_mean_abs_error - 0.20) < 1e-12
    both = summarise("fsdp2", "h100-80g", runs, like=("cp", "pp"))
    assert both.like_runs == 1 and both.line().endswith(
        "like this plan (context parallel + pipeline parallel): 1 run, time 10.0% mean error, worst 10%; "
        "docs/validation.md")
    assert summarise("fsdp2", "h100-80g", runs, like=("moe",)).line().endswith(
        "like this plan (mixture-of-experts): none; docs/validation.md")
    assert "like this plan" not in summarise("fsdp2", "h100-80g", runs).line()
    # From the CLI: an MoE plan on fsdp2 is told no published run of its stack was an MoE.
    assert main(["estimate", "--preset", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-80g", "--format", "json"]) == 0
    like = json.loads(capsys.readouterr().out)["stack"]["checked_against"]["like_this_plan"]
    assert like == {"features": ["moe"], "runs": 0, "time_mean_abs_error": None, "time_worst_abs_error": None,
                    "worst_speed_error": None, "memory_runs": 0, "memory_mean_abs_error": None,
                    "memory_worst_abs_error": None, "worst_memory_error": None}


def test_the_worst_run_says_which_way_it_was_off():
    """A speed error > 0 is a prediction faster than the run (tokens/s above, or step time below,
    the measured); the worst run by |time error| gives the line its direction, memory likewise."""
    runs = (
        {"source": "A", "run": "1", "stack": "fsdp2", "gpu": "h100-80g", "time_error": 0.25, "speed_error": 0.25,
         "memory_error": 0.04, "cp": 4},
        {"source": "A", "run": "2", "stack": "fsdp2", "gpu": "h100-80g", "time_error": 0.10, "speed_error": -0.0909,
         "memory_error": -0.12, "cp": 1},
        {"source": "A", "run": "3", "stack": "fsdp2", "gpu": "h100-80g", "time_error": -0.02, "speed_error": 0.0204,
         "cp": 2},
    )
    e = summarise("fsdp2", "h100-80g", runs, like=("cp",))
    assert (e.worst_speed_error, e.worst_memory_error, e.like_worst_speed_error) == (0.25, -0.12, 0.25)
    # Like this plan (cp > 1): runs 1 and 3; only run 1 has a memory error (+4%: above the measured).
    assert ("time 12.3% mean error, worst 25%, predicted faster than measured (out of sample); "
            "memory (2 runs) 8.0%, worst 12%, predicted below measured; like this plan (context parallel): 2 runs, "
            "time 13.5% mean error, worst 25%, predicted faster than measured, memory (1 run) 4.0%, worst 4%, "
            "predicted above measured; docs/validation.md") in e.line()
    assert (e.like_memory_runs, e.like_worst_memory_error) == (1, 0.04)
    slow = summarise("fsdp2", "h100-80g", runs[1:], like=("cp",))  # run 2 is the worst: a step-time row, predicted slower
    assert "worst 10%, predicted slower than measured" in slow.line()
    assert "like this plan (context parallel): 1 run, time 2.0% mean error, worst 2%, predicted faster" in slow.line()
    assert slow.line().endswith("predicted faster than measured; docs/validation.md")  # run 3: no memory measured


def test_the_runs_like_the_plan_give_their_own_memory_error():
    """torchtitan's six pipelined rows (Tables 5 and 6) are the runs like a pipelined plan; their
    memory errors in docs/validation.md: -14.5, +6.5, -6.3, -4.0, -4.8, -12.3% (mean |e| 8.1%,
    worst 14.5%, below). The line gives them beside the family's (20 runs, worst 14.5% too)."""
    e = evidence_for("fsdp2", "h100-96g-hbm2e", like=("pp",))
    assert e.like_memory_runs == 6
    assert abs(e.like_memory_mean_abs_error - 0.081) < 0.002
    assert abs(e.like_memory_worst_abs_error - 0.145) < 0.002 and e.like_worst_memory_error < 0
    assert "like this plan (pipeline parallel): 6 runs, time " in e.line()
    assert ", memory (6 runs) 8.1%, worst 15%, predicted below measured; docs/validation.md" in e.line()


def test_the_committed_speed_errors_have_one_sign_for_both_kinds_of_row():
    """Tokens/s rows (torchtitan): the speed error is the time error. Step-time rows: speed =
    1 / (1 + step error) - 1, so (1 + speed)(1 + step error) = 1 and the two have opposite signs."""
    for r in records():
        s, t = r["speed_error"], r["time_error"]
        if r["source"] == "published torchtitan":
            assert s == t, r
        else:
            assert abs((1 + s) * (1 + t) - 1) < 2e-5 and (s * t < 0 or s == t == 0), r


def test_a_plan_fuller_than_its_like_runs_were_underpredicted_is_warned():
    """A plan that leaves less free than the runs like it were predicted below their measured
    memory (at worst) is told so, with the headroom that would cover them (rounded up to the
    percent): 84 of 96 GiB leaves 12.5% free, under a 14.5% under-prediction."""
    from planner.core.checks import warnings_for

    gib = 2**30
    common = {"comm_fraction": 0.0, "bubble_fraction": 0.0, "pp": 8, "vpp": 1, "grad_accum": 64, "tp": 8,
              "gpus_per_node": 8}
    like = (0.145, "pipeline parallel: 6 published torchtitan runs")
    w = warnings_for(total_bytes=84 * gib, capacity_bytes=96 * gib, gpu_bytes=96 * gib, measured_under=like, **common)
    assert w == [("memory at 88% of the GPU's, and the measured runs like this plan (pipeline parallel: 6 published "
                  "torchtitan runs) were predicted up to 14.5% below the memory they used; fix: --memory-headroom 0.15 (plan with that "
                  "share free), recompute, a smaller micro-batch or a higher ZeRO stage")]
    # 80 GiB leaves 16.7% free: nothing to say. Nor under --memory-headroom 0.15 (capacity 81.6 GiB).
    assert warnings_for(total_bytes=80 * gib, capacity_bytes=96 * gib, gpu_bytes=96 * gib, measured_under=like,
                        **common) == []
    kept = warnings_for(total_bytes=81 * gib, capacity_bytes=0.85 * 96 * gib, gpu_bytes=96 * gib,
                        measured_under=like, **common)  # 84% of the GPU: the headroom covers the runs
    assert not any("like this plan" in x for x in kept)
    # Runs predicted within 5% leave the 5% rule alone.
    near = warnings_for(total_bytes=92 * gib, capacity_bytes=96 * gib, gpu_bytes=96 * gib,
                        measured_under=(0.04, "x"), **common)
    assert len(near) == 1 and near[0].startswith("memory at 96% of capacity (within 5%)")
    assert "retry (each retry synchronises the GPU" in near[0]  # the slowdown near the ceiling, not only OOM


def test_the_estimate_warns_from_the_runs_like_its_plan():
    """70B on 64 H100s with pp 4 and tp 2 pinned, micro-batch 1: the plan runs context parallel
    too at 78.2 of 80 GiB. The runs with both (torchtitan's 405B at cp 2, 4, 8 with PP 8) were
    predicted 4.0, 4.8 and 12.3% below the memory they used (docs/validation.md): the plan leaves 2%
    free, so the warning names them and --memory-headroom 0.13. A plan with none of those features
    is not told."""
    from planner.core.layout import Job
    from planner.core.plan import plan
    from planner.core.presets import get_preset
    from planner.core.search import Pins
    from planner.hardware import get_profile

    h100 = get_profile("h100-80g")
    best = plan(get_preset("llama3-70b"), h100, Job(), 64, Pins(pp=4, tp=2, micro_batch=1, recompute="full"), top=0).best
    assert best.layout.cp > 1 and best.memory.total_bytes > 0.877 * h100.gpu.memory_bytes
    said = [w for w in best.warnings if "like this plan" in w]
    assert said and "(context parallel + pipeline parallel: 3 published torchtitan runs)" in said[0]
    assert "were predicted up to 12.3% below the memory they used; fix: --memory-headroom 0.13" in said[0]
    flat = plan(get_preset("llama3-8b"), h100, Job(), 8, Pins(pp=1, cp=1), top=0).best
    assert not any("like this plan" in w for w in flat.warnings)
