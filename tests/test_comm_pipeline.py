"""Collectives, stage split and bubble, by hand."""

import numpy as np
import pytest

from planner.core import comm
from planner.core.pipeline import bubble_fraction_ideal, stage_layer_counts, stage_layer_ranges
from planner.errors import PlannerError

LINKS = comm.Links(intra_bw=200e9, inter_bw=20e9, intra_lat=5e-6, inter_lat=10e-6, gpus_per_node=8,
                   p2p_bw=200e9, p2p_lat=5e-6)


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


def test_a_groups_line_gives_the_collectives_own_times():
    """group_coefficients is group_collective written as passes * (bytes * per_byte + latency):
    on random groups, strides and sizes the two agree, and one hand case: 16 ranks 1 apart on
    8-GPU nodes reduce-scatter (1 pass) 1 GB as 7/8 over NVLink and 1/2 of an eighth over the network."""
    import numpy as np

    from planner.core import comm
    from planner.hardware import get_profile

    links = comm.Links.of(get_profile("h100-80g"))
    rng = np.random.default_rng(1)
    size = rng.choice([1, 2, 3, 4, 8, 16, 64, 1024], 300)
    stride = rng.choice([1, 2, 4, 8, 16], 300)
    b = rng.uniform(1, 1e10, 300)
    per_byte, latency = comm.group_coefficients(links, size, stride)
    for passes in (1.0, 2.0):
        want = comm.group_collective(links, b, size, stride, passes)
        assert np.allclose(passes * (b * per_byte + latency), want, rtol=1e-12, atol=0)
    pb, lat = comm.group_coefficients(links, np.array([16]), np.array([1]))
    hand = 7 / 8 * 1e9 / links.intra_bw + 1 / 2 * 1e9 / 8 / links.inter_bw + 7 * links.intra_lat + links.inter_lat
    assert float(1e9 * pb[0] + lat[0]) == pytest.approx(hand, rel=1e-12)


def test_a_send_inside_a_node_costs_the_point_to_point_figures():
    # One 1 MB activation: 1e6 / 4e9 s + 80 us = 330 us, not the collectives' 1e6 / 200e9 + 5 us.
    links = comm.Links(intra_bw=200e9, inter_bw=20e9, intra_lat=5e-6, inter_lat=10e-6, gpus_per_node=8,
                       p2p_bw=4e9, p2p_lat=80e-6)
    t = comm.p2p(links, np.array([1e6]), np.array([1]), np.array([2]))
    assert float(t[0]) == pytest.approx(330e-6, rel=1e-12)
    # Across nodes (stride 8 >= 8 GPUs per node) the NIC sets it: 1e6 / 20e9 + 10 us, as before.
    t = comm.p2p(links, np.array([1e6]), np.array([1]), np.array([8]))
    assert float(t[0]) == pytest.approx(60e-6, rel=1e-12)


def test_profiles_without_point_to_point_figures_send_at_the_collectives_figures():
    from planner.hardware import get_profile

    hw = get_profile("h100-80g")
    links = comm.Links.of(hw)
    assert hw.network.p2p_bytes_per_s is None and hw.network.p2p_latency_s is None
    assert links.p2p_bw == hw.network.intra_bytes_per_s * hw.efficiency.intra_node_bw
    assert links.p2p_lat == hw.network.intra_latency_s


def test_the_committed_cpu_probe_sends_at_its_measured_point_to_point_figures():
    # benchmarks/runs/cpu-2core/probed.toml: gloo's ping-pong gave 78 us for 4 KB and 4.1 ms for
    # 16 MB per send; its all-reduce ~2.4 ms for 4 KB. A pipeline send must cost the former.
    from pathlib import Path

    from planner.hardware import load_profile_file

    hw = load_profile_file(Path(__file__).parent.parent / "benchmarks/runs/cpu-2core/probed.toml")
    links = comm.Links.of(hw)
    small = float(comm.p2p(links, np.array([4096.0]), np.array([1]), np.array([1]))[0])
    large = float(comm.p2p(links, np.array([2.0**24]), np.array([1]), np.array([1]))[0])
    assert small == pytest.approx(78.3e-6, rel=0.1) and large == pytest.approx(4.14e-3, rel=0.1)
