"""One step's pieces, each against a hand-derived value: the learning-rate schedule's end points,
when gradients are reduced, the loader's prefetch depth, the activation-checkpointing saving and
the troubleshooting flags. All in this process: no torchrun."""

from __future__ import annotations

import itertools
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from planner.core.model import ModelSpec
from reference_trainer.config import TrainingConfig
from reference_trainer.data import TokenSource, make_loader
from reference_trainer.model import GPT, loss_fn
from reference_trainer.parallel import apply_recompute
from reference_trainer.record import _flags
from reference_trainer.step import Stepper, lr_at


# --- learning rate -----------------------------------------------------------------------------
@pytest.mark.parametrize("steps,warmup", [(10, 2), (6, 0), (100, 10), (4, 2)])
def test_lr_end_points(steps, warmup):
    tr = TrainingConfig(steps=steps, warmup_steps=warmup, lr=3e-4, min_lr_ratio=0.1)
    if warmup:
        assert lr_at(0, tr) == pytest.approx(3e-4 / warmup)  # the first of `warmup` linear steps
        assert lr_at(warmup - 1, tr) == pytest.approx(3e-4)
    assert lr_at(warmup, tr) == pytest.approx(3e-4)  # cosine starts at the peak
    assert lr_at(steps - 1, tr) == pytest.approx(3e-5)  # and ends at min_lr_ratio * lr on the last step
    lrs = [lr_at(i, tr) for i in range(warmup, steps)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_lr_midpoint_is_halfway():
    # 2 warm-up steps, then steps 2..10 (progress 0..1): step 6 is progress 1/2, cos = 0.
    tr = TrainingConfig(steps=11, warmup_steps=2, lr=1.0, min_lr_ratio=0.0)
    assert lr_at(6, tr) == pytest.approx(0.5)


# --- gradient reduction ------------------------------------------------------------------------
class _Layout:
    def __init__(self, zero_stage):
        self.zero_stage = zero_stage


class _Fsdp:
    """What FSDP2 offers: set_requires_gradient_sync (recorded)."""

    def __init__(self):
        self.calls = []

    def set_requires_gradient_sync(self, flag):
        self.calls.append(flag)


class _Ddp:
    def __init__(self):
        self.entered = 0

    def no_sync(self):
        self.entered += 1
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # any context manager


def _sync_flags(zero_stage, model, m=4):
    stub = type("S", (), {"layout": _Layout(zero_stage)})()
    for k in range(m):
        with Stepper._sync(stub, model, last=k == m - 1):
            pass
    return model


@pytest.mark.parametrize("zero,expected", [(0, [False, False, False, True]), (1, [False, False, False, True]),
                                           (2, [True] * 4), (3, [True] * 4)])
def test_fsdp_reduces_on_the_last_micro_batch_only_for_zero_0_and_1(zero, expected):
    # ZeRO 0 with tp > 1 is FSDP2 with a shard group of one (parallel.apply_dp): it must not
    # all-reduce gradients on every micro-batch (issue 13).
    assert _sync_flags(zero, _Fsdp()).calls == expected


def test_ddp_skips_the_reduction_before_the_last_micro_batch():
    assert _sync_flags(0, _Ddp(), m=4).entered == 3


# --- loader ------------------------------------------------------------------------------------
class _CountingSource(TokenSource):
    """Leaves a file per sample read (the loader's workers are other processes)."""

    def __init__(self, folder: Path, **kw):
        super().__init__(**kw)
        self.folder = folder

    def sample(self, index: int) -> np.ndarray:
        (self.folder / f"{index}").touch()
        return super().sample(index)


def _settled_count(folder: Path, at_least: int, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while len(list(folder.iterdir())) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # anything beyond the depth would show up now
    return len(list(folder.iterdir()))


@pytest.mark.parametrize("prefetch_samples,expected_steps", [(1, 1), (3, 2), (6, 3)])
def test_prefetch_depth(tmp_path, prefetch_samples, expected_steps):
    # One worker, steps of 2 samples: ceil(prefetch / 2) steps are loaded ahead of the one consumed.
    source = _CountingSource(tmp_path, seed=1, vocab=50, seq_len=8)
    loader = make_loader(source, start_step=0, global_batch=2, micro_batch=1, micro_batches=2, dp_rank=0,
                         workers=1, prefetch_samples=prefetch_samples, pin_memory=False)
    assert tuple(next(loader).shape) == (2, 9)
    ahead = expected_steps + 1  # the one handed over, plus the depth refilled
    assert _settled_count(tmp_path, 2 * ahead) == 2 * ahead
    del loader


def test_loader_workers_are_spawned_not_forked(tmp_path):
    # A fork of the training process (other threads running: gloo, torch.distributed) can leave
    # the worker deadlocked in CPython's after-fork child (gh-112275, CPython before 3.11.10):
    # seen as a tp2 run stuck before its first step, its worker hung in PyOS_AfterFork_Child.
    # The workers are spawned instead, as children of this process (so that they end with it).
    tokens = np.arange(1000, dtype=np.uint16) % 50
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    source = TokenSource(seed=3, vocab=50, seq_len=8, path=str(path), dtype="uint16")
    source.sample(0)  # the parent has mapped the file: the worker must map it itself, not get a copy
    assert source.__getstate__()["_tokens"] is None
    plain = make_loader(source, start_step=4, global_batch=2, micro_batch=1, micro_batches=2, dp_rank=0,
                        workers=0, prefetch_samples=1, pin_memory=False)
    loader = make_loader(source, start_step=4, global_batch=2, micro_batch=1, micro_batches=2, dp_rank=0,
                         workers=1, prefetch_samples=1, pin_memory=False)
    assert torch.equal(next(loader), next(plain)) and torch.equal(next(loader), next(plain))
    it = loader.gi_frame.f_locals[".0"]  # the DataLoader's iterator, which the generator reads
    for worker in it._workers:
        stat = Path(f"/proc/{worker.pid}/stat")
        if stat.exists():  # Linux: spawned (multiprocessing.spawn's entry point), this process's child
            assert int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
            assert b"spawn_main" in Path(f"/proc/{worker.pid}/cmdline").read_bytes()
    del it, loader, plain


def test_memmapped_tokens_are_read_in_windows(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16) % 50
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    source = TokenSource(seed=3, vocab=50, seq_len=8, path=str(path), dtype="uint16")
    assert source.num_samples == (1000 - 1) // 8
    sample = source.sample(5)
    assert sample.tolist() == [(40 + i) % 50 for i in range(9)]  # offset 5 * 8, seq_len + 1 tokens


# --- activation checkpointing ------------------------------------------------------------------
def _saved_activation_bytes(recompute: str) -> int:
    """Bytes autograd keeps for backward after one forward of a 4-layer model (each storage
    counted once; parameters left out). Checkpointed regions keep only their inputs."""
    spec = ModelSpec(arch="gpt", layers=4, hidden=128, heads=4, vocab=64, seq_len=256, dropout=0.0)
    torch.manual_seed(0)
    model = GPT(spec, attention="standard")
    apply_recompute(model, recompute)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, 64, (4, 256))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(x), x)
    loss.backward()
    return sum(seen.values())


