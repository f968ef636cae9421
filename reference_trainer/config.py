"""The run config: a YAML file with strict keys, checked in full before any process group starts.

No torch here: the launcher and ``python -m reference_trainer`` validate first, so a bad config
costs a fraction of a second and prints one line (exit code 2), never a traceback.

Three inputs, as in the planner: what to train (``model``: a planner ``ModelSpec``), how it runs
(``layout``: a planner ``Layout``; ``training``), and the run's plumbing (``data``,
``checkpoint``, ``profile``). README.md lists every key with its default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.core.layout import ATTENTION, GPU_FACTORS, JOB_OPTIONS, LAYOUT_DIMS, MODES, Layout
from planner.core.model import ModelSpec
from planner.core.pipeline import stage_layer_ranges
from planner.core.resilience import Operations
from planner.errors import PlannerError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # what the trainer runs (no fp8: no Transformer Engine here)
# The planner's declared defaults (planner.core.layout.Job, planner.core.resilience.Operations):
# the trainer's LoRA, mode, attention and checkpoint defaults are these, never a second copy.
JOB_DEFAULTS = {o.name: o.default for o in JOB_OPTIONS}
OPS_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Operations)}
# The layout dimensions this trainer runs (reference_trainer/parallel.py, step.py). Any other
# dimension declared in planner.core.layout (context parallel, ...) is accepted in a config and as
# a flag, and refused unless it keeps its default: a new dimension needs no trainer edit to parse.
TRAINER_DIMS = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "global_batch", "zero_stage", "recompute",
                "sequence_parallel", "schedule", "offload", "sharding")
LAYOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Layout)}
TOKEN_DTYPES = ("uint16", "uint32")
# A tiny shape that trains in seconds on a CPU (the default when no model is given).
DEBUG_MODEL = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 64}
SEED_MAX = 2**32 - 1
MAX_WORKERS = 64  # loader processes per rank
SPEC_KEYS = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.name != "name")
# The shape keys a model given by its shape must have (ModelSpec's fields without a default).
SHAPE_REQUIRED = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.name != "name"
                       and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


class ConfigError(ValueError):
    """A bad run config. ``str(error)`` is the one line the user sees."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingConfig:
    steps: int = 20
    precision: str = "fp32"
    lr: float = 6e-5  # GPT-3 175B's peak rate (Brown et al. 2020, Table 2.1)
    betas: tuple[float, float] = (0.9, 0.999)  # betas and eps: torch.optim.AdamW's defaults
    eps: float = 1e-8
    weight_decay: float = 0.01  # applied to matrices and embeddings, not to biases or norms
    warmup_steps: int = 2  # linear warm-up, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables it
    max_nonfinite_steps: int = 10  # this many non-finite steps in a row stop the run with a diagnosis
    init_loss_scale: float = 2.0**16  # fp16 only: the dynamic loss scaler's start and growth interval
    loss_scale_growth_interval: int = 2000
    mode: str = JOB_DEFAULTS["mode"]  # pretrain | full-finetune (train everything) | lora (frozen model + adapters)
    moe_aux_loss_coef: float = 0.0  # Switch load-balancing loss per MoE layer (0: off); e.g. 0.01 (Fedus et al. 2022)


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraConfig:
    """Used when training.mode is lora. Defaults: the planner's Job options (r=8, alpha=16 on q_proj
    and v_proj, as in Hu et al. 2021, Sec. 7.1, and PEFT's examples)."""

    r: int = JOB_DEFAULTS["lora_r"]
    alpha: float = JOB_DEFAULTS["lora_alpha"]
    targets: tuple[str, ...] = JOB_DEFAULTS["lora_targets"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    path: str | None = None  # a flat token file (np.memmap); None: the seeded synthetic stream
    dtype: str = "uint16"
    workers: int = 1  # DataLoader worker processes (0: load in the training process)
    prefetch_samples: int | None = None  # None: micro_batch x 4 samples per worker in flight
    pin_memory: bool | None = None  # None: on when training on a GPU


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    dir: str | None = None  # None: runs/<run_name>/checkpoints
    interval: int = 0  # steps between saves; 0: never (a final save happens when interval > 0)
    keep_last: int = OPS_DEFAULTS["keep_last"]
    auto_resume: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileConfig:
    warmup_steps: int = 2  # left out of the step-time statistics
    trace_steps: int = 2  # steps after warm-up traced with torch.profiler (communication, bubble)
    nvml_interval_s: float = 0.1
    hardware_profile: str | None = None  # planner profile for MFU; None: the GPU found, if a profile names it
    peak_tflops: float | None = None  # explicit peak per device (e.g. a CPU), overrides the profile
    tensorboard: bool = False  # TensorBoard event files under runs/<run_name>/tensorboard (rank 0)
    metrics_port: int | None = None  # Prometheus text endpoint /metrics on rank 0 (0: any free port)
    memory_fraction: float | None = None  # cap on each GPU process's memory (allocator-pressure runs); None: the whole GPU


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    run_name: str
    runs_dir: str = "runs"
    seed: int = 1234
    spec: ModelSpec  # its dropout is the model's (ModelSpec: 0.1 for gpt, 0 for llama by default)
    attention: str = JOB_DEFAULTS["attention"]
    layout: Layout
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    log_every: int = 1

    @property
    def world_size(self) -> int:
        return self.layout.gpus  # the product of the mesh degrees (dp*tp*pp...)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.run_name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (gradient accumulation)."""
        return self.layout.grad_accum

    @property
    def prefetch_samples(self) -> int:
        return self.data.prefetch_samples or 4 * self.layout.micro_batch


SECTIONS = {"training": TrainingConfig, "data": DataConfig, "checkpoint": CheckpointConfig,
            "profile": ProfileConfig, "lora": LoraConfig}
TOP_KEYS = ("run_name", "runs_dir", "seed", "model", "layout", "log_every", *SECTIONS)
MODEL_KEYS = ("name", "preset", "params", *SPEC_KEYS, "attention")
LAYOUT_KEYS = tuple(f.name for f in dataclasses.fields(Layout))


def _check_keys(where: str, data: object, allowed: tuple[str, ...]) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown key; allowed: {', '.join(allowed)}" if where else
                              f"{key}: unknown key; allowed: {', '.join(allowed)}")
    return dict(data)


