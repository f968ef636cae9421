"""Hostile strings in what the planner writes, and paths it must not write or read (issue 12).

Every export is parsed back (bash -n, PyYAML safe_load, tomllib) and the shell scripts are run
with stub launchers: a value like '$(touch PWNED)' must stay text, a newline in a name must not
end a comment line or add YAML keys. `--out` refuses folders, device nodes and missing folders;
the explorer's Runs tab reads only under its configured roots.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.errors import PlannerError

yaml = pytest.importorskip("yaml")
tomli_w = pytest.importorskip("tomli_w")

PLAN = ["--params", "7B", "--gpus", "16"]
HOSTILE = "$(touch PWNED)`touch PWNED`'\"; touch PWNED #"
NEWLINE_NAME = "evil\ntouch PWNED\n#SBATCH --comment=x\nkey: injected"


def export(capsys, *argv: str) -> str:
    try:
        code = main(["export", *argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def stub_bin(tmp_path: Path) -> Path:
    """torchrun, srun and scontrol that only record their arguments (one per line)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("torchrun", "srun"):
        (folder / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/{name}.args"\n')
    (folder / "scontrol").write_text("#!/bin/sh\necho node0\n")
    for p in folder.iterdir():
        p.chmod(0o755)
    return folder


def run_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{stub_bin(tmp_path)}:{os.environ['PATH']}", "NODE_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node0",
           "SLURM_SUBMIT_DIR": str(work)}
    env.pop("CONFIG", None)
    return subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("fmt", ["torchrun", "slurm"])
def test_config_path_is_written_literally_never_expanded(capsys, tmp_path, fmt):
    out = export(capsys, "--format", fmt, *PLAN, "--config-path", HOSTILE)
    proc = run_script(tmp_path, out)
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "work"
    assert not (work / "PWNED").exists() and not (tmp_path / "PWNED").exists()
    written = work / HOSTILE  # the config went to a file of exactly that name
    assert written.is_file(), sorted(p.name for p in work.iterdir())
    assert yaml.safe_load(written.read_text())["layout"]["dp"] >= 1
    launcher = "torchrun" if fmt == "torchrun" else "srun"
    args = (tmp_path / f"{launcher}.args").read_text().splitlines()
    assert args[args.index("--config") + 1] == HOSTILE


def hostile_profile(tmp_path: Path) -> str:
    data = tomllib.loads((Path(__file__).parents[1] / "hardware_profiles" / "a100-80g.toml").read_text())
    data["name"] = NEWLINE_NAME
    path = tmp_path / "evil.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


@pytest.mark.parametrize("fmt", ["torchrun", "slurm", "megatron"])
def test_a_profile_name_with_newlines_stays_inside_comments(capsys, tmp_path, fmt):
    try:
        out = export(capsys, "--format", fmt, *PLAN, "--gpu", hostile_profile(tmp_path))
    except AssertionError:  # a profile schema may refuse the name: then one line, exit 2, is as safe
        pytest.skip("the profile loader refuses a name with newlines")
    for line in out.splitlines():
        assert not line.startswith(("touch", "key:")), line
        assert not line.startswith("#SBATCH --comment"), line
    if fmt != "megatron":
        proc = run_script(tmp_path, out)
        assert proc.returncode == 0, proc.stderr
        assert not (tmp_path / "work" / "PWNED").exists()
    else:
        script = tmp_path / "m.sh"
        script.write_text(out)
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_an_image_with_a_newline_adds_no_kubernetes_keys(capsys, tmp_path):
    image = "registry/img:1\ninjected: true\n  - evil"
    out = export(capsys, "--format", "k8s", *PLAN, "--image", image, "--gpu", hostile_profile(tmp_path))
    config_map, job = list(yaml.safe_load_all(out))
    assert set(config_map) == {"apiVersion", "kind", "metadata", "data"}
    assert set(job) == {"apiVersion", "kind", "metadata", "spec"}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        assert container["image"] == image
        assert set(container) == {"name", "image", "command", "resources", "volumeMounts"}
    run_config = yaml.safe_load(config_map["data"]["run.yaml"])
    assert set(run_config) <= {"run_name", "model", "layout", "training", "checkpoint", "profile"}


def test_calibrated_profile_toml_keeps_hostile_names_as_strings():
    from planner.calibration.calibrate import calibrate, calibrated_profile_toml
    from tests.test_calibrate import A100, synthetic_runs

    runs = synthetic_runs(A100.efficiency.replace(matmul=0.6))
    fit = calibrate(runs, A100, ("matmul",), leave_one_out=False)
    name = 'cal"\n[gpu]\nmemory_gib = 1 # \\'
    base = dataclasses.replace(A100, name=NEWLINE_NAME)
    data = tomllib.loads(calibrated_profile_toml(base, fit, runs, name))
    assert data["name"] == name and data["gpu"] == tomllib.loads(Path(A100.path).read_text())["gpu"]
    assert data["provenance"]["base"] == base.name


def test_out_refuses_folders_devices_and_missing_folders(tmp_path):
    from planner.files import write_atomic

    for target, why in ((tmp_path, "not a folder or a device"), ("/dev/null", "not a folder or a device"),
                        (tmp_path / "missing" / "x.toml", "does not exist; create it first")):
        with pytest.raises(PlannerError, match=why):
            write_atomic(target, "x")
    assert not (tmp_path / "missing").exists()
    write_atomic(tmp_path / "ok.toml", "x = 1\n")
    assert (tmp_path / "ok.toml").read_text() == "x = 1\n"


@pytest.mark.parametrize("out", ["/dev/null", "{tmp}", "{tmp}/missing/p.toml"])
def test_cli_out_is_one_line_and_exit_2(capsys, tmp_path, out):
    try:
        code = main(["probe", "--out", out.format(tmp=tmp_path)])
    except SystemExit as exit_:
        code = exit_.code
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "missing").exists()


def test_runs_tab_reads_only_under_its_roots(tmp_path, monkeypatch):
    from planner.calibration import run_records

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(run_records.ROOTS_ENV, raising=False)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    assert run_records.runs_folder_problem("runs") is None
    assert run_records.runs_folder_problem("runs/a") is None
    committed = Path(__file__).parents[1] / "benchmarks" / "runs"
    assert run_records.runs_folder_problem(committed) is None
    for bad in ("/", "/etc", "runs/../..", str(tmp_path)):
        problem = run_records.runs_folder_problem(bad)
        assert problem is not None and repr(bad) in problem and run_records.ROOTS_ENV in problem
    (tmp_path / "runs" / "link").symlink_to("/etc")
    assert run_records.runs_folder_problem("runs/link") is not None
    monkeypatch.setenv(run_records.ROOTS_ENV, str(tmp_path / "elsewhere"))
    assert run_records.runs_folder_problem("runs") is not None
    assert run_records.runs_folder_problem(tmp_path / "elsewhere" / "x") is None
