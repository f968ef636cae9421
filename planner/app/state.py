"""The what-if explorer's state: its fields, their bounds, the URL query string and the mapping.

The state is a flat mapping of field name -> widget value. It is what the sidebar widgets hold,
what the URL query string carries (only values that differ from the defaults), and, through
``mapping_from_state``, the mapping of declared names that ``planner.core.options.build_inputs``
reads, the same builder the CLI's parsed flags go to. The job, operations and layout fields are
derived from their declarations (``Job``, ``OPS_OPTIONS``, ``PIN_DIMS``). No streamlit here: the
page (planner/app/page.py) builds one widget per field from the bounds below.
"""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from planner.core.layout import DIMS, JOB_OPTIONS, PIN_DIMS, Dim, Option
from planner.core.model import ARCHS
from planner.core.options import DEFAULT_GPU, GPU_DEFAULTED, HW_OVERRIDES, OPS_OPTIONS
from planner.core.resilience import LLAMA3_MTBF_GPU_HOURS, Operations
from planner.core.search import OBJECTIVES

AUTO = "auto"  # a layout field left to the search
MODEL_SOURCES = ("params", "preset", "shape", "hf")  # hf: an uploaded Hugging Face config.json
LORA_TARGET_SETS = ("q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj",
                    "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")

SCALES = {"tokens": 1e9, "eval_every": 1e9, "eval_tokens": 1e9}  # the explorer shows tokens in billions
BLANK_MEANS_DEFAULT = ("price_usd_per_gpu_hour", "memory_headroom")  # empty, not 0: 0 is a price; a headroom of 0 plans up to capacity
# Options whose default is computed (None in the declaration): the value the explorer shows, and
# what its 0 means.
SHOWN_DEFAULT = {"mtbf_gpu_hours": round(LLAMA3_MTBF_GPU_HOURS),
                 "storage_gbps": Operations().storage_write_bytes_per_s / 1e9}
ZERO_MEANS = {"mtbf_gpu_hours": math.inf}  # 0 hours between failures: no failures
NAMED = ("stack",)  # options whose values are names of data files: the explorer offers the built-in ones


