"""The what-if explorer's state: its fields, their bounds, the URL query string and the command line.

The state is a flat mapping of field name -> value. It is what the sidebar widgets hold, what the
URL query string carries (only values that differ from the defaults), and what becomes the
`planner estimate` flags, so a what-if shared by link, the page and the CLI all mean the same plan.
No streamlit here: the page (app.py) builds one widget per field from the bounds below.
"""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from planner.cli.inputs import DEFAULT_GPU
from planner.core.layout import ATTENTION, MODES, RECOMPUTE, SCHEDULES
from planner.core.model import ARCHS
from planner.core.resilience import LLAMA3_MTBF_GPU_HOURS
from planner.hardware import PRECISIONS

AUTO = "auto"  # a layout field left to the search
MODEL_SOURCES = ("params", "preset", "shape")
LORA_TARGET_SETS = ("q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj",
                    "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
OBJECTIVES = ("time", "cost", "memory")


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """One input. ``kind``: int, float (None allowed when ``optional``), choice or bool.

    Numbers are bounded by ``low`` and ``high``; for layout pins 0 means 'search it'.
    """

    name: str
    label: str
    kind: str
    default: object
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    help: str = ""
    group: str = ""


@functools.cache
def fields() -> tuple[Field, ...]:
    """Every input, in sidebar order (reads the preset and profile lists once)."""
    from planner.core.presets import presets
    from planner.hardware import profile_names

    return (
        Field(name="model", label="Model from", kind="choice", default="params", choices=MODEL_SOURCES,
              group="model", help="a parameter count (nearest preset or a LLaMA-style shape), a preset, or a shape"),
        Field(name="params", label="Parameters (billions)", kind="float", default=33.0, low=0.01, high=10000.0,
              step=1.0, group="model", help="`--params`: e.g. 33 for 33B"),
        Field(name="preset", label="Preset", kind="choice", default="llama-33b", choices=tuple(presets()),
              group="model", help="`planner presets` lists them with their sources"),
        Field(name="arch", label="Architecture", kind="choice", default="llama", choices=ARCHS, group="shape"),
        Field(name="layers", label="Layers", kind="int", default=32, low=1, high=1024, group="shape"),
        Field(name="hidden", label="Hidden size", kind="int", default=4096, low=64, high=131072, step=64,
              group="shape"),
        Field(name="heads", label="Attention heads", kind="int", default=32, low=1, high=1024, group="shape"),
        Field(name="kv_heads", label="KV heads (0: = heads)", kind="int", default=0, low=0, high=1024,
              group="shape"),
        Field(name="ffn_hidden", label="FFN hidden (0: architecture default)", kind="int", default=0, low=0,
              high=1048576, step=256, group="shape"),
        Field(name="vocab", label="Vocabulary", kind="int", default=32000, low=1, high=1048576, step=256,
              group="shape"),
        Field(name="seq_len", label="Sequence length", kind="int", default=2048, low=16, high=1048576, step=256,
              group="shape"),
        Field(name="gpu", label="GPU profile", kind="choice", default=DEFAULT_GPU, choices=tuple(profile_names()),
              group="hardware", help="built-in and calibrated profiles (`planner profiles`)"),
        Field(name="gpus", label="GPUs", kind="int", default=128, low=1, high=65536, step=8, group="hardware"),
        Field(name="tokens", label="Tokens to train (billions; 0: default)", kind="float", default=0.0,
              low=0.0, high=1e6, step=100.0, group="job",
              help="0: the Chinchilla rule (20 tokens per parameter) for pre-training, 1B for fine-tuning"),
        Field(name="precision", label="Precision", kind="choice", default="bf16", choices=PRECISIONS, group="job"),
        Field(name="attention", label="Attention", kind="choice", default="flash", choices=ATTENTION, group="job"),
        Field(name="overlap", label="Overlap DP reduction with backward", kind="bool", default=True, group="job"),
        Field(name="price", label="Price per GPU-hour (USD; empty: the profile's)", kind="float", default=None,
              low=0.0, high=1000.0, step=0.25, optional=True, group="job"),
        Field(name="pue", label="PUE", kind="float", default=1.2, low=1.0, high=3.0, step=0.05, group="job",
              help="data-centre power usage effectiveness"),
        Field(name="mode", label="Training", kind="choice", default="pretrain", choices=MODES, group="finetune",
              help="pre-training, full fine-tuning, or LoRA (frozen model + rank-r adapters)"),
        Field(name="lora_r", label="LoRA rank r", kind="int", default=8, low=1, high=4096, group="finetune"),
        Field(name="lora_alpha", label="LoRA alpha", kind="float", default=16.0, low=0.01, high=65536.0, step=1.0,
              group="finetune", help="scales the update; costs nothing"),
        Field(name="lora_targets", label="LoRA targets", kind="choice", default=LORA_TARGET_SETS[0],
              choices=LORA_TARGET_SETS, group="finetune"),
        Field(name="mtbf_gpu_hours", label="MTBF per GPU, hours (0: no failures)", kind="float",
              default=round(LLAMA3_MTBF_GPU_HOURS), low=0.0, high=1e9, step=1000.0, group="operations",
              help="default: Llama 3's 419 unexpected interruptions in 54 days on 16,384 GPUs"),
        Field(name="restart_minutes", label="Restart after a failure, minutes", kind="float", default=10.0,
              low=0.0, high=1440.0, step=1.0, group="operations", help="detect, reschedule, re-initialise"),
        Field(name="storage_gbps", label="Storage bandwidth, GB/s", kind="float", default=20.0, low=0.001,
              high=100000.0, step=1.0, group="operations", help="aggregate, for checkpoints and training data"),
        Field(name="keep_last", label="Checkpoints kept", kind="int", default=3, low=1, high=1000,
              group="operations"),
        Field(name="epochs", label="Epochs over the dataset", kind="float", default=1.0, low=0.01, high=1000.0,
              step=1.0, group="operations"),
        Field(name="packing_efficiency", label="Packing efficiency", kind="float", default=1.0, low=0.01, high=1.0,
              step=0.05, group="operations", help="share of sequence positions holding real tokens"),
        Field(name="tp", label="Tensor parallel (0: search)", kind="int", default=0, low=0, high=1024,
              group="layout"),
        Field(name="pp", label="Pipeline stages (0: search)", kind="int", default=0, low=0, high=1024,
              group="layout"),
        Field(name="vpp", label="Virtual stages per rank (0: search)", kind="int", default=0, low=0, high=128,
              group="layout", help="interleaving; needs pp > 1"),
        Field(name="micro_batch", label="Micro-batch (0: search)", kind="int", default=0, low=0, high=1024,
              group="layout"),
        Field(name="global_batch", label="Global batch, sequences (0: about 4M tokens)", kind="int", default=0,
              low=0, high=10_000_000, group="layout"),
        Field(name="zero", label="ZeRO stage", kind="choice", default=AUTO, choices=(AUTO, "0", "1", "2", "3"),
              group="layout"),
        Field(name="recompute", label="Activation recompute", kind="choice", default=AUTO,
              choices=(AUTO, *RECOMPUTE), group="layout"),
        Field(name="sequence_parallel", label="Sequence parallel", kind="choice", default=AUTO,
              choices=(AUTO, "on", "off"), group="layout"),
        Field(name="schedule", label="Pipeline schedule", kind="choice", default=AUTO, choices=(AUTO, *SCHEDULES),
              group="layout"),
        Field(name="sort", label="Rank layouts by", kind="choice", default="time", choices=OBJECTIVES,
              group="layout"),
    )


def field_map() -> dict[str, Field]:
    return {f.name: f for f in fields()}


def defaults() -> dict[str, object]:
    return {f.name: f.default for f in fields()}


LAYOUT_PINS = ("tp", "pp", "vpp", "micro_batch", "global_batch", "zero", "recompute", "sequence_parallel",
               "schedule")


def coerce(f: Field, text: object) -> object:
    """A value for ``f`` from text (a URL) or a value; ValueError saying what is allowed."""
    if f.kind == "choice":
        value = str(text)
        if value not in f.choices:
            raise ValueError(f"one of {', '.join(f.choices)}")
        return value
    if f.kind == "bool":
        value = str(text).strip().lower()
        if value not in ("1", "0", "true", "false", "on", "off", "yes", "no"):
            raise ValueError("true or false")
        return value in ("1", "true", "on", "yes")
    if f.optional and (text is None or str(text).strip() == ""):
        return None
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"a number from {f.low:g} to {f.high:g}") from None
    if not math.isfinite(number) or not f.low <= number <= f.high:
        raise ValueError(f"a number from {f.low:g} to {f.high:g}")
    if f.kind == "int":
        if number != int(number):
            raise ValueError(f"a whole number from {f.low:g} to {f.high:g}")
        return int(number)
    return number


