"""Search = enumerate, evaluate, filter, rank. A single estimate is a search of one.

Every (dp, tp, pp, vpp, cp, micro_batch, zero, recompute, sequence_parallel) valid for the model and
the GPU count is built as numpy columns, evaluated in one vectorised pass, the layouts that do
not fit are dropped and the rest ranked by the objective.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from planner.core.columns import not_, where
from planner.core.evaluate import (
    DeferredStepTime,
    Evaluation,
    as_table,
    evaluate_deferred,
    evaluate_fitting,
    evaluate_one,
    take,
)
from planner.core.layout import (
    DIMS,
    DUALPIPEV,
    GPIPE,
    GPU_FACTORS,
    LAYOUT_DIMS,
    OFFLOAD,
    PIN_DIMS,
    SCHEDULES,
    Candidates,
    Job,
    _checked_layout,
    _computed,
    default_global_batch,
    one_row_of,
)
from planner.core.memory import Memory
from planner.core.model import ModelSpec
from planner.errors import PlannerError, require
from planner.hardware import HardwareProfile
from planner.memo import by_identity, fast_init
from planner.schema import MAX_GPUS
from planner.stacks import Stack, get_stack, job_stack, stack_names

OBJECTIVES = ("time", "cost", "memory")
_OBJECTIVES_ALLOWED = f"one of {', '.join(OBJECTIVES)}"
_ONE_ORDER = np.zeros(1, dtype=np.int64)  # a search of one layout: its order (shared, read-only)
_ONE_ORDER.flags.writeable = False
TIER_STEP = 1e6  # rank_order's key: one memory tier apart outranks any gap in the objective


_PIN_NAMES = tuple(d.name for d in PIN_DIMS)


def _pinned(self) -> dict[str, object]:
    return dict(_pinned_of(self))  # a copy: the caller may change it


@by_identity  # Pins are immutable: read once per object
def _pinned_of(pins) -> dict[str, object]:
    return {name: value for name in _PIN_NAMES if (value := getattr(pins, name)) is not None}


def _check_own(self) -> None:
    for name, value in _pinned(self).items():
        DIMS[name].check(value)


# Layout fields the user fixed; None means 'search it'. One optional field per pinnable dimension.
Pins = fast_init(dataclasses.make_dataclass(
    "Pins", [(d.name, f"{d.type.__name__} | None", dataclasses.field(default=None)) for d in PIN_DIMS],
    namespace={"pinned": _pinned, "__post_init__": _check_own,
               "__doc__": "Layout fields the user fixed; None means 'search it'."},
    frozen=True, kw_only=True, slots=True))
Pins.__module__ = __name__


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """A ranked search. ``table``: every layout evaluated, in the enumeration's order; ``order``: the
    table's rows in rank order (fitting ones first, then by the objective), or the selected ones
    (``select``). ``evaluation`` is the table in that order, built on first use (a gather of every
    column: a fifth of a 70K-layout search); ``ranked(k)`` builds only the rows at rank positions k,
    which is all a plan, a probe or a top-N listing needs. The step time of layouts that do not fit
    is computed when first read (``table``, ``evaluation``, or ``ranked`` rows that need it):
    ``candidates``, ``fits`` and ``memory`` read the table without it."""

    _table: Evaluation | None  # None: one layout, ``one``, whose table is built from it when read
    order: np.ndarray
    evaluated: int
    feasible: int
    search_seconds: float
    objective: str = "time"
    notes: list[str] = field(default_factory=list)
    _deferred: DeferredStepTime | None = None  # shared by ``select``'s copies: each row is filled once
    _in_order: list = field(default_factory=list, init=False, repr=False, compare=False)  # ``evaluation``, once built
    # One layout (every layout field pinned): its evaluation with its columns as Python scalars
    # (``evaluate_one``), all a pinned estimate reads; the one-row table is built from it if read.
    one: Evaluation | None = None
    _built: list = field(default_factory=list, init=False, repr=False, compare=False)

    def _whole(self) -> Evaluation:
        if self._table is not None:
            return self._table
        if not self._built:
            self._built.append(as_table(self.one))
        return self._built[0]

    @property
    def table(self) -> Evaluation:
        """Every layout evaluated, step times included."""
        if self._deferred is not None:
            self._deferred.fill()
        return self._whole()

    @property
    def partial_table(self) -> Evaluation:
        """The table as evaluated so far: every column, but the step times of layouts that do not
        fit are NaN until read through ``table`` or ``ranked``."""
        return self._whole()

    @property
    def candidates(self) -> Candidates:
        return self._whole().candidates

    @property
    def fits(self) -> np.ndarray:
        return self._whole().fits

    @property
    def memory(self) -> Memory:
        return self._whole().memory

    @property
    def evaluation(self) -> Evaluation:
        """Every selected layout in rank order: fitting ones first."""
        if not self._in_order:
            o = self.order
            whole = _every_row_in_order(o, len(self._whole().candidates))
            if self._deferred is not None:
                self._deferred.fill(None if whole else o)
            self._in_order.append(self._whole() if whole else take(self._whole(), o))
        return self._in_order[0]

    def ranked(self, positions) -> Evaluation:
        """The layouts at these rank positions (0: the best), in that order."""
        rows = self.order[np.asarray(positions, dtype=np.int64)]
        if self._deferred is not None:
            self._deferred.fill(rows)
        if _every_row_in_order(rows, len(self._whole().candidates)):
            return self._whole()  # one pinned layout, say: the table itself
        return take(self._whole(), rows)

    def in_rank_order(self, column: np.ndarray) -> np.ndarray:
        """A column of ``table`` (or one computed from it) in rank order."""
        return column[self.order]


def _every_row_in_order(rows: np.ndarray, n: int) -> bool:
    """Whether ``rows`` are 0..n-1 in order: the table itself, no gather needed."""
    return len(rows) == n and bool(np.all(rows == np.arange(n)))


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    """Divisors of n (n <= MAX_GPUS: at most 1,000 candidates), remembered, as Python ints (a numpy
    int asked first would otherwise be kept for the equal Python int)."""
    n = int(n)
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small) | {n // d for d in small}))


_FACTORS_NAME = "*".join(GPU_FACTORS)  # the field named when the pinned degrees do not multiply to the GPUs


def _check_pins(model: ModelSpec, gpus: int, pins: Pins, global_batch: int | None, stack: Stack) -> None:
    """Pinned values that can never be valid get one clear error each (each value's own rule was
    checked when the Pins were made)."""
    uneven, linear_cp = stack.uneven_interleave, linear_cp_runs(stack)
    require(isinstance(gpus, (int, np.integer)) and 1 <= gpus <= MAX_GPUS, "gpus", gpus,
            lambda: f"an integer from 1 to {MAX_GPUS:,}")
    if pins.tp is not None:
        linear = (f", linear_key_heads={model.linear_key_heads} and linear_value_heads={model.linear_value_heads}"
                  if model.linear_layers else f", global_kv_heads={model.global_kv_heads}" if model.global_kv_heads
                  else "")
        require(tp_splits(model, pins.tp), "tp", pins.tp,
                lambda: f"must divide heads={model.heads} and kv_heads={model.kv_heads}{linear}; valid on {gpus} "
                        f"GPUs: {', '.join(str(t) for t in _divisors(gpus) if tp_splits(model, t))}")
    for name in GPU_FACTORS:
        value = getattr(pins, name)
        if value is not None:
            require(gpus % value == 0, name, value, lambda: f"must divide gpus={gpus}")
    if pins.pp is not None:
        require(pins.pp <= model.layers, "pp", pins.pp, lambda: f"at most layers={model.layers}")
    if pins.cp is not None and pins.cp > 1:
        if model.linear_layers:
            require(linear_cp, "cp", pins.cp, lambda: f"1 for a model with linear-attention layers on the {stack.name} "
                    "stack (torchtitan's Qwen3.5 refuses context parallel); stacks that run it over Gated DeltaNet "
                    f"by all-to-all: {stacks_with(linear_cp_runs)}")
            split = pins.cp * (pins.tp or 1)
            require(linear_heads_split(model, split), "cp", pins.cp,
                    lambda: f"{'tp*cp' if pins.tp else 'cp'}={split} must divide linear_key_heads="
                            f"{model.linear_key_heads} and linear_value_heads={model.linear_value_heads} (the "
                            "all-to-all gives each rank whole heads of the whole sequence)")
        require(model.seq_len % (2 * pins.cp) == 0, "cp", pins.cp,
                lambda: f"seq_len={model.seq_len} must divide into 2*cp={2 * pins.cp} load-balanced chunks")
    degrees = {name: getattr(pins, name) for name in GPU_FACTORS}
    if None not in degrees.values():
        product = math.prod(degrees.values())
        require(product == gpus, _FACTORS_NAME, product,
                lambda: "must equal gpus: " + " ".join(f"{k}={v}" for k, v in degrees.items()) + f" gpus={gpus}")
    others = {k: v for k, v in degrees.items() if k != "cp"}
    if degrees["cp"] is None and None not in others.values():  # context parallel would take the rest
        product = math.prod(others.values())
        rest = gpus // product if gpus % product == 0 else 0
        require(rest in cp_degrees(model, rest, None, linear_cp) if rest else False, "*".join(others), product,
                lambda: f"must equal gpus={gpus} (" + " ".join(f"{k}={v}" for k, v in others.items())
                + (f"; context parallel {rest} does not split seq_len={model.seq_len} into chunks of at least "
                   f"{CP_MIN_TOKENS} tokens" if rest > 1 else "") + ")")
    if pins.ep is not None and pins.ep > 1:
        require(model.moe, "ep", pins.ep, lambda: f"1: {model.name} is a dense model (expert parallel needs experts)")
        require(model.experts % pins.ep == 0, "ep", pins.ep, lambda: f"must divide experts={model.experts}")
        require(gpus % pins.ep == 0, "ep", pins.ep, lambda: f"must divide gpus={gpus} (it is carved out of dp*cp)")
        if pins.dp is not None and pins.cp is not None:
            require((pins.dp * pins.cp) % pins.ep == 0, "ep", pins.ep,
                    lambda: f"must divide dp*cp={pins.dp * pins.cp} (expert parallel is carved out of those ranks)")
    if pins.sharding == "hybrid":
        require(pins.zero_stage is None or pins.zero_stage >= 1, "sharding", "hybrid",
                lambda: f"hybrid sharding shards ZeRO states: it needs zero_stage >= 1 (pinned {pins.zero_stage})")
        require(pins.ep is None or pins.ep == 1, "sharding", "hybrid",
                lambda: f"hybrid sharding is not combined with expert parallel here (pinned ep={pins.ep})")
    require(not (pins.sequence_parallel is True and pins.tp == 1), "sequence_parallel", True,
            "sequence parallel splits the activations over the tensor-parallel group: it needs tp > 1 "
            "(pinned tp=1); leave it off or pin tp > 1")
    if (model.moe or model.index_topk) and pins.tp is not None and pins.tp > 1 and pins.sequence_parallel is False:
        raise PlannerError("sequence_parallel", False, f"{'an MoE' if model.moe else 'DSA'} with tp > 1 runs "
                                                       "sequence parallel (Megatron-Core "
                                                       "requires it); leave it on or unpinned")
    if pins.vpp is not None and pins.vpp > 1 and pins.pp is not None:
        require(pins.pp > 1, "vpp", pins.vpp, "interleaving (vpp > 1) needs pp > 1")
        if uneven:  # the stack splits layers unevenly across virtual stages: each needs one
            require(pins.pp * pins.vpp <= model.layers, "vpp", pins.vpp,
                    lambda: f"pp*vpp={pins.pp * pins.vpp} virtual stages need at least as many layers ({model.layers})")
        else:
            require(model.layers % (pins.pp * pins.vpp) == 0, "vpp", pins.vpp,
                    lambda: f"layers={model.layers} must divide by pp*vpp={pins.pp * pins.vpp} (this stack splits evenly)")
    if global_batch is not None and pins.dp is not None and pins.micro_batch is not None:
        require(global_batch % (pins.dp * pins.micro_batch) == 0, "global_batch", global_batch,
                lambda: f"must be divisible by dp*micro_batch={pins.dp * pins.micro_batch}")


@by_identity  # per model, pins and stack object: the (gpus, global_batch) pairs whose pins passed
def _pins_passed(model: ModelSpec, pins: Pins, stack: Stack) -> set:
    return set()


def _check_pins_once(model: ModelSpec, gpus: int, pins: Pins, global_batch: int | None, stack: Stack) -> None:
    """``_check_pins``, once per model, pins, stack, GPU count and batch (an estimate repeated with the
    same inputs checks them once; a failing check raises every time)."""
    passed, key = _pins_passed(model, pins, stack), (gpus, global_batch)
    try:
        if key in passed:
            return
    except TypeError:  # an unhashable count or batch: _check_pins names it
        key = None
    _check_pins(model, gpus, pins, global_batch, stack)
    if key is not None:
        passed.add(key)


UNEVEN_VPP = (2, 3, 4)  # interleaving degrees tried when the layers do not divide pp*vpp


CP_MAX = 32  # context-parallel degrees searched up to this (pinned: any)
CP_MIN_TOKENS = 4096  # searched only while each rank keeps at least this many tokens of a sequence


def linear_heads_split(model: ModelSpec, ranks: int) -> bool:
    """Each of ``ranks`` ranks gets whole linear-attention key and value heads (always, without them)."""
    return not model.linear_layers or (model.linear_key_heads % ranks == 0 and model.linear_value_heads % ranks == 0)


def tp_splits(model: ModelSpec, tp: int) -> bool:
    """Tensor parallel splits whole heads: query, K/V (the full-attention layers' own too, Gemma 4's)
    and, with linear attention, its key and value heads."""
    return (model.heads % tp == 0 and model.kv_heads % tp == 0 and model.global_kv_heads % tp == 0
            and (not model.linear_layers or linear_heads_split(model, tp)))


def linear_cp_runs(stack: Stack) -> bool:
    """The stack runs context parallel over linear-attention layers (Megatron-Core's all-to-all)."""
    return stack.linear_attention_cp == "all_to_all"


def cp_degrees(model: ModelSpec, n: int, pinned: int | None, linear_cp: bool = False) -> list[int]:
    """Context-parallel degrees dividing ``n`` GPUs: a sequence splits into 2*cp load-balanced
    causal chunks (torchtitan, Megatron-Core), so seq_len must divide by 2*cp; searched only for
    long sequences (each rank keeping at least CP_MIN_TOKENS), any pinned degree tried. With
    linear-attention layers, none but 1 unless the stack runs them split (``linear_cp``: then the
    degree must also leave whole linear heads per rank, which ``_mesh`` checks with tp)."""
    if model.linear_layers and not linear_cp:
        return [1] if pinned in (None, 1) else []
    if pinned is not None:
        return [pinned] if n % pinned == 0 and (pinned == 1 or model.seq_len % (2 * pinned) == 0) else []
    return [c for c in _divisors(n) if c == 1 or (c <= CP_MAX and model.seq_len % (2 * c) == 0
                                                  and model.seq_len // c >= CP_MIN_TOKENS)]


@functools.lru_cache(maxsize=256)  # a tuple of a few hundred rows, the same for every search of a model, count and pins
def _mesh(model: ModelSpec, gpus: int, pins: Pins, uneven: bool = False,
          extra_vpp: int | None = None, linear_cp: bool = False) -> tuple[tuple[int, int, int, int, int], ...]:
    """Every (dp, tp, pp, vpp, cp) whose product dp*tp*pp*cp is the GPU count, tp dividing the heads,
    vpp dividing the layers per stage, and the pinned ones kept. ``uneven``: the stack splits
    layers unevenly across virtual stages too (torchtitan's split points, Megatron-Core's
    first/last-stage layer counts), so a few interleaving degrees are tried when layers do not
    divide pp*vpp (Llama 3 405B: 126 layers). ``extra_vpp``: a pinned degree tried as well, unpinned
    (the widened table of ``enumerate_layouts``). ``linear_cp``: the stack splits linear-attention
    layers over context parallel too (tp*cp dividing their heads)."""
    out = []
    for tp in _dividing(gpus, pins.tp):
        if not tp_splits(model, tp):
            continue
        for pp in _dividing(gpus // tp, pins.pp):
            if pp > model.layers:
                continue
            vpps = _vpps(model, pp, uneven, pins.vpp, extra_vpp)
            for cp in cp_degrees(model, gpus // (tp * pp), pins.cp, linear_cp):
                dp = gpus // (tp * pp * cp)
                if (pins.dp is not None and dp != pins.dp) or (cp > 1 and not linear_heads_split(model, tp * cp)):
                    continue
                out += [(dp, tp, pp, vpp, cp) for vpp in vpps]
    return tuple(out)


def _vpps(model: ModelSpec, pp: int, uneven: bool, pinned: int | None, extra: int | None) -> list[int]:
    """``_mesh``'s interleaving degrees for ``pp`` stages: 1, those dividing the layers per stage
    evenly, and under ``uneven`` the few UNEVEN_VPP (and ``pinned``, ``extra``) that leave each
    virtual stage a layer; with one pinned, it alone when it is one of them."""
    layers = model.layers

    def even(v: int) -> bool:  # each virtual stage as many layers (v divides the layers per stage)
        return pp > 1 and v > 1 and (layers // pp) % v == 0 and layers % (pp * v) == 0

    def spread(v: int) -> bool:  # a stack that splits unevenly: a layer for each virtual stage
        return uneven and pp > 1 and v > 1 and pp * v <= layers

    if pinned is not None:  # it alone, when the list below would hold it
        return [pinned] if pinned == 1 or even(pinned) or spread(pinned) else []
    vpps = [1] + [v for v in _divisors(layers // pp) if even(v)]
    tried = set(UNEVEN_VPP) | ({extra} if extra else set())
    return vpps + [v for v in sorted(tried) if spread(v) and v not in vpps]


def _dividing(n: int, pinned: int | None) -> tuple[int, ...]:
    """The divisors of ``n``; with a pinned one, it alone (if it divides ``n``)."""
    if pinned is None:
        return _divisors(n)
    return (pinned,) if n % pinned == 0 else ()


def _values(d, job: Job, model: ModelSpec, pinned: object, widen: bool) -> list:
    """The values of one dimension the enumeration tries: the pinned one, or those it declares for
    the search (``widen``: those and the pinned one)."""
    if pinned is not None and not widen:
        return [pinned]
    searched = list(d.searched(job, model))
    if pinned is None:
        return searched
    return searched + [pinned] * (pinned not in searched)


def enumerate_layouts(model: ModelSpec, gpus: int, job: Job, pins: Pins = Pins(),
                      widen: bool = False, gpus_per_node: int | None = None,
                      as_row: bool = False) -> tuple[Candidates, str]:
    """All valid layouts as columns, and a reason when there are none. ``widen``: every layout of
    the free search plus the pinned values, unchecked, so that the layouts of these pins, and of
    any of them freed, are a selection of one table (``matches``). ``gpus_per_node``: leave out
    the hybrid-sharded layouts whose group fits in one node (``without_redundant_hybrid``).
    ``as_row``: when the fields allow one layout alone (every one pinned), that layout as
    ``Candidates.one_row`` gives it (its columns Python scalars), built without arrays."""
    stack = job_stack(job)
    if model.index_topk:
        require(stack.sparse_attention, "stack", stack.name,
                lambda: "one that runs DeepSeek sparse attention, as this model needs (its time and memory are "
                        "Megatron-Core's dsa variant's): " + stacks_with(lambda s: s.sparse_attention))
    if model.mtp_layers:
        require(stack.multi_token_prediction, "mtp_layers", model.mtp_layers,
                lambda: f"0 on the {stack.name} stack, which trains no multi-token-prediction modules; "
                        "stacks that do: " + stacks_with(lambda s: s.multi_token_prediction))
        require(not job.lora, "mtp_layers", model.mtp_layers,
                "0 under --mode lora (the modules train beside the model in pretraining and full fine-tuning)")
    if not widen:
        _check_pins_once(model, gpus, pins, job.global_batch, stack)
        check_stack_pins(stack, pins)
        if pins.schedule == "dualpipev" and job.compile:
            raise PlannerError("schedule", "dualpipev", "torch's ScheduleDualPipeV does not run compiled stages "
                                                        "(its split backward); drop --compile or pin --schedule 1f1b")
    uneven, linear_cp = stack.uneven_interleave, bool(model.linear_layers) and linear_cp_runs(stack)
    mesh = (_mesh(model, gpus, Pins(), uneven, pins.vpp, linear_cp) if widen
            else _mesh(model, gpus, pins, uneven, None, linear_cp))
    if not mesh:
        linear = (f"; tp*cp dividing linear_key_heads={model.linear_key_heads} and linear_value_heads="
                  f"{model.linear_value_heads}" if model.linear_layers else "")
        return Candidates.empty(), (f"no (dp, tp, pp, vpp, cp) multiplies to gpus={gpus} with tp dividing "
                                    f"heads={model.heads} and kv_heads={model.kv_heads}{linear} and the fields "
                                    f"pinned ({pins.pinned()})")
    # Every other dimension: its pinned value, or the values it declares for the search.
    free = _FREE_DIMS
    values = {d.name: _values(d, job, model, getattr(pins, d.name), widen) for d in free}
    if len(mesh) == 1 and all(len(v) == 1 for v in values.values()):  # one layout (every field pinned)
        one, why = _one_layout(model, gpus, job, pins, mesh[0], values, gpus_per_node)
        return (one if as_row or why else one.table()), why
    codes = {d.name: d.encode(values[d.name]) for d in free}
    mesh_cols = dict(zip(("dp", "tp", "pp", "vpp", "cp"), np.array(mesh, dtype=np.int64).T.copy()))
    gb, batch_ok = _batch_table(model, gpus, job, mesh_cols["dp"], codes["micro_batch"])
    rules = _rules(model, job, gpus_per_node)
    # The product grows a dimension at a time. A rule applies as soon as the columns it reads exist:
    # before the product grows when it reads only the mesh and dimensions of one value (constant
    # columns from the start), else when the last dimension it reads of several values is added
    # (at the last step when one of them is no dimension of the product).
    names = [d.name for d in free]
    grows = [n for n in names if len(codes[n]) > 1]
    at = [max((names.index(n) for n in needs if n in grows), default=-1)
          if all(n in names or n in mesh_cols for n in needs) else len(names) - 1 for needs, _ in rules]
    c = _Product(mesh_cols, codes, gb, batch_ok)
    c.keep([rule for (_, rule), when in zip(rules, at) if when == -1])
    for step, name in enumerate(names):
        c.extend(name, [rule for (_, rule), when in zip(rules, at) if when == step])
    c = c.candidates()
    if len(c) == 0:
        return c, _NO_SPLIT.format(job.global_batch, pins.pinned())
    return c, ""


_FREE_DIMS = tuple(d for d in LAYOUT_DIMS if d.searched is not None)  # the dimensions beside the mesh's


@by_identity  # the same rules for every layout of a model, job and node size
def _rules(model: ModelSpec, job: Job, gpus_per_node: int | None) -> tuple:
    """The enumeration's rules across dimensions: (the dimensions each rule reads besides the
    mesh's, the rule), the batch rule first."""
    stack, gpipe, dualpipe = job_stack(job), GPIPE, DUALPIPEV
    batch_rule = (("micro_batch",), lambda c: c.batch_ok)  # the global batch splits (``_batch_table``)
    rules = (  # (the dimensions each rule reads besides the mesh's, the rule)
        batch_rule,
        (("sequence_parallel",), lambda c: not_(c.sequence_parallel & (c.tp == 1))),  # SP means nothing without TP
        # Interleaved 1F1B (Megatron's, torch's) takes micro-batches in rounds of pp: m % pp.
        (("micro_batch", "schedule"), lambda c: (c.vpp == 1) | (c.m % c.pp == 0) | (c.schedule == dualpipe)),
        (("schedule",), lambda c: not_((c.schedule == gpipe) & (c.vpp > 1))),  # GPipe is not interleaved here
        # DualPipeV: two stages per rank (vpp 2), at least as many micro-batches as stages (torch's
        # ScheduleDualPipeV: n_microbatches >= 2 pp).
        (("schedule", "micro_batch"),
         lambda c: (c.schedule != dualpipe) | ((c.pp > 1) & (c.vpp == 2) & (c.m >= 2 * c.pp))),
        (("zero_stage", "schedule", "offload"), lambda c: runs_on_stack(c, stack)),
        (("ep",), lambda c: expert_parallel_ok(model, c)),
        (("sequence_parallel",), lambda c: moe_sequence_parallel_ok(model, c)),
        # Hybrid sharding: with ZeRO on a group of more than one rank, without expert parallel (its
        # expert-data-parallel groups are not split again here); whether the group spans nodes is
        # known with the hardware (``search`` drops the layouts where hybrid equals full).
        (("sharding", "zero_stage", "ep"),
         lambda c: (c.sharding == 0) | ((c.zero_stage >= 1) & (c.shard_group > 1) & (c.ep == 1))),
    )
    if gpus_per_node is not None:
        rules += ((("sharding",), lambda c: _not_redundant_hybrid(c, gpus_per_node)),)
    return rules


def _one_layout(model: ModelSpec, gpus: int, job: Job, pins: Pins, mesh: tuple, values: dict,
                gpus_per_node: int | None) -> tuple[Candidates, str]:
    """``enumerate_layouts`` of one layout (each field one value), as Python scalars: the layout
    (``Candidates.one_row``'s kind) when every rule keeps it, else no layout and the reason. Its
    values are those the product would give that row (``_batch_table``'s global batch)."""
    (dp, tp, pp, vpp, cp) = mesh
    mb = values["micro_batch"][0]
    if job.global_batch is not None:
        gb = job.global_batch
        batch_ok = gb % (dp * mb) == 0
    else:  # _batch_table's, on a table of this one layout
        gb_col, ok = _batch_table(model, gpus, job, np.array([dp], dtype=np.int64), np.array([mb], dtype=np.int64))
        gb, batch_ok = gb_col.item(0), bool(ok.item(0))
    columns = {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "global_batch": gb}
    fields = dict(columns)  # the Layout: each value as a column holds it and as Layout.decode gives it back
    for name, v in values.items():
        d = DIMS[name]
        columns[name] = code = d.code(v[0])
        fields[name] = d.decode(code)
    one = one_row_of(columns, _checked_layout(fields))
    _, *rules = _rules(model, job, gpus_per_node)
    if batch_ok:
        for _, rule in rules:
            if not rule(one):
                break
        else:
            return one, ""
    return Candidates.empty(), _NO_SPLIT.format(job.global_batch, pins.pinned())


_NO_SPLIT = ("no layout splits global_batch={} sequences into dp x micro_batch (and m divisible by pp when "
             "interleaved, m >= 2 pp under DualPipeV) with the fields pinned ({})")


def _batch_table(model: ModelSpec, gpus: int, job: Job, dp: np.ndarray,
                 micro_batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of every (mesh row, micro-batch) pair, and whether it is kept (shape
    (len(dp), len(micro_batch))): the job's, kept when dp*micro_batch divides it; else about 4M
    tokens, rounded per layout, never more than 1.5x that unless dp alone needs it."""
    dp_mb = dp[:, None] * micro_batch[None, :]
    if job.global_batch is not None:
        gb = np.full_like(dp_mb, job.global_batch)
        return gb, gb % dp_mb == 0
    target = job.batch_tokens_target(gpus)
    gb = default_global_batch(model, dp_mb, target)
    # Only when no layout keeps the batch near the target does data parallelism alone set it
    # (405B on 16,384 GPUs must not pick DP 16384 and a 134M-token batch).
    near = gb * model.seq_len <= 1.5 * target
    return gb, near if near.any() else (gb == dp_mb) & (micro_batch[None, :] == 1)


def _bits(count: int) -> int:
    """Bits that hold an index below ``count``."""
    return max(count - 1, 0).bit_length()


_CANDIDATE_PROPERTIES = {name: v for name, v in vars(Candidates).items() if isinstance(v, property)}


GROW_ROWS = 16384  # ``_Product.extend`` builds a product up to this many rows before its rules prune it


class _Product:
    """The layouts enumerated so far: the mesh rows times the values of the dimensions added, in
    lexicographic order (a meshgrid's, flattened), read like ``Candidates`` (columns by name, and
    its properties) by the enumeration's rules. Pruning while it grows keeps the full product (a
    hundred times the valid layouts) from ever being built. Each row is one number whose bit
    fields, most significant first, are the mesh row and each dimension's value index, so growing
    and pruning move one column and reading a field is a shift and a mask."""

    def __init__(self, mesh: dict[str, np.ndarray], codes: dict[str, np.ndarray], gb: np.ndarray,
                 batch_ok: np.ndarray) -> None:
        self._mesh, self._codes, self._gb, self._batch_ok = mesh, codes, gb, batch_ok
        self._code = np.arange(len(gb), dtype=np.int64)
        self._bits = {"mesh": _bits(len(gb))}  # the fields of the code, most significant first
        self._read: dict[str, np.ndarray] = {}  # fields and columns read from the current code
        self._fixed: tuple[str, int] | None = None  # (dimension, value index) tried before it is added
        self._read_fixed = False  # whether the column being read read that value

    def extend(self, name: str, rules: list = ()) -> None:
        """Add dimension ``name`` (each row times its values), keeping the rows where ``rules`` hold.
        With several values and more than GROW_ROWS rows once multiplied, the rules are read once
        per value on the rows before they multiply (the columns of the other dimensions read once
        for all values), and only the rows kept are built; up to GROW_ROWS, the rows are built and
        the rules read once on them (fewer numpy calls: the same rows, in the same order)."""
        k = len(self._codes[name])
        if k == 0:  # a dimension with no value: no layout
            self._bits[name] = 0
            self._code, self._read = self._code[:0], {}
            return
        if k == 1 or not rules or len(self._code) * k <= GROW_ROWS:
            self._bits[name] = _bits(k)
            if k > 1:
                self._code = ((self._code[:, None] << self._bits[name]) | np.arange(k)).reshape(-1)
                self._read = {}
            self.keep(rules)
            return
        bits = _bits(k)
        held = np.zeros((len(self._code), 1 << bits), dtype=bool)  # each row's values held, a row per code
        for v in range(k):
            self._fixed = (name, v)
            held[:, v] = self._holds(rules)
        self._fixed = None
        self._bits[name] = bits
        # The codes kept, in order: a held cell's flat index is its row's position and its value's bits.
        kept = np.flatnonzero(held)
        self._code, self._read = (self._code[kept >> bits] << bits) | (kept & ((1 << bits) - 1)), {}

    def _holds(self, rules: list) -> np.ndarray:
        keep = np.ones(len(self._code), dtype=bool)
        for rule in rules:
            keep &= rule(self)
        return keep

    def keep(self, rules: list) -> None:
        if rules:
            keep = self._holds(rules)
            if not keep.all():
                self._code, self._read = self._code[keep], {}

    def _index(self, name: str) -> np.ndarray:
        """Which value of dimension ``name`` (or which mesh row) each row holds."""
        if self._fixed is not None and name == self._fixed[0]:  # the value being tried (``extend``)
            self._read_fixed = True
            return self._fixed[1]
        if name not in self._read:
            if name not in self._bits:  # a dimension of one value not added yet: its only value
                assert len(self._codes[name]) == 1, name
                return np.zeros(len(self._code), dtype=np.int64)
            fields = list(self._bits)
            shift = sum(self._bits[f] for f in fields[fields.index(name) + 1:])
            self._read[name] = (self._code >> shift) & ((1 << self._bits[name]) - 1)
        return self._read[name]

    def _column(self, name: str) -> np.ndarray:
        # (``take``, and a table's cells by their flat index: numpy's fancy indexing costs more,
        # twice that with two index arrays.)
        if name in self._mesh:
            return self._mesh[name].take(self._index("mesh"))
        if name in ("global_batch", "batch_ok"):
            table = self._gb if name == "global_batch" else self._batch_ok
            return table.ravel().take(self._index("mesh") * table.shape[1] + self._index("micro_batch"))
        if len(self._codes[name]) == 1:  # one value: no field in the code, read as a scalar (a rule holds of one
            return self._codes[name].item(0)  # layout's scalars too: ``_one_layout``)
        return self._codes[name].take(self._index(name))

    _once = _computed  # (the properties of ``Candidates`` read by the rules: computed each time)

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _CANDIDATE_PROPERTIES:  # m, gpus, shard_group, ...: as Candidates computes them
            return _CANDIDATE_PROPERTIES[name].fget(self)
        if name == "zero_group":  # a method of the columns, as Candidates has it
            return types.MethodType(Candidates.zero_group, self)
        key = "column " + name
        if key in self._read:
            return self._read[key]
        self._read_fixed = False
        column = self._column(name)
        if not self._read_fixed:  # kept while ``extend`` tries the next value: it does not read that one
            self._read[key] = column
        return column

    def candidates(self) -> Candidates:
        n = len(self._code)
        return Candidates(**{name: np.full(n, self._codes[name][0]) if len(self._codes.get(name, ())) == 1
                             else getattr(self, name) for name in DIMS})


def expert_parallel_ok(model: ModelSpec, c: Candidates) -> np.ndarray:
    """Expert parallel's rules (Megatron-Core, torchtitan): ep divides the routed experts and the
    dp*cp ranks it is carved out of; a dense model has ep 1 (and see ``moe_sequence_parallel_ok``)."""
    if not model.moe:
        return c.ep == 1
    return (model.experts % c.ep == 0) & (c.shard_group % c.ep == 0)


def moe_sequence_parallel_ok(model: ModelSpec, c: Candidates) -> np.ndarray | bool:
    """An MoE with tp > 1 runs sequence parallel (Megatron-Core requires it: the token dispatcher
    works on the sequence shard); so does DSA (its absorbed MLA asserts it)."""
    return (c.tp == 1) | c.sequence_parallel if model.moe or model.index_topk else True


def one_of(column: np.ndarray, values) -> np.ndarray:
    """``np.isin`` for the few values of a layout dimension: one comparison each (isin sorts); one
    layout's value (a scalar) as a bool."""
    if type(column) is not np.ndarray:
        return column in values
    out = np.zeros(np.shape(column), dtype=bool)
    for v in values:
        out |= column == v
    return out


def without_redundant_hybrid(c: Candidates, gpus_per_node: int) -> Candidates:
    """Drop hybrid-sharded layouts whose group fits in one node: there hybrid is full sharding."""
    return c.take(np.flatnonzero(_not_redundant_hybrid(c, gpus_per_node)))


def _not_redundant_hybrid(c: Candidates, gpus_per_node: int) -> np.ndarray:
    return (c.sharding == 0) | (c.zero_group(gpus_per_node) < c.shard_group)


def runs_on_stack(c: Candidates, stack: Stack) -> np.ndarray:
    """The layouts the software stack can run: its ZeRO stages, its pipeline schedules, and
    interleaving only where it has an interleaved schedule (planner/stacks.py)."""
    schedules, offloads = _stack_codes(stack)
    ok = one_of(c.zero_stage, stack.zero_stages) & (one_of(c.schedule, schedules) | (c.pp == 1))
    # Offload: the modes the stack has; the optimizer's needs ZeRO >= 1 (DeepSpeed's ZeRO-Offload,
    # Megatron's distributed optimizer), the parameters' ZeRO-3 (they are streamed in per layer).
    ok &= one_of(c.offload, offloads)
    ok &= (c.offload == 0) | (c.zero_stage >= where(c.offload == 2, 3, 1))
    if not stack.model_parallel:  # data parallel only (llm-foundry: Composer's FSDP has no TP or PP)
        ok &= (c.tp == 1) & (c.pp == 1) & (c.cp == 1) & (c.ep == 1)
    return ok & ((c.vpp == 1) | stack.interleaved)


@by_identity
def _stack_codes(stack: Stack) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The stack's pipeline schedules and offload modes as a column holds them."""
    return tuple(SCHEDULES.index(s) for s in stack.schedules), tuple(OFFLOAD.index(m) for m in stack.offload)


def stacks_with(test: Callable[[Stack], bool]) -> str:
    """The built-in stacks that pass ``test``, by name: what a refusal offers instead."""
    return ", ".join(n for n in stack_names() if test(get_stack(n)))


def check_stack_pins(stack: Stack, pins: Pins) -> None:
    """A pinned value the stack cannot run: one error naming the stacks that can."""
    if pins.zero_stage is not None and pins.zero_stage not in stack.zero_stages:
        raise PlannerError("zero_stage", pins.zero_stage,
                           f"the {stack.name} stack runs ZeRO {', '.join(map(str, stack.zero_stages))}; "
                           f"stacks with ZeRO-{pins.zero_stage}: {stacks_with(lambda s: pins.zero_stage in s.zero_stages)}")
    if pins.schedule is not None and pins.schedule not in stack.schedules:
        raise PlannerError("schedule", pins.schedule, f"the {stack.name} stack runs {', '.join(stack.schedules)}; "
                                                      f"stacks with {pins.schedule}: "
                                                      f"{stacks_with(lambda s: pins.schedule in s.schedules)}")
    if pins.offload is not None and pins.offload not in stack.offload:
        raise PlannerError("offload", pins.offload, f"the {stack.name} stack offloads {', '.join(stack.offload)}; "
                                                    f"stacks with {pins.offload}: "
                                                    f"{stacks_with(lambda s: pins.offload in s.offload)}")
    if pins.offload in ("optimizer", "params") and pins.zero_stage is not None:
        need = 3 if pins.offload == "params" else 1
        require(pins.zero_stage >= need, "zero_stage", pins.zero_stage,
                f"offload {pins.offload} needs ZeRO stage {need} or higher")
    if pins.schedule == "dualpipev":
        require(pins.vpp in (None, 2), "vpp", pins.vpp, "2 with --schedule dualpipev (two stages per rank in a V)")
        require(pins.pp is None or pins.pp > 1, "pp", pins.pp, "> 1 with --schedule dualpipev (a pipeline)")
    for dim in ("tp", "pp", "cp", "ep"):
        value = getattr(pins, dim, None)
        if not stack.model_parallel and value is not None and value > 1:
            raise PlannerError(dim, value, f"the {stack.name} stack is data parallel only ({dim} 1); stacks with "
                                           f"model parallelism: {stacks_with(lambda s: s.model_parallel)}")
    if pins.vpp is not None and pins.vpp > 1 and not stack.interleaved:
        raise PlannerError("vpp", pins.vpp, f"the {stack.name} stack has no interleaved schedule; "
                                            f"stacks with one: {stacks_with(lambda s: s.interleaved)}")


def batch_units(model: ModelSpec, gpus: int, job: Job, pins: Pins = Pins()) -> set[int]:
    """Every global batch some layout with these pins can split is a multiple of one of these:
    dp*micro_batch, times pp when interleaved (m divisible by pp)."""
    mbs = _values(DIMS["micro_batch"], job, model, pins.micro_batch, widen=False)
    gpipe = pins.schedule == "gpipe"  # GPipe is not interleaved here
    mesh = _mesh(model, gpus, pins, False, None, bool(model.linear_layers) and linear_cp_runs(job_stack(job)))
    return {dp * mb * (pp if vpp > 1 else 1) for dp, _, pp, vpp, _ in mesh for mb in mbs
            if not (gpipe and vpp > 1)}


def matches(c: Candidates, pins: Pins) -> np.ndarray:
    """The rows of ``c`` that agree with every pinned field."""
    keep = np.ones(len(c), dtype=bool)
    for name, value in pins.pinned().items():
        keep &= getattr(c, name) == DIMS[name].encode([value])[0]
    return keep


def searched_by_default(c: Candidates, job: Job, model: ModelSpec) -> np.ndarray:
    """The rows of ``c`` that the search tries with nothing pinned (a widened table holds more)."""
    keep = ~(c.sequence_parallel & (c.tp == 1))
    for d in LAYOUT_DIMS:
        if d.searched is not None:
            keep &= one_of(getattr(c, d.name), d.encode(list(d.searched(job, model))))
    return keep


def rank_order(ev: Evaluation, objective: str) -> np.ndarray:
    """Fitting layouts first, by memory tier (under the plan's safe line, fitting above it, tight:
    ``Evaluation.tier``); within each tier by the objective, then by memory; layouts that do not
    fit by how much they exceed capacity. (``np.lexsort`` of ``_rank_keys``, sorted in two
    parts: the layouts ranked by the objective first, then the rest, most of a large table, by
    memory alone where that is all their keys hold.)"""
    mem, second, bucket = _rank_keys(ev, objective)
    ranked = np.isfinite(bucket)
    head, tail = np.flatnonzero(ranked), np.flatnonzero(~ranked)
    head = head[lexsort((mem[head], second[head], bucket[head]))]
    mem_tail, second_tail = mem[tail], second[tail]
    if np.array_equal(second_tail, mem_tail):  # none fits: ranked by memory (a stable sort keeps ties in order)
        return np.concatenate([head, tail[lexsort((mem_tail,))]])
    return np.concatenate([head, tail[lexsort((mem_tail, second_tail))]])


def lexsort(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """``np.lexsort(keys)``: the rows by the last key, then the one before..., rows equal in every key
    in table order (NaN last, -0.0 equal to 0.0). The rows are put in order by the last two keys
    (``_stable_order``), and only rows equal on both are then ordered by the keys before (few: the
    ranking's memory breaks ties of objective and step time), where ``np.lexsort`` sorts every row
    by every key, a sort of float64 keys in random order each."""
    if len(keys) == 1:
        return _stable_order(keys)
    *rest, second, first = keys
    order = _stable_order((second, first))
    if rest and len(order) > 1:
        f, s = first[order], second[order]
        tie = _equal(f[1:], f[:-1]) & _equal(s[1:], s[:-1])  # position i and i + 1 tie
        if tie.any():
            joined = np.concatenate([[False], tie])  # position i ties with i - 1
            run = np.cumsum(~joined)  # each run of positions tied together: one number
            held = joined.copy()
            held[:-1] |= tie
            rows = np.flatnonzero(held)  # the positions in a run of ties
            tied = order[rows]
            order[rows] = tied[np.lexsort((*(k[tied] for k in rest), run[rows]))]
    return order


RADIX_MIN_ROWS = 256  # ``_stable_order`` sorts by 16-bit digits from this many rows


def _stable_order(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """The rows in the order of ``keys`` (the last most significant), rows equal in all in table
    order: ``np.lexsort`` of one or two keys. Of many rows, with every key float64 or int64, a
    radix sort: each key an unsigned integer in the same order (``_sort_bits``), sorted by the
    16-bit digits that vary, least significant first, each by numpy's stable sort of 16-bit
    integers (itself a radix sort). A comparison sort of a table's float keys (step times,
    memory) mispredicts a branch at about every other comparison where it sees the keys once, as
    a search does: on the ranking keys of eight searches (33B to 70B, 600 to 6,400 rows) sorted in
    turn, numpy's stable sort took 42-52 ns a row and this 22-24 ns (sorting one array over and
    over trains the branch predictor: 11 ns, a speed no search sees)."""
    order = None
    if len(keys[0]) < RADIX_MIN_ROWS or any(k.dtype not in _RADIX_DTYPES for k in keys):
        for k in keys:
            order = _then_by(order, k)
        return order
    for k in keys:
        b = _sort_bits(k)
        varied = int(np.bitwise_or.reduce(b ^ b[0]))  # the bits that differ between some rows
        digits = b.view(np.uint16).reshape(-1, 4)  # each row's four 16-bit digits, in memory order
        for d in range(4):
            if (varied >> (16 * d)) & 0xFFFF:
                order = _then_by(order, digits[:, d if _LITTLE else 3 - d])
    return np.arange(len(keys[0])) if order is None else order


def _then_by(order: np.ndarray | None, key: np.ndarray) -> np.ndarray:
    """The rows in ``order`` (None: table order) sorted stably by ``key``: one more, more
    significant key for an order of the keys before it."""
    if order is None:
        return np.argsort(key, kind="stable")
    return order.take(np.argsort(key.take(order), kind="stable"))


_LITTLE = sys.byteorder == "little"
_SIGN = np.uint64(1 << 63)


_RADIX_DTYPES = (np.dtype(np.float64), np.dtype(np.int64))  # the keys ``_sort_bits`` takes


def _sort_bits(key: np.ndarray) -> np.ndarray:
    """``key`` (float64 or int64) as unsigned 64-bit integers in the order a stable sort gives it
    (a float64 key: NaN last, -0.0 equal to 0.0)."""
    if key.dtype == np.float64:
        x = key + 0.0  # -0.0 as 0.0
        nan = np.isnan(x)
        if nan.any():  # every NaN as one, above +inf
            x[nan] = np.nan
        u = x.view(np.uint64)
        # Positive floats: the sign bit set above the negatives; negative ones: every bit flipped.
        return u ^ ((np.uint64(0) - (u >> np.uint64(63))) | _SIGN)
    return key.view(np.uint64) ^ _SIGN


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a == b`` as a sort sees it: NaN equal to NaN."""
    same = a == b
    if a.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    return same


def _rank_keys(ev: Evaluation, objective: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rank_order``'s sort keys, least significant first (``np.lexsort``'s order)."""
    require(objective in OBJECTIVES, "sort", objective, _OBJECTIVES_ALLOWED)
    # The objective's column alone (each is a few passes over the table)
    primary = ev.train_seconds if objective == "time" else ev.cost_usd if objective == "cost" else ev.memory.total
    fits = ev.fits
    primary = np.where(fits, primary, np.inf)
    # Layouts within 0.1% of each other on the objective are a tie: prefer less memory. Layouts
    # that do not fit come last, those closest to fitting first.
    bucket = np.round(np.log(primary, where=np.isfinite(primary), out=np.full_like(primary, np.inf)) / 1e-3)
    # Memory tiers before the objective (Evaluation.tier): under the plan's safe line, fitting above
    # it, tight (within the stack's measured memory error of capacity); |log| / 1e-3 < 1e5 always.
    bucket = bucket + TIER_STEP * ev.tier
    second = np.where(fits, ev.step_s, ev.memory.total)
    return ev.memory.total, second, bucket


def search(model: ModelSpec, hw: HardwareProfile, job: Job, gpus: int, pins: Pins = Pins(),
           objective: str = "time", widen: bool = False) -> SearchResult:
    """Enumerate, evaluate, rank. ``widen``: the table of ``enumerate_layouts(widen=True)``."""
    start = time.perf_counter()
    if not hw.gpu.supports(job.precision):
        have = [p for p in hw.gpu.peak_flops if hw.gpu.supports(p)]
        raise PlannerError("precision", job.precision, f"{hw.name} has no {job.precision} tensor rate; "
                                                       f"choose one of {', '.join(have)}")
    # Hybrid sharding where the group fits in a node is full sharding: left out unless pinned.
    c, why = enumerate_layouts(model, gpus, job, pins, widen,
                               hw.network.gpus_per_node if pins.sharding is None else None, as_row=True)
    if len(c) == 0:
        raise PlannerError("layout", pins.pinned() or "search", why)
    require(objective in OBJECTIVES, "sort", objective, _OBJECTIVES_ALLOWED)
    if len(c) == 1:  # one layout (every field pinned): evaluated as scalars, its own order
        one = evaluate_one(model, hw, job, c, gpus)
        return SearchResult(_table=None, one=one, order=_ONE_ORDER, evaluated=1,
                            feasible=int(one.fits), search_seconds=time.perf_counter() - start, objective=objective)
    ev, deferred = evaluate_deferred(model, hw, job, c, gpus)
    order = rank_order(ev, objective)
    return SearchResult(_table=ev, order=order, evaluated=len(c), feasible=int(ev.fits.sum()),
                        search_seconds=time.perf_counter() - start, objective=objective, _deferred=deferred)


def enumerate_counts(model: ModelSpec, counts, job: Job) -> dict[int, Candidates]:
    """``enumerate_layouts``' free layouts of each GPU count; a count no layout splits into is left out."""
    out = {}
    for n in counts:
        try:
            out[n] = enumerate_layouts(model, n, job)[0]
        except PlannerError:
            continue
    return out


def counts_table(tables: dict[int, Candidates], gpus_per_node: int) -> tuple[list[int], Candidates, np.ndarray, dict]:
    """The layouts of several GPU counts as one table, as ``search`` keeps them (hybrid sharding
    where the group fits in a node is full sharding, dropped): (the counts with layouts, the
    table, each row's index in those counts, a dict for what profiles evaluating it share).
    ``tables``: {count: ``enumerate_layouts``' layouts}."""
    counts, parts = [], []
    for n, c in tables.items():
        c = without_redundant_hybrid(c, gpus_per_node)
        if len(c):
            counts.append(n)
            parts.append(c)
    if not parts:
        return [], Candidates.empty(), np.zeros(0, dtype=np.int64), {}
    together = Candidates(**{name: np.concatenate([getattr(c, name) for c in parts]) for name in DIMS})
    return counts, together, np.repeat(np.arange(len(parts)), [len(c) for c in parts]), {}


def first_per_segment(keys: list[np.ndarray], segment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows grouped in contiguous segments (``segment``: each row's label, ascending), the
    segments and the index of each one's first row by ``keys`` (least significant first, as
    ``_rank_keys`` gives them): the rows with every key at their segment's least, the first of them."""
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    owner = np.searchsorted(starts, np.arange(len(segment)), "right") - 1
    best = np.ones(len(segment), dtype=bool)
    for key in keys[::-1]:  # most significant first
        key = np.where(best, key, np.inf)
        best &= key == np.minimum.reduceat(key, starts)[owner]
    found, first = np.unique(segment[best], return_index=True)
    return found, np.flatnonzero(best)[first]


def fastest_fitting(model: ModelSpec, hw: HardwareProfile, job: Job,
                    table: tuple[list[int], Candidates, np.ndarray, dict]) -> dict[int, Evaluation]:
    """For each GPU count, the layout a free ``search`` by time ranks first, when it fits: a one-row
    Evaluation (its ``gpus`` the count). ``table``: ``counts_table`` at the profile's GPUs per node
    (profiles running the same job share it, and the memory of its layouts where they read the
    same of the hardware). The counts' layouts are evaluated together, the step time only for those
    that fit: each row's numbers, and so each count's order, are the search's."""
    if not hw.gpu.supports(job.precision):
        have = [p for p in hw.gpu.peak_flops if hw.gpu.supports(p)]
        raise PlannerError("precision", job.precision, f"{hw.name} has no {job.precision} tensor rate; "
                                                       f"choose one of {', '.join(have)}")
    counts, together, segment, shared = table
    if not counts:
        return {}
    blocks = evaluate_fitting(model, hw, job, together, shared)
    if not blocks:
        return {}
    # Each count's first row in ``rank_order`` (its keys: objective bucket, step time, memory; then
    # the row's place): the rows with each key at its count's least, the first of them. The blocks
    # hold the fitting rows in table order, so their keys joined are in that order too.
    keys = [np.concatenate(k) for k in zip(*(_rank_keys(ev, "time") for ev, _ in blocks))]
    rows = np.concatenate([r for _, r in blocks])
    found, first = first_per_segment(keys, segment[rows])  # ascending: the counts' rows are contiguous
    ends = np.cumsum([len(r) for _, r in blocks])
    out = {}
    for k, j in zip(found, first):
        b = int(np.searchsorted(ends, j, "right"))
        ev = blocks[b][0]
        local = j - (ends[b - 1] if b else 0)
        out[counts[k]] = dataclasses.replace(take(ev, np.array([local])), gpus=counts[k])
    return out


def select(result: SearchResult, index: np.ndarray) -> SearchResult:
    """The search result restricted to ``index``, rank positions (rank order kept when ``index`` ascends)."""
    index = np.asarray(index)
    order = result.order[np.flatnonzero(index) if index.dtype == bool else index]
    return dataclasses.replace(result, order=order, evaluated=len(order),
                               feasible=int(result.fits[order].sum()))
