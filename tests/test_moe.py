"""Mixture-of-experts in the time and memory model: expert parallel's all-to-all, the experts'
FLOPs and GEMMs, memory sharded by ep, the search's rules. Expected values are derived by hand
from the shapes and the profile's datasheet figures (h100-80g: NVLink 450 GB/s per direction,
3,200 Gb/s of NICs per 8-GPU node, 5 / 10 us latency)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core import comm, moe
from planner.core.evaluate import evaluate
from planner.core.flops import model_flops_per_token
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.core.search import Pins, enumerate_layouts, search
from planner.errors import PlannerError
from planner.hardware import get_profile

# Mixtral 8x7B's released config (mistralai/Mixtral-8x7B-v0.1 config.json): 32 layers, hidden 4096,
# 32 heads, 8 KV heads, intermediate 14336, 8 local experts, 2 per token, vocab 32000, untied.
MIXTRAL = ModelSpec(name="mixtral", arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                    vocab=32000, seq_len=4096, experts=8, top_k=2)
H100 = get_profile("h100-80g")


def one(**fields) -> Candidates:
    return Candidates.from_layouts([Layout(**{"dp": 1, "global_batch": 64, **fields})])


def test_mixtral_active_weights_by_hand():
    """Per layer: attention 4096*(4096 + 2*1024) + 4096^2 = 41,943,040; router 4096*8 = 32,768;
    two SwiGLU experts 2*3*4096*14336 = 352,321,536. x32 layers + head 32000*4096 = 12,748,587,008
    weights per token; Mistral's paper: 12.9B active of 46.7B."""
    assert MIXTRAL.matmul_params_per_token == 12_748_587_008
    assert MIXTRAL.active_params == pytest.approx(12.9e9, rel=0.005)
    assert MIXTRAL.params == pytest.approx(46.7e9, rel=0.001)
    s = MIXTRAL.seq_len
    attention = 0.5 * 4 * s * 4096 * 32  # causal QK^T and AV per token, all layers
    assert model_flops_per_token(MIXTRAL) == pytest.approx(3 * (2 * 12_748_587_008 + attention), rel=1e-12)


@pytest.mark.parametrize("ep, tp", [(1, 1), (2, 1), (8, 1), (4, 2)])
def test_expert_flops_do_not_depend_on_expert_parallel(ep, tp):
    """Whatever the ep and tp, one GPU computes its tokens' routed experts: 2 FLOPs x tokens x
    top_k x 3*h*ef / tp, plus the router 2 x tokens x h x E (imbalance 1)."""
    c = one(dp=8, tp=tp, ep=ep, micro_batch=2, sequence_parallel=tp > 1)
    job = Job(expert_imbalance=1.0)
    flops = sum(float(np.sum(g.flops)) for g in moe.moe_gemms(MIXTRAL, job, c))
    tokens = 2 * 4096
    expected = 2 * tokens * (2 * 3 * 4096 * 14336 / tp + 4096 * 8)
    assert flops == pytest.approx(expected, rel=1e-12)


def test_all_to_all_inside_a_node_by_hand():
    """ep 8 on one node: 7/8 of the bytes over NVLink at 450 GB/s x the profile's efficiency."""
    links = comm.Links.of(H100)
    b = 64e6
    t = float(comm.all_to_all(links, np.array(b), np.array(8), np.array(1)))
    assert t == pytest.approx(b * 7 / 8 / links.intra_bw + links.intra_lat, rel=1e-12)


def test_all_to_all_across_nodes_by_hand():
    """ep 16 over two nodes (tp 1): 7/16 of the bytes to node peers over NVLink, 8/16 to the other
    node over the GPU's NIC share (400 Gb/s); both at once, the NIC side is slower."""
    links = comm.Links.of(H100)
    b = 64e6
    t = float(comm.all_to_all(links, np.array(b), np.array(16), np.array(1)))
    across = b * 8 / 16 / links.inter_bw + links.inter_lat
    assert across > b * 7 / 16 / links.intra_bw + links.intra_lat
    assert t == pytest.approx(across, rel=1e-12)
    # tp 2 puts the ep ranks two apart: only 4 of 16 share a node.
    t2 = float(comm.all_to_all(links, np.array(b), np.array(16), np.array(2)))
    assert t2 == pytest.approx(b * 12 / 16 / links.inter_bw + links.inter_lat, rel=1e-12)


def test_dispatch_bytes_by_hand():
    """One dispatch on the busiest rank: tokens/tp x top_k x h x 2 bytes x imbalance."""
    links = comm.Links.of(H100)
    c = one(dp=8, tp=1, ep=8, micro_batch=1)
    job = Job(expert_imbalance=1.25)
    b = 4096 * 2 * 4096 * 2 * 1.25
    assert float(moe.all_to_all_time(MIXTRAL, job, c, links, 2)[0]) == pytest.approx(
        b * 7 / 8 / links.intra_bw + links.intra_lat, rel=1e-12)


