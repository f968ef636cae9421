"""Input safety: every number that enters is finite and in its documented range, hardware
profile files are checked by a schema, and every output is finite.

Each case of the issue's list is here; expected values are worked by hand in the comments.
"""

from __future__ import annotations

import json
import math

import pytest

from planner.cli.main import main
from planner.core.layout import JOB_OPTIONS
from planner.core.options import _JOB_VALUES, _OPS_VALUES, OPS_OPTIONS, _value
from planner.core.resilience import expected_wall_seconds
from planner.core.search import _divisors
from planner.errors import PlannerError
from planner.hardware import get_profile, load_profile_file
from planner.schema import Key, check_csv_row, check_table
from planner.units import GIB, parse_count, parse_duration

MODEL = ["--preset", "gpt3-1.3b"]


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    get_profile.cache_clear()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_refusal(capsys, argv: list[str], *needles: str) -> str:
    rc, out, err = run(capsys, argv)
    assert rc == 2, (argv, out, err)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


def strict_json(text: str) -> object:
    def reject(name: str) -> None:
        raise ValueError(f"non-finite JSON constant {name}")

    return json.loads(text, parse_constant=reject)


# --- the list ---------------------------------------------------------------------


@pytest.mark.parametrize("argv,needles", [
    (["estimate", "--params", "1e30"], ("params", "1e30", "at most 1e+15")),  # was: a hang
    (["estimate", *MODEL, "--gpus", "99999999999999999999"], ("gpus", "1,000,000")),  # was: a hang
    (["compare", *MODEL, "--gpus", "8,99999999999999999999"], ("gpus", "1,000,000")),
    (["estimate", *MODEL, "--micro-batch", "99999999999999999999"], ("micro_batch", "1,048,576")),  # IndexError
    (["estimate", *MODEL, "--tokens", "1e400B"], ("tokens", "1e400B")),  # was: inf days, nan goodput
    (["estimate", *MODEL, "--storage-gbps", "1e-320"], ("storage_gbps", "[0.001, 100,000]")),
    (["estimate", *MODEL, "--storage-write-gbps", "0"], ("storage_write_gbps",)),  # was: the default
    (["estimate", *MODEL, "--gpus-per-node", "0"], ("gpus_per_node", "from 1 to 1,024")),  # was: the default
    (["estimate", *MODEL, "--mtbf-gpu-hours", "0.001"], ("mtbf_gpu_hours", "8 GPUs")),  # was: OverflowError
    (["estimate", *MODEL, "--mtbf-gpu-hours", "nan"], ("mtbf_gpu_hours", "nan")),
    (["estimate", *MODEL, "--pue", "inf"], ("pue",)),
    (["estimate", *MODEL, "--price-per-gpu-hour", "-1"], ("price",)),
    (["estimate", *MODEL, "--packing-efficiency", "1e-320"], ("packing_efficiency",)),
    (["estimate", *MODEL, "--memory-headroom", "0.6"], ("memory_headroom=0.6", "[0, 0.5]")),
    (["estimate", *MODEL, "--memory-headroom", "-0.1"], ("memory_headroom=-0.1", "[0, 0.5]")),
    (["estimate", *MODEL, "--pp=--"], ("pp",)),  # argparse hands over a list
    (["recommend", *MODEL, "--deadline", "99999999d"], ("deadline", "1000 years")),
    (["recommend", *MODEL, "--deadline", "30d", "--budget", "1e400"], ("budget",)),
    (["probe", "--out", "x.toml", "--nprocs", "99999999999999999999"], ("nprocs", "1,024")),  # was: OverflowError
])
def test_bad_numbers_are_one_line(capsys, argv, needles):
    one_line_refusal(capsys, argv, *needles)


def test_a_folder_as_output_is_refused_before_the_work(capsys, tmp_path):
    folder = tmp_path / "plot.png"
    folder.mkdir()
    one_line_refusal(capsys, ["compare", *MODEL, "--plot", str(folder)], "plot", "not a folder")
    one_line_refusal(capsys, ["probe", "--out", str(tmp_path), "--nprocs", "1"], "out", "not a folder")
    csv = tmp_path / "t.csv"
    csv.write_text("x\n1\n")
    one_line_refusal(capsys, ["validate", "--published", str(csv), "--plot", str(tmp_path)], "plot")


