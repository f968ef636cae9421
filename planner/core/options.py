"""The planner's inputs from one mapping of declared names -> values: what the CLI and the explorer
both call, so a flag and an explorer field mean the same thing.

The names are those declared once elsewhere: the model's (``preset``, ``params`` or a shape), the
hardware's (``gpu``, ``gpus``, ``gpus_per_node``), the job's options (``planner.core.layout.Job``),
the operations options (``OPS_OPTIONS`` below) and the layout's pinnable dimensions
(``planner.core.layout.PIN_DIMS``). A missing name or ``None`` takes the declared default; text is
parsed the way the CLI reads it (``tokens="1T"``, ``lora_targets="q_proj,v_proj"``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from planner.core.layout import JOB_OPTIONS, PIN_DIMS, Job, Option, options_of
from planner.core.model import ARCHS, ModelSpec
from planner.core.presets import get_preset, resolve_params
from planner.core.resilience import LLAMA3_MTBF_GPU_HOURS, Operations
from planner.core.search import Pins
from planner.errors import PlannerError
from planner.hardware import HardwareProfile, get_profile
from planner.memo import fast_init
from planner.schema import FLAGS, check_number
from planner.stacks import job_stack
from planner.units import GB, GIB, TERA, parse_count

DEFAULT_GPU = "a100-80g"
DEFAULT_GPUS = 8
SHAPE_KEYS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "window",
              "window_layers", "mtp_layers")
SHAPE_HELP = {"mtp_layers": "multi-token-prediction modules trained beside the model (Megatron-Core's "
                            "--mtp-num-layers; DeepSeek-V3: 1), on a stack that trains them (0: none)",
              "window": "sliding-window attention: keys each query sees, in --window-layers of the layers "
                        "(0: full attention; Llama 4's chunked attention: the chunk length)",
              "window_layers": "layers with the sliding window (default: all of them)"}
_OPS = Operations()  # the operations defaults, converted to the options' units below


@dataclass(frozen=True, kw_only=True, slots=True)
class OpsOptions:
    """Failures, checkpoints, storage and data as a user gives them (hours, minutes, GB/s); each
    field an option declared once. ``Operations`` (SI units) is built from them."""

    mtbf_gpu_hours: float | None = dataclasses.field(default=None, metadata={"option": Option(
        help=f"mean time between failures per GPU (default {LLAMA3_MTBF_GPU_HOURS:,.0f}: Llama 3's 419 "
             "interruptions in 54 days on 16,384 GPUs; inf: none)",
        label="MTBF per GPU, hours (0: no failures)", low=0.0, high=1e9, step=1000.0, group="operations")})
    mtbf_node_hours: float | None = dataclasses.field(default=None, metadata={"option": Option(
        help="the same per node, a host of the scheduler's (divided among its GPUs)")})
    restart_minutes: float = dataclasses.field(default=_OPS.restart_s / 60, metadata={"option": Option(
        help=f"detect + reschedule + re-init (default {_OPS.restart_s / 60:g})",
        label="Restart after a failure, minutes", low=0.0, high=1440.0, step=1.0, group="operations")})
    storage_gbps: float | None = dataclasses.field(default=None, metadata={"option": Option(
        help=f"storage bandwidth in GB/s, read and write (default {_OPS.storage_write_bytes_per_s / 1e9:g})",
        label="Storage bandwidth, GB/s (empty: default)", low=0.001, high=100000.0, step=1.0,
        group="operations")})
    storage_write_gbps: float | None = dataclasses.field(default=None, metadata={"option": Option(
        help="checkpoint write bandwidth, GB/s, aggregate")})
    storage_read_gbps: float | None = dataclasses.field(default=None, metadata={"option": Option(
        help="read bandwidth (loads, data), GB/s, aggregate")})
    keep_last: int = dataclasses.field(default=_OPS.keep_last, metadata={"option": Option(
        help=f"checkpoints kept (default {_OPS.keep_last})", label="Checkpoints kept", low=1, high=1000,
        group="operations")})
    checkpoint_interval: int | None = dataclasses.field(default=None, metadata={"option": Option(
        help="steps between checkpoints (default: Young/Daly optimum)")})
    epochs: float = dataclasses.field(default=_OPS.epochs, metadata={"option": Option(
        help=f"passes over the dataset (sizes it; default {_OPS.epochs:g})", label="Epochs over the dataset",
        low=0.01, high=1000.0, step=1.0, group="operations")})
    token_bytes: int | None = dataclasses.field(default=None, metadata={"option": Option(
        help="bytes per stored token (default 2 if vocab <= 65536, else 4)")})


OPS_OPTIONS: tuple[Option, ...] = options_of(OpsOptions)


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Inputs:
    model: ModelSpec
    model_note: str
    hardware: HardwareProfile
    gpus: int
    job: Job
    pins: Pins
    ops: Operations


def _value(values: Mapping[str, object], o: Option) -> object:
    """One option's value from the mapping: its default when absent or None, text parsed."""
    v = values.get(o.name)
    if v is None:
        return o.default
    if isinstance(v, (list, tuple)) and o.base_type == "tuple":  # one item per flag (--set A --set B)
        return tuple(t for x in v for t in _value({o.name: x}, o)) if o.repeat else tuple(v)
    if isinstance(v, str):
        if o.base_type == "tuple":
            return tuple(t.strip() for t in v.split(o.separator) if t.strip())
        if o.count:
            return parse_count(v, o.name)
    return v


