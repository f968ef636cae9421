"""Meta-device initialisation (issue 13): each rank builds shapes only, parallelises them, then
allocates and initialises its own shard. The values must equal eager initialisation's for the
same seed, in every layout (tests/trainer/meta_init_check.py compares every tensor exactly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.core.layout import Layout  # noqa: E402
from planner.core.model import ModelSpec  # noqa: E402
from reference_trainer.parallel import build_stages  # noqa: E402
from tests.trainer.helpers import trainer_env  # noqa: E402

CHECK = Path(__file__).with_name("meta_init_check.py")
LLAMA = {"arch": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 510,
         "seq_len": 32, "tied_embeddings": True}  # vocab 510: uneven FSDP shards of the embedding
GPT = {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "seq_len": 32, "dropout": 0.0}
BATCH = {"micro_batch": 1, "global_batch": 2}


def case(model: dict, **layout) -> str:
    return json.dumps({"model": model, "layout": {"dp": 1, **BATCH, **layout}})


def run_check(nproc: int, cases: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(CHECK), *cases]
    return subprocess.run(cmd, env=trainer_env(), capture_output=True, text=True, timeout=300, check=False,
                          cwd=CHECK.parents[2])


def test_meta_build_allocates_nothing():
    spec = ModelSpec(**{k: v for k, v in LLAMA.items()})
    modules, _ = build_stages(spec, Layout(dp=1, **BATCH), 0, seed=1, attention="flash", meta=True)
    assert all(p.is_meta for m in modules for p in m.parameters())


@pytest.mark.slow
def test_meta_init_equals_eager_init_on_two_ranks():
    cases = [case(LLAMA, dp=2, zero_stage=3), case(LLAMA, dp=2, zero_stage=0), case(LLAMA, dp=2, zero_stage=2),
             case(LLAMA, tp=2, sequence_parallel=True, recompute="full"), case(GPT, tp=2, recompute="selective"),
             case(LLAMA, pp=2), case(GPT, pp=2, vpp=2), case(LLAMA, pp=2, vpp=2, schedule="dualpipev")]
    proc = run_check(2, cases)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("tensors equal") == len(cases), proc.stdout


@pytest.mark.slow
def test_meta_init_equals_eager_init_on_four_ranks():
    cases = [case(LLAMA, dp=2, tp=2, zero_stage=1), case(LLAMA, dp=2, tp=2, zero_stage=0),
             case(GPT, dp=2, pp=2, zero_stage=3), case(LLAMA, tp=2, pp=2, sequence_parallel=True)]
    proc = run_check(4, cases)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("tensors equal") == len(cases), proc.stdout