def test_recompute_saves_activation_memory():
    # Korthikanti et al. 2022, per layer: 34*s*b*h + 5*a*s^2*b without recompute, 34*s*b*h with
    # selective, 2*s*b*h with full (only the layer input kept). Here s=256, b=4, h=128, a=4:
    # 5*a*s/h = 40, so selective keeps 34/74 = 46% and full 2/74 = 2.7% of the no-recompute
    # activations. This eager model saves more than Megatron's fused kernels do (measured: 67%
    # and 6.6%), so the bounds leave room: selective under 85%, full under 15%.
    none, full, selective, half, quarter = (_saved_activation_bytes(r)
                                            for r in ("none", "full", "selective", "half", "quarter"))
    assert full < 0.15 * none
    assert selective < 0.85 * none
    assert full < selective
    # half: layers 2 and 4 of the 4 checkpointed (torchtitan's selective layer AC counts so), 1 and
    # 3 keeping all; quarter: layer 4 alone. The planner's per-layer share of none and full, within 5%.
    assert half == pytest.approx((none + full) / 2, rel=0.05)
    assert quarter == pytest.approx(0.75 * none + 0.25 * full, rel=0.05)


# --- troubleshooting flags ---------------------------------------------------------------------
def _rec(comm, bubble, data_wait):
    return {"comm_share": comm, "bubble_fraction": bubble, "data_wait_share": data_wait,
            "loss": {"any_nonfinite": False, "nonfinite_steps": 0},
            "memory": {"capacity_bytes": 100, "peak_reserved_bytes": 50}}


def test_flags_fire_past_their_limits_and_not_below():
    assert _flags(_rec(0.14, 0.14, 0.09)) == []
    fired = {f["check"]: f for f in _flags(_rec(0.20, 0.30, 0.12))}
    assert set(fired) == {"comm_share", "bubble_fraction", "data_wait_share"}
    assert fired["comm_share"]["limit"] == 0.15 and fired["bubble_fraction"]["limit"] == 0.15
    assert fired["data_wait_share"]["limit"] == 0.10 and "prefetch" in fired["data_wait_share"]["advice"]
    assert not math.isnan(fired["bubble_fraction"]["value"])


def test_allocator_retries_are_flagged_and_a_cpu_run_has_none():
    rec = _rec(0.1, 0.1, 0.05)
    assert _flags(rec) == []
    rec["memory"]["alloc_retries"] = None  # a CPU run: nothing to count
    assert _flags(rec) == []
    rec["memory"]["alloc_retries"] = 3
    fired = {f["check"]: f for f in _flags(rec)}
    assert set(fired) == {"alloc_retries"} and fired["alloc_retries"]["value"] == 3
    assert "expandable_segments" in fired["alloc_retries"]["advice"]


def test_the_record_summarises_allocator_retries_as_the_most_of_any_rank():
    from reference_trainer.record import _memory

    ranks = [{"memory": {"kind": "cuda", "peak_allocated_bytes": 10, "peak_reserved_bytes": 12, "capacity_bytes": 100,
                         "alloc_retries": r}} for r in (0, 4, 1)]
    assert _memory(ranks)["alloc_retries"] == 4
    cpu = [{"memory": {"kind": "cpu_rss", "peak_allocated_bytes": 10, "peak_reserved_bytes": None,
                       "capacity_bytes": None, "alloc_retries": None}}]
    assert _memory(cpu)["alloc_retries"] is None


@pytest.mark.slow
def test_a_run_from_a_memmapped_token_file(single_sweep):
    from reference_trainer.record import load_record
    from tests.trainer.helpers import column, explain

    runs, proc = single_sweep
    rec = load_record(runs / "gpt-memmap")
    assert rec["status"] == "completed", explain(proc)
    assert rec["config"]["data"]["path"].endswith("tokens.bin")
    loss = column(runs / "gpt-memmap", "loss")
    # A ramp mod 97 is learnable in context: 10 steps at lr 1e-3 bring the loss well below the
    # untrained log(vocab) = log(512) = 6.24.
    assert loss[0] == pytest.approx(math.log(512), abs=0.5) and loss[-1] < loss[0] - 0.5
