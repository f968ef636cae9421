"""`planner run`'s launcher end to end: two "nodes" on loopback through torchrun's c10d
rendezvous (--nnodes 2), each a launcher process with one rank."""

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
