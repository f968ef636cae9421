"""Crashes: kill -9 one rank mid-save, then another mid-run, truncate the newest checkpoint, and
relaunch each time with auto_resume: the run ends with exactly the uninterrupted run's loss
curve, weights and optimizer state (same layout, same seed: bitwise)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.conftest import FAULT, checkpointed_config  # noqa: E402
from tests.trainer.helpers import explain, steps  # noqa: E402

pytestmark = pytest.mark.slow


def checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def final_state(run_dir, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{run_dir.name}.pt"
    dcp_to_torch_save(run_dir / "checkpoints" / "step_00000008", out)
    return torch.load(out, weights_only=False)


def test_killed_ranks_resume_to_the_uninterrupted_result(two_sweep, tmp_path):
    from tests.trainer.helpers import run_trainer

    reference = two_sweep[0] / "ckpt-reference"
    assert two_sweep[1].returncode == 0, explain(two_sweep[1])
    config = checkpointed_config(tmp_path, "ckpt")
    run = tmp_path / "runs" / "ckpt"

    # 1. Rank 1 dies while saving step 6 (its shards written, nothing committed).
    proc = run_trainer([config], 2, env={FAULT: "kill:rank=1:step=6:at=save"})
    assert proc.returncode != 0
    assert checkpoints(run) == ["step_00000002", "step_00000004", "step_00000006.partial"], explain(proc)

    # 2. Relaunch: the unfinished save is dropped, step 4 loaded; rank 0 dies in step 7.
    proc = run_trainer([config], 2, env={FAULT: "kill:rank=0:step=7:at=step"})
    assert proc.returncode != 0
    assert "removing step_00000006.partial: a save that never committed" in proc.stdout, explain(proc)
    assert "resumed from step_00000004 (step 4)" in proc.stdout
    assert checkpoints(run) == ["step_00000004", "step_00000006"]  # keep_last=2 pruned step 2

    # 3. The newest checkpoint is truncated: skipped with a warning, step 4 loaded instead.
    shard = max((run / "checkpoints" / "step_00000006").glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    proc = run_trainer([config], 2)
    assert proc.returncode == 0, explain(proc)
    assert "warning: skipping checkpoint step_00000006: file" in proc.stdout and "(truncated?)" in proc.stdout
    assert "resumed from step_00000004 (step 4)" in proc.stdout

    # The loss curve, then weights and optimizer state, equal the uninterrupted run's.
    columns = ("step", "loss", "lr", "grad_norm", "skipped")
    assert [[r[c] for c in columns] for r in steps(run)] == [[r[c] for c in columns] for r in steps(reference)]
    got, want = final_state(run, tmp_path), final_state(reference, tmp_path)
    for part in ("model", "optim"):
        assert got[part].keys() == want[part].keys()
        for key, value in want[part].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[part][key], value), key
