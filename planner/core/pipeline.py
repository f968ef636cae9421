"""Pipeline schedule: how layers split into stages, the bubble, and micro-batches in flight.

The reference trainer calls ``stage_layer_ranges`` too, so what is predicted is what is run.
"""

from __future__ import annotations

import numpy as np

from planner.core.columns import any_, as_float, as_int, maximum, minimum, where
from planner.core.layout import DUALPIPEV, GPIPE
from planner.errors import require


def stage_layer_counts(layers: int, stages: int) -> list[int]:
    """Layers per (virtual) stage, in pipeline order.

    Even split; a remainder r goes one layer each to stages 1..r (not stage 0, which already
    holds the embedding and the most micro-batches in flight under 1F1B).
    """
    require(stages >= 1, "pp", stages, "a positive integer")
    require(stages <= layers, "pp", stages, f"at most layers={layers} (every stage needs a layer)")
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    for i in range(extra):
        counts[1 + i if stages > 1 else 0] += 1
    return counts


def stage_of(k: int, pp: int, schedule: str = "1f1b") -> int:
    """The rank that runs (virtual) stage k: k % pp (Megatron's interleaved assignment), or under
    DualPipeV the V: stages 0..pp-1 down the ranks, pp..2pp-1 back up (stage 2pp-1-r on rank r)."""
    if schedule == "dualpipev" and k >= pp:
        return 2 * pp - 1 - k
    return k % pp


def virtual_stage(rank: int, chunk: int, pp: int, schedule: str = "1f1b") -> int:
    """The stage a rank's chunk runs (``stage_of``'s inverse): chunk c of rank r is stage c pp + r,
    or under DualPipeV, on the way back up the V, stage 2 pp - 1 - r."""
    if schedule == "dualpipev" and chunk > 0:
        return 2 * pp - 1 - rank
    return chunk * pp + rank


def stage_layer_ranges(layers: int, pp: int, vpp: int = 1, schedule: str = "1f1b") -> list[list[tuple[int, int]]]:
    """For each pipeline rank, its [start, end) layer ranges, one per virtual stage it runs (in
    stage order: ``stage_of``). Interleaving needs layers divisible by pp*vpp; otherwise chunks
    would be empty or uneven.
    """
    if vpp > 1:
        require(layers % (pp * vpp) == 0, "vpp", vpp,
                f"interleaving needs layers={layers} divisible by pp*vpp={pp * vpp}")
    counts = stage_layer_counts(layers, pp * vpp)
    starts = np.concatenate([[0], np.cumsum(counts)])
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    for k in range(pp * vpp):
        ranges[stage_of(k, pp, schedule)].append((int(starts[k]), int(starts[k + 1])))
    return ranges


def head_layers(model, sw) -> float:
    """The output head and loss in units of one layer's work (their weight FLOPs over a layer's),
    when the stack (``sw``: planner.stacks.Software) balances them in the pipeline split; else 0.
    Multi-token-prediction modules are not counted: Megatron-Core's split reserves room for the loss
    alone (a layout placing fewer layers beside them is the user's --pipeline-model-parallel-layout)."""
    if not sw.stack.balance_pipeline:
        return 0.0
    layer = (model.matmul_params_per_token - model.vocab * model.hidden) / model.layers
    return model.vocab * model.hidden / layer