def _reader(options: tuple[Option, ...]) -> Callable[[Mapping[str, object]], dict[str, object]]:
    """``lambda values: {o.name: _value(values, o) for o in options}`` written out as one dict
    display, an option left at None read as its default without the call (an estimate with its
    caches empty reads the job's and the operations' options: less than half the comprehension's
    time)."""
    names: dict[str, object] = {"_value": _value}
    items = []
    for i, o in enumerate(options):
        names[f"_o{i}"], names[f"_d{i}"] = o, o.default
        items.append(f"{o.name!r}: _d{i} if get({o.name!r}) is None else _value(values, _o{i})")
    exec("def read(values):\n    get = values.get\n    return {" + ", ".join(items) + "}\n", names)  # noqa: S102 (our own text, as planner.memo writes out __init__)
    return names["read"]


_JOB_VALUES, _OPS_VALUES = _reader(JOB_OPTIONS), _reader(OPS_OPTIONS)


def job_from(values: Mapping[str, object]) -> Job:
    return Job(**_JOB_VALUES(values))


def pins_from(values: Mapping[str, object]) -> Pins:
    return Pins(**{d.name: values.get(d.name) for d in PIN_DIMS})


def ops_from(values: Mapping[str, object], gpus_per_host: int) -> Operations:
    o = _OPS_VALUES(values)  # OpsOptions' fields, by name
    if o["mtbf_gpu_hours"] is not None and o["mtbf_node_hours"] is not None:
        raise PlannerError("mtbf_node_hours", o["mtbf_node_hours"], "give --mtbf-gpu-hours or --mtbf-node-hours")
    mtbf = LLAMA3_MTBF_GPU_HOURS if o["mtbf_gpu_hours"] is None else o["mtbf_gpu_hours"]
    if o["mtbf_node_hours"] is not None:
        if not o["mtbf_node_hours"] > 0:
            raise PlannerError("mtbf_node_hours", o["mtbf_node_hours"], "greater than zero hours (inf: no failures)")
        mtbf = o["mtbf_node_hours"] * gpus_per_host  # a node (host) failing stops all its GPUs' work
    for name in ("storage_gbps", "storage_write_gbps", "storage_read_gbps"):
        value = o[name]
        if value is not None and not value > 0:
            raise PlannerError(name, value, "greater than zero GB/s")
    # A value given is used as given (0 is refused above), never replaced by the default.
    both = o["storage_gbps"] if o["storage_gbps"] is not None else _OPS.storage_write_bytes_per_s / 1e9
    write = (o["storage_write_gbps"] if o["storage_write_gbps"] is not None else both) * 1e9
    read = (o["storage_read_gbps"] if o["storage_read_gbps"] is not None else both) * 1e9
    return Operations(mtbf_gpu_hours=mtbf, restart_s=o["restart_minutes"] * 60, storage_write_bytes_per_s=write,
                      storage_read_bytes_per_s=read, keep_last=o["keep_last"],
                      checkpoint_interval_steps=o["checkpoint_interval"], epochs=o["epochs"],
                      token_bytes=o["token_bytes"])


