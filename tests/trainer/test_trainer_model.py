"""The model: parameter counts equal the planner's, stages split as the planner says, and the
pieces that must agree do."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from planner.core.layout import Layout  # noqa: E402
from planner.core.model import ModelSpec  # noqa: E402
from planner.core.pipeline import stage_layer_ranges  # noqa: E402
from planner.core.presets import get_preset  # noqa: E402
from reference_trainer.model import GPT, loss_fn  # noqa: E402
from reference_trainer.parallel import build_stages  # noqa: E402

SHAPES = [
    ModelSpec(arch="gpt", layers=3, hidden=64, heads=4, vocab=100, seq_len=32),  # tied, MHA, learned positions
    ModelSpec(arch="gpt", layers=2, hidden=96, heads=6, kv_heads=2, vocab=77, seq_len=16, tied_embeddings=False),
    ModelSpec(arch="llama", layers=3, hidden=64, heads=8, kv_heads=2, vocab=100, seq_len=32),  # GQA, untied
    ModelSpec(arch="llama", layers=2, hidden=64, heads=4, vocab=50, seq_len=8, tied_embeddings=True),
    ModelSpec(arch="llama", layers=2, hidden=64, heads=4, vocab=50, seq_len=8, dropout=0.1),
]


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: f"{s.arch}-kv{s.kv_heads}-tied{s.tied_embeddings}")
def test_parameter_count_equals_the_planners(spec):
    assert count(GPT(spec)) == spec.params


@pytest.mark.parametrize("name", ["gpt3-125m", "gpt3-1.3b", "llama2-70b", "llama3-8b"])  # dense
def test_parameter_count_of_presets(name):
    spec = get_preset(name)
    with torch.device("meta"):  # shapes only: no memory, no init
        model = GPT(spec)
    assert count(model) == spec.params


@settings(max_examples=25, deadline=None)
@given(arch=st.sampled_from(["gpt", "llama"]), layers=st.integers(1, 4), head_dim=st.sampled_from([8, 16]),
       kv_heads=st.integers(1, 3), group=st.integers(1, 3), vocab=st.integers(8, 300), seq_len=st.integers(1, 64),
       tied=st.booleans())
def test_parameter_count_property(arch, layers, head_dim, kv_heads, group, vocab, seq_len, tied):
    heads = kv_heads * group
    spec = ModelSpec(arch=arch, layers=layers, hidden=heads * head_dim, heads=heads, kv_heads=kv_heads,
                     vocab=vocab, seq_len=seq_len, tied_embeddings=tied)
    with torch.device("meta"):
        assert count(GPT(spec)) == spec.params


@pytest.mark.parametrize("pp,vpp", [(2, 1), (3, 1), (2, 2)])
def test_stages_hold_the_planners_layers_with_the_same_weights(pp, vpp):
    spec = ModelSpec(arch="gpt", layers=8 if vpp > 1 else 7, hidden=32, heads=4, vocab=64, seq_len=16)
    whole = GPT(spec)
    whole.init_weights(5)
    reference = dict(whole.named_parameters())
    layout = Layout(dp=1, pp=pp, vpp=vpp, global_batch=8)
    ranges = stage_layer_ranges(spec.layers, pp, vpp)
    total = 0
    for rank in range(pp):
        modules, ids = build_stages(spec, layout, rank, seed=5, attention="flash")
        assert ids == [chunk * pp + rank for chunk in range(vpp)]
        for module, (start, end) in zip(modules, ranges[rank]):
            assert [int(k) for k in module.layers] == list(range(start, end))
            for name, p in module.named_parameters():
                copy = name == "head.weight" and module.head_is_tied_copy  # equals the embedding
                assert torch.equal(p, reference["embed.tok.weight" if copy else name]), name
                total += 0 if copy else p.numel()
    assert total == spec.params


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_flash_and_standard_attention_agree(arch):
    spec = ModelSpec(arch=arch, layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, dropout=0.0)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    out = {}
    for kind in ("flash", "standard"):
        model = GPT(spec, attention=kind)
        model.init_weights(1)
        out[kind] = model(x)
    assert out["flash"].shape == (2, 16, 64)
    torch.testing.assert_close(out["flash"], out["standard"], rtol=1e-5, atol=1e-5)


def test_causal_mask_hides_the_future():
    spec = ModelSpec(arch="llama", layers=2, hidden=32, heads=4, vocab=64, seq_len=16)
    model = GPT(spec)
    model.init_weights(2)
    x = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 64
    torch.testing.assert_close(model(x)[:, :10], model(y)[:, :10])


def test_untrained_loss_is_near_log_vocab():
    spec = ModelSpec(arch="gpt", layers=2, hidden=32, heads=4, vocab=128, seq_len=16, tied_embeddings=False)
    model = GPT(spec)
    model.init_weights(3)
    x = torch.randint(0, 128, (4, 17), generator=torch.Generator().manual_seed(0))
    assert abs(loss_fn(model(x[:, :-1]), x[:, 1:]).item() - torch.log(torch.tensor(128.0)).item()) < 0.1


MOE_SHAPES = [  # routed experts only; shared experts and leading dense layers; top-1 with a gated shared MLP
    ModelSpec(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, experts=4, top_k=2),
    ModelSpec(arch="gpt", layers=3, hidden=32, heads=4, vocab=64, seq_len=16, experts=4, top_k=2, expert_ffn=48,
              shared_experts=2, dense_layers=1),
    ModelSpec(arch="llama", layers=2, hidden=32, heads=4, vocab=64, seq_len=16, experts=8, top_k=1,
              capacity_factor=1.0, shared_experts=1, shared_expert_gate=True),
]


@pytest.mark.parametrize("spec", MOE_SHAPES, ids=lambda s: f"{s.arch}-e{s.experts}-s{s.shared_experts}")
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_moe_parameter_count_over_expert_parallel_ranks_equals_the_planners(spec, ep):
    """Each ep rank holds experts/ep of every MoE layer's experts and a copy of the rest: the
    unique parameters over the ranks are the planner's count, and each rank's experts are its
    slice of the one-process model's."""
    whole = GPT(spec)
    whole.init_weights(4)
    reference = dict(whole.named_parameters())
    assert count(whole) == spec.params
    total = 0
    for rank in range(ep):
        part = GPT(spec, ep_rank=rank, ep=ep)
        part.init_weights(4)
        for name, p in part.named_parameters():
            if ".experts." in name:
                local = spec.experts // ep
                assert p.shape[0] == local
                assert torch.equal(p, reference[name][rank * local:(rank + 1) * local]), name
                total += p.numel()
            else:
                assert torch.equal(p, reference[name]), name
                total += p.numel() if rank == 0 else 0
    assert total == spec.params