def _typed(where: str, value: object, kind: str) -> object:
    """``value`` checked against a dataclass field's type ("int", "float | None", ...)."""
    base, optional = kind.removesuffix(" | None"), kind.endswith(" | None")
    if value is None and optional:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base == "float" and number:
        if not math.isfinite(value):  # inf passes "> 0" checks and would train NaNs (a rank's traceback)
            raise ConfigError(f"{where}={value!r}: a finite number")
        return float(value)
    if base == "bool" and isinstance(value, bool):
        return value
    if base == "str" and isinstance(value, str):
        return value
    if base == "tuple[str, ...]" and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if base == "tuple[str, ...]" and isinstance(value, str):  # "q_proj,v_proj"
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if base == "tuple[float, float]" and isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return (float(value[0]), float(value[1]))
    expected = {"tuple[float, float]": "two numbers, e.g. [0.9, 0.999]", "tuple[str, ...]": "a list of names",
                "int": "an integer", "float": "a number",
                "bool": "true or false", "str": "a string"}[base]
    raise ConfigError(f"{where}={value!r}: expected {expected}{' or null' if optional else ''}")


def _section(name: str, cls: type, data: object):
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    values = _check_keys(name, data, tuple(fields))
    return cls(**{k: _typed(f"{name}.{k}", v, fields[k]) for k, v in values.items()})