def test_a_short_mtbf_is_a_finite_answer_or_a_reason(capsys):
    # 10 GPU-hours on 64 GPUs: a failure every 10*3600/64 = 562 s against a 10-minute restart;
    # Daly's model still finishes (goodput ~30%), every figure finite and strict JSON.
    rc, out, _ = run(capsys, ["estimate", *MODEL, "--gpus", "64", "--mtbf-gpu-hours", "10", "--format", "json"])
    assert rc == 0
    rel = strict_json(out)["reliability"]
    assert rel["mtbf_job_hours"] == pytest.approx(10 / 64)
    assert 0 < rel["goodput"] < 1 and math.isfinite(rel["expected_seconds"])
    # on 4,096 GPUs a failure every 8.8 s: the job never finishes, said in one line (was 110 digits)
    one_line_refusal(capsys, ["estimate", *MODEL, "--gpus", "4096", "--mtbf-gpu-hours", "10"], "4,096 GPUs")


def test_zero_means_zero(capsys):
    rc, out, _ = run(capsys, ["estimate", *MODEL, "--price-per-gpu-hour", "0", "--format", "json"])
    assert rc == 0 and strict_json(out)["train"]["cost_usd"] == 0.0


def test_no_failures_is_null_in_strict_json(capsys):
    rc, out, _ = run(capsys, ["estimate", *MODEL, "--mtbf-gpu-hours", "inf", "--format", "json"])
    assert rc == 0
    rel = strict_json(out)["reliability"]
    assert rel["mtbf_job_hours"] is None and rel["goodput"] == 1.0


# --- units and arithmetic -----------------------------------------------------------------


def test_parse_count_is_finite_and_bounded():
    assert parse_count("33B", "params") == 33e9
    assert parse_count("1.5T", "tokens", hi=1e16) == 1.5e12
    for bad in ("1e400", "1e400B", "nan", "inf", "0", "-1", "", "1e30T"):
        with pytest.raises(PlannerError):
            parse_count(bad, "x", hi=1e16)
    with pytest.raises(PlannerError, match="at least 1"):
        parse_count("1e-320", "tokens", lo=1)
    assert parse_duration("2w", "deadline") == 14 * 86400
    with pytest.raises(PlannerError, match="1000 years"):
        parse_duration("400000d", "deadline")


def test_divisors_match_brute_force():
    for n in (1, 2, 12, 97, 720720, 999983, 10**6):
        assert list(_divisors(n)) == [d for d in range(1, n + 1) if n % d == 0]


def test_daly_in_logarithms_equals_the_direct_formula():
    # Daly 2006 eq. 20, evaluated directly where it does not overflow: T_s=1e6 s, tau=3600 s,
    # d=60 s, R=600 s, M=86400 s -> 86400 e^(600/86400) (e^(3660/86400) - 1) 1e6 / 3600.
    direct = 86400 * math.exp(600 / 86400) * math.expm1(3660 / 86400) * 1e6 / 3600
    assert expected_wall_seconds(1e6, 3600, 60, 600, 86400) == pytest.approx(direct, rel=1e-12)
    # M = 1 s against R = 1e4 s: e^(1e4) overflows a float; the figure is infinite, not an OverflowError
    assert expected_wall_seconds(1e6, 1.0, 0.1, 1e4, 1.0) == math.inf


# --- the schema ---------------------------------------------------------------------------

SPEC = {"n": Key(int, 1, 1024), "bw_gb_per_s": Key(float, 0, 1e6, lo_open=True, scale=1e9),
        "share": Key(float, 0, 1, default=0.5), "label": Key(str, default="")}


def test_check_table_converts_and_fills_defaults():
    assert check_table({"n": 8.0, "bw_gb_per_s": 2}, SPEC, "f.toml") == {
        "n": 8, "bw_gb_per_s": 2e9, "share": 0.5, "label": ""}


@pytest.mark.parametrize("table,needles", [
    ({"n": 0, "bw_gb_per_s": 1}, ("f.toml n=0", "from 1 to 1,024")),
    ({"n": 8, "bw_gb_per_s": 0}, ("bw_gb_per_s=0", "in (0, 1,000,000]")),
    ({"n": 8, "bw_gb_per_s": float("nan")}, ("nan",)),
    ({"n": 8, "bw_gb_per_s": float("inf")}, ("inf",)),
    ({"n": True, "bw_gb_per_s": 1}, ("n=True",)),
    ({"n": 2.5, "bw_gb_per_s": 1}, ("n=2.5", "an integer")),
    ({"n": "8", "bw_gb_per_s": 1}, ("n='8'",)),
    ({"bw_gb_per_s": 1}, ("f.toml n='missing'", "required")),
    ({"n": 8, "bw_gb_per_s": 1, "bogus": 1}, ("bogus", "allowed: bw_gb_per_s, label, n, share")),
])
def test_check_table_names_key_value_and_range(table, needles):
    with pytest.raises(PlannerError) as exc:
        check_table(table, SPEC, "f.toml")
    for n in needles:
        assert n in str(exc.value)


