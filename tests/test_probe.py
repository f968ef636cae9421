"""`planner probe`: the curve fits by hand, and a quick real probe that yields a usable profile."""

import tomllib

import numpy as np
import pytest

from planner.calibration.probe import DeviceInfo, ProbeResult, base_for, fit_alpha_beta, fit_half_dim, profile_toml
from planner.errors import PlannerError
from planner.hardware import load_profile_file


def test_half_dim_fit_recovers_a_known_curve():
    points = [(n, 100e12 * n / (n + 64)) for n in (64, 128, 256, 1024, 4096)]
    peak, half = fit_half_dim(points)
    assert half == pytest.approx(64) and peak == pytest.approx(100e12)


def test_alpha_beta_fit_recovers_latency_and_bandwidth():
    # all-reduce on 4 ranks: t = 30 us + 2*3/4 * bytes / 10 GB/s
    points = [(b, 30e-6 + 1.5 * b / 10e9) for b in (2**12, 2**16, 2**20, 2**24)]
    alpha, bw = fit_alpha_beta(points, 1.5)
    assert alpha == pytest.approx(30e-6, rel=1e-6) and bw == pytest.approx(10e9, rel=1e-6)


# Hand-made all-reduce points: 4 ranks (bus factor 2*3/4), alpha 50 us, 10 GB/s, sizes 1 KiB to 64 MiB
# (latency-bound to bandwidth-bound), each time times exp(N(0, 0.1)): ~10% multiplicative noise.
ALPHA, BW, FACTOR = 50e-6, 10e9, 1.5
SIZES = [2**k for k in range(10, 27, 2)]


def _noisy(seed: int, alpha: float = ALPHA) -> list[tuple[int, float]]:
    rng = np.random.default_rng(seed)
    return [(b, (alpha + FACTOR * b / BW) * float(np.exp(rng.normal(0.0, 0.1)))) for b in SIZES]


def _absolute_fit(points):  # plain least squares on absolute times, for comparison (numpy, not the code under test)
    slope, intercept = np.polyfit([FACTOR * b for b, _ in points], [t for _, t in points], 1)
    return intercept, 1.0 / slope


def test_relative_fit_recovers_alpha_and_beta_under_multiplicative_noise():
    # Tolerance: 25% on each of 20 seeds (over 200 seeds the worst was 15% on alpha, 21% on bandwidth).
    fits = [fit_alpha_beta(_noisy(seed), FACTOR) for seed in range(20)]
    for alpha, bw in fits:
        assert alpha == pytest.approx(ALPHA, rel=0.25) and bw == pytest.approx(BW, rel=0.25)
    assert np.median([abs(a / ALPHA - 1) for a, _ in fits]) < 0.08


def test_absolute_fit_does_worse_on_the_same_points():
    rel = [abs(fit_alpha_beta(_noisy(seed), FACTOR)[0] / ALPHA - 1) for seed in range(20)]
    ab = [abs(_absolute_fit(_noisy(seed))[0] / ALPHA - 1) for seed in range(20)]
    # The absolute fit's latency is set by the noise of the 16-64 MiB points: typically off by half or more.
    assert np.median(ab) > 0.3 and np.median(ab) > 4 * np.median(rel)


def test_fit_keeps_latency_and_bandwidth_non_negative():
    # True latency 0: noise pushes the unconstrained intercept below zero on some seeds; it is refitted at 0.
    for seed in range(20):
        alpha, bw = fit_alpha_beta(_noisy(seed, alpha=0.0), FACTOR)
        assert alpha >= 0.0 and bw == pytest.approx(BW, rel=0.25)
    assert any(_absolute_fit(_noisy(seed, alpha=0.0))[0] < 0 for seed in range(20))


@pytest.mark.parametrize("points", [
    [(4096, 1e-4), (4096, 2e-4)],  # one size: latency and bandwidth cannot be told apart
    [(4096, 2e-3), (2**20, 1e-3), (2**24, 5e-4)],  # time falls with size: no bandwidth
    [(4096, 0.0), (2**20, 1e-3)],  # a zero time
    [(4096, 1e-4), (2**20, float("nan"))],
])
def test_fit_refuses_points_that_cannot_determine_both(points):
    with pytest.raises(PlannerError, match="collective points"):
        fit_alpha_beta(points, FACTOR)


