"""The GPU session script (issue 40) rehearsed on a CPU: `--dry-run` takes the GPU's path with a
tiny model, with the packages the GPU image lacks (PyYAML, tomli-w, matplotlib) made unimportable
in every process it starts, and leaves one archive plus a summary; a failed stage makes it exit
non-zero, and still leaves both."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.trainer.helpers import trainer_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_session.py"
# Imported first by every Python process the session starts (sitecustomize on PYTHONPATH): the
# modules the GPU image does not have cannot be imported, as there.
ABSENT = """
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("yaml", "tomli_w", "matplotlib"):
            raise ImportError(f"{name} is not on the GPU image")
sys.meta_path.insert(0, _Absent())
"""


def session(tmp_path: Path, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(ABSENT)
    run_env = trainer_env({"PYTHONPATH": str(site), **(env or {})})
    run_env.pop("OUT", None)
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work"), *args], capture_output=True, text=True,
                          timeout=timeout, env=run_env, cwd=tmp_path, check=False)


def archived(tmp_path: Path) -> dict[str, bytes]:
    with tarfile.open(tmp_path / "out" / "gpu-session.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.slow
def test_the_dry_run_calibrates_on_half_and_validates_on_the_other_half(tmp_path):
    pytest.importorskip("torch")
    from planner.calibration.record import validate_record

    proc = session(tmp_path)
    out = tmp_path / "out"
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-session.tar.gz", "session.log", "summary.txt"]
    files = archived(tmp_path)
    records = {Path(n).parent.name: validate_record(json.loads(b)) for n, b in files.items()
               if n.endswith("/record.json")}
    assert len(records) == 12 and {r["layout"]["recompute"] for r in records.values()} == {
        "none", "selective", "full", "half", "quarter"}
    assert all(r["software"]["torch"] and "driver" in r["software"] for r in records.values())
    assert not [n for n in files if "checkpoint" in n or n.endswith(".lock")]
    # Fit on the first of each pair (even), validated on the second (odd): no run in both.
    prov = __import__("tomllib").loads(files["gpu-session/calibrated.toml"].decode())["provenance"]
    fitted = {Path(p).parent.name for p in prov["runs"]}
    held = {p["run"] for p in json.loads(files["gpu-session/validate-calibrated.json"])["points"]}
    assert fitted == {"350m-mb4", "760m-mb4", "760m-mb8-selective", "350m-mb16-full", "350m-mb8", "350m-mb8-quarter"}
    assert held == {"350m-mb8-selective", "760m-mb8", "760m-mb16-full", "350m-mb2", "760m-mb2", "760m-mb8-half"}
    assert prov["fitted"] == "step time and its parts"
    summary = (out / "summary.txt").read_text()
    assert "result: every stage passed" in summary and "calibrated on 6 (even), held out 6 (odd)" in summary
    assert "held-out step time |error| (6 runs)" in summary and files["gpu-session/summary.txt"].decode() == summary
    device = json.loads(files["gpu-session/device.json"])
    assert device["kind"] == "cpu" and device["torch"] and device["base"] is None


def test_an_injected_failure_exits_non_zero_and_still_leaves_the_archive(tmp_path):
    proc = session(tmp_path, env={"GPU_SESSION_FAIL": "device"}, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "device FAILED" in summary and "probe skipped: device did not pass" in summary
    assert "result: FAILED: device, probe, runs, calibrate, validate" in summary
    log = archived(tmp_path)["gpu-session/session.log"].decode()
    assert "injected failure of stage device" in log


def test_bad_arguments_are_one_line(tmp_path):
    for args in (["--fail", "warp"], ["--budget-s", "0"]):
        proc = session(tmp_path, *args, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and args[0] in proc.stderr, proc.stderr


def test_the_device_stage_refuses_a_base_of_other_memory(tmp_path, monkeypatch, capsys):
    # On an H100 (what torch and NVML report there, KINDS.md) the h200 profile's 140 GiB is refused.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_session

    from planner.calibration import probe

    h100 = probe.DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_bytes=81559 * 2**20, torch="2.11.0",
                            cuda="13.0", driver="580.159.04")
    monkeypatch.setattr(probe, "device_info", lambda device=None, nprocs=1: h100)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "nvidia-smi", ""))
    path = tmp_path / "device.json"
    assert gpu_session.write_device_json(path, "h200", dry=False) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "base='h200'" in err and "this device is h100-80g" in err and not path.exists()
    assert gpu_session.write_device_json(path, None, dry=False) == 0  # the device's own profile
    data = json.loads(path.read_text())
    assert (data["base"], data["driver"], data["cuda"], data["torch"]) == ("h100-80g", "580.159.04", "13.0", "2.11.0")


def test_a_ceiling_rerun_of_no_finished_run_is_one_line(tmp_path):
    script = SCRIPT.parent / "trainer_gpu.py"
    for run_dir in (tmp_path / "760m-mb8", tmp_path / "not-a-setting"):  # no record; not a run of the script
        proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "c"), "--tiny", "--ceiling",
                               str(run_dir)], capture_output=True, text=True, timeout=120, env=trainer_env(),
                              check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--ceiling" in proc.stderr, proc.stderr
        assert not (tmp_path / "c").exists()  # nothing written
