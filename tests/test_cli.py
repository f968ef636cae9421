"""The command line: the JSON contract, exit codes, one-line errors, a light import path."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.core.options import model_from
from planner.core.presets import get_preset


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_contract(capsys):
    code, out, _ = run(capsys, "estimate", "--params", "33B", "--gpus", "128", "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert set(d["model"]) >= {"name", "params", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                               "seq_len"}
    assert d["cluster"] == {"gpu": "a100-80g", "gpus": 128, "gpus_per_node": 8, "gpus_per_host": 8}
    assert set(d["layout"]) >= {"dp", "tp", "pp", "vpp", "micro_batch", "global_batch", "grad_accum", "zero_stage",
                                "recompute", "sequence_parallel", "precision"}
    assert set(d["memory"]) >= {"weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                                "other_bytes", "total_bytes", "capacity_bytes", "fits"}
    assert set(d["time"]) == {"step_s", "compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
                              "optimizer_s", "other_s"}
    assert set(d["train"]) >= {"tokens", "seconds", "days", "gpu_hours", "energy_kwh", "cost_usd"}
    for key in ("bubble_fraction", "comm_fraction", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu"):
        assert isinstance(d[key], float)
    assert isinstance(d["warnings"], list)
    # LLaMA-33B by hand (Touvron et al. 2023, Table 2: 60 layers, 6656 wide, 52 heads; FFN 17920):
    # per layer 4 h^2 attention + 3 h f gated MLP + 2 h norms; embeddings and head V h each; final norm h.
    h, f, layers, vocab = 6656, 17920, 60, 32000
    params = layers * (4 * h * h + 3 * h * f + 2 * h) + 2 * vocab * h + h
    assert params == 32_528_943_616 and d["model"]["params"] == params  # "32.5B" in the paper
    assert d["layout"]["dp"] * d["layout"]["tp"] * d["layout"]["pp"] * d["layout"]["cp"] == 128
    assert d["train"]["tokens"] == pytest.approx(20 * params)  # Chinchilla default
    # MFU from outside: model FLOPs are 6 per non-embedding parameter per token (Kaplan et al. 2020)
    # plus attention scores and the logits, a few percent at s=2048, over 128 x A100 bf16 312 TFLOP/s
    # (NVIDIA A100 datasheet).
    tokens = d["layout"]["global_batch"] * d["model"]["seq_len"]
    floor = 6 * (params - vocab * h) * tokens / (d["time"]["step_s"] * 128 * 312e12)
    assert 1.0 <= d["mfu"] / floor <= 1.1
    # days = tokens / (tokens/s) / 86400; GPU-hours = days * 24 * GPUs
    assert d["train"]["days"] == pytest.approx(d["train"]["tokens"] / d["tokens_per_s"] / 86400)
    assert d["train"]["gpu_hours"] == pytest.approx(d["train"]["days"] * 24 * 128)
    assert d["train"]["energy_kwh"] == pytest.approx(d["train"]["seconds"] * 128 * 400 * 1.2 / 3.6e6)


def test_search_json(capsys):
    code, out, _ = run(capsys, "search", "--preset", "llama-7b", "--gpus", "16", "--format", "json", "--top", "3")
    d = json.loads(out)
    assert code == 0 and d["evaluated"] >= d["feasible"] > 0 and len(d["results"]) == 3
    assert d["results"][0]["time"]["step_s"] <= d["results"][1]["time"]["step_s"] * 1.001
    # Written a row at a time, the text is json's own indented text of the whole document.
    assert out == json.dumps(d, indent=2) + "\n"


def test_search_json_with_no_row_is_jsons_text(capsys):
    """Nothing fits (405B on 8 GPUs): an empty list, as json writes it, and exit 3."""
    code, out, _ = run(capsys, "search", "--preset", "llama3-405b", "--gpus", "8", "--format", "json")
    d = json.loads(out)
    assert code == 3 and d["feasible"] == 0 and d["results"] == []
    assert out == json.dumps(d, indent=2) + "\n"


def test_text_report_and_csv(capsys):
    code, out, _ = run(capsys, "estimate", "--preset", "llama-7b", "--gpus", "8")
    assert code == 0 and "memory" in out and "MFU" in out and "days" in out
    code, out, _ = run(capsys, "search", "--preset", "llama-7b", "--gpus", "8", "--format", "csv", "--top", "2")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 3 and lines[0].startswith("model,params,gpu")


@pytest.mark.parametrize("argv, needle", [
    (["estimate", "--params", "33B", "--gpu", "a100-80"], "did you mean"),
    (["estimate", "--preset", "llama-34b"], "did you mean"),
    (["estimate", "--params", "lots"], "params="),
    (["estimate", "--params=-5B"], "params="),
    (["estimate", "--params", "33B", "--gpus", "0"], "gpus="),
    (["estimate", "--params", "33B", "--gpus", "128", "--tp", "3"], "tp=3"),
    (["estimate", "--params", "33B", "--gpus", "32", "--dp", "4", "--tp", "2", "--pp", "2"], "dp=4 tp=2 pp=2"),
    (["estimate", "--preset", "llama-7b", "--gpus", "8", "--dp", "8", "--micro-batch", "4", "--global-batch", "100"],
     "global_batch=100"),
    (["estimate", "--preset", "llama-7b", "--precision", "fp4"], "invalid choice"),
    (["estimate", "--layers", "4", "--hidden", "100", "--heads", "3"], "heads=3"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    try:
        code, _, err = run(capsys, *argv)
    except SystemExit as exit_:  # argparse's own errors
        code, (_, err) = exit_.code, capsys.readouterr()
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_pinned_layout_that_does_not_fit_exits_3_with_report(capsys):
    code, out, _ = run(capsys, "estimate", "--preset", "llama-33b", "--gpus", "128", "--tp", "1", "--pp", "1",
                       "--zero", "0", "--recompute", "none", "--micro-batch", "8", "--format", "json")
    d = json.loads(out)
    assert code == 3 and d["memory"]["fits"] is False and d["nearest_fit"]["memory"]["fits"] is True


def test_presets_and_profiles_list(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "llama3-405b" in out and "gpt3-175b" in out and "megatron-1t" in out
    code, out, _ = run(capsys, "profiles", "--format", "json")
    names = set(json.loads(out))
    assert {"a100-40g", "a100-80g", "a6000", "v100-16g", "v100-32g", "h100-80g", "h200"} <= names


def test_cli_import_path_is_light():
    code = ("import sys, planner.cli.main, planner.core.plan, planner.core.report, planner.cli.inputs; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'streamlit', 'pandas', 'scipy', 'pynvml') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- issue 11: model input from a Hugging Face config.json, hardware overrides -------------------
DATA = Path(__file__).parent / "data"


def _llama_params(layers, h, heads, kv_heads, ffn, vocab):
    """By hand: untied embeddings and head (2*V*h), per layer q,o (h*h each), k,v (h*kv*hd each),
    SwiGLU (3*h*ffn), two RMSNorms (2h); a final RMSNorm (h)."""
    kv = kv_heads * (h // heads)
    return layers * (2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h) + 2 * vocab * h + h


@pytest.mark.parametrize("file,preset,published", [
    ("Llama-2-7b-hf.config.json", "llama2-7b", 6_738_415_616),
    ("Meta-Llama-3-8B.config.json", "llama3-8b", 8_030_261_248),
    ("Mistral-7B-v0.1.config.json", None, 7_241_732_096),
])
def test_hf_config_equals_the_preset_and_the_published_count(capsys, file, preset, published):
    assert main(["estimate", "--hf-config", str(DATA / file), "--gpus", "64", "--format", "json"]) in (0, 3)
    got = json.loads(capsys.readouterr().out)["model"]["params"]
    if preset:
        main(["estimate", "--preset", preset, "--gpus", "64", "--format", "json"])
        assert got == json.loads(capsys.readouterr().out)["model"]["params"]
    assert got == published
    if file.startswith("Mistral"):
        assert published == _llama_params(32, 4096, 32, 8, 14336, 32000)


def test_hf_config_gpt2_is_the_124m_model(capsys):
    main(["estimate", "--hf-config", str(DATA / "gpt2.config.json"), "--format", "json"])
    d = json.loads(capsys.readouterr().out)["model"]
    # GPT-2 small by hand: wte 50257*768 + wpe 1024*768 + 12 layers of (qkv, proj, fc, proj with
    # biases, two LayerNorms) + final LayerNorm = 124,439,808 (the published "124M")
    h, v, s = 768, 50257, 1024
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 4 * h
    assert d["params"] == v * h + s * h + 12 * layer + 2 * h == 124_439_808


@pytest.mark.parametrize("content,needle", [
    (b"not json", "config.json (UTF-8 JSON)"),
    (b"[1, 2]", "a JSON object"),
    (b'{"model_type": "t5"}', "model_type"),
    (b'{"model_type": "llama", "hidden_size": 64}', "num_hidden_layers"),
    (b'{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,'
     b' "vocab_size": 100, "num_local_experts": 8}', "mixture-of-experts"),
    (b'{"model_type": "llama", "num_hidden_layers": -2, "hidden_size": 64, "num_attention_heads": 4,'
     b' "vocab_size": 100}', "positive integer"),
])
def test_a_bad_hf_config_is_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    assert main(["estimate", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and err.startswith("planner estimate: hf_config")


def test_hardware_overrides_reach_the_model_and_the_report(capsys):
    base = ["estimate", "--preset", "llama2-7b", "--gpus", "16", "--tp", "1", "--pp", "1", "--dp", "16",
            "--micro-batch", "1", "--zero", "3", "--recompute", "full", "--format", "json"]
    main(base)
    a = json.loads(capsys.readouterr().out)
    main([*base, "--gpu-memory-gib", "40", "--gpu-tflops", "624", "--hbm-gbps", "4000"])
    b = json.loads(capsys.readouterr().out)
    assert a["memory"]["capacity_bytes"] == 80 * 2**30 and b["memory"]["capacity_bytes"] == 40 * 2**30
    # twice the A100's 312 TFLOP/s bf16 peak: compute time halves (same efficiency factors)
    assert b["time"]["compute_s"] == pytest.approx(a["time"]["compute_s"] / 2, rel=0.02)
    main([*base[:-2], "--gpu-memory-gib", "40"])
    assert "overridden: 40 GiB" in capsys.readouterr().out
    assert main([*base, "--inter-node-gbps", "0"]) == 2
    assert "inter_node_gbps=0.0" in capsys.readouterr().err


# --- issue 11: pictures ---------------------------------------------------------------------------
@pytest.mark.parametrize("pp,vpp,m,schedule", [(4, 1, 8, "1f1b"), (4, 1, 8, "gpipe"), (4, 2, 8, "1f1b"),
                                                (8, 2, 16, "1f1b"), (2, 5, 20, "1f1b"), (4, 1, 1, "gpipe")])
def test_the_drawn_schedule_has_the_papers_bubble(pp, vpp, m, schedule):
    """The timeline is a simulation of each rank's order, not the formula; its idle share must equal
    the bubble of Narayanan et al. 2021, Sec. 2.2: (p-1)/(v*m + p-1) of the step (GPipe the same)."""
    from planner.decisions.pictures import bubble_of, timeline_rows

    rows = timeline_rows(pp, vpp, m, schedule)
    assert len(rows) == 2 * pp * vpp * m  # every forward and backward of every micro-batch and chunk
    assert bubble_of(rows, pp) == pytest.approx((pp - 1) / (vpp * m + pp - 1))
    for r in range(pp):  # a rank never runs two things at once
        lane = sorted((x["start"], x["end"]) for x in rows if x["rank"] == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(lane, lane[1:]))


def test_estimate_plot_writes_an_image_and_checks_the_path_first(tmp_path, capsys):
    target = tmp_path / "plan.png"
    assert main(["estimate", "--params", "7B", "--gpus", "16", "--pp", "2", "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["estimate", "--params", "7B", "--plot", str(tmp_path / "plan.txt")]) == 2
    assert main(["estimate", "--params", "7B", "--plot", str(tmp_path / "missing" / "p.svg")]) == 2
    (tmp_path / "dir.svg").mkdir()
    assert main(["estimate", "--params", "7B", "--plot", str(tmp_path / "dir.svg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("planner estimate: plot=") for line in err)


def test_matplotlib_is_not_imported_without_plot():
    code = ("import sys; from planner.cli.main import main; main(['estimate', '--params', '7B']); "
            "assert 'matplotlib' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_validate_prints_whole_run_names():
    from planner.calibration.validate import Point, table

    long = "llama-7b-dp8-tp2-pp2-mb4-selective-20261130-201228"  # 50 characters: two runs differ at the end
    text = table([Point(run=long, quantity="step_s", predicted=1.0, measured=1.25, error=-0.2),
                  Point(run=long[:-1] + "9", quantity="step_s", predicted=1.0, measured=1.0, error=0.0)])
    assert long in text and long[:-1] + "9" in text


@pytest.mark.parametrize("sub", ["estimate", "search", "compare", "recommend", "export"])
def test_help_shows_the_defaults(capsys, sub):
    with pytest.raises(SystemExit):
        main([sub, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: bf16; fp16 on a GPU without bf16 (V100))" in text
    assert "(default: flash; standard on a GPU older than Ampere (V100))" in text
    if sub in ("compare", "recommend"):
        assert "default: every datacenter profile" in text


def test_nothing_fits_says_what_would_and_each_hint_holds(capsys):
    assert main(["estimate", "--params", "13B", "--gpus", "1"]) == 3
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "\nstep " not in out and "\ntrain " not in out  # no metrics of a non-plan
    more = re.search(r"more GPUs: (\d+) \((\d+)x", out)
    assert more and "--offload params fits" in out
    n = int(more.group(1))
    assert main(["estimate", "--params", "13B", "--gpus", str(n)]) == 0  # the doubling named fits
    assert main(["estimate", "--params", "13B", "--gpus", str(n // 2)]) == 3  # and the one before does not
    assert main(["estimate", "--params", "13B", "--gpus", "1", "--offload", "params"]) == 0
    capsys.readouterr()


def test_the_nearest_layouts_fit_and_change_the_fewest_pins(capsys):
    pins = ["--params", "70B", "--gpus", "128", "--tp", "4", "--pp", "4", "--zero", "1", "--micro-batch", "4",
            "--recompute", "none", "--stack", "megatron-core"]
    assert main(["estimate", *pins, "--format", "json"]) == 3
    d = json.loads(capsys.readouterr().out)
    near = [d["nearest_fit"], *d["nearest_fit_alternatives"]]
    assert len(near) == 3 and all(n["memory"]["fits"] for n in near)
    pinned = {"tp": 4, "pp": 4, "zero_stage": 1, "micro_batch": 4, "recompute": "none"}
    changed = [{k for k, v in pinned.items() if n["layout"][k] != v} for n in near]
    assert len(changed[0]) == 1 and len({frozenset(c) for c in changed}) == 3
    # the first is the fastest of the one-change layouts: re-pinning each alternative's change alone is slower
    for n, c in zip(near[1:], changed[1:]):
        if len(c) == 1:
            assert n["train"]["seconds"] >= near[0]["train"]["seconds"]


def test_a_shape_flag_equal_to_the_presets_value_keeps_the_preset():
    """--seq-len 8192 on llama3-70b (whose context is 8192) is the preset itself, not a custom
    model; a value that differs is named as the override it is."""
    same, note = model_from({"preset": "llama3-70b", "seq_len": 8192})
    assert (same, note) == (get_preset("llama3-70b"), "preset llama3-70b")
    other, note = model_from({"preset": "llama3-70b", "seq_len": 4096, "layers": 80})
    assert other.name == "llama3-70b+custom" and other.seq_len == 4096 and note == "preset llama3-70b with seq_len=4096"


@pytest.mark.parametrize("argv,basis", [
    (["--params", "7B", "--gpus", "8", "--gpu", "h100-80g"], ""),
    (["--params", "7B", "--gpus", "8", "--gpu", "h100-80g", "--precision", "fp8"], " (of the bf16 peak)"),
    (["--preset", "olmoe-1b-7b", "--gpus", "8", "--gpu", "h100-80g"], " (active parameters)"),
    (["--preset", "olmoe-1b-7b", "--gpus", "8", "--gpu", "h100-80g", "--precision", "fp8"],
     " (of the bf16 peak; active parameters)"),
])
def test_the_mfu_line_says_what_it_counts_against(capsys, argv, basis):
    """fp8 MFU is against the bf16 peak and an MoE's against its active parameters: the report says
    which, once, beside the figure the JSON gives."""
    code, out, _ = run(capsys, "estimate", *argv)
    assert code == 0
    code, js, _ = run(capsys, "estimate", *argv, "--format", "json")
    mfu = json.loads(js)["mfu"]
    assert f"| MFU {mfu:.1%}{basis} | HFU" in " ".join(out.split())  # the report wraps at 100 columns
