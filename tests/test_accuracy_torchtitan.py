"""tokens/s per GPU and memory against torchtitan's published benchmarks (FSDP2, TP, PP on A100,
H100 and H200; bf16 and fp8), the rows without context parallelism.

Two factors are fitted to these rows (benchmarks/fit_torchtitan.py): the clock of the 500 W H100
(one number for its GEMM, attention and fp8 efficiencies) and the fsdp2 stack's per-block
overhead; everything else comes from datasheets, the stack files and the Megatron fit of the
A100. Targets: tokens/s mean |error| <= 10%, worst <= 25% (leave-one-out: docs/validation.md);
memory (torch's max reserved, where reported) mean <= 10%; no run that ran judged not to fit.
"""

from pathlib import Path

import numpy as np

from planner.calibration.published import load_torchtitan, predict_torchtitan

CSV = Path(__file__).parent.parent / "benchmarks" / "data" / "torchtitan_performance.csv"


def test_tokens_per_second_and_memory_against_torchtitan():
    runs = load_torchtitan(CSV)
    assert len(runs) == 25  # 31 rows, 6 with context parallelism left out
    tok, mem = [], []
    for r in runs:
        p = predict_torchtitan(r)
        assert p.fits, r.label
        tok.append(p.tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1)
        if r.measured_memory_bytes:
            mem.append(p.memory_bytes / r.measured_memory_bytes - 1)
    tok, mem = np.abs(tok), np.abs(mem)
    assert tok.mean() <= 0.10 and tok.max() <= 0.25, tok
    assert len(mem) == 14 and mem.mean() <= 0.10 and mem.max() <= 0.20, mem


def test_fp8_speedup_and_compile_as_measured():
    """Ratios inside one table (same GPUs, same layout) isolate a mechanism: torch.compile
    (element-wise fusion) 1.16x measured on 8B at 8 H100s, fp8 on top 1.28x."""
    runs = {r.label: r for r in load_torchtitan(CSV)}
    base = "llama3-8b h100-96g-hbm2e x8 fsdp8 tp1 pp1 b2 s8K selective"
    rate = {k: predict_torchtitan(runs[f"{base} {k}"]).tokens_per_s_per_gpu
            for k in ("bf16", "bf16 compile", "fp8 compile")}
    compiled, fp8 = rate["bf16 compile"] / rate["bf16"], rate["fp8 compile"] / rate["bf16 compile"]
    assert abs(compiled / (6667 / 5762) - 1) <= 0.10
    assert abs(fp8 / (8532 / 6667) - 1) <= 0.10


def test_a_bad_torchtitan_row_is_one_line(tmp_path):
    import pytest

    from planner.errors import PlannerError

    rows = CSV.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([rows[0], rows[1].replace(",2904,", ",nan,")]) + "\n")
    with pytest.raises(PlannerError) as err:
        load_torchtitan(bad)
    assert "tokens_per_s_per_gpu" in str(err.value) and "\n" not in str(err.value)