def model_from(values: Mapping[str, object]) -> tuple[ModelSpec, str]:
    """A preset, a parameter count (nearest preset or a LLaMA-style shape), a Hugging Face
    config.json (``hf_config``: a path, or the file's bytes from the explorer's upload) or a shape;
    shape keys given with a preset, a count or a config override its shape."""
    preset, params, hf = values.get("preset"), values.get("params"), values.get("hf_config")
    shape = {k: values[k] for k in SHAPE_KEYS if values.get(k) is not None}
    given = [name for name, v in (("preset", preset), ("params", params), ("hf_config", hf)) if v]
    if len(given) > 1:
        raise PlannerError(given[1], values[given[1]],
                           f"give one of --preset, --params, --hf-config, not {given[0]} too")
    seq_note = ""  # where a config's context came from, said unless --seq-len replaces it
    if hf:
        spec, note, seq_note = _hf_spec(hf)
    elif preset:
        spec, note = get_preset(str(preset)), f"preset {preset}"
    elif params:
        spec, note = resolve_params(parse_count(params, "params") if isinstance(params, str) else float(params))
    elif {"layers", "hidden", "heads"} <= set(shape):
        if shape.get("arch") is not None and shape["arch"] not in ARCHS:
            raise PlannerError("arch", shape["arch"], f"one of {', '.join(ARCHS)}")
        return ModelSpec(name="custom", **shape), "shape from flags"
    else:
        raise PlannerError("model", "none", "give --preset NAME, --params 33B, --hf-config config.json, "
                                            "or --layers, --hidden and --heads")
    if hf and shape.get("mtp_layers"):  # the config's modules planned as given: its note on them is moot
        note = "; ".join(n for n in note.split("; ") if not n.startswith(_HF_MTP_KEYS))
    # A shape key equal to the model's own value changes nothing (and does not make it custom).
    shape = {k: v for k, v in shape.items() if getattr(spec, k) != v}
    if shape:
        if "arch" in shape:  # another architecture: its own MLP width and tying unless given
            shape.setdefault("ffn_hidden", None)
            shape.setdefault("tied_embeddings", None)
        if "heads" in shape and shape.get("kv_heads") is None and spec.kv_heads == spec.heads:
            shape["kv_heads"] = None  # keep multi-head attention when only heads changes
        spec = spec.replace(name=f"{spec.name}+custom", **shape)
        note += " with " + ", ".join(f"{k}={v}" for k, v in shape.items() if v is not None)
    return spec, note + ("" if "seq_len" in shape else seq_note)


# Hugging Face config.json keys -> ModelSpec fields (transformers' LlamaConfig, MistralConfig,
# Qwen2Config share the first names; GPT2Config uses the n_* names).
_HF_KEYS = {"layers": ("num_hidden_layers", "n_layer"), "hidden": ("hidden_size", "n_embd"),
            "heads": ("num_attention_heads", "n_head"), "kv_heads": ("num_key_value_heads",),
            "ffn_hidden": ("intermediate_size", "n_inner"), "vocab": ("vocab_size",),
            "seq_len": ("max_position_embeddings", "n_positions")}
# RMSNorm, gated MLP (SwiGLU; Gemma's GeGLU costs the same), RoPE, untied unless the file says so
_HF_LLAMA = ("llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma", "gemma2", "gemma3_text",
             "granite", "smollm3", "olmo3", "glm4", "seed_oss", "qwen3_vl_text", "qwen3_5_text", "exaone4",
             "cohere2")
_HF_GPT = ("gpt2",)  # LayerNorm, GELU, learned positions, biases, tied
_HF_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3",  # llama-style MoE
                 "kimi_k2", "glm4_moe", "gpt_oss", "llama4_text", "mistral4", "qwen3_vl_moe_text", "qwen3_next",
                 "qwen3_5_moe_text", "gemma4_text",  # Gemma 4: dense (31B) or MoE (26B-A4B)
                 "deepseek_v32", "glm_moe_dsa",  # DeepSeek sparse attention: DeepSeek-V3.2, GLM-5
                 "minimax_m2",  # MiniMax-M2: every layer MoE, QK-norm over the whole q and k, a routing bias
                 "ernie4_5_moe")  # ERNIE 4.5 MoE: moe_* keys, a leading dense layer, shared experts
