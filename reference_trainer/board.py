"""The planner's prediction for a run's own layout, and the TensorBoard board that shows it beside
each measured figure while the run goes (the explorer's live view, planner/app/live.py, reads
the same event files)."""

from __future__ import annotations

import math

from planner.core.step_parts import STEPTIME_FIELDS


def predicted(config, device_name: str, world: int) -> tuple[dict[str, float] | None, str | None]:
    """The planner's step time and its parts (planner.core.step_parts) for this run's model and
    layout, on ``profile.hardware_profile`` or the profile whose GPU is the device found; or None
    and why."""
    from planner.core.evaluate import evaluate
    from planner.core.layout import Candidates, Job
    from planner.core.step_parts import predicted_parts
    from planner.errors import PlannerError
    from planner.hardware import get_profile, profile_names

    name = config.profile.hardware_profile
    if name is None:
        name = next((n for n in profile_names() if get_profile(n).gpu.model.lower() == device_name.lower()), None)
    if name is None:
        return None, "no planner prediction: no hardware profile names this device (set profile.hardware_profile)"
    tr, lay = config.training, config.layout
    lora = config.lora if tr.mode == "lora" else None
    try:
        hw = get_profile(name)
        job = Job(precision=tr.precision, attention=config.attention, global_batch=lay.global_batch, mode=tr.mode,
                  stack="reference", **({"lora_r": lora.r, "lora_alpha": lora.alpha, "lora_targets": lora.targets}
                                      if lora is not None else {}))
        ev = evaluate(config.spec, hw, job, Candidates.from_layouts([lay]), world)
    except (PlannerError, ValueError, KeyError) as exc:
        return None, f"no planner prediction: {exc}"
    parts = predicted_parts(ev.time, 0, hw.efficiency.step_overhead_s)
    return {"step_s": float(ev.step_s[0]), **{f"{k}_s": v for k, v in parts.items()}}, None


class Board:
    """TensorBoard event files (``torch.utils.tensorboard``) under ``folder``, written by rank 0
    as the run goes: loss, lr, gradient norm, the step's timers, the traced steps' breakdown,
    NVML utilisation / memory / power, and beside each timing the planner's prediction for the
    same layout (tag ``.../predicted``), so drift from the plan shows while the run goes.
    ``open`` returns a reason instead when tensorboard is not installed."""

    def __init__(self, folder, prediction: dict[str, float] | None, metrics=None):
        self.folder, self.prediction, self.writer = folder, prediction, None
        self.metrics = metrics  # a reference_trainer.metrics.MetricsServer, or None

    def open(self) -> str | None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            return f"TensorBoard not written: {exc} (pip install tensorboard)"
        self.writer = SummaryWriter(log_dir=str(self.folder), flush_secs=5)
        return None

    def write(self, row: dict, analysis: dict | None, nvml_memory_bytes: float | None = None) -> None:
        if self.writer is None and self.metrics is None:
            return
        step, pred = row["step"], self.prediction or {}
        scalars = {"train/loss": row["loss"], "train/lr": row["lr"], "train/grad_norm": row["grad_norm"],
                   "train/loss_scale": row["loss_scale"], "throughput/tokens_per_s": row["tokens_per_s"],
                   "step_time_s/measured": row["step_s"], "step_time_s/predicted": pred.get("step_s"),
                   "timers_s/data_wait": row["data_wait_s"], "timers_s/fwd_bwd": row["fwd_bwd_s"],
                   "timers_s/optimizer": row["optimizer_s"], "timers_s/optimizer_predicted": pred.get("optimizer_s"),
                   "gpu/util_percent": row.get("gpu_util_percent"), "gpu/power_w": row.get("power_w"),
                   "gpu/memory_used_bytes": nvml_memory_bytes}
        if analysis:  # a traced step: where the forward-backward window went, and the plan's parts
            tp = analysis.get("comm_exposed_tp_s", 0.0)
            scalars.update({"breakdown_s/compute": analysis["fwd_bwd_s"] - analysis["comm_exposed_s"]
                            - analysis["bubble_s"], "breakdown_s/comm_exposed": analysis["comm_exposed_s"],
                            "breakdown_s/comm_exposed_tp": tp, "breakdown_s/bubble": analysis["bubble_s"],
                            "breakdown_s/comm_total": analysis["comm_total_s"]})
        for part in STEPTIME_FIELDS:
            if f"{part}_s" in pred:
                scalars[f"breakdown_s/{part}_predicted"] = pred[f"{part}_s"]
        if self.metrics is not None:
            self.metrics.update(scalars, step)
        if self.writer is None:
            return
        for tag, value in scalars.items():
            if value is not None and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None