def test_check_csv_row_parses_text():
    spec = {"tp": Key(int, 1, 64), "tflops": Key(float, 0, 1e6, lo_open=True)}
    assert check_csv_row({"tp": "8", "tflops": "137", "note": "x"}, spec, "t.csv row 2") == {"tp": 8, "tflops": 137.0}
    for bad in ({"tp": "0x10", "tflops": "1"}, {"tp": "8", "tflops": "nan"}, {"tp": "", "tflops": "1"}):
        with pytest.raises(PlannerError, match="t.csv row 2"):
            check_csv_row(bad, spec, "t.csv row 2")


# --- hardware profile files ---------------------------------------------------------------

GOOD = """name = "test-gpu"
price_usd_per_gpu_hour = 2.0
[gpu]
memory_gib = 80
hbm_gb_per_s = 2039
tdp_w = 400
bf16_tflops = 312
[node]
gpus_per_node = 8
intra_node_gb_per_s = 300
inter_node_gbit_per_s = 1600
[efficiency]
matmul = 0.7
cuda_context_gib = 1
"""


def test_a_profile_file_is_converted_to_base_units(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(GOOD)
    p = load_profile_file(path)
    assert p.gpu.memory_bytes == 80 * 2**30
    assert p.gpu.hbm_bytes_per_s == 2039e9
    assert p.gpu.peak_flops["bf16"] == 312e12 and p.gpu.peak_flops["fp8"] == 0.0
    assert p.network.inter_bytes_per_s == 1600e9 / 8 / 8  # 1,600 Gbit/s per node over 8 GPUs: 25 GB/s each
    assert p.network.intra_latency_s == 5e-6  # the documented default
    assert p.efficiency.cuda_context_bytes == GIB and p.efficiency.matmul == 0.7


@pytest.mark.parametrize("old,new,needles", [
    ("memory_gib = 80", 'memory_gib = "lots"', ("[gpu] memory_gib='lots'", "GiB")),
    ("memory_gib = 80", "memory_gib = -80", ("[gpu] memory_gib=-80",)),
    ("gpus_per_node = 8", "gpus_per_node = 0", ("[node] gpus_per_node=0", "from 1 to 1,024")),
    ("gpus_per_node = 8", "gpus_per_node = 8\np2p_gb_per_s = 0", ("[node] p2p_gb_per_s=0", "[0.001, 1,000,000]")),
    ("gpus_per_node = 8", "gpus_per_node = 8\np2p_latency_us = -1", ("[node] p2p_latency_us=-1", "[0, 1,000,000]")),
    ("gpus_per_node = 8", "gpus_per_node = -8", ("gpus_per_node=-8",)),
    ("gpus_per_node = 8", "gpus_per_node = 8.5", ("gpus_per_node=8.5", "integer")),
    ("intra_node_gb_per_s = 300", "intra_node_gb_per_s = 0", ("intra_node_gb_per_s=0",)),
    ("tdp_w = 400", "tdp_w = -400", ("tdp_w=-400",)),
    ("price_usd_per_gpu_hour = 2.0", "price_usd_per_gpu_hour = -1", ("price_usd_per_gpu_hour=-1",)),
    ("price_usd_per_gpu_hour = 2.0", "price_usd_per_gpu_hour = nan", ("price_usd_per_gpu_hour=nan",)),
    ("matmul = 0.7", "matmul = 1.5", ("[efficiency] matmul=1.5", "[0.001, 1]")),
    ("matmul = 0.7", "matmul = 1e-320", ("matmul",)),
    ("bf16_tflops = 312", "bf16_tflops = 1e-320", ("bf16_tflops", "0 or a number")),
    ("tdp_w = 400", "tdp_w = 400\ncolour = 1", ("[gpu] colour", "allowed: bf16_tflops")),
    ("gpus_per_node = 8", "gpus_per_node = 8\nswitch = 1", ("[node] switch", "allowed:")),
    ("gpus_per_node = 8", "gpus_per_node = 8\ngpus_per_host = 3", ("[node] gpus_per_host=3",
                                                                  "must divide gpus_per_node=8")),
    ("gpus_per_node = 8", "gpus_per_node = 8\ngpus_per_host = 0", ("[node] gpus_per_host=0", "from 1 to 1,024")),
    ("matmul = 0.7", "matmul = 0.7\nmatmull = 0.7", ("[efficiency] matmull", "allowed:")),
    ('name = "test-gpu"', 'name = "test-gpu"\nnmae = 1', ("nmae", "allowed: aliases")),
    ("[node]", "[nodes]", ("nodes",)),
    ("hbm_gb_per_s = 2039\n", "", ("[gpu] hbm_gb_per_s='missing'", "required")),
])
def test_a_bad_profile_file_is_one_line_naming_file_key_value(tmp_path, old, new, needles):
    path = tmp_path / "bad.toml"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(PlannerError) as exc:
        load_profile_file(path)
    text = str(exc.value)
    assert str(path) in text and "\n" not in text
    for n in needles:
        assert n in text, (n, text)


@pytest.mark.parametrize("content,needle", [
    (bytes(range(256)), "not a UTF-8 text file"),
    ('name = "caf\xe9"\n'.encode("latin-1"), "not a UTF-8 text file"),
    (b"this is [not toml", "not valid TOML"),
])
def test_binary_or_malformed_profile_files(tmp_path, capsys, content, needle):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    one_line_refusal(capsys, ["estimate", *MODEL, "--gpu", str(path)], str(path), needle)


def test_a_long_path_in_a_refusal_keeps_its_file_name(tmp_path, capsys):
    """The value in a one-line refusal is shortened only past 160 characters, and then keeps its
    end: a profile path of 150 characters (a CI runner's temporary folders are long) is named
    whole, and a longer one still shows which file it was."""
    def bad_profile_at(length: int) -> str:  # a path whose repr() is ``length`` characters
        pad = length - len(repr(str(tmp_path / "x" / "bad.toml")))
        folder = tmp_path / ("d" * (pad + 1))
        folder.mkdir()
        (folder / "bad.toml").write_bytes(b"this is [not toml")
        path = str(folder / "bad.toml")
        assert len(repr(path)) == length
        return path

    path = bad_profile_at(150)
    one_line_refusal(capsys, ["estimate", *MODEL, "--gpu", path], f"{path!r}:", "not valid TOML")
    path = bad_profile_at(230)
    err = one_line_refusal(capsys, ["estimate", *MODEL, "--gpu", path], "dddd/bad.toml' (230 characters):",
                           "not valid TOML")
    assert path not in err and repr(path)[:100] in err


def test_every_shipped_profile_passes_the_schema():
    from planner.hardware import profile_names

    for name in profile_names():
        p = get_profile(name)
        assert p.gpu.memory_bytes > 0 and p.network.gpus_per_node >= 1


def test_exit_codes_in_a_subprocess(tmp_path):
    import subprocess
    import sys

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True, text=True, timeout=120,
                              check=False)

    r = cli("estimate", *MODEL, "--gpus", "99999999999999999999")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == ""
    r = cli("estimate", *MODEL, "--format", "json")
    assert r.returncode == 0 and strict_json(r.stdout)
    r = cli("estimate", "--preset", "gpt3-175b", "--gpus", "8", "--tp", "1", "--pp", "1", "--format", "json")
    assert r.returncode == 3 and strict_json(r.stdout)  # does not fit: still finite, strict JSON