def _names(option: str) -> list[str]:
    from planner.stacks import stack_names

    return {"stack": stack_names}[option]()


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """One input. ``kind``: int, float (None allowed when ``optional``), choice, bool or text (a list
    option's items separated by its ``separator``, as ``--set``'s).

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


def _option_field(o: Option) -> Field:
    """An explorer field from a declared job or operations option."""
    choices = o.choices or (tuple(_names(o.name)) if o.name in NAMED else ())
    if choices:
        return Field(name=o.name, label=o.label, kind="choice", default=o.default, choices=choices, help=o.help,
                     group=o.group)
    if o.base_type == "bool":
        return Field(name=o.name, label=o.label, kind="bool", default=o.default, help=o.help, group=o.group)
    if o.repeat:  # stack overrides: free text, items separated as the option declares, checked by the planner
        return Field(name=o.name, label=o.label, kind="text", default="", help=o.help, group=o.group)
    if o.base_type == "tuple":  # LoRA targets: a few common sets, comma-separated as on the command line
        sets = (",".join(o.default), *(t for t in LORA_TARGET_SETS if t != ",".join(o.default)))
        return Field(name=o.name, label=o.label, kind="choice", default=sets[0], choices=sets, help=o.help,
                     group=o.group)
    # An optional number is 0 for "the default" (counts), or empty (a price: 0 is a real price).
    empty = o.optional and (o.low or 0) == 0 and o.name in BLANK_MEANS_DEFAULT
    kind = "int" if o.base_type == "int" else "float"
    zero = 0 if kind == "int" else 0.0
    default = (None if empty else SHOWN_DEFAULT.get(o.name, zero) if o.default is None
               else o.default / SCALES[o.name] if o.name in SCALES else o.default)
    return Field(name=o.name, label=o.label, kind=kind, default=default, low=o.low, high=o.high, step=o.step,
                 optional=empty, help=o.help, group=o.group)


def _pin_field(d: Dim) -> Field:
    """An explorer field from a declared layout dimension: 0 or 'auto' leaves it to the search."""
    if d.type is bool:
        return Field(name=d.name, label=d.label, kind="choice", default=AUTO, choices=(AUTO, "on", "off"),
                     help=d.help, group="layout")
    if d.choices:
        return Field(name=d.name, label=d.label, kind="choice", default=AUTO, choices=(AUTO, *map(str, d.choices)),
                     help=d.help, group="layout")
    return Field(name=d.name, label=f"{d.label} (0: search)", kind="int", default=0, low=0, high=d.high,
                 help=d.help, group="layout")


# Fields the sidebar draws only while their group is open (planner.app.page.GROUPS): each widget
# drawn costs every page run about half a millisecond of Streamlit's time (benchmarks/app_speed.py).
# The job's kernel, overlap and overhead settings, and the layout dimensions pinned less often.
SIDEBAR_GROUPS = {**dict.fromkeys(("attention", "overlap_grad_reduce", "kernels", "compile", "async_tp",
                                   "expert_imbalance", "memory_headroom", "pue"), "kernels"),
                  **dict.fromkeys(("cp", "ep", "sequence_parallel", "schedule", "sharding", "offload"), "layout_more")}


@functools.cache
def fields() -> tuple[Field, ...]:
    """Every input, in sidebar order (reads the preset and profile lists once). The job, operations
    and layout fields are derived from their declarations; ``SIDEBAR_GROUPS`` puts some in a group."""
    import dataclasses

    return tuple(dataclasses.replace(f, group=SIDEBAR_GROUPS[f.name]) if f.name in SIDEBAR_GROUPS else f
                 for f in _fields())


def _fields() -> tuple[Field, ...]:
    from planner.core.presets import presets
    from planner.hardware import profile_names

    job = [_option_field(o) for o in (*JOB_OPTIONS, *OPS_OPTIONS) if o.label]
    return (
        Field(name="model", label="Model from", kind="choice", default="params", choices=MODEL_SOURCES,
              group="model", help="a parameter count (nearest preset or a LLaMA-style shape), a preset, or a shape"),
        Field(name="params", label="Parameters (billions)", kind="float", default=33.0, low=0.01, high=10000.0,
              step=1.0, group="model", help="`--params`: e.g. 33 for 33B"),
        Field(name="preset", label="Preset", kind="choice", default="llama-33b", choices=tuple(presets()),
              group="model", help="`planner presets` lists them with their sources"),
        Field(name="seq_len", label="Sequence length (0: the model's own)", kind="int", default=0, low=0,
              high=1048576, step=1024, group="model",
              help="`--seq-len`: tokens per sequence, for any model; 0: the preset's or config's own (a shape: 2048)"),
        Field(name="mtp_layers", label="Multi-token-prediction modules (0: none)", kind="int", default=0, low=0,
              high=16, group="model",
              help="`--mtp-layers`: modules trained beside the model on the last pipeline stage (DeepSeek-V3: 1), "
                   "on a stack that trains them (megatron-core, nemo, megatron-fsdp, hai-llm)"),
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
        Field(name="window", label="Sliding window (0: full attention)", kind="int", default=0, low=0,
              high=1048576, step=512, group="shape", help="`--window`: keys each query sees"),
        Field(name="window_layers", label="Windowed layers (0: all)", kind="int", default=0, low=0, high=1024,
              group="shape", help="`--window-layers`: layers with the window; the rest see the whole sequence"),
        Field(name="gpu", label="GPU profile", kind="choice", default=DEFAULT_GPU, choices=tuple(profile_names()),
              group="hardware", help="built-in and calibrated profiles (`planner profiles`)"),
        Field(name="gpus", label="GPUs", kind="int", default=128, low=1, high=65536, step=8, group="hardware"),
        *_override_fields(),
        *(f for f in job if f.group != "layout"),
        *(f for f in job if f.group == "layout"),
        *(_pin_field(d) for d in PIN_DIMS if d.name != "dp"),  # dp follows from GPUs / (tp x pp)
        Field(name="sort", label="Rank layouts by", kind="choice", default="time", choices=OBJECTIVES,
              group="layout"),
    )


def _override_fields() -> tuple[Field, ...]:
    """The CLI's hardware overrides (--gpu-tflops ...): empty keeps the profile's value; bounds from
    planner/schema.py FLAGS, so the explorer refuses what the CLI refuses."""
    from planner.schema import FLAGS

    labels = {"gpu_tflops": "Peak TFLOP/s (dense, training precision)", "gpu_memory_gib": "GPU memory, GiB",
              "hbm_gbps": "HBM bandwidth, GB/s", "intra_node_gbps": "Intra-node GB/s per GPU",
              "inter_node_gbps": "Inter-node GB/s per GPU"}
    return tuple(Field(name=n, label=labels[n], kind="float", default=None, low=FLAGS[n].lo, high=FLAGS[n].hi,
                       step=1.0, optional=True, help=f"`--{n.replace('_', '-')}`: {what}; empty: the profile's",
                       group="hardware_custom") for n, what in HW_OVERRIDES.items())


def field_map() -> dict[str, Field]:
    return {f.name: f for f in fields()}


def defaults() -> dict[str, object]:
    return {f.name: f.default for f in fields()}


# The layout fields of the sidebar: the global batch (a job option) and every pinnable dimension
# but dp, which follows from GPUs / (tp x pp).
LAYOUT_PINS = ("global_batch", *(d.name for d in PIN_DIMS if d.name != "dp"))


def coerce(f: Field, text: object) -> object:
    """A value for ``f`` from text (a URL) or a value; ValueError saying what is allowed."""
    if f.kind == "choice":
        value = str(text)
        if value not in f.choices:
            raise ValueError(f"one of {', '.join(f.choices)}")
        return value
    if f.kind == "text":
        return "" if text is None else str(text)
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


def _count(value: float) -> str:
    """33e9 -> '33B', 6.7e9 -> '6.7B', 1e12 -> '1T' (the CLI's count syntax)."""
    billions = value / 1e9
    if billions >= 1000 and (billions / 1000) == round(billions / 1000, 6):
        return f"{billions / 1000:.10g}T"
    return f"{billions:.10g}B"


def _declared(f: Field, value: object) -> object:
    """A widget's value as the declared option or dimension holds it; None: its default (or searched)."""
    if f.name in DIMS:
        d = DIMS[f.name]
        if value in (AUTO, 0):
            return None
        return {"on": True, "off": False}[value] if d.type is bool else int(value) if d.type is int else value
    if value == f.default:
        return None
    if f.name in ZERO_MEANS and value == 0:
        return ZERO_MEANS[f.name]
    if f.kind in ("int", "float") and value == 0 and not f.optional:
        return None
    return value * SCALES.get(f.name, 1.0) if isinstance(value, (int, float)) and f.name in SCALES else value


def mapping_from_state(state: Mapping[str, object]) -> dict[str, object]:
    """The explorer's state as the mapping of declared names that ``build_inputs`` reads (the CLI's
    parsed flags are the same mapping): the model source chosen, the rest by name."""
    s = {**defaults(), **state}
    out: dict[str, object] = {"gpu": s["gpu"], "gpus": int(s["gpus"]), "sort": s["sort"]}
    out.update({n: float(s[n]) for n in HW_OVERRIDES if s.get(n) is not None})
    if s["model"] == "hf":
        if s.get("hf_config"):  # the uploaded file's bytes (not a field: not in the URL)
            out["hf_config"] = s["hf_config"]
    elif s["model"] == "preset":
        out["preset"] = s["preset"]
    elif s["model"] == "params":
        out["params"] = float(s["params"]) * 1e9
    else:
        out.update({k: s[k] for k in ("arch", "layers", "hidden", "heads", "vocab")})
        out.update({k: s[k] for k in ("kv_heads", "ffn_hidden", "window") if s[k]})
        if s["window"] and s["window_layers"]:
            out["window_layers"] = s["window_layers"]
    if s["seq_len"]:  # any source: a preset's, a count's or a config's own length replaced (--seq-len)
        out["seq_len"] = int(s["seq_len"])
    if s["mtp_layers"]:  # any source: modules trained beside the model (--mtp-layers)
        out["mtp_layers"] = int(s["mtp_layers"])
    for f in fields():
        if f.group not in ("model", "shape", "hardware", "hardware_custom") and f.name != "sort":
            value = _declared(f, s[f.name])
            if value is not None and not (f.name in GPU_DEFAULTED and value == f.default):
                out[f.name] = value  # a GPU-dependent field at its default is left to the GPU (fit_job_to_gpu)
    return out


def _flag_text(value: object) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.10g}"
    return ",".join(value) if isinstance(value, tuple) else str(value)


