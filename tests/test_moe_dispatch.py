"""How expert parallel's all-to-all runs (the stack's [moe] table) and group-limited routing.

Expected values come from a simulation of the routing (remote nodes per token), from the
released configs (tests/data/*.config.json), and by hand from the profile's figures (h100-80g:
8 GPUs per node; its achieved NVLink and NIC bandwidths from planner.core.comm.Links)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from planner.core import comm, moe
from planner.core.evaluate import evaluate
from planner.core.layout import Candidates, Job, Layout
from planner.core.model import ModelSpec
from planner.core.options import model_from_hf_config
from planner.core.presets import get_preset
from planner.errors import PlannerError
from planner.hardware import get_profile
from planner.stacks import get_stack

H100 = get_profile("h100-80g")
DATA = Path(__file__).parent / "data"
V3 = get_preset("deepseek-v3")


def simulate_remote_nodes(model: ModelSpec, nodes: int, samples: int = 40000, seed: int = 0) -> float:
    """Route tokens as the model says, one by one: pick groups_per_token groups at random, then
    top_k distinct experts among theirs; count the nodes (contiguous blocks of experts) other than
    the token's own that they lie on."""
    rng = np.random.default_rng(seed)
    e, g = model.experts, model.expert_groups
    per_group, per_node = e // g, e // nodes
    total = 0
    for _ in range(samples):
        groups = rng.choice(g, model.groups_per_token, replace=False)
        pool = np.concatenate([np.arange(x * per_group, (x + 1) * per_group) for x in groups])
        experts = rng.choice(pool, model.top_k, replace=False)
        own = rng.integers(nodes)
        total += len({int(x) // per_node for x in experts} - {int(own)})
    return total / samples


@pytest.mark.parametrize("name,nodes", [("deepseek-v3", 8), ("deepseek-v3", 4), ("deepseek-v3", 16),
                                        ("mixtral-8x7b", 2), ("olmoe-1b-7b", 8)])
def test_remote_nodes_per_token_equals_a_simulation_of_the_routing(name, nodes):
    """DeepSeek-V3 over 8 nodes (each node one group, a token reaching 4), 4 (two groups per node)
    and 16 (a group over two nodes); Mixtral's top-2 of 8 over 2 nodes; OLMoE's top-8 of 64 over 8.
    40,000 simulated tokens: the standard error is under 0.01 nodes."""
    m = get_preset(name)
    want = simulate_remote_nodes(m, nodes)
    assert float(moe.remote_nodes_per_token(m, np.array([float(nodes)]))[0]) == pytest.approx(want, abs=0.03)


def test_remote_nodes_by_hand():
    """Mixtral top-2 of 8 experts on 2 nodes of 4: the other node is missed when both picks are on
    the token's own, C(4,2)/C(8,2) = 6/28. DeepSeek-V3 on 8 nodes: a token reaches 4 nodes (128
    experts), a reachable node is missed with probability C(96,8)/C(128,8)."""
    assert float(moe.remote_nodes_per_token(get_preset("mixtral-8x7b"), np.array([2.0]))[0]) == pytest.approx(
        1 * (1 - 6 / 28), rel=1e-12)
    miss = np.prod([(96 - i) / (128 - i) for i in range(8)])
    assert float(moe.remote_nodes_per_token(V3, np.array([8.0]))[0]) == pytest.approx(7 * 0.5 * (1 - miss), rel=1e-12)
    assert float(moe.remote_nodes_per_token(V3, np.array([1.0]))[0]) == 0.0


def test_released_configs_give_the_routing_groups():
    """DeepSeek-V3: n_group 8, topk_group 4; DeepSeek-V2-Lite: 1 and 1 (no limit)."""
    v3, _ = model_from_hf_config(str(DATA / "DeepSeek-V3.config.json"))
    lite, _ = model_from_hf_config(str(DATA / "DeepSeek-V2-Lite.config.json"))
    assert (v3.expert_groups, v3.groups_per_token) == (8, 4) == (V3.expert_groups, V3.groups_per_token)
    assert (lite.expert_groups, lite.groups_per_token) == (1, 1)
    assert "top-8 in 4 of 8 groups" in V3.describe()


@pytest.mark.parametrize("fields,name,allowed", [
    ({"expert_groups": 3}, "expert_groups", "a divisor of experts=8"),
    ({"expert_groups": 4, "groups_per_token": 5}, "groups_per_token", "from 1 to expert_groups=4"),
    ({"expert_groups": 8, "groups_per_token": 1}, "groups_per_token", "enough groups for top_k=2"),
    ({"expert_groups": 0}, "expert_groups", "a whole number from 1"),
])
def test_bad_routing_groups_name_the_field(fields, name, allowed):
    with pytest.raises(PlannerError) as err:
        ModelSpec(name="m", layers=2, hidden=64, heads=4, experts=8, top_k=2, **fields)
    assert err.value.field == name and allowed in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(PlannerError, match="1 for a dense model"):
        ModelSpec(name="d", layers=2, hidden=64, heads=4, expert_groups=2)


def one(**fields) -> Candidates:
    return Candidates.from_layouts([Layout(**{"dp": 64, "global_batch": 1024, "zero_stage": 1, **fields})])


def test_deduplicated_dispatch_by_hand():
    """ep 64 over 8 nodes, 4,096 tokens, fp8 dispatch (1 byte), no imbalance: a plain all-to-all
    sends 56/64 of the 8 routed copies over the NIC; DeepEP sends one copy per other node touched
    (remote_nodes_per_token) over the NIC and 7/8 of the copies one NVLink hop."""
    links = comm.Links.of(H100)
    c, job = one(ep=64), Job(expert_imbalance=1.0)
    copy = 4096 * 7168 * 1.0
    plain = float(moe.all_to_all_time(V3, job, c, links, 1.0)[0])
    assert plain == pytest.approx(8 * copy * 56 / 64 / links.inter_bw + links.inter_lat, rel=1e-12)
    remote = float(moe.remote_nodes_per_token(V3, np.array([8.0]))[0])
    inside = 8 * copy * 7 / 8 / links.intra_bw + links.intra_lat
    across = copy * remote / links.inter_bw + links.inter_lat
    assert float(moe.all_to_all_time(V3, job, c, links, 1.0, dedup=True)[0]) == pytest.approx(max(inside, across),
                                                                                             rel=1e-12)
    assert across < plain / 2  # at most 4 nodes, once each, against 7 of 8 copies


def moe_stack(**kw) -> types.SimpleNamespace:
    base = {"ep_dispatch_bytes": 0.0, "ep_combine_bytes": 0.0, "ep_dedup": False, "ep_overlap": 0.0,
            "ep_sm_share": 0.0}
    return types.SimpleNamespace(**{**base, **kw})


def test_exposed_all_to_all_with_fp8_dispatch_and_overlap_by_hand():
    """No recompute: dispatch (1 byte) + combine (2 bytes) forward, the same backward, plus the
    forward's count exchange. Overlap 1 behind a compute longer than all of it leaves only the SM
    share's slowdown of that compute (20 of 132 SMs: x 20/112 of the hidden time); behind a
    compute of a third of it, two thirds stay exposed."""
    links = comm.Links.of(H100)
    c, job = one(ep=64), Job(expert_imbalance=1.0)
    no = np.array([False])
    d = float(moe.all_to_all_time(V3, job, c, links, 1.0)[0])
    k = float(moe.all_to_all_time(V3, job, c, links, 2.0)[0])
    counts = float(comm.all_to_all(links, 8.0 * 256, np.array(64), np.array(1)))
    total = 2 * (d + k) + counts
    plain = moe_stack(ep_dispatch_bytes=1.0, ep_combine_bytes=2.0)
    assert float(moe.exposed_all_to_all(V3, job, c, links, 2, no, plain)[0]) == pytest.approx(total, rel=1e-12)
    assert float(moe.exposed_all_to_all(V3, job, c, links, 2, no)[0]) == pytest.approx(4 * k + counts, rel=1e-12)
    hidden = moe_stack(ep_dispatch_bytes=1.0, ep_combine_bytes=2.0, ep_overlap=1.0, ep_sm_share=20 / 132)
    long = float(moe.exposed_all_to_all(V3, job, c, links, 2, no, hidden, 10 * total)[0])
    assert long == pytest.approx(total * 20 / 112, rel=1e-9)
    short = float(moe.exposed_all_to_all(V3, job, c, links, 2, no, hidden, total / 3)[0])
    assert short == pytest.approx(2 / 3 * total + total / 3 * 20 / 112, rel=1e-9)
    assert float(moe.exposed_all_to_all(V3, job, one(ep=1), links, 2, no, hidden, 1.0)[0]) == 0.0


def test_hai_llm_stack_is_megatron_core_but_its_all_to_all():
    """hai-llm inherits every megatron-core value but the [moe] table, which it sets from the
    DeepSeek-V3 report (fp8 dispatch, bf16 combine, per-node dedup, full overlap, 20 of 132 SMs),
    its schedules (DualPipe, planned as DualPipeV), and context parallel over linear attention
    (the report describes none)."""
    hai, mc = get_stack("hai-llm"), get_stack("megatron-core")
    moe_keys = {"ep_dispatch_bytes", "ep_combine_bytes", "ep_dedup", "ep_overlap", "ep_sm_share"}
    for f in type(mc).__dataclass_fields__:
        if f not in moe_keys | {"name", "description", "source", "path", "not_modelled", "schedules", "base",
                                "linear_attention_cp"}:
            assert getattr(hai, f) == getattr(mc, f), f
    assert hai.schedules == ("1f1b", "dualpipev") and mc.schedules == ("1f1b",)  # DualPipe, as DualPipeV
    assert hai.base == "megatron-core"
    assert (hai.linear_attention_cp, mc.linear_attention_cp) == ("none", "all_to_all")
    assert (hai.ep_dispatch_bytes, hai.ep_combine_bytes, hai.ep_dedup, hai.ep_overlap) == (1.0, 2.0, True, 1.0)
    assert hai.ep_sm_share == pytest.approx(20 / 132, abs=5e-4)
    assert get_stack("deepseek").name == "hai-llm"


def test_the_stack_moves_only_the_all_to_all():
    """DeepSeek-V3 on 2,048 H100s as its report lays it out (pp 16, ep 64 over 8 nodes, ZeRO-1):
    hai-llm's compute, bubble aside, equals megatron-core's; its exposed all-to-all is smaller,
    but not zero (the SMs the hidden all-to-all holds)."""
    lay = Layout(dp=128, pp=16, ep=64, micro_batch=1, global_batch=15360, zero_stage=1, recompute="full")
    c = Candidates.from_layouts([lay])
    runs = {s: evaluate(V3, H100, Job(precision="fp8", stack=s), c, 2048) for s in ("megatron-core", "hai-llm")}
    mc, hai = runs["megatron-core"].time, runs["hai-llm"].time
    assert hai.compute[0] == pytest.approx(mc.compute[0], rel=1e-12)
    assert 0 < hai.ep_comm[0] < 0.2 * mc.ep_comm[0]


def test_an_all_to_all_bound_plan_is_told_how_to_hide_it():
    """DeepSeek-V3 with ep 64 over 8 nodes on megatron-core: the exposed all-to-all is most of the
    step, so the communication warning names it and its fixes (ep inside a node, a stack that
    deduplicates and hides it); under hai-llm it is under the 15% line and nothing is said. A
    dense plan over the line keeps the data-parallel fix."""
    from planner.core.checks import COMM_SHARE_LIMIT, warnings_for
    from planner.core.plan import plan
    from planner.core.search import Pins

    pins = Pins(tp=1, pp=16, ep=64, zero_stage=1, recompute="full", micro_batch=1)
    h800 = get_profile("h800")
    mc = plan(V3, h800, Job(precision="fp8", stack="megatron-core", global_batch=15360), 2048, pins, top=0).best
    share = mc.time.ep_comm_s / mc.time.step_s
    assert share > 0.5
    comm = [w for w in mc.warnings if w.startswith("communication is")]
    assert comm and f"expert parallel's all-to-all is {share:.0%}" in comm[0]
    assert "ep <= 8" in comm[0] and "--stack hai-llm" in comm[0]
    hai = plan(V3, h800, Job(precision="fp8", stack="hai-llm", global_batch=15360), 2048, pins, top=0).best
    assert hai.comm_fraction < COMM_SHARE_LIMIT and not any(w.startswith("communication is") for w in hai.warnings)
    dense = warnings_for(comm_fraction=0.3, bubble_fraction=0.0, total_bytes=1.0, capacity_bytes=2.0, pp=1, vpp=1,
                         grad_accum=1, tp=1, gpus_per_node=8, comm_parts={"dp": 0.25, "ep": 0.05}, ep=2)
    want = ("communication is 30% of the step (> 15%); the data-parallel gradient reduction is 25%; fix: a larger "
            "global batch (each gradient reduction serves more tokens), or fewer GPUs")
    assert dense == [want]


def test_tensor_parallel_over_nodes_that_the_search_chose_is_not_the_fix():
    """DeepSeek-V3 on 64 B200s (megatron-core) barely holds its optimizer states: the search's best
    runs tp 64, over 8 nodes, and most of its step is TP communication. Keeping tp inside a node
    is no fix there: the table shows every listed layout that does (tp <= 8) slower or holding
    more memory, so the warning names more GPUs or more memory. With tp pinned over nodes the fix
    is to keep it inside one."""
    from planner.core.plan import plan
    from planner.core.search import Pins

    b200, job = get_profile("b200"), Job(stack="megatron-core")
    p = plan(V3, b200, job, 64, Pins(), top=0)
    best = p.best
    assert best.layout.tp > 8
    comm_warning = [w for w in best.warnings if w.startswith("communication is")]
    assert comm_warning and "fix: more GPUs, or GPUs with more memory" in comm_warning[0]
    assert "keep tensor parallel inside a node" not in comm_warning[0]
    t = p.result.table  # what the warning claims, read off the table
    inside = t.fits & (t.candidates.tp <= 8)
    assert inside.sum() > 10
    assert np.all((t.step_s[inside] > best.time.step_s) | (t.memory.total[inside] > best.memory.total_bytes))
    assert np.any(t.step_s[inside] < best.time.step_s)  # faster ones exist, over the memory it holds
    pinned = plan(V3, b200, job, 64, Pins(tp=best.layout.tp), top=0).best
    assert any(w.startswith("communication is") and w.endswith("fix: keep tensor parallel inside a node")
               for w in pinned.warnings)


def test_expert_parallel_over_nodes_that_the_search_chose_is_not_the_fix():
    """Mixtral 8x22B on 64 H100s (NeMo): the search's best spreads expert parallel over nodes and
    its all-to-all is most of the communication. Every listed layout keeping ep inside a node
    ranks behind it, slower or holding more memory (read off the table), so the fix names only the
    stacks that hide the all-to-all; with ep pinned it also names keeping ep inside a node."""
    from planner.core.plan import plan
    from planner.core.presets import get_preset
    from planner.core.search import Pins

    model, h100, job = get_preset("mixtral-8x22b"), get_profile("h100-80g"), Job(stack="nemo")
    p = plan(model, h100, job, 64, Pins(), top=0)
    best, inside = p.best, max(1, 8 // p.best.layout.tp)
    assert best.layout.ep > inside
    (warning,) = [w for w in best.warnings if w.startswith("communication is")]
    assert "expert parallel's all-to-all" in warning and "--stack hai-llm" in warning
    assert "keep expert parallel inside a node" not in warning
    t = p.result.table
    kept_in = t.fits & (t.candidates.ep <= 8 // t.candidates.tp)
    assert kept_in.sum() > 10
    assert np.all((t.step_s[kept_in] > best.time.step_s) | (t.memory.total[kept_in] > best.memory.total_bytes))
    pinned = plan(model, h100, job, 64, Pins(ep=best.layout.ep), top=0).best
    assert any(w.startswith("communication is") and f"keep expert parallel inside a node (ep <= {inside})" in w
               for w in pinned.warnings)
