"""`planner run`'s launcher end to end: two "nodes" on loopback through torchrun's c10d
rendezvous (--nnodes 2), each a launcher process with one rank; bad flags and a run folder held
by a live run are one line and exit 2 before anything launches."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from reference_trainer.record import load_record
from tests.trainer.helpers import RUN_TIMEOUT_S, trainer_env

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_loopback(tmp_path):
    argv = [sys.executable, "-m", "reference_trainer.launch", "--layers", "2", "--hidden", "64", "--heads", "4",
            "--vocab", "512", "--seq-len", "64", "--dropout", "0", "--dp", "2", "--micro-batch", "2",
            "--global-batch", "8", "--steps", "4", "--workers", "0", "--runs-dir", str(tmp_path / "runs"),
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv-id", "loopback"]
    nodes = [subprocess.Popen(argv, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=RUN_TIMEOUT_S) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, out[-2000:] + err[-2000:]
    rec = load_record(tmp_path / "runs" / "loopback")
    assert rec["hardware"]["nodes"] == 2 and rec["hardware"]["device_count"] == 2
    assert rec["steps"]["completed"] == 4 and rec["status"] == "completed"
    assert sum("status completed: 4/4 steps" in out for out, _ in outputs) == 1  # rank 0's summary, once


@pytest.mark.parametrize("argv, needle", [
    (["--steps", "abc"], "--steps='abc': expected an integer"),
    (["--lr", "fast"], "--lr='fast': expected a number"),
    (["--seed", "-1", "--dry-run"], "seed=-1: an integer from 0 to 4294967295"),
    (["--seed", str(2**32), "--dry-run"], "seed=4294967296: an integer from 0 to 4294967295"),
    (["--arch", "rnn"], "invalid choice: 'rnn'"),
])
def test_planner_run_bad_flags_are_one_line_and_exit_2(argv, needle, tmp_path):
    proc = subprocess.run(["planner", "run", *argv, "--runs-dir", str(tmp_path)], capture_output=True, text=True,
                          env=trainer_env(), timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "usage:" not in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())  # nothing launched, nothing written


def test_planner_run_refuses_a_run_folder_held_by_a_live_run(tmp_path):
    from reference_trainer.faults import RunLock

    lock = RunLock(tmp_path / "held")  # this test process plays the live run
    assert lock.acquire() is None
    proc = subprocess.run(["planner", "run", "--run-name", "held", "--runs-dir", str(tmp_path), "--steps", "2"],
                          capture_output=True, text=True, env=trainer_env(), timeout=60, check=False)
    lock.release()
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "in use by a live run" in proc.stderr
    assert "run held" not in proc.stdout  # torchrun never started


@pytest.mark.parametrize("argv, needle", [
    (["--lr", "inf"], "training.lr=inf: a finite number"),
    (["--peak-tflops", "inf"], "profile.peak_tflops=inf: a finite number"),
    (["--workers", "100000"], "data.workers=100000: from 0 to 64"),
])
def test_planner_run_values_ranks_would_die_on_are_refused(argv, needle, tmp_path):
    proc = subprocess.run(["planner", "run", *argv, "--runs-dir", str(tmp_path), "--dry-run"], capture_output=True,
                          text=True, env=trainer_env(), timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {needle}", proc.stderr