def stage_layers_arrays(layers: int, pp: np.ndarray, head_layers: float = 0.0
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised ``stage_layer_counts`` for three stages that bound the peak and the pace:
    the first stage, the fullest stage (stage 1 when there is a remainder) and the last stage.

    ``head_layers`` > 0: the split balances the last stage's output head and loss, worth that
    many layers of work, by giving the last stage fewer layers (Megatron-Core's
    --account-for-loss-in-pipeline-split / --decoder-last-pipeline-num-layers); the others share
    the rest evenly."""
    base, extra = divmod(layers, pp)
    first = where(pp == 1, layers, base)
    fullest = base + (extra > 0)
    last = where(pp == 1, layers, base + (extra >= pp - 1) * (extra > 0))
    if head_layers > 0:
        ppf = as_float(maximum(pp, 1))
        balanced_last = np.clip(np.rint((layers + head_layers) / ppf - head_layers), 1,
                                maximum(layers - (pp - 1), 1))
        rest = layers - balanced_last
        even = -(-rest // maximum(pp - 1, 1))  # ceil: the fullest of the other stages
        use = pp > 1
        last = as_int(where(use, balanced_last, last))
        fullest = as_int(where(use, maximum(even, last), fullest))
        first = as_int(where(use, rest // maximum(pp - 1, 1), first))
    return first, fullest, last


def schedule_name(schedule: str, vpp: int) -> str:
    """A layout's pipeline schedule as people name it."""
    if schedule == "gpipe":
        return "GPipe"
    if schedule == "dualpipev":
        return "DualPipeV"
    return "interleaved 1F1B" if vpp > 1 else "1F1B"


def stage_layers(model, c, sw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``stage_layers_arrays`` for each layout of ``c`` (planner.core.layout.Candidates): the
    stack's head balancing (``head_layers``) for 1F1B, interleaved and GPipe; none under DualPipeV,
    whose first rank holds the last stage, head and all (torch splits its stages evenly)."""
    h = head_layers(model, sw)
    arrays = stage_layers_arrays(model.layers, c.pp, h)
    v_shape = c.schedule == DUALPIPEV
    if h > 0 and any_(v_shape):
        even = stage_layers_arrays(model.layers, c.pp, 0.0)
        arrays = tuple(where(v_shape, a, b) for a, b in zip(even, arrays))
    return arrays


def bubble_fraction_ideal(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Idle time over ideal pipeline time: (p-1)/(v*m) for 1F1B and interleaved 1F1B
    (Narayanan et al. 2021, Sec. 2.2); GPipe has the same (p-1)/m (Huang et al. 2019)."""
    return (pp - 1) / (vpp * m)


def in_flight(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray, schedule: np.ndarray,
              stage: np.ndarray) -> np.ndarray:
    """Micro-batches whose activations a stage holds at its peak, in units of one micro-batch
    through that stage's layers.

    1F1B: stage i holds p - i (Narayanan et al. 2021, Sec. 2.2.1). Interleaved: the first stage
    holds p * (1 + (p-1)/(p*v)) = p + (p-1)/v (Korthikanti et al. 2022, Sec. 4.2.3); we add the
    same (p-1)/v to every stage. GPipe: all m. DualPipeV: every rank holds PP + 1 micro-batches of
    one of its two chunks (DeepSeek's DualPipe README, PP = 2p chunks), p + 1/2 of its two.
    Never more than the micro-batches that exist.
    """
    one_f_one_b = (pp - stage) + where(vpp > 1, (pp - 1) / vpp, 0.0)  # 1 without a pipeline
    piped = pp > 1  # without one, accumulation holds one micro-batch whatever the schedule's name
    held = where(piped & (schedule == GPIPE), m, where(piped & (schedule == DUALPIPEV), pp + 0.5, one_f_one_b))
    return minimum(held, m)


def dualpipe_bubble_ratio(forward: np.ndarray, backward: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """DualPipeV's bubble over 1F1B's on the same ranks: (PP/2 - 1)(F&B + B - 3W) against
    (p - 1)(F + B) per micro-batch (DeepSeek-AI 2024, DeepSeek-V3 report, Table 2; DualPipeV has
    PP = 2p chunks, two per rank). Per chunk F, B (the full backward, recompute included) and W
    (its weight gradients) are half a rank's; F&B, a forward and a backward chunk run together,
    is F + B when nothing overlaps them (torch runs them one after the other). So the ratio is
    (F + 2B - 3W) / (2 (F + B)) in a rank's per-layer times: 1/3 when B = 2F and W = F."""
    total = maximum(forward + backward, 1e-30)
    return np.clip((forward + 2 * backward - 3 * weight) / (2 * total), 0.0, 1.0)