def resolve_spec(model: dict) -> ModelSpec:
    """A ModelSpec from the config's ``model`` section: a preset, a parameter count, or a shape;
    shape keys given next to a preset override the preset's (e.g. a shorter ``seq_len``)."""
    from planner.core.presets import get_preset, resolve_params
    from planner.units import parse_count

    shape = {k: model[k] for k in SPEC_KEYS if k in model}
    if model.get("preset") is not None and model.get("params") is not None:
        raise ConfigError("model: give preset or params, not both")
    if model.get("preset") is not None:
        base = get_preset(str(model["preset"]))
    elif model.get("params") is not None:
        base, _ = resolve_params(parse_count(model["params"], "model.params"))
    elif shape:
        missing = [k for k in SHAPE_REQUIRED if k not in shape]
        if missing:
            raise ConfigError(f"model.{missing[0]}: missing: a shape needs {', '.join(SHAPE_REQUIRED)} (given: "
                              f"{', '.join(shape)}), or give preset or params")
        base = ModelSpec(**shape)
        shape = {}
    else:
        base = ModelSpec(name="debug", **DEBUG_MODEL)
    if model.get("name") is not None:
        shape["name"] = _typed("model.name", model["name"], "str")
    return base.replace(**shape) if shape else base


def build_config(data: dict, *, default_name: str = "run") -> RunConfig:
    """A RunConfig from a parsed YAML mapping; raises ConfigError naming the bad key."""
    data = _check_keys("", data, TOP_KEYS)
    try:
        model = _check_keys("model", data.get("model"), MODEL_KEYS)
        spec = resolve_spec(model)
        layout_data = _check_keys("layout", data.get("layout"), LAYOUT_KEYS)
        if "sequence_parallel" in layout_data:
            _typed("layout.sequence_parallel", layout_data["sequence_parallel"], "bool")
        if model.get("tied_embeddings") is not None:
            _typed("model.tied_embeddings", model["tied_embeddings"], "bool")
        layout_data.setdefault("dp", 1)
        layout_data.setdefault("global_batch", layout_data["dp"] * layout_data.get("micro_batch", 1))
        layout = Layout(**layout_data)
        sections = {name: _section(name, cls, data.get(name)) for name, cls in SECTIONS.items()}
        config = RunConfig(run_name=_typed("run_name", data.get("run_name") or default_name, "str"), spec=spec,
                           layout=layout, runs_dir=_typed("runs_dir", data.get("runs_dir", "runs"), "str"),
                           seed=_typed("seed", data.get("seed", 1234), "int"),
                           attention=_typed("model.attention", model.get("attention", JOB_DEFAULTS["attention"]),
                                            "str"),
                           log_every=_typed("log_every", data.get("log_every", 1), "int"), **sections)
    except PlannerError as exc:
        raise ConfigError(str(exc)) from None
    except TypeError as exc:  # a wrong type that a dataclass rejected
        raise ConfigError(f"config: {exc}") from None
    validate(config)
    return config


def load_config(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read ({exc.strerror})") from None
    try:
        import yaml
    except ImportError:  # an image without PyYAML (benchmarks/gpu_session.py's): JSON, a subset of YAML, reads
        import json

        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config {path}: not JSON, and YAML needs PyYAML (pip install pyyaml): {exc}") from None
        return build_config(data or {}, default_name=path.stem)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return build_config(data or {}, default_name=path.stem)


def config_to_dict(config: RunConfig) -> dict:
    """The config as plain data (what the run record stores and the launcher writes as YAML)."""
    spec = config.spec
    model = {"name": spec.name, **{k: getattr(spec, k) for k in SPEC_KEYS}, "attention": config.attention}
    out = {"run_name": config.run_name, "runs_dir": config.runs_dir, "seed": config.seed, "model": model,
           "layout": {k: getattr(config.layout, k) for k in LAYOUT_KEYS}, "log_every": config.log_every}
    for name in SECTIONS:
        section = dataclasses.asdict(getattr(config, name))
        out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in section.items()}
    return out


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(config: RunConfig, world_size: int | None = None) -> None:
    """Every check that needs no process group. ``world_size``: the launched one, if known."""
    _check_run(config)
    _check_training(config)
    _check_layout(config)
    _check_data(config)
    _check_checkpoint_and_profile(config)
    if world_size is not None:
        _check_world(config, world_size)


def _check_run(config: RunConfig) -> None:
    _require(re.fullmatch(r"[A-Za-z0-9._-]+", config.run_name) is not None,
             f"run_name={config.run_name!r}: letters, digits, '.', '_' and '-' only")
    # numpy's generators take seeds >= 0; torch.manual_seed(seed + per-rank offsets) stays below 2**64.
    _require(0 <= config.seed <= SEED_MAX, f"seed={config.seed}: an integer from 0 to {SEED_MAX}")
    _require(config.attention in ATTENTION, f"model.attention={config.attention!r}: one of {', '.join(ATTENTION)}")