def state_from_query(query: Mapping[str, object]) -> tuple[dict[str, object], list[str]]:
    """The state a link describes, and one note per value in it that was out of bounds (its default is used)."""
    state, notes = defaults(), []
    table = field_map()
    for key, raw in query.items():
        if key not in table:
            continue  # a parameter of something else: not ours to judge
        value = raw[-1] if isinstance(raw, (list, tuple)) and raw else raw
        f = table[key]
        try:
            state[key] = coerce(f, value)
        except ValueError as exc:
            notes.append(f"link: {key}={value!r} ignored ({exc}); using {f.default!r}")
    return state, notes


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.10g}"
    return "" if value is None else str(value)


def query_from_state(state: Mapping[str, object]) -> dict[str, str]:
    """The URL query for a state: only the values that differ from the defaults."""
    return {f.name: _text(state[f.name]) for f in fields() if f.name in state and state[f.name] != f.default}


def _count(billions: float) -> str:
    """33.0 -> '33B', 6.7 -> '6.7B', 1000 -> '1T' (the CLI's count syntax)."""
    if billions >= 1000 and (billions / 1000) == round(billions / 1000, 6):
        return f"{billions / 1000:.10g}T"
    return f"{billions:.10g}B"


def argv_from_state(state: Mapping[str, object]) -> list[str]:
    """The `planner estimate` flags for a state: the model, the hardware, and what differs from the defaults."""
    s = {**defaults(), **state}
    argv: list[str] = []
    if s["model"] == "preset":
        argv += ["--preset", str(s["preset"])]
    elif s["model"] == "params":
        argv += ["--params", _count(float(s["params"]))]
    else:
        argv += ["--arch", str(s["arch"]), "--layers", str(s["layers"]), "--hidden", str(s["hidden"]),
                 "--heads", str(s["heads"])]
        if s["kv_heads"]:
            argv += ["--kv-heads", str(s["kv_heads"])]
        if s["ffn_hidden"]:
            argv += ["--ffn-hidden", str(s["ffn_hidden"])]
        argv += ["--vocab", str(s["vocab"]), "--seq-len", str(s["seq_len"])]
    argv += ["--gpu", str(s["gpu"]), "--gpus", str(s["gpus"])]
    if s["tokens"]:
        argv += ["--tokens", _count(float(s["tokens"]))]
    if s["global_batch"]:
        argv += ["--global-batch", str(s["global_batch"])]
    for name, flag in (("precision", "--precision"), ("attention", "--attention")):
        if s[name] != field_map()[name].default:
            argv += [flag, str(s[name])]
    if not s["overlap"]:
        argv.append("--no-overlap")
    if s["price"] is not None:
        argv += ["--price-per-gpu-hour", f"{float(s['price']):.10g}"]
    if s["pue"] != field_map()["pue"].default:
        argv += ["--pue", f"{float(s['pue']):.10g}"]
    if s["mode"] != "pretrain":
        argv += ["--mode", str(s["mode"])]
    if s["mode"] == "lora":
        argv += ["--lora-r", str(s["lora_r"]), "--lora-alpha", f"{float(s['lora_alpha']):.10g}",
                 "--lora-targets", str(s["lora_targets"])]
    if s["mtbf_gpu_hours"] != field_map()["mtbf_gpu_hours"].default:
        argv += ["--mtbf-gpu-hours", "inf" if not s["mtbf_gpu_hours"] else f"{float(s['mtbf_gpu_hours']):.10g}"]
    for name in ("restart_minutes", "storage_gbps", "keep_last", "epochs", "packing_efficiency"):
        if s[name] != field_map()[name].default:
            value = s[name]
            argv += [f"--{name.replace('_', '-')}", f"{value:.10g}" if isinstance(value, float) else str(value)]
    for name in ("tp", "pp", "vpp", "micro_batch"):
        if s[name]:
            argv += [f"--{name.replace('_', '-')}", str(s[name])]
    for name in ("zero", "recompute", "schedule"):
        if s[name] != AUTO:
            argv += [f"--{name}", str(s[name])]
    if s["sequence_parallel"] != AUTO:
        argv.append("--sequence-parallel" if s["sequence_parallel"] == "on" else "--no-sequence-parallel")
    if s["sort"] != "time":
        argv += ["--sort", str(s["sort"])]
    return argv