def argv_from_mapping(m: Mapping[str, object]) -> list[str]:
    """The `planner estimate` flags for a mapping of declared names (each flag from its declaration)."""
    argv: list[str] = []
    if "hf_config" in m:
        argv += ["--hf-config", "config.json"]
    elif "preset" in m:
        argv += ["--preset", str(m["preset"])]
    elif "params" in m:
        argv += ["--params", _count(float(m["params"]))]
    else:
        argv += [x for k in ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "window",
                             "window_layers")
                 if k in m for x in ("--" + k.replace("_", "-"), str(m[k]))]
    if "seq_len" in m:
        argv += ["--seq-len", str(m["seq_len"])]
    if "mtp_layers" in m:
        argv += ["--mtp-layers", str(m["mtp_layers"])]
    argv += ["--gpu", str(m["gpu"]), "--gpus", str(m["gpus"])]
    argv += [x for n in HW_OVERRIDES if m.get(n) is not None for x in ("--" + n.replace("_", "-"), f"{m[n]:.10g}")]
    for o in (*JOB_OPTIONS, *OPS_OPTIONS):
        if o.name in m and m[o.name] != o.default:
            value = m[o.name]
            if o.repeat:  # one flag per item: --set A --set B
                items = value.split(o.separator) if isinstance(value, str) else value
                argv += [x for item in items if item.strip() for x in (o.cli_flag, item.strip())]
                continue
            argv += ([o.cli_flag] if o.base_type == "bool" else
                     [o.cli_flag, _count(value) if o.count else _flag_text(value)])
    for d in PIN_DIMS:
        value = m.get(d.name)
        if value is not None:
            argv += ([d.flag if value else "--no-" + d.flag[2:]] if d.type is bool else [d.flag, str(value)])
    if m.get("sort", "time") != "time":
        argv += ["--sort", str(m["sort"])]
    return argv