def test_the_readme_lists_every_range():
    """Each flag and profile key is on a row of docs/cli.md's Limits tables with its range (tables
    generated by planner.schema.limits_markdown (of planner.core.limits.FLAGS) and planner.hardware.profile_limits_markdown;
    a new key goes on the row of its range, or regenerate them)."""
    from pathlib import Path

    from planner.hardware import EFFICIENCY_KEYS, GPU_KEYS, NODE_KEYS, TOP_KEYS
    from planner.core.limits import FLAGS

    rows = [line for line in (Path(__file__).parent.parent / "docs" / "cli.md").read_text().splitlines()
            if line.startswith("| `")]
    keys = {**FLAGS, **{k: v for k, v in TOP_KEYS.items() if v.kind in (int, float)},
            **{f"[gpu] {k}": v for k, v in GPU_KEYS.items() if v.kind in (int, float)},
            **{f"[node] {k}": v for k, v in NODE_KEYS.items() if v.kind in (int, float)},
            **{f"[efficiency] {k}": v for k, v in EFFICIENCY_KEYS.items() if v.kind in (int, float)}}
    for name, key in keys.items():
        assert any(f"`{name}`" in r and r.endswith(f"| {key.allowed()} |") for r in rows), name


def test_a_huge_integer_is_refused_in_one_short_line(tmp_path):
    # TOML integers have no size limit: 10**400 does not convert to a float (OverflowError before)
    path = tmp_path / "big.toml"
    path.write_text(GOOD.replace("memory_gib = 80", "memory_gib = " + "9" * 400))
    with pytest.raises(PlannerError) as exc:
        load_profile_file(path)
    text = str(exc.value)
    assert "memory_gib=" in text and "(400 characters)" in text and len(text) < 400


