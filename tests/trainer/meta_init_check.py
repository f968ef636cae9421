"""Run under torchrun by test_trainer_meta_init.py: for each {"model": ..., "layout": ...} given
as JSON on the command line, build this rank's model parts twice, initialised eagerly and on the meta device (then
parallelised and materialised), and compare every parameter's and buffer's local values."""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from planner.core.layout import Layout
from planner.core.model import ModelSpec
from reference_trainer.parallel import build_mesh, parallelize


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def check(spec: ModelSpec, layout: Layout) -> int:
    mesh = build_mesh(layout, "cpu")
    built = [parallelize(spec, layout, mesh, torch.device("cpu"), seed=7, attention="flash", compute_dtype=None,
                         meta=meta) for meta in (False, True)]
    eager, meta = ([dict(m.named_parameters()) | dict(m.named_buffers()) for m in parts.modules] for parts in built)
    compared = 0
    for a, b in zip(eager, meta, strict=True):
        assert a.keys() == b.keys(), (sorted(a), sorted(b))
        for name in a:
            x, y = local(a[name]), local(b[name])
            assert y.device.type == "cpu" and not y.is_meta, name
            assert torch.equal(x, y), f"{name}: max |diff| {(x - y).abs().max():.3g}"
            compared += 1
    del built, eager, meta
    gc.collect()
    return compared


def main() -> int:
    dist.init_process_group("gloo")
    for text in sys.argv[1:]:
        case = json.loads(text)
        n = check(ModelSpec(**case["model"]), Layout(**case["layout"]))
        # Every rank waits until every other has finished building: a gloo group's members can finish
        # connecting at different moments, and a rank that ran ahead and exited closed its half of a
        # connection its peer was still opening ("Connection closed by peer" in a loaded CI run).
        dist.barrier()
        if dist.get_rank() == 0:
            print(f"ok {text}: {n} tensors equal", flush=True)
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
