"""Context parallel, optimizer offload and mixture-of-experts with expert parallel train the same
model as one process.

Same seed, same data, the tolerances of test_trainer_equivalence.py (losses within 2e-5
relative, gradient norms within 1e-4). The dense one-process references are conftest's single
sweep; the MoE ones run here (one process, every expert on it).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tests.trainer.helpers import TINY_GPT, TINY_LLAMA, column, explain, run_trainer, write_config  # noqa: E402
from tests.trainer.test_trainer_equivalence import assert_same_curve  # noqa: E402

# Tiny MoEs: llama dropless with a shared expert and a leading dense layer; gpt top-1 with a
# capacity factor (drops depend on the micro-batch's tokens: its layouts keep micro_batch 2 and cp 1).
MOE_LLAMA = {**TINY_LLAMA, "experts": 4, "top_k": 2, "expert_ffn": 64, "shared_experts": 1, "dense_layers": 1}
MOE_GPT = {**TINY_GPT, "experts": 4, "top_k": 1, "expert_ffn": 64, "capacity_factor": 1.25}
# Attention variants of released MoE models: explicit head_dim with q/k/v biases (Qwen1.5/2, Qwen3
# shapes), per-head QK-norm with a gated shared expert (Qwen-MoE).
VARIANT = {**TINY_LLAMA, "head_dim": 24, "qkv_bias": True}
QWEN_MOE = {**TINY_LLAMA, "qk_norm": "head", "experts": 4, "top_k": 2, "expert_ffn": 32, "shared_experts": 2,
            "shared_expert_gate": True}
ONE = [("moe-llama-1", MOE_LLAMA, {"dp": 1}, None), ("moe-gpt-1", MOE_GPT, {"dp": 1}, None),
       ("variant-1", VARIANT, {"dp": 1}, None), ("qwen-moe-1", QWEN_MOE, {"dp": 1}, None),
       ("moe-llama-aux", MOE_LLAMA, {"dp": 1}, None)]  # with the load-balancing loss (training section below)
OWN_REFERENCES = {r[0] for r in ONE}
TWO = [  # name, model, layout, reference
    ("gpt-cp2", TINY_GPT, {"dp": 1, "cp": 2}, "gpt-1"),  # context parallel alone, flash attention
    ("llama-cp2-std", {**TINY_LLAMA, "attention": "standard"}, {"dp": 1, "cp": 2, "recompute": "selective"},
     "llama-1"),  # RoPE at global positions, GQA, the gather recomputed in backward
    ("gpt-dp2-offload", TINY_GPT, {"dp": 2, "offload": "optimizer"}, "gpt-1"),  # DDP + host AdamW
    ("llama-dp2-zero3-offload", TINY_LLAMA, {"dp": 2, "zero_stage": 3, "offload": "optimizer"}, "llama-1"),
    ("moe-llama-dp2-ep2", MOE_LLAMA, {"dp": 2, "ep": 2}, "moe-llama-1"),  # DDP for the rest, all-to-all
    ("moe-gpt-dp2-ep2-zero3", MOE_GPT, {"dp": 2, "ep": 2, "zero_stage": 3}, "moe-gpt-1"),  # FSDP2, capacity
    ("variant-tp2", VARIANT, {"tp": 2, "sequence_parallel": True}, "variant-1"),  # wider q split by tp
    ("qwen-moe-cp2-ep2", QWEN_MOE, {"dp": 1, "cp": 2, "ep": 2}, "qwen-moe-1"),  # ep over the cp ranks
]
FOUR = [
    ("llama-dp2-cp2-zero3", TINY_LLAMA, {"dp": 2, "cp": 2, "zero_stage": 3, "recompute": "full"}, "llama-1"),
    ("llama-tp2-cp2", TINY_LLAMA, {"tp": 2, "cp": 2, "sequence_parallel": True}, "llama-1"),
    ("gpt-pp2-cp2", TINY_GPT, {"pp": 2, "cp": 2, "micro_batch": 1}, "gpt-1"),
    ("moe-llama-dp4-ep2", MOE_LLAMA, {"dp": 4, "ep": 2}, "moe-llama-1"),  # expert grads summed over edp=2
    ("moe-llama-dp2-cp2-ep4-zero2", MOE_LLAMA, {"dp": 2, "cp": 2, "ep": 4, "zero_stage": 2}, "moe-llama-1"),
    ("moe-llama-pp2-dp2-ep2", MOE_LLAMA, {"pp": 2, "dp": 2, "ep": 2, "micro_batch": 1}, "moe-llama-1"),
]


def _sweep(tmp_path_factory, label: str, runs: list, nproc: int):
    folder = tmp_path_factory.mktemp(label)
    configs = [write_config(folder, name, model, layout, **({"training": {"moe_aux_loss_coef": 0.01}}
                                                            if name.endswith("-aux") else {}))
               for name, model, layout, _ in runs]
    return folder / "runs", run_trainer(configs, nproc)


@pytest.fixture(scope="module")
def one_new(tmp_path_factory):
    return _sweep(tmp_path_factory, "one-new", ONE, 1)


def _reference(single_sweep, one_new, name):
    if name in OWN_REFERENCES:
        assert one_new[1].returncode == 0, explain(one_new[1])
        return one_new[0] / name
    return single_sweep[0] / name


@pytest.fixture(scope="module")
def two_new(tmp_path_factory):
    return _sweep(tmp_path_factory, "two-new", TWO, 2)


@pytest.fixture(scope="module")
def four_new(tmp_path_factory):
    return _sweep(tmp_path_factory, "four-new", FOUR, 4)


@pytest.mark.slow
@pytest.mark.parametrize("name, reference", [(r[0], r[3]) for r in TWO])
def test_two_process_new_dimensions_match_one_process(single_sweep, one_new, two_new, name, reference):
    runs, proc = two_new
    assert proc.returncode == 0, explain(proc)
    assert_same_curve(runs / name, _reference(single_sweep, one_new, reference))


@pytest.mark.slow
@pytest.mark.parametrize("name, reference", [(r[0], r[3]) for r in FOUR])
def test_four_process_new_dimensions_match_one_process(single_sweep, one_new, four_new, name, reference):
    runs, proc = four_new
    assert proc.returncode == 0, explain(proc)
    assert_same_curve(runs / name, _reference(single_sweep, one_new, reference))


@pytest.mark.slow
def test_records_carry_the_new_dimensions_and_the_exchange_time(two_new):
    runs, proc = two_new
    assert proc.returncode == 0, explain(proc)
    cp = json.loads((runs / "gpt-cp2" / "record.json").read_text())
    assert cp["layout"]["cp"] == 2 and cp["layout"]["offload"] == "none"
    assert cp["breakdown_s"]["cp_comm"] > 0  # the K/V gathers were timed
    assert sorted(r["cp_rank"] for r in cp["per_rank"]) == [0, 1]
    off = json.loads((runs / "gpt-dp2-offload" / "record.json").read_text())
    assert off["layout"]["offload"] == "optimizer" and off["layout"]["cp"] == 1
    assert off["breakdown_s"]["cp_comm"] == 0.0 and off["breakdown_s"]["all_to_all"] == 0.0
    assert len(column(runs / "gpt-dp2-offload", "loss")) == 6
    moe = json.loads((runs / "moe-llama-dp2-ep2" / "record.json").read_text())
    assert moe["layout"]["ep"] == 2 and moe["breakdown_s"]["all_to_all"] > 0
    assert moe["model"]["experts"] == 4 and moe["model"]["active_params"] < moe["model"]["params"]
    # planner validate reads the MoE shape and the new layout back, and books the timed exchanges.
    from planner.calibration.measured import from_record
    from planner.calibration.record import load_record

    for name, part, key in (("moe-llama-dp2-ep2", "ep_comm", "all_to_all"), ("gpt-cp2", "cp_comm", "cp_comm")):
        rec = load_record(runs / name)
        run = from_record(rec, "test")
        assert run.model.params == rec["model"]["params"] and run.layout.ep * run.layout.cp == 2
        assert run.parts[part] == rec["breakdown_s"][key] > 0


# --- fast checks, one process ---------------------------------------------------------------------
def test_chunk_positions_are_the_load_balanced_split():
    from reference_trainer.context import chunk_positions

    # seq 8, cp 2: four chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))
    # Equal causal work: each rank's queries see sum(p + 1) keys, the same for every rank.
    work = [int((chunk_positions(24, 3, r) + 1).sum()) for r in range(3)]
    assert work == [work[0]] * 3 == [(24 * 25 // 2) // 3] * 3


def test_positions_move_rope_and_the_position_table():
    """A model fed tokens 4..7 at positions 4..7 gives the full sequence's outputs there."""
    from planner.core.model import ModelSpec
    from reference_trainer.model import GPT

    for arch in ("gpt", "llama"):
        spec = ModelSpec(arch=arch, layers=1, hidden=32, heads=4, vocab=64, seq_len=8, dropout=0.0)
        model = GPT(spec)
        model.init_weights(1)
        model.eval()
        x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
        whole = model.embed(x)
        model.set_positions(torch.arange(4, 8))
        part = model.embed(x[:, 4:])
        torch.testing.assert_close(part, whole[:, 4:])
        if arch == "llama":
            attn = model.layers["0"].attn
            q = torch.randn(1, 4, 4, 8)
            from reference_trainer.model import apply_rope

            full = apply_rope(torch.cat([torch.zeros(1, 4, 4, 8), q], 1), attn.rope_cos, attn.rope_sin)
            torch.testing.assert_close(apply_rope(q, attn.rope_cos, attn.rope_sin, attn.positions), full[:, 4:])


