"""Communication time: an alpha-beta model per collective and per link tier.

Ring all-reduce moves 2*(n-1)/n of the buffer through each GPU's link, reduce-scatter and
all-gather (n-1)/n each (Patarasuk & Yuan 2009; the 'bus bandwidth' of nccl-tests). A group
that spans nodes reduces hierarchically: inside each node over NVLink, across nodes with each
GPU using its share of the node's NICs, then inside the node again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.columns import as_array, as_float, ceil_log2, floor, maximum, minimum, ones_like, where
from planner.hardware import HardwareProfile
from planner.memo import by_identity, fast_init


@fast_init
@dataclass(frozen=True, slots=True)
class Links:
    """Achieved bandwidth (bytes/s per GPU per direction) and latency (s) of the two tiers."""

    intra_bw: float
    inter_bw: float
    intra_lat: float
    inter_lat: float
    gpus_per_node: int
    p2p_bw: float  # a point-to-point send inside a node: the profile's measured figures, else the tier's
    p2p_lat: float
    tp_intra_bw: float = 0.0  # tensor-parallel collectives inside a node (0: intra_bw)

    @staticmethod
    def of(hw: HardwareProfile) -> "Links":
        return _links_of(hw)


@by_identity  # a profile's links, once (each step time reads them)
def _links_of(hw: HardwareProfile) -> Links:
    n, e = hw.network, hw.efficiency
    intra = n.intra_bytes_per_s * e.intra_node_bw
    tp = intra if e.tp_intra_node_bw is None else n.intra_bytes_per_s * e.tp_intra_node_bw
    return Links(intra, n.inter_bytes_per_s * e.inter_node_bw, n.intra_latency_s, n.inter_latency_s,
                 n.gpus_per_node, intra if n.p2p_bytes_per_s is None else n.p2p_bytes_per_s,
                 n.intra_latency_s if n.p2p_latency_s is None else n.p2p_latency_s, tp)


def _ring(bytes_: np.ndarray, n: np.ndarray, bw: float, lat: float, passes: float) -> np.ndarray:
    """``passes`` = 2 for all-reduce, 1 for reduce-scatter or all-gather; zero when n == 1."""
    n = as_float(n)
    steps = passes * (n - 1)
    return where(n > 1, steps / maximum(n, 1) * bytes_ / bw + steps * lat, 0.0)


def in_node(links: Links, size: np.ndarray, stride: np.ndarray) -> np.ndarray:
    """Ranks of a group of ``size`` ranks ``stride`` apart that share one node (ranks fill nodes in order)."""
    return minimum(size, maximum(links.gpus_per_node // maximum(stride, 1), 1))


def group_collective(links: Links, bytes_: np.ndarray, size: np.ndarray, stride: np.ndarray,
                     passes: float, intra_bw: float | None = None) -> np.ndarray:
    """Time of a collective over ``size`` ranks spaced ``stride`` apart (ranks fill nodes in order).

    k = ranks of the group inside one node; when the group spans nodes, the k ranks first
    reduce-scatter inside the node, the n/k node-level shards cross the network in parallel
    (one NIC share per GPU), and the result is gathered inside the node again. ``intra_bw``: the
    bandwidth inside a node, when not the links' own.
    """
    size = as_array(size)
    k = in_node(links, size, stride)
    nodes = maximum(size // k, 1)
    inside = _ring(bytes_, k, links.intra_bw if intra_bw is None else intra_bw, links.intra_lat, passes)
    across = _ring(bytes_ / k, nodes, links.inter_bw, links.inter_lat, passes)
    return inside + across


def group_coefficients(links: Links, size: np.ndarray, stride: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``group_collective`` as a line: (seconds per byte, seconds) of one pass, so that
    group_collective(links, b, size, stride, passes) == passes * (b * per_byte + latency). A caller
    timing several collectives over the same group (the data-parallel reduction, gathers, the
    last bucket) computes the group's shape once. (k - 1)/k and (nodes - 1)/nodes vanish for a
    group of one, as ``_ring``'s zero does."""
    size = as_float(size)
    k = in_node(links, size, stride)
    nodes = maximum(floor(size / k), 1)
    per_byte = (k - 1) / k / links.intra_bw + (nodes - 1) / nodes / k / links.inter_bw
    return per_byte, (k - 1) * links.intra_lat + (nodes - 1) * links.inter_lat