def _result(all_reduce) -> ProbeResult:
    return ProbeResult(device="cpu", device_name="test", matmul={"fp32": [(64, 1e10), (128, 2e10), (256, 3e10)]},
                       memory_bytes_per_s=20e9, collectives={"all_reduce": all_reduce}, nprocs=2, cores=2,
                       memory_bytes=8 * 2**30, torch_version="none")


def test_profile_writes_the_fitted_latency_per_hop_and_bus_bandwidth():
    # 2 ranks: t = 2*(n-1) * 100 us + 2*(n-1)/n * bytes / 2 GB/s, so 100 us per hop and 2 GB/s.
    points = [(b, 2 * 100e-6 + 1.0 * b / 2e9) for b in (2**12, 2**16, 2**20, 2**24)]
    node = tomllib.loads(profile_toml(_result(points), "t"))["node"]
    assert node["intra_node_latency_us"] == pytest.approx(100, rel=1e-3)
    assert node["intra_node_gb_per_s"] == pytest.approx(2.0, rel=1e-3)


def test_profile_writes_the_point_to_point_latency_and_bandwidth():
    # One send: t = 80 us + bytes / 4 GB/s; the all-reduce's figures stay its own.
    result = _result([(b, 2 * 100e-6 + 1.0 * b / 2e9) for b in (2**12, 2**16, 2**20, 2**24)])
    result.collectives["p2p"] = [(b, 80e-6 + b / 4e9) for b in (2**12, 2**16, 2**20, 2**24)]
    node = tomllib.loads(profile_toml(result, "t"))["node"]
    assert node["p2p_latency_us"] == pytest.approx(80, rel=1e-3)
    assert node["p2p_gb_per_s"] == pytest.approx(4.0, rel=1e-3)
    assert node["intra_node_latency_us"] == pytest.approx(100, rel=1e-3)
    # Without point-to-point points the keys are absent: sends cost the collectives' figures.
    assert "p2p_latency_us" not in tomllib.loads(profile_toml(_result(result.collectives["all_reduce"]), "t"))["node"]


def test_profile_warns_and_keeps_defaults_when_the_fit_refuses(capsys):
    points = [(4096, 2e-3), (2**20, 1e-3), (2**24, 5e-4)]
    node = tomllib.loads(profile_toml(_result(points), "t"))["node"]
    assert "not fitted" in capsys.readouterr().err
    assert node["intra_node_latency_us"] == pytest.approx(10) and node["intra_node_gb_per_s"] == pytest.approx(5.0)


def test_quick_probe_writes_a_profile_the_planner_uses(tmp_path):
    pytest.importorskip("torch")
    from planner.cli.main import main
    from planner.hardware import load_profile_file

    out = tmp_path / "cpu.toml"
    assert main(["probe", "--out", str(out), "--nprocs", "2", "--quick"]) == 0
    hw = load_profile_file(out)
    assert hw.gpu.peak_flops["fp32"] > 1e9 and hw.gpu.hbm_bytes_per_s > 1e8
    assert hw.network.gpus_per_node >= 2 and hw.network.intra_bytes_per_s > 0 and hw.network.compute_slots >= 1
    assert main(["estimate", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq-len", "32",
                 "--gpu", str(out), "--gpus", "2", "--precision", "fp32", "--tokens", "1M"]) == 0


# The devices a GPU slot gives (KINDS.md): what torch.cuda and NVML report there.
H100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_bytes=81559 * 2**20, torch="2.11.0+cu130",
                  cuda="13.0", driver="580.159.04")
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", memory_bytes=143771 * 2**20, torch="2.11.0+cu130", cuda="13.0",
                  driver="580.159.03")


def test_the_base_profile_is_the_devices_own():
    assert base_for(H100).name == "h100-80g" and base_for(H200).name == "h200"
    # An H100 of another memory size is another profile; a device no profile names is refused.
    assert base_for(DeviceInfo(kind="cuda", name="NVIDIA H100 NVL", memory_bytes=95830 * 2**20, torch="")).name \
        == "h100-nvl"
    with pytest.raises(PlannerError, match="no profile in hardware_profiles/ is this device"):
        base_for(DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_bytes=40 * 2**30, torch=""))