# Profiles and the row of the project's datasheet table (benchmarks/data/hardware.csv, a copy of
# ../shared/data/hardware.csv) that transcribes the same GPU.
DATASHEET_ROWS = {"h100-80g": "H100 SXM5 80GB", "h200": "H200 SXM 141GB", "h100-nvl": "H100 NVL 94GB",
                  "h100-pcie": "H100 PCIe 80GB", "a100-80g": "A100 80GB SXM4", "a100-40g": "A100 40GB SXM4",
                  "a100-pcie": "A100 80GB PCIe", "l40s": "L40S", "a6000": "RTX A6000",
                  "b200": "B200 (HGX B200, per GPU)", "gb200-nvl72": "GB200 (per Blackwell GPU in NVL72)",
                  "gb300-nvl72": "GB300 (per Blackwell Ultra GPU in NVL72)"}


def test_profiles_carry_the_datasheet_tables_dense_rates():
    """Dense 16-bit and fp8 rates and HBM bandwidth as the datasheet table gives them, memory within
    1 GB of its figure (the H200's 141 GB is kept as 140 GiB usable)."""
    import csv
    from pathlib import Path

    text = (Path(__file__).parents[1] / "benchmarks" / "data" / "hardware.csv").read_text().splitlines()
    table = {r["gpu"]: r for r in csv.DictReader(text)}
    for name, row in DATASHEET_ROWS.items():
        g, r = get_profile(name).gpu, table[row]
        assert g.peak_flops["bf16"] == float(r["bf16_tensor_dense_tflops"]) * 1e12, name
        if r["fp8_tensor_dense_tflops"].replace(".", "").isdigit():
            assert g.peak_flops["fp8"] == float(r["fp8_tensor_dense_tflops"]) * 1e12, name
        assert g.hbm_bytes_per_s == float(r["memory_bw_GBps"]) * 1e9, name
        assert abs(g.memory_bytes / 2**30 - float(r["memory_gb"])) <= 1, name


def test_the_gb300_rack_adds_up_to_its_datasheet():
    """NVIDIA's GB300 NVL72 rack figures (360 PFLOPS fp8 dense for training, 20 TB of HBM3e at
    576 TB/s, 72 GPUs in one NVLink domain) from the per-GPU profile: an independent check of it."""
    hw = get_profile("gb300")
    assert hw.name == "gb300-nvl72" and hw.network.gpus_per_node == 72
    assert 72 * hw.gpu.peak_flops["fp8"] == 360e15
    assert 72 * hw.gpu.hbm_bytes_per_s == 576e12
    assert 20e12 <= 72 * hw.gpu.memory_bytes * 1e9 / 2**30 <= 20.2e12  # 72 x 279 GB


def test_the_options_readers_are_the_comprehension_they_write_out():
    """The job's and operations' options read by the written-out dict display, against the
    comprehension it stands for: defaults, text counts, a list option given as text, a repeated
    flag's list, numbers, None."""
    cases = [{}, {"precision": "fp8", "tokens": "2T", "lora_targets": "q_proj,v_proj",
                  "stack_set": ["dp_overlap=0.5", "zero3_overlap=0.7"], "keep_last": 3, "storage_gbps": 7.5,
                  "epochs": None, "unrelated": 1}]
    for values in cases:
        for read, options in ((_JOB_VALUES, JOB_OPTIONS), (_OPS_VALUES, OPS_OPTIONS)):
            assert read(values) == {o.name: _value(values, o) for o in options}
    job, ops = _JOB_VALUES(cases[1]), _OPS_VALUES(cases[1])
    assert job["tokens"] == 2e12 and job["stack_set"] == ("dp_overlap=0.5", "zero3_overlap=0.7")
    assert job["lora_targets"] == ("q_proj", "v_proj") and ops["keep_last"] == 3 and ops["epochs"] == 1.0