def small_all_reduce(links: Links, size: np.ndarray, stride: np.ndarray) -> np.ndarray:
    """An all-reduce of a few bytes (a gradient norm, a loss) over ``size`` ranks ``stride`` apart:
    latency only, up and down a tree, log2 of the ranks in a node and of the nodes (NCCL's trees
    for small messages, Sanders et al. 2009 double binary trees; NCCL 2.4 release notes). A ring's
    2(n-1) latencies would charge 16,384 GPUs ~40 ms for 16 bytes."""
    size = as_float(size)
    k = in_node(links, size, stride)
    nodes = maximum(size / k, 1)
    return 2 * (ceil_log2(k) * links.intra_lat + ceil_log2(nodes) * links.inter_lat)


def tp_collective(links: Links, bytes_: np.ndarray, tp: np.ndarray, passes: float = 2.0) -> np.ndarray:
    """A tensor-parallel all-reduce (or its reduce-scatter + all-gather pair under sequence
    parallel: the same bytes) over contiguous ranks, at the TP collectives' own achieved bandwidth
    inside a node (``Links.tp_intra_bw``) where a profile has one."""
    return group_collective(links, bytes_, tp, ones_like(tp), passes, links.tp_intra_bw or links.intra_bw)


def p2p(links: Links, bytes_: np.ndarray, tp: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Send one activation (or its gradient) to the next pipeline stage, tp*dp ranks away.

    Across nodes each of the tp ranks sends 1/tp of it and the receivers all-gather over
    NVLink (Megatron's scatter/gather optimisation, Narayanan et al. 2021, Sec. 4.1). Inside a node
    it costs the profile's point-to-point figures (``Links.p2p_bw``/``p2p_lat``): one send, no
    reduction and no ring steps."""
    stride = tp * dp
    inter = stride >= links.gpus_per_node
    tpf = as_float(tp)
    across = bytes_ / tpf / links.inter_bw + links.inter_lat + _ring(bytes_, tp, links.intra_bw, links.intra_lat, 1.0)
    inside = bytes_ / links.p2p_bw + links.p2p_lat
    return where(inter, across, inside)


def flat_collective(links: Links, bytes_: np.ndarray, size: np.ndarray, stride: np.ndarray,
                    passes: float) -> np.ndarray:
    """The same collective as one flat ring over all ``size`` ranks: when the group spans nodes,
    every step crosses the network at each GPU's NIC share (no intra-node stage first). DeepSpeed's
    ZeRO-3 collectives ran this way in 2021 (Narayanan et al. 2021, Table 2: step time constant as
    the GPU count doubled at a fixed batch, i.e. each GPU moving the whole model at its NIC rate)."""
    size = as_array(size)
    spans = size * maximum(stride, 1) > links.gpus_per_node
    across = _ring(bytes_, size, links.inter_bw, links.inter_lat, passes)
    inside = _ring(bytes_, size, links.intra_bw, links.intra_lat, passes)
    return where(spans, across, inside)



def all_to_all(links: Links, bytes_: np.ndarray, size: np.ndarray, stride: np.ndarray) -> np.ndarray:
    """All-to-all of ``bytes_`` per rank over ``size`` ranks ``stride`` apart: each rank keeps 1/n
    and sends 1/n to each other rank, all at once. The k - 1 peers inside the node take theirs
    over NVLink, the n - k outside over the GPU's NIC share, concurrently: the slower tier sets
    the time, plus one latency per tier used (NCCL issues the n - 1 sends together)."""
    size = as_float(size)
    k = in_node(links, size, stride)
    n = maximum(size, 1.0)
    inside = bytes_ * (k - 1) / n / links.intra_bw + where(k > 1, links.intra_lat, 0.0)
    across = bytes_ * (size - k) / n / links.inter_bw + where(size > k, links.inter_lat, 0.0)
    return where(size > 1, maximum(inside, across), 0.0)
