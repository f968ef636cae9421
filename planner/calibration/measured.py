"""Measured runs as planner inputs: a reference-trainer run record or a published row becomes a
``Measurement`` (what ran, on what, and what was measured), which calibration fits and
validation compares against.

Reading run records needs no torch (planner.calibration.record has no torch import).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.calibration.published import PublishedRun, load_published
from planner.core.layout import LAYOUT_DIMS, Job, Layout
from planner.core.model import ModelSpec
from planner.core.step_parts import measured_parts
from planner.errors import PlannerError
from planner.hardware import HardwareProfile, get_profile, profile_names

# Every ModelSpec field a record carries (older records: the dense shape only; the rest default).
MODEL_KEYS = tuple(ModelSpec.__dataclass_fields__)
LAYOUT_KEYS = tuple(d.name for d in LAYOUT_DIMS)  # every layout dimension, as the run record names it
_JOB = Job()  # the declared defaults (LoRA r, alpha, targets) for records that predate them


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    label: str
    source: str
    model: ModelSpec
    layout: Layout
    job: Job
    gpus: int
    device_kind: str  # "cuda", "cpu", or "published"
    device_name: str
    hardware_profile: str | None  # the planner profile the run names, if any
    step_s: float
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    memory_kind: str | None = None  # "cuda" (allocated) is comparable with the planner's total; CPU RSS is not
    bubble_fraction: float | None = None
    comm_fraction: float | None = None
    # Seconds per step part (planner.core.step_parts.measured_parts; None: not measured) and the
    # step they add up to (the record's mean over measured steps and ranks).
    parts: dict | None = None
    parts_step_s: float | None = None
    record_path: str | None = None  # the record it came from: where a profile file it names is looked for


def from_record(rec: dict, source: str) -> Measurement:
    """A validated run record (planner.calibration.record.load_record) as a Measurement. The
    reference trainer runs plain PyTorch ops (no fused kernels): the ``reference`` stack."""
    model = ModelSpec(**{k: rec["model"][k] for k in MODEL_KEYS if k in rec["model"]})
    layout = Layout(**{k: rec["layout"][k] for k in LAYOUT_KEYS})
    mode = _section(rec, "training").get("mode", "pretrain")
    lora = _section(rec, "lora")
    job = Job(precision=rec["precision"], attention=rec["attention"], global_batch=layout.global_batch,
              mode=mode if mode in ("pretrain", "full-finetune", "lora") else "pretrain",
              lora_r=int(lora.get("r", _JOB.lora_r)), lora_alpha=float(lora.get("alpha", _JOB.lora_alpha)),
              lora_targets=tuple(lora.get("targets", _JOB.lora_targets)), stack="reference")
    hw = rec["hardware"]
    profile = _profile_name(_section(rec, "profile").get("hardware_profile"))
    mem = rec["memory"]
    parts = measured_parts(rec["breakdown_s"], layout.tp, layout.dp * layout.cp, hw["device_kind"])  # grads over dp*cp
    total = sum(parts[k] or 0.0 for k in ("compute", "bubble", "optimizer", "data_wait", "other", "_comm"))
    return Measurement(label=rec["run_name"], source=source, model=model, layout=layout, job=job,
                       gpus=int(hw["device_count"]), device_kind=hw["device_kind"], device_name=hw["device_name"],
                       hardware_profile=profile, step_s=float(rec["step_time_s"]["median"]),
                       tokens_per_s=rec["tokens_per_s"], mfu=rec["mfu"],
                       peak_memory_bytes=float(mem["peak_allocated_bytes"]), memory_kind=mem["kind"],
                       bubble_fraction=rec["bubble_fraction"], comm_fraction=rec["comm_share"],
                       parts=parts, parts_step_s=total if total > 0 else None, record_path=source)


def _section(rec: dict, name: str) -> dict:
    """A section of the record's run config, {} when absent or not a mapping."""
    config = rec.get("config")
    value = config.get(name) if isinstance(config, dict) else None
    return value if isinstance(value, dict) else {}


def _profile_name(name: object) -> str | None:
    """The record's profile reference, checked for type (it is resolved when it is used:
    ``profile_reference``; a run compared on a profile given by hand never reads it)."""
    if name is not None and (not isinstance(name, str) or not name.strip() or "\x00" in name):
        raise ValueError(f"config.profile.hardware_profile={name!r}: expected a profile name or a .toml file")
    return name