def _check_training(config: RunConfig) -> None:
    tr = config.training
    _require(tr.precision in PRECISIONS, f"training.precision={tr.precision!r}: one of {', '.join(PRECISIONS)}")
    _require(tr.steps >= 1, f"training.steps={tr.steps}: a positive integer")
    _require(0 <= tr.warmup_steps <= tr.steps,
             f"training.warmup_steps={tr.warmup_steps}: between 0 and steps={tr.steps}")
    _require(tr.lr > 0 and tr.eps > 0 and tr.weight_decay >= 0 and tr.grad_clip >= 0,
             "training: lr and eps must be > 0, weight_decay and grad_clip >= 0")
    _require(tr.moe_aux_loss_coef >= 0, f"training.moe_aux_loss_coef={tr.moe_aux_loss_coef}: zero (off) or more")
    _require(tr.moe_aux_loss_coef == 0 or config.layout.pp == 1,
             f"training.moe_aux_loss_coef={tr.moe_aux_loss_coef}: the load-balancing loss runs with pp = 1 here")
    _require(tr.max_nonfinite_steps >= 1, f"training.max_nonfinite_steps={tr.max_nonfinite_steps}: at least 1")
    _require(tr.mode in MODES, f"training.mode={tr.mode!r}: one of {', '.join(MODES)}")
    if tr.mode == "lora":
        _check_lora(config)


def _check_lora(config: RunConfig) -> None:
    from planner.core.finetune import trainable_params
    from planner.core.layout import Job

    try:
        trainable_params(config.spec, Job(mode="lora", lora_r=config.lora.r, lora_alpha=config.lora.alpha,
                                          lora_targets=config.lora.targets))
    except PlannerError as exc:
        raise ConfigError(f"lora.{exc}") from None
    _require(config.layout.tp == 1, f"layout.tp={config.layout.tp}: LoRA runs with tp = 1 here "
                                    "(the adapters are not tensor-parallel)")


def _check_layout(config: RunConfig) -> None:
    """What Layout itself does not check: the rules across dimensions and the model that the
    planner's search applies (planner.core.search), and the dimensions this trainer runs."""
    spec, lay = config.spec, config.layout
    for d in LAYOUT_DIMS:
        value, default = getattr(lay, d.name), LAYOUT_DEFAULTS[d.name]
        _require(d.name in TRAINER_DIMS or value == default,
                 f"layout.{d.name}={value}: the reference trainer does not run this dimension; leave it at {default}")
    dp_mb = lay.dp * lay.micro_batch
    _require(lay.global_batch % dp_mb == 0,
             f"layout.global_batch={lay.global_batch}: must be divisible by "
             f"dp*micro_batch={lay.dp}*{lay.micro_batch}={dp_mb}")
    for name, value in (("heads", spec.heads), ("kv_heads", spec.kv_heads), ("ffn_hidden", spec.ffn_hidden),
                        ("vocab", spec.vocab)):
        _require(value % lay.tp == 0, f"layout.tp={lay.tp}: must divide model {name}={value}")
    if lay.sequence_parallel:
        _require(spec.seq_len % lay.tp == 0,
                 f"layout.sequence_parallel: tp={lay.tp} must divide seq_len={spec.seq_len}")
    _require(lay.pp * lay.vpp <= spec.layers,
             f"layout.pp={lay.pp} x vpp={lay.vpp}: at most layers={spec.layers} stages (every stage needs a layer)")
    try:
        stage_layer_ranges(spec.layers, lay.pp, lay.vpp, lay.schedule)
    except PlannerError as exc:
        raise ConfigError(f"layout.{exc}") from None
    _check_schedule(config)
    _check_cp(config)
    _check_offload(config)
    _check_moe(config)
    if config.layout.sharding == "hybrid":  # the planner's rules (planner.core.search)
        lay = config.layout
        _require(lay.zero_stage >= 1, f"layout.sharding=hybrid: shards ZeRO states; needs zero_stage >= 1 "
                                      f"(got {lay.zero_stage})")
        _require(lay.ep == 1, f"layout.sharding=hybrid: not combined with expert parallel (ep={lay.ep})")


