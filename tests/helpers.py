"""Small builders shared by the planner tests."""

from __future__ import annotations

from planner.core.evaluate import Evaluation, evaluate
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.hardware import get_profile


def evaluate_one(model: ModelSpec, layout: Layout, job: Job = Job(), gpu: str = "a100-80g") -> Evaluation:
    return evaluate(model, get_profile(gpu), job, Candidates.from_layouts([layout]), layout.gpus)
