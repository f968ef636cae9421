"""Crashes: kill -9 one rank mid-save, then another mid-run, truncate the newest checkpoint, and
relaunch each time with auto_resume: the run ends with exactly the uninterrupted run's loss
curve, weights and optimizer state (same layout, same seed: bitwise). Then the crash series of
benchmarks/crash_resume.py (whole job and launcher alone killed at random points, mid-save
included; a checkpoint corrupted at the same size), the run-folder lock, a checkpoint of another
layout, and checkpoint files that would run code when unpickled."""

from __future__ import annotations

import importlib.util
import io
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.conftest import FAULT, checkpointed_config
from tests.trainer.helpers import explain, steps

pytestmark = pytest.mark.slow


def checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def final_state(run_dir, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{run_dir.name}.pt"
    dcp_to_torch_save(run_dir / "checkpoints" / "step_00000008", out)
    return torch.load(out, weights_only=True)


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


def crash_module():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "crash_resume.py"
    spec = importlib.util.spec_from_file_location("crash_resume", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_kills_resume_from_the_newest_good_checkpoint_bitwise(tmp_path):
    """4 kills (2 of the whole job, 2 of the launcher alone, mid-save among them), a finishing
    launch, then a same-size corruption of the newest checkpoint: every launch resumes from the
    newest good checkpoint, no rank outlives its launcher, steps.csv equals the uninterrupted run."""
    figures = crash_module().crash_series(tmp_path, kills=4, steps=8, seed=3, say=lambda _: None)
    assert figures["failures"] == []
    assert figures["kills"] == 4 and figures["launcher_only"] == 2 and figures["orphans"] == 0
    assert figures["resumed_from_newest"] == figures["launches"] == 6
    assert figures["mid_save"] >= 1 and figures["identical"]


def test_a_live_run_locks_its_folder_and_a_dead_ones_lock_is_taken_over(tmp_path):
    from reference_trainer.faults import RunLock

    folder = tmp_path / "run"
    code = (f"import time; from reference_trainer.faults import RunLock; RunLock({str(folder)!r}).acquire(); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    busy = RunLock(folder).acquire()
    assert busy is not None and "in use by a live run" in busy and f'"pid": {holder.pid}' in busy
    assert RunLock(folder).probe() == busy
    holder.kill()
    holder.wait()
    holder.stdout.close()
    said = []
    lock = RunLock(folder)
    assert lock.probe() is None and lock.acquire(said.append) is None
    assert len(said) == 1 and said[0].startswith(f"taking over the lock of {folder}") and str(holder.pid) in said[0]
    lock.release()
    assert RunLock(folder).acquire(said.append) is None and len(said) == 1  # a clean release: nothing to say


def test_a_checkpoint_of_another_layout_exits_2_and_keeps_its_checkpoints(tmp_path):
    from tests.trainer.helpers import TINY_GPT, run_trainer, write_config

    ckpt = {"checkpoint": {"interval": 2, "keep_last": 1, "dir": str(tmp_path / "ckpt")}, "training": {"steps": 2}}
    first = write_config(tmp_path, "a", {**TINY_GPT, "layers": 2}, {"dp": 1}, **ckpt)
    assert run_trainer([first], 1).returncode == 0
    other = write_config(tmp_path, "b", {**TINY_GPT, "layers": 2}, {"dp": 1, "micro_batch": 1}, **ckpt)
    proc = run_trainer([other], 1)
    assert proc.returncode == 2, explain(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "written by another layout" in lines[0] and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000002"]


class _Payload:
    def __reduce__(self):
        return (print, ("this ran",))


def test_checkpoint_metadata_and_extra_state_never_run_code():
    from reference_trainer.checkpoint import _MetadataUnpickler

    with pytest.raises(pickle.UnpicklingError, match="builtins.print, which is not allowed"):
        _MetadataUnpickler(io.BytesIO(pickle.dumps(_Payload()))).load()
    blob = io.BytesIO()
    torch.save({"rng": torch.zeros(2), "payload": _Payload()}, blob)
    blob.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(blob, weights_only=True)


def test_steps_csv_is_cut_after_the_checkpoint_and_appended(tmp_path):
    from reference_trainer.record import CSV_COLUMNS, StepCsv

    path = tmp_path / "steps.csv"
    csv = StepCsv(path, keep_until=0)
    rows = [dict.fromkeys(CSV_COLUMNS, 0.5) | {"step": s, "skipped": 0, "traced": 0, "loss_scale": None}
            for s in (1, 2, 3)]
    for row in rows:
        csv.write(row)
    head = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b"4,0.5,0.")  # a half-written row from a killed launch
    resumed = StepCsv(path, keep_until=2)
    assert [r["step"] for r in resumed.rows] == [1, 2]
    assert head.startswith(path.read_bytes()) and path.read_bytes().count(b"\n") == 3  # header + 2 rows, cut
    resumed.write(rows[2])
    assert path.read_bytes() == head


def test_a_missing_record_is_rebuilt_and_a_corrupted_metadata_falls_back(tmp_path):
    """Killed between the final checkpoint and record.json: the relaunch rebuilds the record. Then
    DCP's .metadata is corrupted at the same size: skipped with a line, the previous checkpoint
    used, and the continuation equals the first launch's CSV."""
    import json

    from tests.trainer.helpers import TINY_GPT, run_trainer, write_config

    config = write_config(tmp_path, "r", {**TINY_GPT, "layers": 2}, {"dp": 1},
                          training={"steps": 4}, checkpoint={"interval": 2, "keep_last": 3})
    run = tmp_path / "runs" / "r"
    assert run_trainer([config], 1).returncode == 0
    columns = ("step", "loss", "lr", "grad_norm", "skipped")
    first = [[r[c] for c in columns] for r in steps(run)]
    (run / "record.json").unlink()
    proc = run_trainer([config], 1)
    assert proc.returncode == 0, explain(proc)
    assert "complete but its record is missing: rebuilding it from steps.csv" in proc.stdout
    assert json.loads((run / "record.json").read_text())["status"] == "completed_rebuilt"
    metadata = run / "checkpoints" / "step_00000004" / ".metadata"
    data = bytearray(metadata.read_bytes())
    data[len(data) // 2] ^= 0xFF
    metadata.write_bytes(bytes(data))
    proc = run_trainer([config], 1)
    assert proc.returncode == 0, explain(proc)
    assert ("warning: skipping checkpoint step_00000004: file .metadata does not match its sha256 in COMMIT.json "
            "(corrupted); moved to step_00000004.bad, using the previous one") in proc.stdout
    assert "resumed from step_00000002 (step 2)" in proc.stdout and "Traceback" not in proc.stderr
    assert [[r[c] for c in columns] for r in steps(run)] == first  # bitwise: floats read back from repr
    assert json.loads((run / "record.json").read_text())["status"] == "completed"


def test_pruning_keeps_the_newest_good_checkpoint(tmp_path):
    from reference_trainer.checkpoint import Checkpointer

    ckpt = object.__new__(Checkpointer)  # no process group needed for pruning
    ckpt.root, ckpt.keep_last = tmp_path, 1
    for step in (2, 4, 6):
        (tmp_path / f"step_{step:08d}").mkdir()
    (tmp_path / "step_00000008.bad").mkdir()
    ckpt.good = tmp_path / "step_00000002"  # e.g. the one resumed from, newer ones unverified
    ckpt._prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000006", "step_00000008.bad"]
