"""The planner's per-layer activation memory against live bytes measured in eager torch (CPU).

benchmarks/activation_memory.py counts every tensor storage alive during a forward and backward
of torchtitan's 2024 eager Llama block (bf16, Llama 3 8B's head and MLP ratios): what each layer
keeps, and what the backward holds beside that. The planner's fsdp2-2024 stack must match what
is kept (it is an exact count: 1%) and the working set within 10% (the op-level policy keeps a
few matmul outputs the backward does not read, which the planner does not subtract twice)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "activation_memory.py"


def _script():
    spec = importlib.util.spec_from_file_location("activation_memory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kv_heads", [2, 1])  # one K/V head: repeat_kv is a view, no copy kept
@pytest.mark.parametrize("mode", ["none", "op", "full"])
def test_kept_and_working_bytes_match_the_eager_block(mode, kv_heads):
    am = _script()
    heads = 4 * kv_heads  # 4 query heads per K/V head, heads of 128, MLP 3.5 h, as Llama 3 8B
    h = 128 * heads
    dims = (h, heads, kv_heads, 7 * h // 2)
    (mk, mw), (pk, pw) = am.measured_per_token(*dims, h, mode), am.predicted_per_token(*dims, h, mode)
    assert pk == pytest.approx(mk, rel=0.01)
    assert pw == pytest.approx(mw, rel=0.10)