def _moe_presets() -> list[str]:
    from planner.core.presets import presets

    return sorted(n for n, s in presets().items() if s.experts)


@pytest.mark.parametrize("name", _moe_presets())
def test_moe_preset_parameter_counts(name):
    """Every MoE preset the trainer builds (all but those with a variant in UNBUILT_SPEC: multi-head
    latent attention, DeepSeek-V3's routing bias, gpt-oss's biases and sinks): Mixtral, OLMoE (QK-norm), Qwen-MoE (q/k/v biases, gated shared expert), Qwen3
    (explicit head_dim, per-head QK-norm)."""
    from reference_trainer.config import UNBUILT_SPEC

    spec = get_preset(name)
    unbuilt = [k for k, default in UNBUILT_SPEC.items() if getattr(spec, k) != default]
    if unbuilt:  # DeepSeek's latent attention and routing bias, gpt-oss's biases and sinks, ...
        pytest.skip(f"{', '.join(unbuilt)}: not built by the reference trainer")
    with torch.device("meta"):
        assert count(GPT(spec)) == spec.params


def test_moe_layer_equals_a_per_token_reference():
    """Routing written independently, token by token: softmax over all experts, the top k
    renormalised, the weighted sum of those experts' SwiGLU outputs, plus the shared MLP."""
    import torch.nn.functional as F

    spec = ModelSpec(arch="llama", layers=1, hidden=16, heads=2, vocab=32, seq_len=8, experts=4, top_k=2,
                     expert_ffn=24, shared_experts=1)
    model = GPT(spec)
    model.init_weights(9)
    moe = model.layers["0"].mlp
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    ex = moe.experts
    expected = torch.zeros(16, 16)
    for i, tok in enumerate(x.reshape(-1, 16)):
        probs = torch.softmax(tok @ moe.router.weight.T, dim=-1)
        top = torch.topk(probs, 2)
        for w, e in zip(top.values / top.values.sum(), top.indices):
            expected[i] += w * ((F.silu(tok @ ex.gate[e]) * (tok @ ex.up[e])) @ ex.down[e])
        expected[i] += moe.shared(tok[None])[0]
    torch.testing.assert_close(moe(x).reshape(-1, 16), expected, rtol=1e-5, atol=1e-6)


def test_capacity_drops_the_slots_past_each_experts_capacity():
    """Top-1 to 4 experts, capacity factor 1: ceil(1 * 16 * 1 / 4) = 4 slots per expert, the first
    four tokens routed to each expert kept in token order (Switch Transformer)."""
    spec = ModelSpec(arch="gpt", layers=1, hidden=16, heads=2, vocab=32, seq_len=16, experts=4, top_k=1,
                     capacity_factor=1.0)
    model = GPT(spec)
    model.init_weights(2)
    moe = model.layers["0"].mlp
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    token, expert, _ = moe.route(x)
    choice = (x @ moe.router.weight.T).argmax(dim=-1)
    kept = sorted(t for e in range(4) for t in [i for i in range(16) if choice[i] == e][:4])
    assert sorted(token.tolist()) == kept
    assert torch.bincount(expert, minlength=4).max() <= 4