def test_offloaded_adamw_steps_like_adamw_from_a_separate_host_copy():
    from reference_trainer.offload import HostOffloadAdamW

    torch.manual_seed(0)
    a = torch.nn.Linear(8, 4)
    b = torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    ref = torch.optim.AdamW([{"params": list(a.parameters()), "weight_decay": 0.1}], lr=1e-2)
    off = HostOffloadAdamW([{"params": list(b.parameters()), "weight_decay": 0.1, "lr": 1e-2}], lr=1e-2,
                           betas=(0.9, 0.999), eps=1e-8, device=torch.device("cpu"))
    for step in range(3):
        x = torch.randn(5, 8)
        for model, opt in ((a, ref), (b, off)):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    # The states and masters are host tensors of their own, not the model's parameters.
    assert off.state == {} and len(off.host.state) == 2
    params = {p.data_ptr() for p in b.parameters()}
    assert all(m.data_ptr() not in params for _, m in off.pairs)
    assert off.host_state_bytes() == 4 * 4 * (8 * 4 + 4)  # master, grad buffer, two moments; fp32


@pytest.mark.parametrize("layout, model, checkpoint, message", [
    ({"dp": 1, "cp": 3}, TINY_GPT, {}, "layout.cp=3: seq_len=64 must divide into 2*cp=6"),
    ({"dp": 1, "offload": "params"}, TINY_GPT, {}, "layout.offload='params': the reference trainer offloads"),
    ({"dp": 1, "offload": "optimizer"}, TINY_GPT, {"interval": 2}, "checkpoint.interval=2: checkpoints are not"),
    ({"dp": 2, "sharding": "hybrid"}, TINY_GPT, {}, "layout.sharding=hybrid: shards ZeRO states; needs zero_stage >= 1"),
    ({"tp": 4, "cp": 2, "sequence_parallel": True}, {**TINY_GPT, "seq_len": 12}, {},
     "layout.sequence_parallel: tp=4 must divide the tokens per cp rank seq_len/cp=6"),
])
def test_bad_new_dimensions_give_one_line(tmp_path, layout, model, checkpoint, message):
    import yaml

    from reference_trainer.config import ConfigError, build_config

    path = write_config(tmp_path, "bad", model, layout, checkpoint=checkpoint)
    with pytest.raises(ConfigError) as err:
        build_config(yaml.safe_load(path.read_text()))
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("model, layout, message", [
    (TINY_LLAMA, {"dp": 2, "ep": 2}, "layout.ep=2: expert parallel needs an MoE model"),
    (MOE_LLAMA, {"dp": 2, "ep": 4}, "layout.ep=4: must divide dp*cp=2*1=2"),
    ({**MOE_LLAMA, "experts": 6}, {"dp": 4, "ep": 4}, "layout.ep=4: must divide model experts=6"),
    (MOE_LLAMA, {"tp": 2}, "layout.tp=2: the reference trainer runs MoE models with tp = 1"),
    (MOE_LLAMA, {"pp": 2, "training": {"moe_aux_loss_coef": 0.01}},
     "training.moe_aux_loss_coef=0.01: the load-balancing loss runs with pp = 1 here"),
    ({**MOE_LLAMA, "router_bias": True}, {"dp": 1}, "model.router_bias=True: the reference trainer does not build"),
])
def test_bad_moe_layouts_give_one_line(tmp_path, model, layout, message):
    import yaml

    from reference_trainer.config import ConfigError, build_config

    training = layout.pop("training", {})
    path = write_config(tmp_path, "bad", model, layout, training=training)
    with pytest.raises(ConfigError) as err:
        build_config(yaml.safe_load(path.read_text()))
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.slow
def test_load_balancing_loss_moves_the_gradient_not_the_reported_loss(one_new):
    runs, proc = one_new
    assert proc.returncode == 0, explain(proc)
    plain, aux = runs / "moe-llama-1", runs / "moe-llama-aux"
    assert column(aux, "loss")[0] == column(plain, "loss")[0]  # the reported loss is the LM loss
    assert column(aux, "grad_norm")[0] != pytest.approx(column(plain, "grad_norm")[0], rel=1e-6)