def test_expert_parallel_has_a_cost_and_imbalance_slows_it():
    job = Job()
    ev = evaluate(MIXTRAL, H100, job, Candidates.from_layouts(
        [Layout(dp=64, ep=ep, global_batch=512, zero_stage=1, recompute="full") for ep in (1, 8, 64)]), 64)
    assert ev.time.ep_comm[0] == 0.0 and 0 < ev.time.ep_comm[1] < ev.time.ep_comm[2]  # 64 spans 8 nodes
    slow = evaluate(MIXTRAL, H100, Job(expert_imbalance=1.5), ev.candidates, 64)
    assert np.all(slow.step_s[1:] > ev.step_s[1:]) and slow.step_s[0] == ev.step_s[0]  # ep 1: all local


def test_weights_by_hand_with_expert_parallel():
    """ZeRO-1 on 8 GPUs, ep 8, no pipeline, Megatron-Core (separate fp32 master): each GPU holds
    every non-expert weight and one expert per layer, in bf16. ZeRO-3 shards both to 1/8 whatever
    ep is. Under FSDP2 the fp32 parameters are the master: 4 bytes, sharded like the optimizer."""
    m = MIXTRAL
    experts_all = 32 * 8 * 3 * 4096 * 14336
    c = Candidates.from_layouts([Layout(dp=8, ep=8, global_batch=64, zero_stage=1),
                                 Layout(dp=8, ep=1, global_batch=64, zero_stage=3),
                                 Layout(dp=8, ep=8, global_batch=64, zero_stage=3)])
    ev = evaluate(m, H100, Job(stack="megatron-core"), c, 8)
    assert float(ev.memory.weights[0]) == pytest.approx(2 * (m.params - experts_all + experts_all / 8), rel=1e-12)
    assert float(ev.memory.weights[1]) == pytest.approx(2 * m.params / 8, rel=1e-12)
    assert float(ev.memory.weights[2]) == pytest.approx(2 * m.params / 8, rel=1e-12)
    # Optimizer states: ZeRO-1 shards them over 8 ranks for non-experts, over 8/ep = 1 for experts.
    held = (m.params - experts_all) / 8 + experts_all / 8
    assert float(ev.memory.optimizer[0]) == pytest.approx(12 * held, rel=1e-12)
    fsdp = evaluate(m, H100, Job(stack="fsdp2"), c, 8)
    # ZeRO-1: the bf16 weights as above, beside the fp32 shard that is the master; AdamW's 8 bytes.
    assert float(fsdp.memory.weights[0]) == pytest.approx(2 * (m.params - experts_all + experts_all / 8) + 4 * held,
                                                          rel=1e-12)
    assert float(fsdp.memory.optimizer[0]) == pytest.approx(8 * held, rel=1e-12)
    assert float(fsdp.memory.weights[1]) == pytest.approx(4 * m.params / 8, rel=1e-12)
    assert float(fsdp.memory.optimizer[2]) == pytest.approx(8 * m.params / 8, rel=1e-12)


def test_search_offers_only_valid_expert_parallel():
    c, _ = enumerate_layouts(MIXTRAL, 64, Job())
    assert set(c.ep.tolist()) == {1, 2, 4, 8}  # divides 8 experts
    assert np.all((c.dp * c.cp) % c.ep == 0)
    assert np.all(c.sequence_parallel | (c.tp == 1))
    dense = ModelSpec(arch="llama", layers=8, hidden=1024, heads=8)
    d, _ = enumerate_layouts(dense, 64, Job())
    assert set(d.ep.tolist()) == {1}


@pytest.mark.parametrize("pins, field", [({"ep": 3}, "ep"), ({"ep": 16}, "ep"),
                                         ({"dp": 2, "cp": 1, "tp": 8, "pp": 4, "ep": 4}, "ep"),
                                         ({"tp": 2, "sequence_parallel": False}, "sequence_parallel")])
def test_bad_expert_parallel_pins_name_the_field(pins, field):
    with pytest.raises(PlannerError) as err:
        search(MIXTRAL, H100, Job(), 64, Pins(**pins))
    assert err.value.field == field


def test_dense_model_refuses_expert_parallel():
    dense = ModelSpec(arch="llama", layers=8, hidden=1024, heads=8)
    with pytest.raises(PlannerError, match="dense model"):
        search(dense, H100, Job(), 8, Pins(ep=2))


@pytest.mark.parametrize("fields, field", [({"experts": 8, "top_k": 9}, "top_k"), ({"experts": 1, "top_k": 1}, "experts"),
                                           ({"top_k": 2}, "top_k"), ({"experts": 8, "top_k": 2, "dense_layers": 4},
                                                                     "dense_layers"),
                                           ({"experts": 8, "top_k": 2, "capacity_factor": -1.0}, "capacity_factor")])
def test_bad_moe_shapes_name_the_field(fields, field):
    with pytest.raises(PlannerError) as err:
        ModelSpec(arch="llama", layers=4, hidden=256, heads=4, **fields)
    assert err.value.field == field