# ModelSpec variants of released models this trainer does not build (planner/core/model.py counts
# them): each must keep its default here.
UNBUILT_SPEC = {"router_bias": False, "kv_lora_rank": 0, "q_lora_rank": 0, "window": 0, "post_norms": False,
                "out_bias": False, "attention_sinks": False, "expert_bias": False, "chunked": False, "moe_every": 1,
                "linear_layers": 0, "output_gate": False, "global_head_dim": 0, "global_kv_heads": 0,
                "global_k_eq_v": False, "router_scale": False, "moe_norms": 0, "index_topk": 0,
                "parallel_block": False}


def _check_moe(config: RunConfig) -> None:
    """Mixture-of-experts and expert parallel (reference_trainer/moe.py)."""
    spec, lay = config.spec, config.layout
    for name, default in UNBUILT_SPEC.items():
        _require(getattr(spec, name) == default, f"model.{name}={getattr(spec, name)!r}: the reference trainer does "
                                                 f"not build this variant; leave it at {default!r}")
    if spec.qk_norm != "none":
        _require(lay.tp == 1, f"layout.tp={lay.tp}: model.qk_norm={spec.qk_norm!r} runs with tp = 1 here (its "
                              "norm weights would need their gradients summed over the tensor-parallel ranks)")
    if not spec.experts:
        _require(lay.ep == 1, f"layout.ep={lay.ep}: expert parallel needs an MoE model (model.experts > 0)")
        return
    _require(lay.tp == 1, f"layout.tp={lay.tp}: the reference trainer runs MoE models with tp = 1 "
                          "(no expert-tensor parallel); use dp, cp, ep or pp")
    ranks = lay.dp * lay.cp
    _require(ranks % lay.ep == 0, f"layout.ep={lay.ep}: must divide dp*cp={lay.dp}*{lay.cp}={ranks} "
                                  "(expert parallel is carved out of those ranks)")
    _require(spec.experts % lay.ep == 0, f"layout.ep={lay.ep}: must divide model experts={spec.experts}")
    if lay.ep > 1:
        _require(config.checkpoint.interval == 0, f"checkpoint.interval={config.checkpoint.interval}: checkpoints "
                                                  "are not written with expert parallel (ep > 1); set interval 0")


def _check_offload(config: RunConfig) -> None:
    """Optimizer offload runs (reference_trainer/offload.py); parameter offload does not."""
    off = config.layout.offload
    _require(off in ("none", "optimizer"), f"layout.offload={off!r}: the reference trainer offloads the optimizer "
                                           "(states and fp32 masters) only; use none or optimizer")
    if off == "optimizer":
        _require(config.checkpoint.interval == 0, f"checkpoint.interval={config.checkpoint.interval}: checkpoints are "
                                                  "not written with layout.offload=optimizer; set interval 0")


def _check_cp(config: RunConfig) -> None:
    """Context parallel: 2*cp equal chunks of each sequence (reference_trainer/context.py)."""
    spec, lay = config.spec, config.layout
    if lay.cp == 1:
        return
    _require(spec.seq_len % (2 * lay.cp) == 0,
             f"layout.cp={lay.cp}: seq_len={spec.seq_len} must divide into 2*cp={2 * lay.cp} load-balanced chunks")
    if lay.sequence_parallel:
        local = spec.seq_len // lay.cp
        _require(local % lay.tp == 0, f"layout.sequence_parallel: tp={lay.tp} must divide the tokens per cp rank "
                                      f"seq_len/cp={local}")


