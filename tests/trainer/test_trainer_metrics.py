"""The Prometheus text endpoint (issue 13, optional item): what the trainer writes to TensorBoard,
served at /metrics in the text exposition format, read back over HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from reference_trainer.config import ConfigError, build_config
from reference_trainer.metrics import MetricsServer, exposition, metric_name


def test_exposition_by_hand():
    text = exposition({"train/loss": 2.5, "step_time_s/predicted": 0.125, "gpu/power_w": None,
                       "timers_s/data_wait": float("nan")}, {"run": 'a"b'}, step=7)
    assert text.splitlines() == [
        "# TYPE reference_trainer_step_time_s_predicted gauge",
        'reference_trainer_step_time_s_predicted{run="a\\"b"} 0.125',
        "# TYPE reference_trainer_train_loss gauge",
        'reference_trainer_train_loss{run="a\\"b"} 2.5',
        "# TYPE reference_trainer_train_step gauge",
        'reference_trainer_train_step{run="a\\"b"} 7.0',
    ]  # None and NaN left out; names sorted; the label escaped
    assert metric_name("breakdown_s/tp_comm_predicted") == "reference_trainer_breakdown_s_tp_comm_predicted"


def test_the_board_serves_what_it_writes_over_http(tmp_path):
    pytest.importorskip("torch")
    from reference_trainer.board import Board

    server = MetricsServer({"run": "t"})
    port = server.start(0, host="127.0.0.1")
    board = Board(tmp_path / "tb", {"step_s": 0.5, "compute_s": 0.3}, server)  # no TensorBoard writer opened
    row = {"step": 3, "loss": 4.25, "lr": 1e-3, "grad_norm": 1.5, "loss_scale": None, "tokens_per_s": 1000.0,
           "step_s": 0.625, "data_wait_s": 0.0, "fwd_bwd_s": 0.5, "optimizer_s": 0.125}
    try:
        board.write(row, None, 2**30)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                  if not line.startswith("#")}
        assert values["reference_trainer_train_loss"] == 4.25
        assert values["reference_trainer_step_time_s_measured"] == 0.625
        assert values["reference_trainer_step_time_s_predicted"] == 0.5
        assert values["reference_trainer_breakdown_s_compute_predicted"] == 0.3
        assert values["reference_trainer_gpu_memory_used_bytes"] == 2**30
        assert values["reference_trainer_train_step"] == 3
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    finally:
        board.close()


@pytest.mark.parametrize("port", [-1, 65536, "9100", True])
def test_a_bad_metrics_port_is_one_line(port):
    with pytest.raises(ConfigError, match="profile.metrics_port"):
        build_config({"run_name": "x", "profile": {"metrics_port": port}})