def test_a_timed_exchange_is_exposed_communication_not_compute():
    """Context parallel on the CPU: the K/V all-gather blocks the thread inside its mark
    (rt:cp_comm, 40-90 us) while gloo's worker runs it (45-88); the cat after it (aten::cat
    90-95) and the matmuls before are compute. A nested aten op inside the mark (aten::empty_like
    40-42, the receive buffers) is waiting, not compute; the exchange is not tensor-parallel."""
    from reference_trainer import profiler

    class Event:
        def __init__(self, name, start, end):
            self.name, self.device_type = name, torch.autograd.DeviceType.CPU
            self.time_range = type("R", (), {"start": start, "end": end})()

    events = [Event("rt:step", 0, 120), Event("rt:fwd_bwd", 0, 110), Event("aten::mm", 0, 40),
              Event("rt:cp_comm", 40, 90), Event("aten::empty_like", 40, 42), Event("gloo:all_gather", 45, 88),
              Event("aten::cat", 90, 95)]
    out = profiler.analyse(events, "cpu")
    assert out["busy_s"] == pytest.approx(45e-6)  # 0-40 and 90-95
    assert out["comm_exposed_s"] == pytest.approx(50e-6)  # the whole mark
    assert out["comm_exposed_tp_s"] == 0.0
    # Total: the all-gather (45-88) within its mark (40-90): 50 us, so exposed (the mark) is not more.
    assert out["comm_total_s"] == pytest.approx(50e-6)


