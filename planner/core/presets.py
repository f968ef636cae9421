"""Model presets (planner/presets.toml) and the rule that turns '--params 33B' into a shape."""

from __future__ import annotations

import bisect
import functools
import tomllib
from pathlib import Path

from planner.core.model import ModelSpec, spec_from_dict
from planner.errors import PlannerError, closest_names

# A preset is taken for --params N when its parameter count is within this relative distance.
PRESET_MATCH_TOLERANCE = 0.10


@functools.cache
def _raw() -> dict[str, dict]:
    return tomllib.loads((Path(__file__).parent / "presets.toml").read_text())


@functools.cache
def presets() -> dict[str, ModelSpec]:
    return {name: spec_from_dict(name, data) for name, data in _raw().items()}


def preset_source(name: str) -> str:
    return _raw()[name].get("source", "")


def get_preset(name: str) -> ModelSpec:
    table = presets()
    key = name.strip().lower()
    if key not in table:
        hint = closest_names(key, list(table))
        raise PlannerError("preset", name, f"unknown preset; {hint + ' ' if hint else ''}"
                                           "`planner presets` lists them")
    return table[key]


@functools.cache
def dense_by_count() -> tuple[tuple[int, ...], dict[int, tuple[int, ModelSpec]]]:
    """The dense presets' parameter counts, sorted and each once, and for each count the first
    preset in the table with it (its place in the table, the spec): what '--params N' is matched
    against. Like the table, it depends on the preset file alone (counted once per process, not
    once per '--params' value asked: 28 counts cost more than the rest of an estimate's inputs)."""
    first: dict[int, tuple[int, ModelSpec]] = {}
    for i, spec in enumerate(s for s in presets().values() if not s.moe):
        first.setdefault(spec.params, (i, spec))
    return tuple(sorted(first)), first


@functools.lru_cache(maxsize=256)  # a pure function of the count: an estimate in a loop resolves it once
def resolve_params(target: float) -> tuple[ModelSpec, str]:
    """The model for '--params N': the nearest dense preset within 10%, else a LLaMA-style shape.

    Mixture-of-experts presets are not matched: a total count does not say how many parameters a
    token uses (Mixtral 8x7B's 46.7B runs like a 12.9B dense model), so '--params 47B' means a
    dense 47B model; an MoE is chosen by name (--preset mixtral-8x7b).
    Returns the spec and one sentence saying how it was chosen.
    """
    counts, first = dense_by_count()
    # The nearest by |count / N - 1| is the nearest count below N or above it (the distance grows
    # with the gap on each side, in floating point too); of equal distances, the first in the table.
    i = bisect.bisect_left(counts, target)
    near = [(abs(c / target - 1), first[c][0], first[c][1]) for c in counts[max(i - 1, 0):i + 1]]
    best, _, spec = min(near)
    if best <= PRESET_MATCH_TOLERANCE:
        return spec, f"nearest preset to {target / 1e9:g}B parameters"
    spec = scaled_llama(target)
    return spec, (f"no preset within {PRESET_MATCH_TOLERANCE:.0%} of {target / 1e9:g}B parameters; "
                  "LLaMA-style shape from the scaling rule (head_dim 128, hidden/layers ~ 100-128)")


def scaled_llama(target: float, vocab: int = 32000, seq_len: int = 4096) -> ModelSpec:
    """A LLaMA-style shape with about ``target`` parameters.

    Rule (documented in docs/estimate.md): head_dim 128; hidden a multiple of 1024 from 4096 up (so
    heads is a multiple of 8 and tensor parallel 8 divides it), of 256 below; SwiGLU ffn
    int(8h/3) rounded up to 256; for each width the depth closest to the target. Among shapes
    within 2% of the target, the one whose aspect ratio hidden/layers is closest to 112 wins
    (LLaMA 7B-65B span 102-128; Kaplan et al. 2020 find loss flat over a wide range of aspect
    ratios); if none is within 2%, the closest count wins.
    """
    import math

    best = None
    for hidden, fixed, per_layer, probe in _widths(vocab, seq_len):
        layers = max(1, round((target - fixed) / per_layer))
        error = abs((fixed + layers * per_layer) / target - 1)  # a dense model's count is affine in its depth
        near = error <= 0.02  # within 2%: the aspect ratio chooses; else the count alone
        key = (not near, abs(math.log(hidden / layers / 112)) if near else 0.0, error)
        if best is None or key < best[0]:
            best = (key, probe, layers)
    _, probe, layers = best
    return probe.replace(layers=layers, name=f"llama-style-{target / 1e9:g}b")


@functools.cache
def _widths(vocab: int, seq_len: int) -> tuple[tuple[int, int, int, ModelSpec], ...]:
    """Per width of the scaling rule: (hidden, the parameters outside the layers, per layer, a
    one-layer probe). They do not depend on the target, so a process builds them once: each
    '--params' value not seen before then costs one model instead of 154 (the explorer's model-size
    field: benchmarks/app_speed.py)."""
    out = []
    for hidden in [*range(256, 4096, 256), *range(4096, 65536 + 1, 1024)]:
        probe = ModelSpec(arch="llama", layers=1, hidden=hidden, heads=max(1, hidden // 128),
                          vocab=vocab, seq_len=seq_len)
        out.append((hidden, probe.params - probe.layer_params, probe.layer_params, probe))
    return tuple(out)
