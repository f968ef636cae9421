"""Calibration and validation: the fit recovers known factors; bad records are named and skipped."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from planner.calibration.calibrate import (
    calibrate,
    calibrated_profile_toml,
    check_factors,
    describe_fit,
    predict_step_s,
)
from planner.calibration.measured import Measurement, load_measurements
from planner.calibration.validate import compare, summary, table
from planner.cli.main import main
from planner.core.evaluate import evaluate
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.errors import PlannerError
from planner.hardware import get_profile, load_profile_file

RECORD = Path(__file__).parent / "app" / "data" / "runs" / "tiny-cpu"
A100 = get_profile("a100-80g")


def synthetic_run(label: str, model, layout, truth) -> Measurement:
    """A run whose measured step time is the planner's prediction on the ``truth`` profile."""
    step = float(evaluate(model, truth, Job(), Candidates.from_layouts([layout]), layout.gpus).step_s[0])
    return Measurement(label=label, source="synthetic", model=model, layout=layout, job=Job(), gpus=layout.gpus,
                       device_kind="cuda", device_name="x", hardware_profile=None, step_s=step)


def synthetic_runs(eff) -> list[Measurement]:
    """Runs 'measured' on an A100 whose true factors are ``eff``: the fit must find them again."""
    truth = A100.with_efficiency(eff)
    runs = []
    for i, (layers, hidden, tp, pp, mb) in enumerate([(8, 1024, 1, 1, 1), (8, 2048, 2, 1, 2), (16, 1024, 1, 2, 4),
                                                      (8, 4096, 4, 1, 1), (16, 2048, 2, 2, 2), (4, 512, 1, 1, 8),
                                                      (8, 1536, 1, 1, 2), (16, 4096, 8, 1, 1)]):
        model = ModelSpec(arch="llama", layers=layers, hidden=hidden, heads=hidden // 128, vocab=32000, seq_len=2048)
        layout = Layout(dp=2, tp=tp, pp=pp, micro_batch=mb, global_batch=2 * mb * 4 * pp)
        runs.append(synthetic_run(f"run{i}", model, layout, truth))
    return runs


def test_fit_recovers_known_factors():
    truth = A100.efficiency.replace(matmul=0.55, memory=0.6, layer_overhead_s=2e-4)
    runs = synthetic_runs(truth)
    fit = calibrate(runs, A100, ("matmul", "memory", "layer_overhead_s"))
    assert fit.converged
    assert np.max(np.abs(fit.errors)) < 1e-3
    assert fit.efficiency.matmul == pytest.approx(0.55, rel=0.02)
    assert fit.efficiency.layer_overhead_s == pytest.approx(2e-4, rel=0.1)
    assert np.mean(np.abs(fit.base_errors)) > 0.1  # the defaults were clearly off
    assert fit.loo_errors is not None and np.max(np.abs(fit.loo_errors)) < 0.01


def test_a_fit_with_fewer_than_two_runs_per_factor_says_so():
    truth = A100.efficiency.replace(matmul=0.55, memory=0.6, layer_overhead_s=2e-4)
    runs = synthetic_runs(truth)  # 8 runs
    factors = ("matmul", "memory", "layer_overhead_s")
    note = [x for x in describe_fit(calibrate(runs[:5], A100, factors), runs[:5]).splitlines() if x.startswith("note:")]
    want = ("note: 3 factors from 5 runs: the fit can follow the runs' noise, and each leave-one-out fit has 4 "
            "runs for 3; 6 or more runs (or fewer factors, --factors) give figures that say more")
    assert note == [want]
    assert not [x for x in describe_fit(calibrate(runs[:6], A100, factors), runs[:6]).splitlines()
                if x.startswith("note:")]


def test_too_few_runs_for_the_factors_is_refused():
    with pytest.raises(PlannerError) as err:
        check_factors(("matmul", "memory", "layer_overhead_s"), 2)
    assert "at least 3 runs" in str(err.value)
    with pytest.raises(PlannerError):
        check_factors(("warp_speed",), 5)


def test_calibrated_profile_file_round_trips_with_provenance(tmp_path):
    runs = synthetic_runs(A100.efficiency.replace(matmul=0.6))
    fit = calibrate(runs, A100, ("matmul",), leave_one_out=False)
    path = tmp_path / "a100-cal.toml"
    path.write_text(calibrated_profile_toml(A100, fit, runs, "a100-cal"))
    hw = load_profile_file(path)
    assert hw.name == "a100-cal" and hw.calibrated and hw.efficiency.matmul == pytest.approx(0.6, rel=0.02)
    assert hw.gpu == A100.gpu
    import tomllib

    prov = tomllib.loads(path.read_text())["provenance"]
    assert prov["base"] == "a100-80g" and prov["runs"] == ["synthetic"] * 8 and prov["fit_mean_abs_error"] < 1e-3


def _copy_record(tmp_path: Path, name: str, change=None) -> Path:
    run = tmp_path / name
    shutil.copytree(RECORD, run)
    if change:
        rec = json.loads((run / "record.json").read_text())
        change(rec)
        (run / "record.json").write_text(json.dumps(rec))
    return run


def test_bad_records_are_named_and_skipped_or_fatal_with_strict(tmp_path):
    pytest.importorskip("reference_trainer.record")
    good = _copy_record(tmp_path, "good")
    old = _copy_record(tmp_path, "old", lambda r: r.update(schema_version=0))
    missing = _copy_record(tmp_path, "missing", lambda r: r.pop("step_time_s"))
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "record.json").write_text("{not json")
    runs, skipped = load_measurements([str(good), str(old), str(missing), str(tmp_path / "garbled")])
    assert [r.label for r in runs] == ["tiny-cpu"]
    assert len(skipped) == 3
    assert any("schema_version" in s for s in skipped) and any("step_time_s" in s for s in skipped)
    assert any("not JSON" in s for s in skipped)
    with pytest.raises(PlannerError):
        load_measurements([str(old)], strict=True)