def test_moe_estimate_reports_active_parameters(tmp_path):
    from planner.core.plan import plan

    p = plan(MIXTRAL, H100, Job(), 64)
    j = p.best.to_json()
    assert j["model"]["active_params"] == MIXTRAL.active_params and j["model"]["experts"] == 8
    assert "ep_comm_s" in j["time"]
    assert 0 < p.best.mfu < 1


def test_hybrid_sharding_by_hand():
    """HSDP on 64 GPUs (8 nodes of 8), ZeRO-3, tp 1: weights (FSDP2's fp32 parameters, 4 bytes)
    sharded over the node's 8 ranks (4 bytes x P / 8), not all 64; the replicas all-reduce the
    node-sharded fp32 gradients."""
    from planner.core.presets import get_preset

    model = get_preset("llama-7b")
    c = Candidates.from_layouts([Layout(dp=64, global_batch=512, zero_stage=3, sharding=s) for s in ("full", "hybrid")])
    ev = evaluate(model, H100, Job(), c, 64)
    assert float(ev.memory.weights[0]) == pytest.approx(4 * model.params / 64, rel=1e-12)
    assert float(ev.memory.weights[1]) == pytest.approx(4 * model.params / 8, rel=1e-12)
    # The replicas' all-reduce of node-sharded fp32 gradients: 2 * 7/8 * (4P / 8) bytes at the NIC share.
    links = comm.Links.of(H100)
    replica = comm.group_collective(links, np.array(4 * model.params / 8), np.array(8), np.array(8), 2.0)
    assert float(replica) == pytest.approx(2 * 7 / 8 * 4 * model.params / 8 / links.inter_bw + 14 * links.inter_lat,
                                           rel=1e-9)


def test_hybrid_sharding_pins():
    from planner.core.presets import get_preset

    with pytest.raises(PlannerError) as err:
        search(get_preset("llama-7b"), H100, Job(), 64, Pins(sharding="hybrid", zero_stage=0))
    assert err.value.field == "sharding"
    r = search(get_preset("llama-7b"), H100, Job(), 64, Pins(sharding="hybrid"))
    assert {r.evaluation.candidates.layout(i).sharding for i in range(5)} == {"hybrid"}


@pytest.mark.parametrize("name", ["mixtral-8x7b", "mixtral-8x22b", "deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b",
                                  "qwen1.5-moe-a2.7b", "olmoe-1b-7b", "llama3-8b"])
def test_the_gemms_timed_are_the_flops_mfu_counts(name):
    """The GEMM shapes the step time prices (attention projections, dense MLP, router, shared and
    routed experts) add up to 2 x the active weights per token that MFU counts (head aside),
    whatever the attention variant (MLA, explicit head_dim) -- two independent derivations."""
    from planner.core.flops import layer_gemms
    from planner.core.presets import get_preset

    model = get_preset(name)
    c = one(dp=1, micro_batch=1)
    tokens = model.seq_len
    gs = layer_gemms(model, c.micro_batch, c.tp, c.cp)
    attention, dense_mlp = sum(float(g.flops[0]) for g in gs[:2]), sum(float(g.flops[0]) for g in gs[2:])
    per_layer = [attention + dense_mlp] * (model.layers - model.moe_layers)
    if model.moe:
        routed = sum(float(np.sum(g.flops)) for g in moe.moe_gemms(model, Job(expert_imbalance=1.0), c))
        per_layer += [attention + routed] * model.moe_layers
    assert sum(per_layer) == pytest.approx(2 * tokens * (model.matmul_params_per_token
                                                                 - model.vocab * model.hidden), rel=1e-9)


def test_exposed_all_to_all_per_layer_by_hand():
    """Dropless routing, ep 8 in one node, no recompute: dispatch + combine forward and backward
    (4 transfers of tokens x top_k x h x 2 bytes) and one exchange of token counts (8 experts x
    8 bytes) per forward; full recompute adds one forward's worth (2 transfers + counts)."""
    links = comm.Links.of(H100)
    c = one(dp=8, ep=8, micro_batch=1)
    job = Job(expert_imbalance=1.0)
    data = 4096 * 2 * 4096 * 2 * 7 / 8 / links.intra_bw + links.intra_lat
    counts = 8 * 8 * 7 / 8 / links.intra_bw + links.intra_lat
    none = float(moe.exposed_all_to_all(MIXTRAL, job, c, links, 2, np.array([False]))[0])
    full = float(moe.exposed_all_to_all(MIXTRAL, job, c, links, 2, np.array([True]))[0])
    assert none == pytest.approx(4 * data + counts, rel=1e-12)
    assert full == pytest.approx(6 * data + 2 * counts, rel=1e-12)
    padded = MIXTRAL.replace(capacity_factor=1.0)  # capacity-limited: buffers of known size, no count exchange
    assert float(moe.exposed_all_to_all(padded, job, c, links, 2, np.array([False]))[0]) == pytest.approx(4 * data,
                                                                                                          rel=1e-12)
