"""Small builders shared by the planner tests."""

from __future__ import annotations

import numpy as np

from planner.core.evaluate import Evaluation, evaluate
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.hardware import get_profile


def evaluate_one(model: ModelSpec, layout: Layout, job: Job = Job(), gpu: str = "a100-80g") -> Evaluation:
    return evaluate(model, get_profile(gpu), job, Candidates.from_layouts([layout]), layout.gpus)


def columns(ev: Evaluation) -> dict[str, np.ndarray]:
    """Every column of an evaluation (layout, memory and time parts, each stage's memory), to
    compare two evaluations bit for bit."""
    out = dict(ev.candidates.columns())
    for name, part in (("mem", ev.memory), ("time", ev.time), *((f"stage{i}", s) for i, s in enumerate(ev.stage_memory))):
        out.update({f"{name}.{f}": getattr(part, f) for f in part.__slots__})
    out.update(train_seconds=ev.train_seconds, fits=ev.fits, mfu=ev.mfu)
    return out


def assert_same(a: dict, b: dict) -> None:
    """Two ``columns`` results equal: the same names, dtypes, shapes and values."""
    assert a.keys() == b.keys()
    for k, x in a.items():
        assert x.dtype == b[k].dtype and x.shape == b[k].shape, k
        assert np.array_equal(x, b[k]), k