# Model types whose language model transformers builds with another type's layers (their modeling
# files): read as that type, the note naming both.
_HF_ALIASES = {"ministral3": "mistral",  # Ministral 3, Devstral 2 (text_config of mistral3): Mistral's layers
               "internlm3": "llama",  # InternLM3: LlamaForCausalLM
               "ernie4_5": "llama", "helium": "llama",  # ERNIE 4.5 (dense), Kyutai's Helium: Llama's weights
               "granitemoe": "mixtral",  # Granite 3 MoE: Mixtral's layers (its multipliers have no weights)
               "glm4v_text": "glm4", "glm4v_moe_text": "glm4_moe"}  # GLM-4.1V's, GLM-4.5V's language models
HF_MODEL_TYPES = _HF_LLAMA + _HF_GPT + _HF_MOE_TYPES + tuple(_HF_ALIASES)  # and the image-and-text types of HF_TEXT_CONFIG
# Image-and-text configs whose language model (text_config) is what trains at scale here.
# Model types people bring that the planner refuses, and what in them it does not model (the refusal says).
_HF_UNMODELLED = (
    (("kimi_linear", "olmo_hybrid"), "their linear-attention layers (Kimi Delta Attention; OLMo's hybrid)"),
    (("falcon_h1", "nemotron_h", "granitemoehybrid", "jamba", "bamba", "zamba", "zamba2", "lfm2", "lfm2_moe",
      "falcon_mamba", "mamba", "mamba2"), "state-space (Mamba) or convolution layers"),
    (("gemma3n", "gemma3n_text"), "per-layer input embeddings, K/V shared across layers, AltUp and LAuReL"),
    (("deepseek_v4",), "compressed attention, hyper-connections and a low-rank output projection"),
)
# The language model's model_type when its text_config names none.
HF_TEXT_CONFIG = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "llama4": "llama4_text", "kimi_k25": "deepseek_v3",
                  "glm4v": "glm4v_text", "glm4v_moe": "glm4v_moe_text", "mistral3": "mistral", "qwen3_vl": "qwen3_vl_text",
                  "qwen3_vl_moe": "qwen3_vl_moe_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