def argv_from_state(state: Mapping[str, object]) -> list[str]:
    """The `planner estimate` flags for a state."""
    return argv_from_mapping(mapping_from_state(state))


def comparison_mapping(state: Mapping[str, object]) -> dict[str, object]:
    """What the cross-hardware views depend on: the model and the job, with no layout pins, no GPU
    choice and no price (each profile is costed at its own rate)."""
    m = mapping_from_state(state)
    for name in (*(d.name for d in PIN_DIMS), "price_usd_per_gpu_hour", "sort", "gpu", "gpus"):
        m.pop(name, None)
    return m


def sweep_mapping(state: Mapping[str, object]) -> dict[str, object]:
    """``comparison_mapping`` without the token count either: the sweep keeps tokens/s, which does
    not depend on it, and days follow from the tokens."""
    m = comparison_mapping(state)
    m.pop("tokens", None)
    return m


def estimate_command(state: Mapping[str, object]) -> str:
    """The command line that reproduces the plan shown."""
    return shlex.join(["planner", "estimate", *argv_from_state(state)])


def pins_from_layout(layout: Mapping[str, object]) -> dict[str, object]:
    """Widget values that pin every field of a layout (its JSON form), e.g. to start from the best one."""
    return dict(pin_value(name, layout[name]) for name in LAYOUT_PINS)


def pin_value(name: str, value: object) -> tuple[str, object]:
    """A layout field and value (as PlannerError and Pins name them) as the sidebar's field and its
    widget value: zero_stage 3 -> ('zero_stage', '3'), sequence_parallel True -> ('sequence_parallel', 'on')."""
    d = DIMS.get(name)
    if d is not None and d.type is bool:
        return name, "on" if value else "off"
    if d is not None and d.choices:
        return name, str(value)
    return name, int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def out_of_range(state: Mapping[str, object]) -> list[str]:
    """One message per widget value outside its field's bounds (the page's number inputs accept
    any number, so that a value out of range is named instead of silently kept)."""
    out = []
    for f in fields():
        value = state.get(f.name)
        if f.kind not in ("int", "float") or value is None:
            continue
        try:
            coerce(f, value)
        except ValueError as exc:
            out.append(f"{f.label}: {value:g} is out of range; allowed: {exc}")
    return out