def test_validate_cli_table_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = _copy_record(tmp_path, "good")
    plot = tmp_path / "val.png"
    assert main(["validate", str(run), "--gpu", "a100-80g", "--format", "json", "--plot", str(plot)]) == 0
    d = json.loads(capsys.readouterr().out)
    quantities = {p["quantity"] for p in d["points"]}
    assert "step_s" in quantities and "tokens_per_s" in quantities
    assert "peak_memory_bytes" not in quantities  # a CPU run's RSS is not what the planner predicts
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_a_quantity_over_decades_is_plotted_on_log_axes(tmp_path, monkeypatch):
    """Jobs of 8 to 512 GPUs put tokens/s over three decades: log axes; memory over one: linear."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from planner.calibration.validate import Point, plot

    scales = []
    monkeypatch.setattr(Axes, "set_xscale", lambda self, value, **kw: scales.append(value))
    pts = [Point(run=str(i), quantity="tokens_per_s", predicted=v * 1.05, measured=v, error=0.05)
           for i, v in enumerate((4e3, 5e4, 1e6))]
    pts += [Point(run=str(i), quantity="peak_memory_bytes", predicted=v, measured=v, error=0.0)
            for i, v in enumerate((5e10, 9e10))]
    plot(pts, str(tmp_path / "p.png"))
    assert scales == ["log"]  # once, for tokens/s only


def test_validate_published_rows_meet_the_accuracy_target(capsys):
    path = Path(__file__).parent.parent / "benchmarks" / "data" / "megatron2021_table1.csv"
    assert main(["validate", "--published", str(path), "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]["step_s"]
    assert s["runs"] == 10 and s["mean_abs_error"] <= 0.05 and s["worst_abs_error"] <= 0.10


def test_validate_and_calibrate_bad_input(tmp_path, capsys):
    assert main(["validate"]) == 2
    assert "runs=" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path), "--base", "a100-80g", "--out", str(tmp_path / "x.toml")]) == 2
    assert "no record.json" in capsys.readouterr().err
    run = _copy_record(tmp_path, "one")
    assert main(["calibrate", str(run), "--base", "a100-80g", "--out", str(tmp_path / "x.toml"),
                 "--factors", "matmul,memory"]) == 2
    assert "needs at least 2 runs" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_compare_errors_are_relative_or_in_points():
    runs = synthetic_runs(A100.efficiency)
    runs = [dataclasses.replace(r, bubble_fraction=0.1, step_s=r.step_s * 1.1) for r in runs]
    points = compare(runs, A100)
    step = [p for p in points if p.quantity == "step_s"]
    assert all(p.error == pytest.approx(1 / 1.1 - 1) for p in step)
    s = summary(points)
    assert s["step_s"]["mean_abs_error"] == pytest.approx(1 - 1 / 1.1)


def test_each_half_of_the_cpu_grid_sees_every_mechanism():
    """The grid's pairs (planner.calibration.profile_grid): the calibrated half and the held-out
    half each hold one process, dp, tp, pp, a mix with pp, full recompute and every model shape."""
    from planner.calibration.profile_grid import GRIDS, held_out, run_name

    halves: dict[bool, list[tuple]] = {False: [], True: []}
    for i, (model, dp, tp, pp, mb, _, rc) in enumerate(GRIDS["cpu"]):
        halves[held_out(run_name(i, model, dp, tp, pp, mb, rc))].append((model, dp, tp, pp, rc))
    for runs in halves.values():
        assert len(runs) == 7
        assert any(dp == tp == pp == 1 for _, dp, tp, pp, _ in runs)
        assert any(dp > 1 for _, dp, _, _, _ in runs) and any(tp > 1 for _, _, tp, _, _ in runs)
        assert any(pp > 1 for _, _, _, pp, _ in runs) and any(pp > 1 and dp * tp > 1 for _, dp, tp, pp, _ in runs)
        assert any(rc == "full" for *_, rc in runs)
        assert {m for m, *_ in runs} == {"gpt-s", "llama-m", "gpt-l"}


def test_held_out_finds_a_run_by_its_configuration_not_its_index():
    from planner.calibration.profile_grid import held_out

    # The committed records were named under the earlier order: their indices no longer say the half.
    assert held_out("03-llama-m-dp1tp2pp1-mb4-full") is False
    assert held_out("02-gpt-s-dp1tp2pp1-mb8-none") is True
    with pytest.raises(PlannerError, match="not a run of grid cpu"):
        held_out("00-gpt-xl-dp1tp1pp1-mb4-none")


def test_a_parts_fit_matches_the_shares_only_of_runs_with_a_core_per_process():
    # On a time-shared host a trace books a rank's wait for a core as communication or bubble
    # (run 11: 4 processes on 2 cores, bubble 19-34% across repeats where processor sharing gives
    # 12.5%): its step time is fitted, its shares are not.
    from planner.calibration.calibrate import FIT_SHARES, residuals

    grid = Path(__file__).parent.parent / "benchmarks" / "runs" / "cpu-2core"
    hw = load_profile_file(grid / "probed.toml")
    runs, _ = load_measurements([grid])
    by_name = {r.label: r for r in runs}
    two = by_name["07-llama-m-dp1tp1pp2-mb2-none"]  # 2 processes on 2 cores
    four = by_name["11-llama-m-dp2tp1pp2-mb2-none"]  # 4 processes on 2 cores
    assert hw.network.compute_slots == 2 and two.gpus == 2 and four.gpus == 4
    assert len(residuals([two], hw, parts=True)) == 1 + len(FIT_SHARES)
    assert len(residuals([four], hw, parts=True)) == 1
    assert residuals([four], hw, parts=True)[0] == residuals([four], hw, parts=False)[0]


def test_validate_judges_a_time_shared_runs_step_time_not_its_shares(capsys):
    # The same rule as calibrate --parts, on the committed grid: run 07 (2 processes on 2 cores)
    # has every share judged; run 11 (4 on 2) has its shares shown, marked and left out of the
    # summary, and its step time judged.
    grid = Path(__file__).parent.parent / "benchmarks" / "runs" / "cpu-2core"
    hw = load_profile_file(grid / "probed.toml")
    runs, _ = load_measurements([grid])
    pick = [r for r in runs if r.label in ("07-llama-m-dp1tp1pp2-mb2-none", "11-llama-m-dp2tp1pp2-mb2-none")]
    points = compare(pick, hw)
    judged = {(p.run[:2], p.quantity): p.judged for p in points}
    assert judged[("07", "bubble_fraction")] and judged[("07", "compute_share")] and judged[("07", "step_s")]
    assert not judged[("11", "bubble_fraction")] and not judged[("11", "compute_share")]
    assert judged[("11", "step_s")] and judged[("11", "tokens_per_s")]
    s = summary(points)
    assert s["step_s"]["runs"] == 2 and s["bubble_fraction"]["runs"] == 1 and s["bubble_fraction"]["not_judged"] == 1
    bubble07 = next(p for p in points if p.run.startswith("07") and p.quantity == "bubble_fraction")
    assert s["bubble_fraction"]["worst_abs_error"] == pytest.approx(abs(bubble07.error))
    text = table(points)
    assert text.count(" *\n") >= 10 and "(1 time-shared not judged *)" in text
    assert main(["validate", str(grid / "11-llama-m-dp2tp1pp2-mb2-none"), "--gpu", str(grid / "probed.toml"),
                 "--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].endswith(",judged")
    assert {r.split(",")[1]: r.split(",")[-1] for r in rows[1:]}["bubble_fraction"] == "false"
    assert {r.split(",")[1]: r.split(",")[-1] for r in rows[1:]}["step_s"] == "true"


def links_runs(eff) -> list[Measurement]:
    """Runs on one 8-GPU A100 node whose TP collectives reach ``eff.tp_intra_node_bw`` of the link
    and whose DP reduction ``eff.intra_node_bw``: TP alone, DP alone, and one process."""
    truth = A100.with_efficiency(eff)
    runs = []
    for i, (dp, tp, mb) in enumerate([(1, 1, 1), (1, 2, 1), (1, 4, 2), (1, 8, 1), (2, 1, 1), (4, 1, 2), (8, 1, 1),
                                      (1, 1, 4)]):
        model = ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, vocab=32000, seq_len=2048)
        layout = Layout(dp=dp, tp=tp, micro_batch=mb, global_batch=dp * mb * 2)
        runs.append(synthetic_run(f"dp{dp}tp{tp}mb{mb}", model, layout, truth))
    return runs


def test_tp_and_dp_bandwidth_are_fitted_apart_where_the_runs_tell_them_apart():
    from planner.calibration.calibrate import default_factors

    truth = A100.efficiency.replace(matmul=0.6, intra_node_bw=0.8, tp_intra_node_bw=0.3)
    runs = links_runs(truth)
    # TP-only and DP-only runs separate the two even from step times alone; mixed runs do not.
    assert {"intra_node_bw", "tp_intra_node_bw"} <= set(default_factors(runs, A100, parts=False))
    mixed = [r for r in synthetic_runs(A100.efficiency) if r.layout.tp > 1]  # all dp 2 x tp > 1
    assert "tp_intra_node_bw" not in default_factors(mixed, A100, parts=False)
    assert {"intra_node_bw", "tp_intra_node_bw"} <= set(default_factors(mixed, A100, parts=True))  # shares do
    fit = calibrate(runs, A100, ("matmul", "intra_node_bw", "tp_intra_node_bw"), parts=False)
    assert fit.converged and np.max(np.abs(fit.errors)) < 1e-3
    assert fit.efficiency.tp_intra_node_bw == pytest.approx(0.3, rel=0.05)
    assert fit.efficiency.intra_node_bw == pytest.approx(0.8, rel=0.05)
    # A profile without the TP factor prices TP collectives at intra_node_bw, as before.
    one = A100.with_efficiency(A100.efficiency.replace(intra_node_bw=0.3))
    both = A100.with_efficiency(A100.efficiency.replace(intra_node_bw=0.3, tp_intra_node_bw=0.3))
    assert predict_step_s(runs, one) == pytest.approx(predict_step_s(runs, both), rel=1e-12)


def test_a_factor_pushed_to_its_bound_is_named():
    # Runs twice as fast as a GEMM at the A100's dense peak allows: matmul ends at its upper
    # bound, 1.0, and the fit says that it is a limit there, not a measurement.
    runs = [dataclasses.replace(r, step_s=r.step_s * 0.5) for r in synthetic_runs(A100.efficiency.replace(matmul=1.0))]
    fit = calibrate(runs, A100, ("matmul",), leave_one_out=False)
    assert fit.at_bound == ("matmul",) and fit.efficiency.matmul == pytest.approx(1.0, abs=1e-3)
    notes = [line for line in describe_fit(fit, runs).splitlines() if "bound" in line]
    assert notes and notes[0].startswith("note: matmul = 1 is at its upper bound (1)")
    inside = calibrate(synthetic_runs(A100.efficiency.replace(matmul=0.6)), A100, ("matmul",), leave_one_out=False)
    assert inside.at_bound == ()


def test_calibrate_fits_the_parts_by_default_and_reports_each_held_out(tmp_path, capsys):
    # The committed CPU grid, the calibrating half: each part's error is reported, in sample and
    # leave-one-out, as the same difference `planner validate` shows for that run.
    grid = Path(__file__).parent.parent / "benchmarks" / "runs" / "cpu-2core"
    base = load_profile_file(grid / "probed.toml")
    runs, _ = load_measurements([str(p) for p in sorted(grid.iterdir()) if p.name[:2] in ("00", "04", "06", "12")])
    fit = calibrate(runs, base, ("matmul", "layer_overhead_s"))
    assert fit.parts and set(fit.share_errors) >= {"compute_share", "tp_comm_share", "optimizer_share"}
    fitted = base.with_efficiency(fit.efficiency)
    shown = [p.error for p in compare(runs, fitted) if p.quantity == "compute_share" and p.judged]
    assert list(fit.share_errors["compute_share"]) == pytest.approx(shown, abs=1e-12)
    assert len(fit.loo_share_errors["compute_share"]) == len(shown) == 4
    text = describe_fit(fit, runs)
    assert "compute_share    4 runs: fitted" in text and "leave-one-out" in text
    out = tmp_path / "cal.toml"
    assert main(["calibrate", *(str(grid / r.label) for r in runs), "--base", str(grid / "probed.toml"),
                 "--out", str(out), "--factors", "matmul,layer_overhead_s", "--total-only"]) == 0
    assert "factors (step time only)" in capsys.readouterr().out
    import tomllib

    prov = tomllib.loads(out.read_text())["provenance"]
    assert prov["fitted"] == "step time only" and prov["factors"] == ["matmul", "layer_overhead_s"]


def test_more_factors_than_runs_and_no_scipy_are_one_line_refusals(tmp_path, capsys, monkeypatch):
    grid = Path(__file__).parent.parent / "benchmarks" / "runs" / "cpu-2core"
    two = [str(grid / "00-gpt-s-dp1tp1pp1-mb4-none"), str(grid / "12-gpt-l-dp1tp1pp1-mb1-none")]
    out = tmp_path / "x.toml"
    assert main(["calibrate", *two, "--base", str(grid / "probed.toml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs=2" in err and "needs at least" in err and "matmul" in err, err
    monkeypatch.setitem(__import__("sys").modules, "scipy.optimize", None)  # import scipy.optimize fails
    assert main(["calibrate", *two, "--base", str(grid / "probed.toml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs scipy: pip install scipy" in err, err
    assert not out.exists()