def comparison_argv(state: Mapping[str, object]) -> list[str]:
    """The flags that the cross-hardware views depend on: the model and the job, with no layout pins,
    no GPU choice and no price (each profile is costed at its own rate)."""
    s = {**defaults(), **state}
    free = {name: defaults()[name] for name in (*LAYOUT_PINS, "price", "sort") if name != "global_batch"}
    return argv_from_state({**s, **free, "gpu": DEFAULT_GPU, "gpus": 1})


def sweep_argv(state: Mapping[str, object]) -> list[str]:
    """``comparison_argv`` without the token count either: the sweep keeps tokens/s, which does not
    depend on it, and days follow from the tokens."""
    return comparison_argv({**state, "tokens": 0.0})


def estimate_command(state: Mapping[str, object]) -> str:
    """The command line that reproduces the plan shown."""
    return shlex.join(["planner", "estimate", *argv_from_state(state)])


def pins_from_layout(layout: Mapping[str, object]) -> dict[str, object]:
    """Widget values that pin every field of a layout (its JSON form), e.g. to start from the best one."""
    return {"tp": int(layout["tp"]), "pp": int(layout["pp"]), "vpp": int(layout["vpp"]),
            "micro_batch": int(layout["micro_batch"]), "global_batch": int(layout["global_batch"]),
            "zero": str(layout["zero_stage"]), "recompute": str(layout["recompute"]),
            "sequence_parallel": "on" if layout["sequence_parallel"] else "off", "schedule": str(layout["schedule"])}


def pin_value(planner_field: str, value: object) -> tuple[str, object]:
    """A planner layout field and value (as PlannerError and Pins name them) as the sidebar field and
    its widget value: zero_stage 3 -> ('zero', '3'), sequence_parallel True -> ('sequence_parallel', 'on')."""
    if planner_field == "zero_stage":
        return "zero", str(value)
    if planner_field == "sequence_parallel":
        return planner_field, "on" if value else "off"
    return planner_field, value
