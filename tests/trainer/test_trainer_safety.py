"""Checkpoints that cannot run code, a checkpoint folder two runs cannot share, and refusals that
come back from a running job as one line (exit 2), before config.yaml is overwritten."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.helpers import RUN_TIMEOUT_S, TINY_GPT, explain, run_trainer, trainer_env, write_config

pytestmark = pytest.mark.slow

SMALL = {**TINY_GPT, "layers": 2}


def planner_run(config: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference_trainer.launch", "--config", str(config), *flags],
                          env=trainer_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


class _Creates:
    """Unpickled, creates the folder it names: what a forged checkpoint would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _recommit(folder: Path) -> None:
    """Rewrite COMMIT.json over the folder's current files, as a forger would."""
    manifest = json.loads((folder / "COMMIT.json").read_text())
    manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                         for p in sorted(folder.iterdir()) if p.is_file() and p.name != "COMMIT.json"}
    (folder / "COMMIT.json").write_text(json.dumps(manifest))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_forged_checkpoint_cannot_create_a_file(tmp_path):
    """A pickled payload planted in a committed checkpoint (DCP's default planner would unpickle
    it with weights_only=False), COMMIT.json rewritten so that the checksums match: the resume
    is refused in one line, exit 2, and the payload's file is never created."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    config = write_config(tmp_path, "f", SMALL, {"dp": 1}, training={"steps": 2},
                          checkpoint={"interval": 2, "keep_last": 1})
    assert run_trainer([config], 1).returncode == 0
    folder = tmp_path / "runs" / "f" / "checkpoints" / "step_00000002"
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".json") == ["COMMIT.json", "state_rank0.json"]
    # The format: tensors only in DCP, the rest JSON (nothing pickled but DCP's own metadata).
    dcp_to_torch_save(folder, tmp_path / "plain.pt")
    state = torch.load(tmp_path / "plain.pt", weights_only=True)
    flat = [v for part in state.values() for v in part.values()]
    assert flat and all(isinstance(v, torch.Tensor) for v in flat)

    marker = tmp_path / "pwned"
    for p in folder.glob("*.distcp"):
        p.unlink()
    (folder / ".metadata").unlink()
    dcp.save({**state, "extra": {"rank0": _Creates(str(marker))}}, checkpoint_id=str(folder), no_dist=True)
    _recommit(folder)

    config.write_text(config.read_text().replace("steps: 2", "steps: 4"))
    proc = run_trainer([config], 1)
    assert proc.returncode == 2, explain(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "pickled item" in lines[0] and "extra.rank0" in lines[0], explain(proc)
    assert "Traceback" not in proc.stderr and not marker.exists()
    # Through `planner run`: the same line from the launcher, exit 2, no torchrun ChildFailedError.
    proc = planner_run(config)
    assert proc.returncode == 2 and not marker.exists(), explain(proc)
    assert error_lines(proc)[-1].startswith("error: checkpoint") and "ChildFailedError" not in proc.stderr

    # The planted payload was potent: DCP's default planner runs it.
    dcp.load({"extra": {"rank0": None}}, checkpoint_id=str(folder), no_dist=True)
    assert marker.exists()


def test_the_load_planner_refuses_a_pickled_item_it_is_handed():
    from reference_trainer.checkpoint import _tensor_only_planner
    from reference_trainer.config import ConfigError

    class Item:
        class dest_index:
            fqn = "optim.x"

    with pytest.raises(ConfigError, match="'optim.x' is a pickle: refused"):
        _tensor_only_planner()().load_bytes(Item(), None)


def test_a_second_run_on_a_shared_checkpoint_folder_is_refused_and_the_first_is_unharmed(tmp_path):
    """Run 'a' holds --checkpoint-dir (stalled in its second save); run 'b', another name on the same
    folder, is refused in one line before it launches; 'a' then finishes with its checkpoints."""
    shared = {"checkpoint": {"interval": 2, "keep_last": 1, "dir": str(tmp_path / "ckpt")}}
    first = write_config(tmp_path, "a", SMALL, {"dp": 1}, training={"steps": 4}, **shared)
    second = write_config(tmp_path, "b", SMALL, {"dp": 1}, training={"steps": 4}, **shared)
    env = trainer_env({"REFERENCE_TRAINER_FAULT": "stall:rank=0:step=4:at=save:seconds=20"})
    holder = subprocess.Popen([sys.executable, "-m", "reference_trainer", "--config", str(first)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in holder.stdout:
            if "fault: stalling in save of step 4" in line:
                break
        proc = planner_run(second)
        assert proc.returncode == 2, explain(proc)
        lines = error_lines(proc)
        assert len(lines) == 1 and f"checkpoint folder {tmp_path / 'ckpt'} is in use by a live run" in lines[0]
        assert f'"pid": {holder.pid}' in lines[0] and "checkpoint.dir" in lines[0]
        assert not (tmp_path / "runs" / "b" / "config.yaml").exists()
        # The trainer's own lock, had the launcher's probe been raced: one line, exit 2, nothing touched.
        proc = run_trainer([second], 1)
        assert proc.returncode == 2 and "is in use by a live run" in proc.stderr, explain(proc)
        assert (tmp_path / "ckpt" / "step_00000004.partial").is_dir()
    finally:
        out, err = holder.communicate(timeout=RUN_TIMEOUT_S)
    assert holder.returncode == 0, out[-2000:] + err[-2000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000004"]
    assert json.loads((tmp_path / "runs" / "a" / "record.json").read_text())["status"] == "completed"


def test_another_layout_through_planner_run_is_one_line_and_keeps_config_yaml(tmp_path):
    shared = {"checkpoint": {"interval": 2, "keep_last": 1, "dir": str(tmp_path / "ckpt")}, "training": {"steps": 2}}
    first = write_config(tmp_path, "a", SMALL, {"dp": 1}, **shared)
    assert planner_run(first).returncode == 0
    written = (tmp_path / "runs" / "a" / "config.yaml").read_text()
    proc = planner_run(first, "--micro-batch", "1")
    assert proc.returncode == 2, explain(proc)
    lines = error_lines(proc)
    assert len(lines) == 1 and "written by another layout" in lines[0]
    assert (tmp_path / "runs" / "a" / "config.yaml").read_text() == written


def test_a_finished_checkpoint_without_steps_is_one_line_and_a_partial_csv_is_flagged(tmp_path):
    """A new run name on a finished checkpoint folder (no steps.csv, no record): one line, exit 2,
    on every relaunch. A record rebuilt from a CSV that lost rows names them, not 'completed'."""
    shared = {"checkpoint": {"interval": 2, "keep_last": 1, "dir": str(tmp_path / "ckpt")}, "training": {"steps": 4}}
    first = write_config(tmp_path, "a", SMALL, {"dp": 1}, **shared)
    assert run_trainer([first], 1).returncode == 0
    other = write_config(tmp_path, "b", SMALL, {"dp": 1}, **shared)
    for _ in range(2):
        proc = run_trainer([other], 1)
        assert proc.returncode == 2, explain(proc)
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "has no step rows" in lines[0] and "Traceback" not in proc.stderr
    run = tmp_path / "runs" / "a"
    (run / "record.json").unlink()
    rows = (run / "steps.csv").read_text().splitlines(keepends=True)
    (run / "steps.csv").write_text("".join([rows[0], *rows[3:]]))  # steps 1 and 2 lost
    proc = run_trainer([first], 1)
    assert proc.returncode == 0, explain(proc)
    rec = json.loads((run / "record.json").read_text())
    assert rec["status"] == "rebuilt_partial" and "lacks 2 of 4 steps (1-2)" in rec["message"]
    # A steps.csv edited to hold an infinite step time: the record schema refuses it, in one line.
    (run / "record.json").unlink()
    header, *body = (run / "steps.csv").read_text().splitlines()
    at = header.split(",").index("step_s")
    body = [",".join("inf" if i == at else v for i, v in enumerate(line.split(","))) for line in body]
    (run / "steps.csv").write_text("\n".join([header, *body]) + "\n")
    proc = run_trainer([first], 1)
    assert proc.returncode == 2, explain(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "no record rebuilt from" in lines[0] and "Traceback" not in proc.stderr