@pytest.mark.slow
def test_hybrid_sharding_on_two_loopback_nodes_matches_one_process(tmp_path, single_sweep):
    """sharding: hybrid (HSDP) on 2 "nodes" of 2 ranks (torchrun's c10d rendezvous on loopback):
    ZeRO shards over the 2 ranks of a node and replicates across nodes (FSDP2's 2-D mesh), alone
    and with context parallel."""
    import socket
    import subprocess
    import sys

    from tests.trainer.helpers import RUN_TIMEOUT_S, trainer_env

    runs = [("hsdp-gpt-dp4-zero3", TINY_GPT, {"dp": 4, "zero_stage": 3, "sharding": "hybrid"}, "gpt-1"),
            ("hsdp-llama-dp2-cp2-zero2", TINY_LLAMA, {"dp": 2, "cp": 2, "zero_stage": 2, "sharding": "hybrid"},
             "llama-1")]
    configs = [a for name, model, layout, _ in runs for a in ("--config", str(write_config(tmp_path, name, model,
                                                                                              layout)))]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hsdp",
           "-m", "reference_trainer", *configs]
    nodes = [subprocess.Popen(cmd, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=RUN_TIMEOUT_S) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, out[-2000:] + err[-2000:]
    for name, _, _, reference in runs:
        assert_same_curve(tmp_path / "runs" / name, single_sweep[0] / reference)
        rec = json.loads((tmp_path / "runs" / name / "record.json").read_text())
        assert rec["layout"]["sharding"] == "hybrid" and rec["hardware"]["nodes"] == 2
