"""Collectives, stage split and bubble, by hand."""

import numpy as np
import pytest

from planner.core import comm
from planner.core.pipeline import bubble_fraction_ideal, stage_layer_counts, stage_layer_ranges
from planner.errors import PlannerError

LINKS = comm.Links(intra_bw=200e9, inter_bw=20e9, intra_lat=5e-6, inter_lat=10e-6, gpus_per_node=8)


def test_ring_allreduce_inside_a_node():
    s = 1e9
    got = comm.tp_collective(LINKS, np.array(s), np.array(8))
    assert float(got) == pytest.approx(2 * 7 / 8 * s / 200e9 + 2 * 7 * 5e-6)
    assert float(comm.tp_collective(LINKS, np.array(s), np.array(1))) == 0.0


def test_hierarchical_allreduce_across_nodes():
    s = 1e9
    # 32 ranks with stride 1: 8 per node x 4 nodes: RS+AG inside (2*7/8 of s), then 4-node ring on s/8.
    got = comm.group_collective(LINKS, np.array(s), np.array(32), np.array(1), 2.0)
    inside = 2 * 7 / 8 * s / 200e9 + 14 * 5e-6
    across = 2 * 3 / 4 * (s / 8) / 20e9 + 6 * 10e-6
    assert float(got) == pytest.approx(inside + across)
    # stride 8 (tp = 8): one rank per node, the whole buffer crosses the network.
    got = comm.group_collective(LINKS, np.array(s), np.array(4), np.array(8), 2.0)
    assert float(got) == pytest.approx(2 * 3 / 4 * s / 20e9 + 6 * 10e-6)


@pytest.mark.parametrize("layers, pp, vpp", [(24, 4, 1), (30, 4, 1), (60, 4, 3), (7, 7, 1), (9, 2, 1)])
def test_stage_split_covers_every_layer_once(layers, pp, vpp):
    ranges = stage_layer_ranges(layers, pp, vpp)
    assert len(ranges) == pp and all(len(r) == vpp for r in ranges)
    covered = sorted(i for rank in ranges for a, b in rank for i in range(a, b))
    assert covered == list(range(layers))
    counts = stage_layer_counts(layers, pp * vpp)
    assert max(counts) - min(counts) <= 1 and counts[0] == min(counts)


def test_interleaved_assignment_is_round_robin():
    assert stage_layer_ranges(8, 2, 2) == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]


@pytest.mark.parametrize("args", [(10, 4, 2), (4, 5, 1), (4, 0, 1)])
def test_bad_splits_are_refused(args):
    with pytest.raises(PlannerError):
        stage_layer_ranges(*args)


def test_bubble_fraction_formula():
    # Narayanan et al. 2021, Sec. 2.2: (p - 1) / (v * m).
    assert float(bubble_fraction_ideal(np.array(8), np.array(1), np.array(32))) == pytest.approx(7 / 32)
    assert float(bubble_fraction_ideal(np.array(8), np.array(2), np.array(32))) == pytest.approx(7 / 64)
    assert float(bubble_fraction_ideal(np.array(1), np.array(1), np.array(4))) == 0.0