_HF_MOE = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "moe_num_experts")
# Qwen3-Next's and Qwen3.5's configuration classes: the gated attention's head width and the Gated DeltaNet's shape
_GDN_DEFAULTS = {"head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                 "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
# Gemma's released configs leave keys at their configuration class's defaults (Gemma 3's
# text_config names only the widths): those defaults, as transformers' GemmaConfig,
# Gemma2Config and Gemma3TextConfig set them; the report names each one used.
_HF_DEFAULTS = {
    "gemma": {"vocab_size": 256000, "head_dim": 256, "max_position_embeddings": 8192, "tie_word_embeddings": True},
    "gemma2": {"vocab_size": 256000, "head_dim": 256, "max_position_embeddings": 8192, "tie_word_embeddings": True,
               "sliding_window": 4096},
    "gemma3_text": {"vocab_size": 262208, "head_dim": 256, "max_position_embeddings": 131072,
                    "tie_word_embeddings": True, "num_key_value_heads": 4, "sliding_window": 4096,
                    "sliding_window_pattern": 6},
    "gemma4_text": {"vocab_size": 262144, "head_dim": 256, "max_position_embeddings": 131072,
                    "tie_word_embeddings": True, "num_key_value_heads": 4, "sliding_window": 512,
                    "global_head_dim": 512, "hidden_size_per_layer_input": 256},
    "smollm3": {"tie_word_embeddings": True},
    "deepseek_v32": {"index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048},
    "glm_moe_dsa": {"index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048},
    **dict.fromkeys(("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"), _GDN_DEFAULTS),
    "olmo3": {"sliding_window": 4096},
    "exaone4": {"sliding_window": 4096, "sliding_window_pattern": 4},
    "cohere2": {"tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 4},
    "ernie4_5_moe": {"moe_layer_start_index": 1, "moe_layer_interval": 1, "moe_num_shared_experts": 0},
    "glm4": {"head_dim": 128, "attention_bias": True},
    "seed_oss": {"head_dim": 128, "attention_bias": True},
    "qwen3_vl_text": {"head_dim": 128},
    "llama4_text": {"vocab_size": 202048, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                    "num_local_experts": 16, "num_experts_per_tok": 1},
}


def model_from_hf_config(source: object) -> tuple[ModelSpec, str]:
    """A ModelSpec from a Hugging Face ``config.json`` (a path, or its bytes) and a note of what was
    read; one PlannerError line for a file that is not one (unreadable, not JSON, an unknown
    ``model_type``, a key missing)."""
    spec, note, seq_note = _hf_spec(source)
    return spec, note + seq_note


def _hf_spec(source: object) -> tuple[ModelSpec, str, str]:
    """The model, the note, and where its context length came from (a note of its own)."""
    import json
    from pathlib import Path

    where, hub = "hf_config", ""
    if (not isinstance(source, (bytes, bytearray)) and _HUB_ID.match(str(source)) and not str(source).endswith(".json")
            and not Path(str(source)).exists()):
        hub, source = str(source), _hub_cached(str(source))  # a Hub id: its config.json in the local cache
    if not isinstance(source, (bytes, bytearray)) and Path(str(source)).is_dir():  # a model's folder
        source = Path(str(source)) / "config.json"
    try:
        raw = source if isinstance(source, (bytes, bytearray)) else Path(str(source)).read_bytes()
        cfg = json.loads(raw)
    except OSError as exc:
        raise PlannerError(where, str(source), f"a readable config.json ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError):
        raise PlannerError(where, _short(source), "a Hugging Face config.json (UTF-8 JSON)") from None
    if not isinstance(cfg, dict):
        raise PlannerError(where, _short(source), "a JSON object (a Hugging Face config.json)")
    notes = []
    wrapper = cfg.get("model_type")
    if wrapper in HF_TEXT_CONFIG:  # image and text: the language model is what trains at scale here
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            from planner.core.hf_moe import brief

            raise PlannerError(f"{where} text_config", "missing" if text is None else brief(text),
                               f"a JSON object: the language model of a {wrapper} config")
        # Tying: the language model's own key, else the wrapper's; without either, the language model's
        # class default (the head its checkpoint holds: transformers 5's Mistral3Config defaults the
        # wrapper to tied, which a Mistral Small checkpoint's own lm_head contradicts; vLLM #51063)
        tie = {"tie_word_embeddings": cfg["tie_word_embeddings"]} if cfg.get("tie_word_embeddings") is not None else {}
        kind = text.get("model_type") or HF_TEXT_CONFIG[wrapper]  # Mistral Small 4: mistral4 inside mistral3
        cfg, where = {**tie, **text, "model_type": kind}, f"{where} text_config"
        notes.append("its language model (text_config; the vision tower is not planned)")
    kind = cfg.get("model_type")
    if kind in _HF_ALIASES:
        from planner.core.hf_moe import ALIAS_FLAGS, brief

        flag = ALIAS_FLAGS.get(kind)
        if flag and cfg.get(flag[0]) not in (None, False):
            value = cfg[flag[0]]
            raise PlannerError(f"{where} {flag[0]}", brief(value) if isinstance(value, (str, list, dict)) else value,
                               flag[1])
        notes.append(f"{kind} read as {_HF_ALIASES[kind]} (transformers builds it with {_HF_ALIASES[kind]}'s layers)")
        kind = _HF_ALIASES[kind]
        cfg = {**cfg, "model_type": kind}
    if kind not in HF_MODEL_TYPES:
        why = next((f"; {kind}: {reason} are not modelled" for kinds, reason in _HF_UNMODELLED if kind in kinds), "")
        raise PlannerError(f"{where} model_type", kind,
                           f"one of {', '.join(HF_MODEL_TYPES + tuple(HF_TEXT_CONFIG))}{why}")
    moe = [k for k in _HF_MOE if cfg.get(k)]
    if moe and kind not in _HF_MOE_TYPES:
        raise PlannerError(f"{where} {moe[0]}", cfg[moe[0]], f"absent for the dense model_type {kind} "
                           f"(mixture-of-experts configs: model_type {', '.join(_HF_MOE_TYPES)})")
    defaults = {k: v for k, v in _HF_DEFAULTS.get(kind, {}).items() if cfg.get(k) is None
                and not (k == "sliding_window_pattern" and cfg.get("layer_types") is not None)}
    if defaults:
        cfg = {**cfg, **defaults}
        notes.append(", ".join(f"{k} {v}" for k, v in defaults.items()) + " (the configuration class's defaults)")
    shape: dict = {}
    for field, keys in _HF_KEYS.items():
        given = next((k for k in keys if cfg.get(k) is not None), None)
        value = None if given is None else cfg[given]
        if field == "seq_len":
            seq_key = given
        if value is None and field in ("layers", "hidden", "heads", "vocab"):
            raise PlannerError(f"{where} {keys[0]}", "missing", "required: an integer")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"{where} {keys[0]}", value, "a positive integer")
            shape[field] = value
    pretrained, seq_note = _pretraining_context(cfg, where), ""
    if pretrained and pretrained < shape.get("seq_len", pretrained + 1):
        seq_note = (f"; seq {pretrained:,}: the context before RoPE scaling (original_max_position_embeddings; "
                    f"max_position_embeddings {shape['seq_len']:,}); --seq-len to set")
        shape["seq_len"] = pretrained
    elif "seq_len" in shape:
        seq_note = f"; seq {shape['seq_len']:,}: {seq_key}; --seq-len to set"
    arch = "gpt" if kind in _HF_GPT else "llama"
    tied = cfg.get("tie_word_embeddings", arch == "gpt")
    path = Path(str(source)) if not isinstance(source, (bytes, bytearray)) else Path("hf/config.json")
    name = path.parent.name if path.name == "config.json" else path.name.removesuffix(".json").removesuffix(".config")
    if hub:  # named as on the Hub, not by the snapshot's commit folder
        name, notes = hub.split("/")[1], [f"{hub} from the local Hugging Face cache ({path.parent.name[:12]})", *notes]
    for key in _HF_MTP_KEYS:  # trained beside the model (DeepSeek-V3, GLM-4.5, Qwen3.5), dropped by transformers
        mtp = cfg.get(key)
        if type(mtp) is int and mtp > 0:
            notes.append(f"{key} {mtp}: its multi-token-prediction module{'s are' if mtp > 1 else ' is'} not planned "
                         f"unless given (--mtp-layers {mtp}, on a stack that trains them: one more layer and head "
                         "pass each, on the last stage), so these are the main model's figures")
            break
    from planner.core.hf_moe import hf_linear_fields, hf_variant_fields, hf_window_fields

    shape.update(hf_variant_fields(cfg, kind, where))
    shape.update(hf_window_fields(cfg, kind, shape["layers"], where))
    shape.update(hf_linear_fields(cfg, kind, shape["layers"], where))
    spec = ModelSpec(name=str(cfg.get("_name_or_path") or name or "hf"), arch=arch, tied_embeddings=bool(tied), **shape)
    return spec, f"Hugging Face config ({kind})" + "".join(f"; {n}" for n in notes), seq_note


# The config keys of a multi-token-prediction module's count (DeepSeek-V3's and GLM's; Qwen3.5's).
_HF_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # organisation/name, as the Hub spells a model


def _hub_cached(model_id: str):
    """The config.json of the Hub model ``model_id`` in the local Hugging Face cache (the snapshot
    ``refs/main`` names, else the newest), as huggingface_hub lays it out under ``$HF_HUB_CACHE``,
    else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``. Nothing is downloaded: one
    PlannerError naming where it looked when the cache has no copy."""
    import os
    from pathlib import Path

    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"))
    repo = cache / ("models--" + model_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    try:
        snapshot = repo / "snapshots" / ref.read_text().strip() if ref.is_file() else None
        if snapshot is None or not (snapshot / "config.json").is_file():
            found = list((repo / "snapshots").glob("*/config.json")) if repo.is_dir() else []
            snapshot = max(found, key=lambda p: p.stat().st_mtime).parent if found else None
    except OSError:
        snapshot = None
    if snapshot is None:
        raise PlannerError("hf_config", model_id, f"a config.json, a model's folder, or a Hub model id in the local "
                           f"Hugging Face cache (none in {repo}; the planner downloads nothing: "
                           f"`hf download {model_id} config.json` fetches it)")
    return snapshot / "config.json"


def _pretraining_context(cfg: dict, where: str) -> int:
    """rope_scaling's (transformers 5: rope_parameters') original_max_position_embeddings: the
    context a long-context model was pretrained at before its RoPE was stretched (Llama 3.1: 8192
    of 131072; DeepSeek-V3: 4096 of 163840); 0 if the file does not say."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        if isinstance(rope, dict) and rope.get("original_max_position_embeddings") is not None:
            value = rope["original_max_position_embeddings"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"{where} {key}.original_max_position_embeddings", value, "a positive integer")
            return value
    return 0


def _short(source: object) -> str:
    return "<uploaded bytes>" if isinstance(source, (bytes, bytearray)) else str(source)


# Hardware overrides on any profile: flag -> (what it replaces, unit). Ranges in planner/schema.py FLAGS.
HW_OVERRIDES = {"gpu_tflops": "dense TFLOP/s at the training precision (other precisions scaled alike)",
                "gpu_memory_gib": "GPU memory, GiB", "hbm_gbps": "HBM bandwidth, GB/s",
                "intra_node_gbps": "inside a node, GB/s per GPU per direction (NVLink/PCIe)",
                "inter_node_gbps": "between nodes, GB/s per GPU per direction (NICs / GPUs per node)"}


def hardware_from(name: str, gpus_per_node: int | None, overrides: Mapping[str, object] | None = None,
                  precision: str = "bf16") -> tuple[HardwareProfile, str]:
    """The named profile with ``gpus_per_node`` and the ``HW_OVERRIDES`` given (None: the
    profile's own); returns it and a note naming what was overridden ('' if nothing)."""
    hw = get_profile(name)
    if gpus_per_node is not None:
        hw = hw.with_gpus_per_node(gpus_per_node)
    given = {k: float(check_number(v, FLAGS[k], k)) for k in HW_OVERRIDES
             if (v := (overrides or {}).get(k)) is not None}
    if not given:
        return hw, ""
    gpu, net = hw.gpu, hw.network
    if "gpu_tflops" in given:
        old = gpu.peak_flops.get(precision, 0.0)
        peak = given["gpu_tflops"] * TERA
        scaled = {p: v * peak / old for p, v in gpu.peak_flops.items()} if old > 0 else gpu.peak_flops
        gpu = dataclasses.replace(gpu, peak_flops={**scaled, precision: peak})
    if "gpu_memory_gib" in given:
        gpu = dataclasses.replace(gpu, memory_bytes=given["gpu_memory_gib"] * GIB)
    if "hbm_gbps" in given:
        gpu = dataclasses.replace(gpu, hbm_bytes_per_s=given["hbm_gbps"] * GB)
    if "intra_node_gbps" in given:
        net = dataclasses.replace(net, intra_bytes_per_s=given["intra_node_gbps"] * GB)
    if "inter_node_gbps" in given:
        net = dataclasses.replace(net, inter_bytes_per_s=given["inter_node_gbps"] * GB)
    units = {"gpu_tflops": f" TFLOP/s {precision}", "gpu_memory_gib": " GiB", "hbm_gbps": " GB/s HBM",
             "intra_node_gbps": " GB/s intra-node", "inter_node_gbps": " GB/s inter-node per GPU"}
    note = "overridden: " + ", ".join(f"{v:,.4g}{units[k]}" for k, v in given.items())
    return dataclasses.replace(hw, gpu=gpu, network=net, description=f"{note}; {hw.description}"), note


FALLBACK_PRECISIONS = ("bf16", "fp16", "fp32")  # tried in order when the GPU lacks the one asked for


def fallback_precision(hw: HardwareProfile, wanted: str) -> str:
    """``wanted`` where the GPU has it, else the first of FALLBACK_PRECISIONS it has (a V100 trains
    in fp16 with loss scaling, an A100 asked for fp8 in bf16)."""
    if hw.gpu.supports(wanted):
        return wanted
    return next((p for p in FALLBACK_PRECISIONS if hw.gpu.supports(p)), wanted)


# Job fields whose default depends on the GPU (``fit_job_to_gpu``). A face passes None for one the
# user left alone (the CLI's flags default to None; the explorer leaves out a value at its default).
GPU_DEFAULTED = ("precision", "attention")


def job_fields_given(values: Mapping[str, object]) -> frozenset[str]:
    """The fields of ``GPU_DEFAULTED`` the user chose (set in ``values``, not None)."""
    return frozenset(k for k in GPU_DEFAULTED if values.get(k) is not None)


def fit_job_to_gpu(job: Job, hw: HardwareProfile, given: Collection[str] = ()) -> tuple[Job, str]:
    """The job as this GPU runs it, for the fields of ``GPU_DEFAULTED`` not in ``given``: a GPU
    without bf16 (V100) trains in fp16 with loss scaling, and without FlashAttention (it needs
    Ampere or newer, the same generations that have bf16: Dao 2023) in standard attention. Returns
    the job and a note saying what changed ('' if nothing). Every face (estimate, search, export,
    compare, recommend, the explorer) comes through here, so one GPU gets one answer; a precision
    given that the GPU lacks (bf16 on a V100, fp8 on an A100) stays and fails in the search."""
    notes = []
    precision = fallback_precision(hw, job.precision)
    if precision != job.precision and "precision" not in given:
        notes.append(f"{precision} (the {hw.name} has no {job.precision}; --precision to choose)")
        job = job.replace(precision=precision)
    if job.attention == "flash" and not hw.gpu.supports("bf16") and "attention" not in given:
        notes.append(f"standard attention (FlashAttention needs an Ampere or newer GPU; the {hw.name} is older)")
        job = job.replace(attention="standard")
    return job, "; ".join(notes)


# The keys ``model_from`` reads: a setup's other parts (``setup_from``) do not depend on them.
MODEL_KEYS = frozenset(("preset", "params", "hf_config", *SHAPE_KEYS))


@dataclass(frozen=True, slots=True)
class Setup:
    """What ``build_inputs`` builds from the values other than the model's (``MODEL_KEYS``), the
    layout's pins and the operations' options: a sweep over models keeps one (planner.estimate does)."""
    gpus: int
    hardware: HardwareProfile
    job: Job
    notes: tuple[str, ...]  # what the GPU changed of the job, what the flags overrode of the hardware


def setup_from(values: Mapping[str, object]) -> Setup:
    """The GPU count, hardware and job of ``values``; raises PlannerError naming the field."""
    gpus = values.get("gpus")
    gpus = DEFAULT_GPUS if gpus is None else gpus
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise PlannerError("gpus", gpus, "a positive integer")
    gpu = DEFAULT_GPU if values.get("gpu") is None else str(values["gpu"])  # '' is refused, not the default
    hw, _ = hardware_from(gpu, values.get("gpus_per_node"))
    job, job_note = fit_job_to_gpu(job_from(values), hw, job_fields_given(values))
    hw, hw_note = hardware_from(gpu, values.get("gpus_per_node"), values, job.precision)  # overrides at its precision
    return Setup(gpus=gpus, hardware=hw, job=job, notes=tuple(n for n in (job_note, hw_note) if n))


def inputs_of(model: tuple[ModelSpec, str], setup: Setup, values: Mapping[str, object]) -> Inputs:
    """``model_from``'s model and note and a ``setup_from`` as one Inputs, with the pins and the
    operations of ``values``: the LoRA targets and rank checked against this model, then the stack,
    the pins and the operations (``build_inputs``'s order: of two bad values, the same one is named
    whatever was kept)."""
    from planner.core.finetune import trainable_params

    (spec, note), hw, job = model, setup.hardware, setup.job
    for extra in setup.notes:
        note = f"{note}; {hw.name}: {extra}" if note else f"{hw.name}: {extra}"
    trainable_params(spec, job)  # validates LoRA targets and rank against this model
    job_stack(job)  # validates the stack and its --set keys: one line naming the key, the value, what is allowed
    return Inputs(model=spec, model_note=note, hardware=hw, gpus=setup.gpus, job=job, pins=pins_from(values),
                  ops=ops_from(values, hw.network.host_gpus))


def build_inputs(values: Mapping[str, object]) -> Inputs:
    """(model, hardware, job, pins, operations) from one mapping; raises PlannerError naming the field."""
    return inputs_of(model_from(values), setup_from(values), values)
