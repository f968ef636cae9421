"""planner compare / recommend: the figures agree with independent plans, the recommended count
meets the deadline and one node fewer does not, and bad input is one line with exit code 2."""

import json
import subprocess
import sys

import pytest

from planner.cli.main import main
from planner.core.layout import Job
from planner.core.plan import plan
from planner.core.presets import get_preset
from planner.core.search import Pins
from planner.decisions.decide import compare, gpu_ladder, options_for, recommend
from planner.hardware import get_profile

DAY = 86400.0


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def wall_days(e) -> float:
    """Expected wall-clock days, read straight from the estimate's reliability plan."""
    return e.reliability.expected_seconds / DAY


def test_gpu_ladder_is_powers_of_two_then_doubling_nodes_then_the_cap():
    assert gpu_ladder(8, 100) == [1, 2, 4, 8, 16, 32, 64, 96]
    assert gpu_ladder(4, 16) == [1, 2, 4, 8, 16]
    assert gpu_ladder(16, 8) == [1, 2, 4, 8]


def test_compare_rows_are_the_plans_of_each_option(capsys):
    code, out, _ = run(capsys, "compare", "--params", "33B", "--gpus", "64,128", "--gpu", "a100-80g,v100-32g",
                       "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert [(r["gpu"], r["gpus"]) for r in d["rows"]] == [("a100-80g", 64), ("a100-80g", 128), ("v100-32g", 64),
                                                          ("v100-32g", 128)]
    # The defaults a V100 cannot run fall back, and say so: fp16 (no bf16), standard attention (no
    # FlashAttention before Ampere), as `planner estimate` does (tests/test_one_path.py).
    [note] = d["notes"]
    assert note.startswith("v100-32g: fp16 (the v100-32g has no bf16") and "standard attention" in note
    model = get_preset("llama-33b")
    for r in d["rows"]:
        attention = "standard" if r["gpu"] == "v100-32g" else "flash"
        e = plan(model, get_profile(r["gpu"]), Job(precision=r["precision"], attention=attention), r["gpus"]).best
        assert r["fits"] and r["days"] == pytest.approx(e.train.days)
        assert r["layout"]["dp"] * r["layout"]["tp"] * r["layout"]["pp"] == r["gpus"]
        # GPU-hours = days x 24 x GPUs; cost = GPU-hours x the profile's price; headroom = 1 - used / capacity
        assert r["gpu_hours"] == pytest.approx(r["days"] * 24 * r["gpus"])
        assert r["cost_usd"] == pytest.approx(r["gpu_hours"] * get_profile(r["gpu"]).price_usd_per_gpu_hour)
        assert r["headroom_fraction"] == pytest.approx(1 - r["memory_bytes"] / r["capacity_bytes"])
        assert r["wall_days"] >= r["days"]


def test_compare_text_table_names_every_option(capsys):
    code, out, _ = run(capsys, "compare", "--preset", "llama-13b", "--gpus", "8", "--gpu", "a100-80g,a6000,v100-16g")
    assert code == 0
    rows = [line.split()[0] for line in out.splitlines() if line.split()[:1] in (["a100-80g"], ["a6000"],
                                                                                   ["v100-16g"])]
    assert rows == ["a100-80g", "a6000", "v100-16g"]
    assert "8 x v100-16g: does not fit" in out  # 13B does not fit on 8 x 16 GiB: the table says why


@pytest.mark.parametrize("gpu", ["a100-80g", "v100-32g"])
def test_more_gpus_never_take_longer(gpu):
    """Doubling the GPUs at a fixed global batch never slows training: free layouts, and a fixed
    layout shape (only dp grows)."""
    model = get_preset("llama-7b")
    opts = options_for([get_profile(gpu)], Job(global_batch=2048))
    counts = (8, 16, 32, 64, 128, 256)
    for pins in (Pins(), Pins(tp=2, pp=2, micro_batch=1, zero_stage=3, recompute="full", sequence_parallel=True)):
        days = [p.best.train.days for p in compare(model, opts, counts, pins).rows]
        assert all(b <= a * (1 + 1e-9) for a, b in zip(days, days[1:])), days


