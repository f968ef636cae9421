"""Small builders shared by the planner tests."""

from __future__ import annotations

from planner.evaluate import Evaluation, evaluate
from planner.hardware import get_profile
from planner.layout import Candidates, Job, Layout
from planner.model import ModelSpec


def evaluate_one(model: ModelSpec, layout: Layout, job: Job = Job(), gpu: str = "a100-80g") -> Evaluation:
    return evaluate(model, get_profile(gpu), job, Candidates.from_layouts([layout]), layout.gpus)