def test_calibrate_from_published_torchtitan_rows(tmp_path, capsys):
    """`planner calibrate --published CSV` fits the 500 W H100's clock and the per-block overhead on
    torchtitan rows and writes a calibrated profile that predicts those rows' published tokens/s
    (Tables 1 and 3 of llama3_h100_202412_torchtitan.md: 8B on 8 and 128 H100s) within 10%."""
    from planner.cli.main import main
    from planner.hardware import get_profile

    lines = CSV.read_text().splitlines()
    rows = [lines[0]] + [line for line in lines[1:] if "Table 1," in line or "Table 3," in line]
    subset = tmp_path / "tt.csv"
    subset.write_text("\n".join(rows) + "\n")
    out = tmp_path / "h100-500w.toml"
    assert main(["calibrate", "--published", str(subset), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "leave-one-out" in printed and "clock" in printed
    hw = get_profile(str(out))
    assert hw.calibrated and hw.name == "h100-500w"
    clock = hw.efficiency.matmul / get_profile("h100-80g").efficiency.matmul
    assert 0.55 <= clock <= 0.9  # a 500 W board below the 700 W H100 SXM's clock, not above it
    for r in load_torchtitan(subset):
        assert r.gpu == "h100-96g-hbm2e"
        rate = predict_torchtitan(r, hw).tokens_per_s_per_gpu
        assert abs(rate / r.measured_tokens_per_s_per_gpu - 1) <= 0.10, r.label


def test_calibrate_published_bad_input_is_one_line(tmp_path, capsys):
    from planner.cli.main import main

    out = str(tmp_path / "x.toml")
    assert main(["calibrate", "--published", str(tmp_path / "none.csv"), "--out", out]) == 2
    assert main(["calibrate", "run1", "--published", "torchtitan", "--out", out]) == 2
    assert main(["calibrate", "--published", "torchtitan", "--base", "a100-80g", "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("planner calibrate:") for line in err)


def test_the_last_pipeline_stage_keeps_every_outputs_logits_on_the_2024_stack(tmp_path):
    """torch.distributed.pipelining's step() returned the merged outputs of the last stage
    (output_chunks) until torchtitan passed return_outputs=False (Oct 2025): on the 2024 stack the
    last stage holds the 16-bit logits of the m - 1 earlier micro-batches (vocabulary split by TP)."""
    import pytest

    from planner.core.layout import Job, Layout
    from planner.core.presets import get_preset
    from planner.hardware import get_profile
    from tests.helpers import evaluate_one

    model = get_preset("llama3-8b")
    lay = Layout(dp=2, tp=2, pp=4, micro_batch=1, global_batch=16, zero_stage=3, recompute="full",
                 sequence_parallel=True)  # m = 16 / (2 x 1) = 8 micro-batches
    # The same stack with return_outputs=False: a stack file on fsdp2-2024 changing that key only.
    released = tmp_path / "released.toml"
    released.write_text('base = "fsdp2-2024"\nname = "released"\ndescription = "d"\nsource = "s"\n'
                        "[pipeline]\npp_keeps_outputs = false\n")
    old, new = (evaluate_one(model, lay, Job(stack=s), gpu="h100-80g").stage_memory[2]
                for s in ("fsdp2-2024", str(released)))
    want = 7 * 2 * 8192 * model.vocab / 2
    frag = 1 + get_profile("h100-80g").efficiency.fragmentation  # the allocator's share on top of activations
    assert float(old.total[0] - new.total[0]) == pytest.approx(want * frag, rel=1e-6)


def test_calibrate_from_published_megatron_rows(tmp_path, capsys):
    """Megatron-style rows (megatron2021_table1.csv) are fitted like run records on the --base GPU;
    the written profile predicts Table 1's published iteration times within 10% each."""
    from planner.calibration.measured import published_measurements
    from planner.calibration.validate import compare
    from planner.cli.main import main
    from planner.hardware import get_profile

    table1 = str(CSV.parent / "megatron2021_table1.csv")
    out = tmp_path / "a100-fit.toml"
    assert main(["calibrate", "--published", table1, "--base", "a100-80g", "--factors", "matmul",
                 "--out", str(out)]) == 0
    assert "leave-one-out" in capsys.readouterr().out
    points = [p for p in compare(published_measurements(table1), get_profile(str(out))) if p.quantity == "step_s"]
    assert len(points) == 10 and all(abs(p.error) <= 0.10 for p in points)


def test_validate_compares_every_published_torchtitan_row(tmp_path, capsys):
    """`planner validate --published torchtitan`: one tokens/s point per row of the CSV (context
    parallel rows too) and one memory point per row that reports memory, measured as the file says
    (tokens/s per GPU x GPUs, GiB); a copy of the file with one row validates that row alone; a
    missing file is one line."""
    import csv
    import json
    import re

    from planner.cli.main import main

    rows = list(csv.DictReader(CSV.read_text().splitlines()))
    assert main(["validate", "--published", "torchtitan", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    tok = [p for p in got["points"] if p["quantity"] == "tokens_per_s"]
    mem = [p for p in got["points"] if p["quantity"] == "peak_memory_bytes"]
    assert [p["measured"] for p in tok] == [float(r["tokens_per_s_per_gpu"]) * int(r["num_gpus"]) for r in rows]
    assert [p["measured"] for p in mem] == [float(r["memory_gib_reported"]) * 2**30
                                            for r in rows if r["memory_gib_reported"]]
    assert got["summary"]["tokens_per_s"]["runs"] == len(rows) and got["summary"]["peak_memory_bytes"]["runs"] == 20
    one = tmp_path / "one.csv"
    one.write_text("\n".join(CSV.read_text().splitlines()[:2]) + "\n")
    assert main(["validate", "--published", str(one), "--gpu", "a100-80g"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^tokens_per_s +1 runs: mean", out, re.MULTILINE) and "peak_memory_bytes" not in out
    assert main(["validate", "--published", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("planner validate:")


def test_validate_gpu_predicts_the_rows_of_its_own_gpu(tmp_path, capsys):
    """`--gpu` with a profile of one row GPU (here the 500 W H100's file with its matmul halved)
    changes the predictions of that GPU's rows only; the A100 and H200 rows keep their profiles."""
    import json
    import re

    from planner.cli.main import main

    src = Path(__file__).parent.parent / "hardware_profiles" / "h100-96g-hbm2e.toml"
    text = src.read_text().replace('name = "h100-96g-hbm2e"', 'name = "slow-h100"').replace("aliases = [", "aliases = [] # ")
    text, n = re.subn(r"^matmul = ([0-9.]+)", lambda m: f"matmul = {float(m.group(1)) / 2}", text, flags=re.MULTILINE)
    assert n == 1
    slow = tmp_path / "slow-h100.toml"
    slow.write_text(text)

    def tokens(*extra):
        assert main(["validate", "--published", "torchtitan", "--format", "json", *extra]) == 0
        pts = json.loads(capsys.readouterr().out)["points"]
        return {p["run"]: p["predicted"] for p in pts if p["quantity"] == "tokens_per_s"}

    base, changed = tokens(), tokens("--gpu", str(slow))
    moved = {run for run in base if changed[run] != base[run]}
    assert moved and all("h100-96g-hbm2e" in run or "h100-94g" in run for run in moved)
    assert all(changed[run] < base[run] for run in moved)  # a slower matmul, slower rows
    assert any("a100-80g" in run for run in base) and not any("a100-80g" in run for run in moved)