def profile_reference(name: str, record: Path) -> str:
    """The hardware profile a record names, as get_profile takes it: a profile name as written, a
    file as its resolved path. A file is looked up beside the record (its run folder and the sweep
    folder above it), then from the project root (records name profiles relative to it) and the
    working directory, and is accepted only inside the project's profile folders or the record's
    own folders: a record cannot make the planner read an arbitrary file (PlannerError otherwise)."""
    from planner.hardware import profile_dirs

    field = "config.profile.hardware_profile"
    name = _profile_name(name)
    if not (name.endswith(".toml") or "/" in name):
        return name
    here = record.resolve().parent
    own = [here, here.parent]
    allowed = [d.resolve() for d in profile_dirs()] + own
    project = Path(__file__).resolve().parents[2]
    bases = [Path("/")] if Path(name).is_absolute() else [*own, project, Path.cwd()]
    found = [(base / name).resolve() for base in bases if (base / name).is_file()]
    for path in found:
        if path.suffix == ".toml" and any(path.parent == root for root in allowed):
            return str(path)
    where = "the project's profile folders or the record's folder"
    if found:
        raise PlannerError(field, name, f"a profile file is read only from {where} ({found[0]} is not); "
                                        "pass --gpu to name a profile yourself")
    raise PlannerError(field, name, f"no such profile file in {where} (or from the project root); "
                                    "pass --gpu to name a profile yourself")


def record_paths(paths: list[str]) -> list[Path]:
    """Run folders, record.json files, or folders of runs (every */record.json beneath)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir() and (p / "record.json").exists():
            out.append(p / "record.json")
        elif p.is_dir():
            found = sorted(p.glob("*/record.json")) or sorted(p.glob("**/record.json"))
            if not found:
                raise PlannerError("runs", str(p), "no record.json in this folder or below")
            out.extend(found)
        else:
            out.append(p)
    return out


def load_measurements(paths: list[str], strict: bool = False, completed_only: bool = True,
                      resolve_profiles: bool = False) -> tuple[list[Measurement], list[str]]:
    """Measurements from run records; a record that is malformed, of another schema version, or
    missing fields is named in one line and skipped (``strict``: raise instead). ``resolve_profiles``
    (when no profile is given by hand): a record whose profile may not be read, does not load, is not
    found or lacks the run's precision is skipped too."""
    from planner.calibration.record import load_record

    runs: list[Measurement] = []
    skipped: list[str] = []
    for path in record_paths(paths):
        try:
            rec = load_record(path)
            if completed_only and rec["status"] != "completed":
                raise ValueError(f"run status is {rec['status']!r}, not 'completed'")
            run = from_record(rec, str(path))
            if resolve_profiles:  # the profile it names (or matches) loads, and has its precision
                profile_with_precision(run, None)
            runs.append(run)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, PlannerError) as exc:
            line = f"{path}: {exc}"
            if strict:
                raise PlannerError("runs", str(path), f"bad run record ({exc})") from None
            skipped.append(line)
    return runs, skipped


def from_published(runs: list[PublishedRun], source: str) -> list[Measurement]:
    return [Measurement(label=r.label, source=source, model=r.model, layout=r.layout, job=r.job, gpus=r.gpus,
                        device_kind="published", device_name=r.gpu, hardware_profile=r.gpu,
                        step_s=r.measured_step_s, tokens_per_s=r.layout.global_batch * r.model.seq_len
                        / r.measured_step_s)
            for r in runs]


def published_measurements(path: str) -> list[Measurement]:
    """A published-results CSV with the columns of megatron2021_table1.csv."""
    return from_published(load_published(path), str(path))


def profile_for(run: Measurement, override: HardwareProfile | None) -> HardwareProfile:
    if override is not None:
        return override
    if run.hardware_profile:  # a file only from the project's profile folders or beside the record
        record = run.record_path and Path(run.record_path)
        return get_profile(profile_reference(run.hardware_profile, record) if record else run.hardware_profile)
    for name in profile_names():
        if get_profile(name).gpu.model.lower() == run.device_name.lower():
            return get_profile(name)
    raise PlannerError("gpu", run.device_name, f"no profile matches run {run.label}; pass --gpu PROFILE "
                                               "(a probed or calibrated one for CPU runs)")


def profile_with_precision(run: Measurement, override: HardwareProfile | None) -> HardwareProfile:
    """``profile_for``, refused (one line) when the profile has no rate for the run's precision."""
    hw = profile_for(run, override)
    if not hw.gpu.supports(run.job.precision):
        have = ", ".join(p for p in hw.gpu.peak_flops if hw.gpu.supports(p))
        raise PlannerError("gpu", hw.name, f"has no {run.job.precision} tensor rate (its {run.job.precision}_tflops "
                                           f"is 0; it has {have}), and run {run.label} ran in {run.job.precision}")
    return hw