def _check_schedule(config: RunConfig) -> None:
    lay, m = config.layout, config.micro_batches
    if lay.schedule == "dualpipev" and lay.pp > 1:  # torch's ScheduleDualPipeV
        _require(lay.vpp == 2, f"layout.vpp={lay.vpp}: DualPipeV runs two stages per rank (vpp 2)")
        _require(m >= 2 * lay.pp, f"layout: DualPipeV needs micro-batches per step m={m} >= 2*pp={2 * lay.pp} "
                                  "(global_batch / (dp*micro_batch))")
    elif lay.vpp > 1:
        _require(lay.pp > 1 and lay.schedule == "1f1b",
                 f"layout.vpp={lay.vpp}: interleaving needs pp > 1 and schedule 1f1b")
        rounds = max(1, m // lay.pp)
        _require(m % rounds == 0, f"layout: interleaved 1F1B needs micro-batches per step m={m} to be a multiple of "
                                  f"max(1, m // pp)={rounds}; choose global_batch so m is a multiple of pp={lay.pp}")
    elif lay.pp > 1 and lay.schedule == "1f1b":
        _require(m >= lay.pp, f"layout: 1F1B needs micro-batches per step m={m} >= pp={lay.pp} "
                              f"(global_batch / (dp*micro_batch)); use schedule gpipe or a larger global_batch")


def _check_data(config: RunConfig) -> None:
    d = config.data
    _require(d.dtype in TOKEN_DTYPES, f"data.dtype={d.dtype!r}: one of {', '.join(TOKEN_DTYPES)}")
    _require(0 <= d.workers <= MAX_WORKERS, f"data.workers={d.workers}: from 0 to {MAX_WORKERS}")
    _require(d.prefetch_samples is None or d.prefetch_samples >= 1,
             f"data.prefetch_samples={d.prefetch_samples}: at least 1")
    if d.path is not None:
        path = Path(d.path)
        _require(path.is_file(), f"data.path={d.path!r}: no such file")
        itemsize = 2 if d.dtype == "uint16" else 4
        seq_len = config.spec.seq_len
        _require(path.stat().st_size // itemsize > seq_len,
                 f"data.path={d.path!r}: fewer than seq_len+1={seq_len + 1} tokens of {d.dtype}")


def _check_checkpoint_and_profile(config: RunConfig) -> None:
    c = config.checkpoint
    _require(c.interval >= 0, f"checkpoint.interval={c.interval}: zero (never) or a positive number of steps")
    _require(c.keep_last >= 1, f"checkpoint.keep_last={c.keep_last}: at least 1")
    p = config.profile
    _require(p.warmup_steps >= 0 and p.trace_steps >= 0, "profile.warmup_steps and trace_steps: zero or more")
    _require(p.nvml_interval_s > 0, f"profile.nvml_interval_s={p.nvml_interval_s}: greater than zero")
    _require(p.metrics_port is None or (isinstance(p.metrics_port, int) and not isinstance(p.metrics_port, bool)
                                        and 0 <= p.metrics_port <= 65535),
             f"profile.metrics_port={p.metrics_port!r}: a port from 0 (any free one) to 65535, or null")
    _require(p.peak_tflops is None or p.peak_tflops > 0, f"profile.peak_tflops={p.peak_tflops}: greater than zero")
    _require(p.memory_fraction is None or (isinstance(p.memory_fraction, (int, float))
                                           and not isinstance(p.memory_fraction, bool) and 0 < p.memory_fraction <= 1),
             f"profile.memory_fraction={p.memory_fraction!r}: a share of the GPU's memory above 0 and at most 1, or null")
    if p.hardware_profile is not None:
        from planner.hardware import get_profile

        try:
            get_profile(p.hardware_profile)
        except PlannerError as exc:
            raise ConfigError(f"profile.hardware_profile: {exc}") from None
    _require(config.log_every >= 1, f"log_every={config.log_every}: a positive integer")


def _check_world(config: RunConfig, world_size: int) -> None:
    """The launched world is the product of the mesh degrees the trainer runs (the others are 1)."""
    lay = config.layout
    degrees = [name for name in GPU_FACTORS if name in TRAINER_DIMS]
    _require(world_size == config.world_size,
             f"world size {world_size} != {'*'.join(degrees)}: "
             f"{' '.join(f'{name}={getattr(lay, name)}' for name in degrees)} needs {config.world_size} processes")


def launched_world_size() -> int | None:
    """WORLD_SIZE as torchrun set it, or None outside torchrun."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None