@pytest.mark.parametrize("variant", [{"head_dim": 24}, {"qkv_bias": True}, {"qk_norm": "full"},
                                     {"qk_norm": "head", "head_dim": 8}, {"arch": "gpt", "qk_norm": "head"}],
                         ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_attention_variant_parameter_counts(variant):
    """Explicit head_dim (q wider than hidden), q/k/v biases, QK-norm over all channels or per head."""
    spec = ModelSpec(**{"arch": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "vocab": 64,
                        "seq_len": 16, **variant})
    model = GPT(spec)
    assert count(model) == spec.params
    model.init_weights(1)
    assert model(torch.randint(0, 64, (2, 16))).shape == (2, 16, 64)


def test_per_head_qk_norm_makes_attention_scale_free():
    """With RMS QK-norm per head, scaling the q/k projection weights leaves the output unchanged
    (the norm undoes it): the norm is applied to q and k, before attention."""
    spec = ModelSpec(arch="llama", layers=1, hidden=32, heads=4, vocab=64, seq_len=16, qk_norm="head")
    model = GPT(spec)
    model.init_weights(1)
    x = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    before = model(x)
    attn = model.layers["0"].attn
    with torch.no_grad():
        rows = attn.wqkv.weight.view(spec.kv_heads, -1, spec.hidden)  # per KV group: [q heads, k, v]
        rows[:, : (attn.q_per_kv + 1) * spec.head_dim] *= 3.0  # q and k rows, not v
    torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-4)


def test_load_balancing_loss_is_switchs_formula():
    """coef * E * sum_e f_e * P_e (Fedus et al. 2022, eqs. 4-6), computed by hand over the top-k slots."""
    spec = ModelSpec(arch="llama", layers=1, hidden=16, heads=2, vocab=32, seq_len=8, experts=4, top_k=2)
    model = GPT(spec)
    model.init_weights(5)
    moe = model.layers["0"].mlp
    moe.aux_coef = 0.01
    x = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        moe(x)
        probs = torch.softmax(x.reshape(-1, 16) @ moe.router.weight.T, dim=-1)  # (24, 4)
    chosen = probs.topk(2, dim=-1).indices
    f = torch.tensor([(chosen == e).sum().item() / (24 * 2) for e in range(4)])
    expected = 0.01 * 4 * float((f * probs.mean(dim=0)).sum())
    assert moe.aux_loss.item() == pytest.approx(expected, rel=1e-5)


def test_a_meta_device_build_computes_no_initial_values():
    """On the meta device the model builds shapes only: torch's meta kernels for normal_ and arange
    are Python references that import torch._dynamo (about a second a process), and every value is
    filled in by init_weights after materialising anyway. Checked in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from planner.core.model import ModelSpec\n"
            "from reference_trainer.model import GPT\n"
            "with torch.device('meta'):\n"
            "    for arch in ('gpt', 'llama'):\n"
            "        GPT(ModelSpec(arch=arch, layers=2, hidden=64, heads=4, vocab=100, seq_len=32))\n"
            "print('torch._dynamo' in sys.modules, 'torch.distributed.tensor' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_group_limited_routing_equals_a_per_token_reference():
    """8 experts in 2 groups of 4, top-3 inside the best group (DeepSeek-V2's group-limited greedy,
    topk_group 1), written token by token: rank the groups by their best expert's probability,
    keep one, take the top 3 of its 4 experts, renormalised. Every token's experts lie in one group,
    and some tokens route differently from unlimited top-3 (the limit is not a no-op)."""
    spec = ModelSpec(arch="llama", layers=1, hidden=16, heads=2, vocab=32, seq_len=8, experts=8, top_k=3,
                     expert_ffn=24, expert_groups=2, groups_per_token=1)
    model = GPT(spec)
    model.init_weights(5)
    moe = model.layers["0"].mlp
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(7))
    token, expert, weight = moe.route(x)
    differs = 0
    for i, tok in enumerate(x):
        probs = torch.softmax(tok @ moe.router.weight.T, dim=-1).tolist()
        group = max(range(2), key=lambda g: max(probs[4 * g:4 * g + 4]))
        want = sorted(sorted(range(4 * group, 4 * group + 4), key=lambda e: -probs[e])[:3])
        got = sorted(expert[token == i].tolist())
        assert got == want, (i, got, want)
        total = sum(probs[e] for e in want)
        assert sorted(weight[token == i].tolist()) == pytest.approx(sorted(probs[e] / total for e in want), rel=1e-5)
        differs += want != sorted(sorted(range(8), key=lambda e: -probs[e])[:3])
    assert differs > 0
