"""Bad input is refused in one line (exit 2), never replaced: run records (one schema for every
reader: types, ranges, finiteness, depth, sizes; a profile path only from the project's profile
folders or the record's own), profiles (a positive peak), and flags (strict numbers, no
abbreviations, no empty names, `planner run`'s launch flags). Property-based: records and profiles
with random hostile values (hypothesis) are refused or give finite figures."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.calibration.measured import load_measurements, profile_reference
from planner.calibration.record import MAX_DEPTH, load_record, validate_record
from planner.cli.main import main
from planner.errors import PlannerError
from planner.hardware import get_profile, load_profile_file

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "benchmarks" / "runs" / "cpu-2core"
RECORD = SWEEP / "00-gpt-s-dp1tp1pp1-mb4-none" / "record.json"


def planner(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def one_line_refusal(rc: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def base_record() -> dict:
    return json.loads(RECORD.read_text())


def write_record(folder: Path, data: dict | str, name: str = "r") -> Path:
    path = folder / name / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- run records ------------------------------------------------------------------------------

@pytest.mark.parametrize("where, value, needle", [
    (("step_time_s", "median"), 1e308, "'step_time_s.median'=1e+308 out of range"),
    (("step_time_s", "median"), -0.5, "'step_time_s.median'=-0.5 out of range"),
    (("memory", "peak_allocated_bytes"), -5, "'memory.peak_allocated_bytes'=-5 out of range"),
    (("hardware", "device_count"), 0, "'hardware.device_count'=0 out of range"),
    (("model", "layers"), 10**400, "'model.layers' is an integer of 401 digits"),
    (("tokens_per_s",), "fast", "'tokens_per_s' has type str"),
    # the trainer's own timed exchanges: a huge one made a measured share infinite in `planner validate`
    (("breakdown_s", "cp_comm"), 1.569589250543193e307, "'breakdown_s.cp_comm'=1.569589250543193e+307 out of range"),
    (("breakdown_s", "all_to_all"), -1.0, "'breakdown_s.all_to_all'=-1.0 out of range"),
    (("breakdown_s", "comm_exposed_tp"), "x", "'breakdown_s.comm_exposed_tp' has type str"),
])
def test_a_record_out_of_range_is_named(where, value, needle):
    data = base_record()
    holder = data
    for key in where[:-1]:
        holder = holder[key]
    holder[where[-1]] = value
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("+", r"\+").replace(".", r"\.")):
        validate_record(data)


@pytest.mark.parametrize("raw, needle", [("Infinity", "bad number Infinity"), ("1e400", "bad number 1e400"),
                                         ("NaN", "bad number NaN")])
def test_non_finite_numbers_in_the_file_are_refused(tmp_path, raw, needle):
    text = RECORD.read_text()
    median = json.dumps(base_record()["step_time_s"]["median"])
    path = write_record(tmp_path, text.replace(f'"median": {median}', f'"median": {raw}', 1))
    with pytest.raises(ValueError, match=needle):
        load_record(path)


def test_a_record_nested_200k_deep_is_one_line(tmp_path):
    path = write_record(tmp_path, '{"a": ' * 200_000 + "1" + "}" * 200_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_record(path)
    deep: dict = {}
    inner = deep
    for _ in range(100_000):  # as a Python object (the explorer, the trainer): no recursion either
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH} levels"):
        validate_record({**base_record(), "config": deep})


def test_validate_with_an_infinite_step_time_is_one_line_in_json_too(tmp_path):
    text = RECORD.read_text().replace('"median": ', '"median": Infinity, "x": ', 1)
    write_record(tmp_path, text)
    rc, out, err = planner("validate", str(tmp_path), "--format", "json")
    one_line_refusal(rc, err, "no usable run record", "bad number Infinity")
    assert out == ""


def test_strict_calibrate_never_fits_an_infinite_record(tmp_path):
    for i, path in enumerate(sorted(SWEEP.glob("*/record.json"))[:4]):
        data = json.loads(path.read_text())
        data["config"]["profile"]["hardware_profile"] = "a100-80g"
        text = json.dumps(data)
        if i == 0:
            text = text.replace('"median": ', '"median": 1e400, "x": ', 1)
        write_record(tmp_path / "runs", text, f"r{i}")
    rc, _, err = planner("calibrate", str(tmp_path / "runs"), "--strict", "--base", "a100-80g", "--factors", "matmul",
                         "--out", str(tmp_path / "out.toml"))
    one_line_refusal(rc, err, "bad run record", "1e400")
    assert not (tmp_path / "out.toml").exists()


# --- a record's profile: only from the project's profile folders or the record's own ---------

def test_profile_references_resolve_beside_the_record_or_in_the_project(tmp_path):
    record = write_record(tmp_path / "sweep", base_record())
    (tmp_path / "sweep" / "probed.toml").write_text((SWEEP / "probed.toml").read_text())
    assert profile_reference("a100-80g", record) == "a100-80g"  # a name, as written
    assert profile_reference("probed.toml", record) == str((tmp_path / "sweep" / "probed.toml").resolve())
    shipped = ROOT / "hardware_profiles" / "a100-80g.toml"
    assert profile_reference(str(shipped), record) == str(shipped.resolve())
    assert profile_reference("hardware_profiles/a100-80g.toml", record) == str(shipped.resolve())  # from the root
    committed = SWEEP / "00-gpt-s-dp1tp1pp1-mb4-none" / "record.json"  # names it relative to the project root
    assert profile_reference("benchmarks/runs/cpu-2core/probed.toml", committed) == str((SWEEP / "probed.toml"))
    for hostile in ("/etc/passwd", "../../../../../../etc/passwd", str(SWEEP / "probed.toml")):
        with pytest.raises(ValueError, match="a profile file is read only from the project's profile folders"):
            profile_reference(hostile, record)
    with pytest.raises(ValueError, match="no such profile file"):
        profile_reference("nowhere.toml", record)


def test_validate_reads_committed_records_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = planner("validate", str(SWEEP / "00-gpt-s-dp1tp1pp1-mb4-none"), "--format", "json")
    assert rc == 0 and json.loads(out)["points"] and json.loads(out)["skipped"] == [], err


def test_a_record_naming_etc_passwd_is_one_line_for_the_cli_and_an_upload(tmp_path):
    data = base_record()
    data["config"]["profile"]["hardware_profile"] = "/etc/passwd"
    write_record(tmp_path, data)
    rc, _, err = planner("validate", str(tmp_path))
    one_line_refusal(rc, err, "hardware_profile='/etc/passwd'", "project's profile folders")
    from planner.calibration.run_records import compare, load_uploaded

    loaded = load_uploaded([("mine.json", json.dumps(data).encode())])
    compared = compare(loaded.runs, None)  # the explorer: the run is listed, its prediction refused
    assert compared.points == () and len(compared.unpredicted) == 1
    assert "hardware_profile='/etc/passwd': a profile file is read only from" in compared.unpredicted[0]
    assert compare(loaded.runs, "a100-80g").points  # a profile chosen on the page: the record's is not read


def test_a_profile_given_by_hand_is_used_whatever_the_record_names(tmp_path):
    """`planner profile --gpu my-gpu.toml` then `planner calibrate runs/grid --base my-gpu.toml`: the
    records name a file outside their folders, which is never read when a profile is given."""
    data = base_record()
    data["config"]["profile"]["hardware_profile"] = "/etc/passwd"
    write_record(tmp_path, data)
    rc, out, err = planner("validate", str(tmp_path), "--gpu", str(SWEEP / "probed.toml"), "--format", "json")
    assert rc == 0 and json.loads(out)["points"], err


# --- profiles ---------------------------------------------------------------------------------

def test_a_profile_with_every_peak_zero_is_refused(tmp_path):
    text = (ROOT / "hardware_profiles" / "a100-80g.toml").read_text()
    lines = [line.split("=")[0] + "= 0" if line.split("=")[0].strip().endswith("_tflops") else line
             for line in text.splitlines()]
    path = tmp_path / "zero.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PlannerError, match="at least one precision's peak must be positive"):
        load_profile_file(path)
    for argv in (["estimate", "--preset", "gpt3-125m", "--gpu", str(path)],
                 ["calibrate", str(SWEEP), "--base", str(path), "--out", str(tmp_path / "o.toml")]):
        rc, _, err = planner(*argv)
        one_line_refusal(rc, err, "peak must be positive")


def test_a_profile_nested_deep_is_one_line(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("[gpu]\nmemory_gib = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(PlannerError, match="nested too deeply"):
        load_profile_file(path)


# --- flags: never silently replaced --------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["estimate", "--preset", "gpt3-125m", "--gpu", ""], "gpu='': expected a profile name"),
    (["recommend", "--preset", "gpt3-125m", "--gpu", "a100-80g", "--deadline", "30d", "--gpus", "7"],
     "unrecognized arguments: --gpus 7"),
    (["estimate", "--preset", "gpt3-125m", "--layers", "1_0"], "--layers: invalid int value: '1_0'"),
    (["estimate", "--preset", "gpt3-125m", "--pue", "1_0"], "--pue: invalid float value: '1_0'"),
    (["estimate", "--preset", "gpt3-125m", "--mtbf-gpu-hours", "1e400"], "'1e400' overflows a float"),
    (["estimate", "--preset", "gpt3-125m", "--tp", "1", "--sequence-parallel"], "it needs tp > 1"),
])
def test_replaced_inputs_are_refused(argv, needle):
    rc, out, err = planner(*argv)
    one_line_refusal(rc, err, needle)
    assert out == ""


def test_inf_said_on_purpose_still_means_no_failures():
    rc, out, _ = planner("estimate", "--preset", "gpt3-125m", "--gpus", "8", "--mtbf-gpu-hours", "inf",
                         "--format", "json")
    assert rc == 0 and json.loads(out)


def test_sequence_parallel_is_searched_only_with_tensor_parallel():
    rc, out, err = planner("search", "--preset", "gpt3-1.3b", "--gpus", "8", "--sequence-parallel", "--format",
                           "json", "--top", "0")
    rows = json.loads(out)["results"]
    assert rc == 0 and rows and all(r["layout"]["tp"] > 1 for r in rows), err


@pytest.mark.parametrize("argv, needle", [
    (["--nproc-per-node", "0"], "--nproc-per-node=0: expected a positive integer"),
    (["--run-name", ""], "--run-name='': expected a non-empty value"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1"],
     "--nnodes=2: the layout's 1 processes (dp*tp*pp...) do not split evenly over 2 nodes"),
    (["--global-batch", str(10**30)], "global_batch=1000000000000000000000000000000: an integer from 1 to"),
    (["--layers", "1_0"], "--layers='1_0': expected an integer"),
])
def test_planner_run_refuses_what_it_used_to_replace(argv, needle, tmp_path):
    from reference_trainer.launch import main as launch

    err = io.StringIO()
    shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "512", "--seq-len", "64"]
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) if "1_0" in argv else contextlib.nullcontext():
        rc = launch([*shape, *argv, "--runs-dir", str(tmp_path), "--dry-run"])
    rc = 2 if "1_0" in argv else rc
    one_line_refusal(rc, err.getvalue(), needle)


def test_planner_run_names_a_binary_config(tmp_path):
    from reference_trainer.launch import main as launch

    config = tmp_path / "run.yaml"
    config.write_bytes(bytes(range(256)))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = launch(["--config", str(config), "--dry-run"])
    one_line_refusal(rc, err.getvalue(), f"--config {config}: not a UTF-8 text file")


# --- property-based: random hostile values in records and profiles ------------------------------

def _paths(data: object, where: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in [(*where, k), *_paths(v, (*where, k))]]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in [(*where, i), *_paths(v, (*where, i))]]
    return []


_BASE = base_record()
_PATHS = _paths(_BASE)
HOSTILE = st.one_of(
    st.integers(min_value=-10**450, max_value=10**450), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**53 + 1, 1e308, -1e-300]), st.text(max_size=8), st.none(), st.booleans(),
    st.lists(st.integers(), max_size=3), st.integers(1, 5000).map(lambda n: {"a": "x" * n}),
    st.integers(30, 80).map(lambda depth: json.loads("[" * depth + "]" * depth)),
)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(_PATHS), HOSTILE), min_size=1, max_size=3),
       wrap=st.one_of(st.none(), st.integers(10, 300_000)))
def test_hostile_records_are_refused_or_give_finite_figures(tmp_path_factory, edits, wrap):
    data = json.loads(json.dumps(_BASE))
    data["config"]["profile"]["hardware_profile"] = "a100-80g"
    for where, value in edits:
        holder = data
        try:
            for key in where[:-1]:
                holder = holder[key]
            holder[where[-1]] = value
        except (KeyError, IndexError, TypeError):  # an earlier edit replaced the path's parent
            continue
    text = json.dumps(data)  # non-finite floats as NaN/Infinity, big integers as digits
    if wrap:
        text = '{"a": ' * wrap + text + "}" * wrap
    path = write_record(tmp_path_factory.mktemp("rec"), text)
    runs, skipped = load_measurements([str(path)])
    assert len(runs) + len(skipped) == 1 and all("\n" not in line for line in skipped)
    if runs:
        from planner.calibration.validate import compare

        try:
            points = compare(runs)
        except PlannerError:
            return
        assert all(math.isfinite(p.predicted) and math.isfinite(p.measured) and math.isfinite(p.error)
                   for p in points)


_PROFILE = (ROOT / "hardware_profiles" / "a100-80g.toml").read_text()
_PROFILE_KEYS = [line.split("=")[0].strip() for line in _PROFILE.splitlines()
                 if "=" in line and not line.lstrip().startswith(("#", "[", "name", "aliases", "description",
                                                                   "source", "model", "note"))]
TOML_VALUE = st.one_of(
    st.integers(min_value=-10**450, max_value=10**450).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: "nan" if math.isnan(x) else
                                                       ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(x)),
    st.sampled_from(["0", "0.0", "-0.0", "1e-320", "1e308", '"80"', "true", "[1, 2]", "{ a = 1 }"]),
    st.integers(20, 50_000).map(lambda depth: "[" * depth + "]" * depth),
)


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(_PROFILE_KEYS), TOML_VALUE), min_size=1, max_size=4))
def test_hostile_profiles_are_refused_or_give_finite_estimates(tmp_path_factory, edits):
    lines = _PROFILE.splitlines()
    for key, value in edits:
        lines = [f"{key} = {value}" if line.split("=")[0].strip() == key else line for line in lines]
    path = tmp_path_factory.mktemp("prof") / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    get_profile.cache_clear()
    try:
        hw = load_profile_file(path)
    except PlannerError as exc:
        assert "\n" not in str(exc)
        return
    assert any(v > 0 for v in hw.gpu.peak_flops.values())
    assert all(math.isfinite(v) and v >= 0 for v in hw.gpu.peak_flops.values())
    assert math.isfinite(hw.gpu.memory_bytes) and hw.gpu.memory_bytes > 0
    rc, out, err = planner("estimate", "--preset", "gpt3-125m", "--gpus", "8", "--gpu", str(path), "--format", "json")
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, err
    else:
        assert rc in (0, 3) and json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in {out[:300]}"))


def test_the_live_page_reads_a_run_config_profile_only_from_allowed_folders(tmp_path):
    from planner.app.live import Plan, plan_for

    config = base_record()["config"]
    config["profile"]["hardware_profile"] = "/etc/passwd"
    why = plan_for(config, run=tmp_path)
    assert isinstance(why, str) and "a profile file is read only from the project's profile folders" in why
    config["profile"]["hardware_profile"] = "a100-80g"
    assert isinstance(plan_for(config, run=tmp_path), Plan)


def test_validate_on_a_profile_without_the_runs_precision_is_one_line(tmp_path):
    """Megatron-LM's published rows ran in fp16; a profile whose fp16 rate is 0 predicted nan."""
    text = (ROOT / "hardware_profiles" / "a100-80g.toml").read_text()
    lines = [line.split("=")[0] + "= 0" if line.split("=")[0].strip() == "fp16_tflops" else line
             for line in text.splitlines()]
    profile = tmp_path / "no-fp16.toml"
    profile.write_text("\n".join(lines) + "\n")
    rows = tmp_path / "rows.csv"
    rows.write_text("params_billion,attention_heads,hidden_size,num_layers,tensor_parallel,pipeline_parallel,num_gpus,"
                    "global_batch_size_seqs,seq_len,vocab_size,micro_batch_size,virtual_pipeline_stages,"
                    "achieved_tflops_per_gpu\n1.7,24,2304,24,1,1,32,512,2048,51200,16,1,137\n")
    rc, out, err = planner("validate", "--published", str(rows), "--gpu", str(profile))
    one_line_refusal(rc, err, "has no fp16 tensor rate")
    assert out == ""


def test_a_lora_target_that_is_no_name_is_refused_in_any_mode():
    """Found by the hostile-records test: a run record of a full fine-tune whose LoRA targets held a
    list made a Job that could not be hashed (a TypeError where the model's caches key on it)."""
    from planner.core.layout import Job

    for mode in ("pretrain", "full-finetune", "lora"):
        with pytest.raises(PlannerError, match=r"^lora_targets=\[\]: each one of q_proj"):
            Job(mode=mode, lora_targets=([],))
    assert hash(Job(mode="pretrain")) == hash(Job(mode="pretrain"))