def test_recommend_meets_the_deadline_and_one_node_fewer_does_not():
    """One node here is a scheduler's node (a host): a node of 8, or a compute tray of 4 inside a
    GB200 NVL72 rack (whose NVLink domain, 72, is the cost model's node)."""
    model, deadline = get_preset("llama-33b"), 30 * DAY
    profiles = [get_profile(n) for n in ("a100-80g", "a6000", "v100-32g", "gb200-nvl72")]
    r = recommend(model, options_for(profiles, Job(tokens=1e12)), deadline)
    for a in r.answers:
        hw, job, n = a.option.hardware, a.option.job, a.pick.gpus
        gpn = hw.network.host_gpus
        e = plan(model, hw, job, n).best
        assert e.fits and wall_days(e) <= 30
        fewer = plan(model, hw, job, n - gpn).best
        assert not fewer.fits or wall_days(fewer) > 30
        # The minimum on which it fits at all: fits there, and not on one node (or half) fewer.
        m = a.min_fit.gpus
        assert plan(model, hw, job, m).best.fits
        assert not plan(model, hw, job, m - gpn if m > gpn else m // 2).best.fits
    costs = {a.name: a.pick.cost_usd for a in r.answers}
    assert r.cheapest.name == min(costs, key=costs.get)
    assert r.min_fit.min_fit.gpus == min(a.min_fit.gpus for a in r.answers)


def test_recommend_over_budget_says_why_and_exits_3(capsys):
    code, out, _ = run(capsys, "recommend", "--params", "33B", "--tokens", "1T", "--deadline", "30d",
                       "--gpu", "a100-80g", "--budget", "$100K")
    assert code == 3
    assert "no option meets the ask" in out and "over budget" in out and "> budget $100,000" in out


def test_recommend_json_and_missed_deadline(capsys):
    code, out, _ = run(capsys, "recommend", "--params", "33B", "--deadline", "2d", "--gpu", "a100-80g,a6000",
                       "--max-gpus", "512", "--format", "json")
    d = json.loads(out)
    assert code == 3 and d["cheapest"] is None and d["deadline_s"] == 2 * DAY
    for a in d["answers"]:
        assert not a["meets"] and a["reason"].startswith("misses the deadline")
        assert a["fastest"]["gpus"] <= 512 and a["fastest"]["wall_days"] > 2
    code, out, _ = run(capsys, "recommend", "--params", "33B", "--deadline", "60d", "--budget", "2e6",
                       "--format", "json")
    d = json.loads(out)
    # the default list: every datacenter GPU profile, not the workstation cards (a6000, l40s)
    from planner.hardware import gpu_profile_names

    considered = {a["gpu"] for a in d["answers"]}
    assert considered == set(gpu_profile_names()) - {"a6000", "l40s"} and {"h100-80g", "h200"} <= considered
    assert code == 0 and d["cheapest"] in considered
    pick = next(a for a in d["answers"] if a["gpu"] == d["cheapest"])["pick"]
    assert pick["wall_days"] <= 60 and pick["wall_cost_usd"] <= 2e6


@pytest.mark.parametrize("argv, needle", [
    (["compare", "--params", "33B", "--gpus", "64,,128"], "gpus='64,,128'"),
    (["compare", "--params", "33B", "--gpus", "64,x"], "gpus='64,x'"),
    (["compare", "--params", "33B", "--gpus", "0"], "gpus='0'"),
    (["compare", "--params", "33B", "--gpu", "a100-80g,,v100"], "gpu='a100-80g,,v100'"),
    (["compare", "--params", "33B", "--gpu", "a100-80g,h1000"], "did you mean"),
    (["compare", "--params", "33B", "--gpus", "128", "--gpu", "v100-32g", "--precision", "bf16"], "precision='bf16'"),
    (["compare", "--params", "33B", "--gpus", "128", "--tp", "3"], "tp=3"),
    (["compare", "--params", "33B", "--plot", "out.jpg"], "plot='out.jpg'"),
    (["compare", "--preset", "llama-65b", "--gpus", "8", "--gpu", "v100-16g,a6000"], "fits on none of the options"),
    (["recommend", "--params", "33B", "--deadline", "soon"], "deadline='soon'"),
    (["recommend", "--params", "33B", "--deadline", "0d"], "deadline='0d'"),
    (["recommend", "--params", "33B", "--deadline", "30d", "--budget", "lots"], "budget='lots'"),
    (["recommend", "--params", "33B", "--deadline", "30d", "--budget", "0"], "budget='0'"),
    (["recommend", "--params", "33B", "--deadline", "30d", "--max-gpus", "0"], "max_gpus=0"),
    (["recommend", "--params", "1T", "--deadline", "30d", "--gpu", "v100-16g", "--max-gpus", "64"],
     "fits on none of the options"),
    (["recommend", "--params", "33B"], "--deadline"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plot_is_written_atomically(tmp_path, capsys):
    target = tmp_path / "days.png"
    code, _, _ = run(capsys, "compare", "--preset", "llama-7b", "--gpus", "8,16,32", "--gpu", "a100-80g,v100-32g",
                     "--plot", str(target))
    assert code == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["days.png"]  # no temporary file left behind


def test_no_matplotlib_without_plot():
    code = ("import sys; from planner.cli.main import main; main(['compare', '--preset', 'llama-7b', '--gpus', '8']); "
            "print('matplotlib' in sys.modules, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stderr.strip().splitlines()[-1] == "False"