def _fake_gpu(monkeypatch, info: DeviceInfo) -> list:
    """The probe's device and measurements faked: what reaches run_probe is recorded."""
    from planner.calibration import probe

    pytest.importorskip("torch")
    calls = []

    def run_probe(nprocs, quick=False, device=None, info=None):
        calls.append(info)
        return ProbeResult(device="cuda", device_name=info.name, matmul={"bf16": [(1024, 4e14), (4096, 7e14)]},
                           memory_bytes_per_s=2.9e12, nprocs=1, cores=16, memory_bytes=info.memory_bytes,
                           torch_version=info.torch, cuda=info.cuda, driver=info.driver)

    monkeypatch.setattr(probe, "device_info", lambda device=None, nprocs=1: info)
    monkeypatch.setattr(probe, "run_probe", run_probe)
    return calls


def test_a_base_of_other_memory_than_the_device_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from planner.cli.main import main

    calls = _fake_gpu(monkeypatch, H100)
    out = tmp_path / "p.toml"
    assert main(["probe", "--out", str(out), "--nprocs", "1", "--base", "h200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "base='h200'" in err and "140 GiB" in err and "79.6 GiB" in err, err
    assert "this device is h100-80g" in err
    assert not calls and not out.exists()  # refused before any probing, nothing written


def test_a_probe_on_a_gpu_keeps_its_datasheet_and_records_the_software(tmp_path, monkeypatch):
    from planner.cli.main import main

    _fake_gpu(monkeypatch, H100)
    out = tmp_path / "p.toml"
    assert main(["probe", "--out", str(out), "--nprocs", "1"]) == 0  # no --base: from the device's name
    data = tomllib.loads(out.read_text())
    assert data["gpu"]["model"] == "NVIDIA H100 80GB HBM3" and data["gpu"]["memory_gib"] == 80
    assert data["gpu"]["hbm_gb_per_s"] == 3350 and data["gpu"]["bf16_tflops"] == 989.5
    prov = data["provenance"]
    assert (prov["base"], prov["device"], prov["driver"], prov["cuda"], prov["torch"]) == (
        "h100-80g", "NVIDIA H100 80GB HBM3", "580.159.04", "13.0", "2.11.0+cu130")
    # 7e14 FLOP/s at n = 4096 of 989.5e12: the matmul factor is measured, the peak kept.
    assert 0.5 < data["efficiency"]["matmul"] <= 1.0
    assert load_profile_file(out).gpu.memory_bytes == 80 * 2**30


@pytest.mark.parametrize("name", ['a"b', "x\nmatmul = 0.01", "tab\there\\", "back\\slash\x7f"])
def test_a_profile_name_stays_one_string(name):
    # A quote or a newline in --name made an invalid profile or injected a key when the file was
    # written by hand (issue 38): the TOML writer escapes it, and the text reads back as written.
    result = _result([(b, 2 * 100e-6 + 1.0 * b / 2e9) for b in (2**12, 2**16, 2**20, 2**24)])
    result.device_name = 'cpu "model"\nname = "evil"'
    data = tomllib.loads(profile_toml(result, name))
    assert data["name"] == name and data["gpu"]["model"] == result.device_name
    assert set(data) == {"name", "description", "gpu", "node", "efficiency", "provenance"}
    assert data["efficiency"]["matmul"] == 1.0


def test_without_tomli_w_the_fallback_writer_escapes_alike(monkeypatch):
    # The GPU image has no tomli-w: planner.toml_text writes the profile itself, with the same escapes.
    monkeypatch.setitem(__import__("sys").modules, "tomli_w", None)
    result = _result([(b, 2 * 100e-6 + 1.0 * b / 2e9) for b in (2**12, 2**16, 2**20, 2**24)])
    result.device_name = 'cpu "model"\nname = "evil"\x7f'
    data = tomllib.loads(profile_toml(result, 'a"b\n[gpu]'))
    assert data["name"] == 'a"b\n[gpu]' and data["gpu"]["model"] == result.device_name
    assert data["node"]["intra_node_latency_us"] == pytest.approx(100, rel=1e-3)
