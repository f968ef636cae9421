"""LoRA in the reference trainer agrees with the planner: the trainable parameter count exactly,
and the memory ratio to full fine-tuning within 10% (issue 6)."""

import json

import pytest

torch = pytest.importorskip("torch")

from planner.core.evaluate import evaluate  # noqa: E402
from planner.core.finetune import trainable_params  # noqa: E402
from planner.core.layout import Candidates, Job, Layout  # noqa: E402
from planner.core.model import ModelSpec  # noqa: E402
from planner.hardware import get_profile  # noqa: E402
from reference_trainer.lora import apply_lora  # noqa: E402
from reference_trainer.model import GPT, loss_fn  # noqa: E402
from tests.trainer.helpers import TINY_LLAMA, run_trainer, write_config  # noqa: E402

SPECS = [
    ModelSpec(arch="llama", layers=3, hidden=128, heads=8, kv_heads=2, ffn_hidden=256, vocab=300, seq_len=32),
    ModelSpec(arch="gpt", layers=2, hidden=96, heads=6, vocab=200, seq_len=32, dropout=0.0),
]
TARGETS = [("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"), ("up_proj", "down_proj"),
           ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]


def lora_model(spec: ModelSpec, targets: tuple[str, ...], r: int = 4) -> GPT:
    model = GPT(spec)
    model.init_weights(0)
    return apply_lora(model, spec, r, 16.0, targets)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.arch)
@pytest.mark.parametrize("targets", TARGETS, ids=lambda t: "+".join(t))
def test_trainable_count_equals_the_planner(spec, targets):
    if "gate_proj" in targets and not spec.gated_mlp:
        targets = tuple(t for t in targets if t != "gate_proj")
    model = lora_model(spec, targets)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert trained == trainable_params(spec, Job(mode="lora", lora_r=4, lora_targets=targets))
    assert frozen == spec.params


def test_lora_starts_from_the_frozen_model_and_trains_only_adapters():
    spec = SPECS[0]
    base = GPT(spec)
    base.init_weights(0)
    model = lora_model(spec, TARGETS[3])
    x = torch.randint(0, spec.vocab, (2, spec.seq_len))
    assert torch.allclose(base(x), model(x), atol=1e-6)  # B = 0 at the start
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        loss_fn(model(x), x).backward()
        opt.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert not torch.allclose(base(x), model(x))


def measured_bytes(model: GPT, spec: ModelSpec, batch: int) -> float:
    """Bytes held for one training step: parameters, gradients, AdamW states, and the tensors
    autograd saves for backward (each storage once, parameters not counted again)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randint(0, spec.vocab, (batch, spec.seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(x), x)
    loss.backward()
    opt.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    states = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.dim() > 0)
    return weights + grads + states + sum(saved.values())


def predicted_bytes(spec: ModelSpec, job: Job, batch: int) -> float:
    layout = Layout(dp=1, micro_batch=batch, global_batch=batch)
    ev = evaluate(spec, get_profile("a100-80g"), job, Candidates.from_layouts([layout]), 1)
    m = ev.memory
    return float(m.weights[0] + m.gradients[0] + m.optimizer[0] + m.activations[0])


def test_memory_ratio_to_full_finetuning_agrees_with_the_planner():
    spec = ModelSpec(arch="llama", layers=4, hidden=256, heads=8, kv_heads=4, ffn_hidden=768, vocab=512,
                     seq_len=128)
    batch, targets = 4, ("q_proj", "v_proj")
    full = GPT(spec)
    full.init_weights(0)
    lora = lora_model(spec, targets, r=8)
    measured = measured_bytes(lora, spec, batch) / measured_bytes(full, spec, batch)
    base = Job(precision="fp32", attention="flash", kernels="eager")
    predicted = (predicted_bytes(spec, base.replace(mode="lora", lora_r=8, lora_targets=targets), batch)
                 / predicted_bytes(spec, base.replace(mode="full-finetune"), batch))
    assert measured == pytest.approx(predicted, rel=0.10), (measured, predicted)
    assert measured < 0.8  # LoRA saves the frozen weights' gradients and optimizer states


@pytest.mark.slow
def test_a_lora_run_records_its_mode(tmp_path):
    config = write_config(tmp_path, "lora", TINY_LLAMA, {"dp": 1},
                          training={"mode": "lora", "steps": 4}, lora={"r": 4, "targets": ["q_proj", "v_proj"]})
    done = run_trainer([config], 1)
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads((tmp_path / "runs" / "lora" / "record.json").read_text())
    assert rec["config"]["training"]["mode"] == "lora" and rec["config"]["lora"]["r"] == 4
    from planner.calibration.measured import from_record

    m = from_record(rec, "lora")
    # TINY_LLAMA: 4 layers, hidden 64, KV width 32: q 4*(64+64) + v 4*(64+32) = 896 per layer.
    assert m.job.lora and trainable_params(m.model, m.job) == 4 * 896
