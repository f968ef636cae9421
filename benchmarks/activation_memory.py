"""What one transformer layer keeps for its backward, and what its backward holds beside that,
measured in eager PyTorch on the CPU and compared with the planner's count.

Two kinds of layers:
- torchtitan's Llama block as its December 2024 benchmarks ran it without torch.compile
  (train_configs/llama3_8b.toml: norm_type = "rmsnorm", compile = false): RMSNorm on an fp32
  upcast of its input, RoPE as a complex product in fp32, K/V repeated to the query heads before
  SDPA (repeat_kv), SwiGLU, bf16 weights as FSDP2's MixedPrecisionPolicy gathers them; its
  op-level selective checkpointing (save every matmul output but every second one, and
  attention's), or full checkpointing. Written here from that description; the planner's
  ``fsdp2-2024`` stack with eager kernels describes it.
- the reference trainer's own layers (reference_trainer/model.py, Llama and GPT), recompute as
  reference_trainer/parallel.py applies it (selective: the attention core), fp32 as its CPU runs
  train; the ``reference`` stack describes them.

A dispatch mode counts the bytes of every tensor storage created while it is on and not yet
freed: the live bytes, exactly, whatever the device. Kept per layer = the live bytes after the
forward, per layer; working = the peak during the backward above that (the gradient arriving
from above included). Both are measured at one and two sequences and reported per token (the
slope), so that the weights, their gradients and any fixed buffer drop out; in units of h bytes
(h = hidden). The shapes keep Llama 3 8B's ratios (4 query heads per K/V head, MLP width 3.5 h),
so the per-token figures are 8B's.

    python benchmarks/activation_memory.py                          # h = 1024, about 20 s
    python benchmarks/activation_memory.py --hidden 512 --seq 512   # one K/V head: repeat_kv is a view
"""

from __future__ import annotations

import argparse
import functools
import sys
import weakref
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

MODES = ("none", "op", "full")


# A CPU without bf16 instructions (AVX2 only) runs torch's bf16 matmuls 7-80x slower than fp32 ones
# (a 2048 x 1024 x 3584 product: 0.2 s in fp32, 1-15 s in bf16, by the operands' layout), and the
# backward of its CPU flash attention 6x slower (0.52 s against 0.08 s, 8 heads of 128 over 1024
# tokens). What is counted here is storages, not values: such an op is computed in fp32 and its
# results rounded to bf16, the same shapes, strides, dtype and new storages as the bf16 kernel
# returns (the fp32 operands and results are this handler's own temporaries, made while the mode is
# off, and are not counted).
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
            torch.ops.aten.baddbmm.default}
_SDPA_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_IN_FP32 = _MATMULS | {_SDPA_BACKWARD}


def _bf16_in_fp32(func, args, kwargs):
    """``func(*args, **kwargs)`` for a matmul of bf16 CPU tensors, or the attention's backward on
    them (its logsumexp is fp32 already), computed in fp32 and rounded to bf16; None for any other
    call (other dtypes or devices, a matmul's ``out=``, an attention mask)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if func is _SDPA_BACKWARD:
        if (kwargs or {}).get("attn_mask") is not None:
            return None
        tensors = tensors[:5]  # grad_out, query, key, value, out (then the fp32 logsumexp)
    elif kwargs:
        return None
    if not tensors or any(t.dtype != torch.bfloat16 or t.device.type != "cpu" for t in tensors):
        return None
    up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
    out = func(*up, **(kwargs or {}))
    if isinstance(out, torch.Tensor):
        return out.to(torch.bfloat16)
    return tuple(o.to(torch.bfloat16) for o in out)


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages created under the mode and still alive, and their peak.
    Storages that existed before (``known``) are not counted when an op returns them."""

    def __init__(self, known: list[torch.Tensor]):
        super().__init__()
        self.live = self.peak = 0
        self.keys = {t.untyped_storage().data_ptr() for t in known}

    def _free(self, key: int, n: int) -> None:
        self.keys.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = _bf16_in_fp32(func, args, kwargs) if func in _IN_FP32 else None
        if out is None:
            out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key, n = st.data_ptr(), st.nbytes()
                if n and key not in self.keys:
                    self.keys.add(key)
                    self.live += n
                    weakref.finalize(st, self._free, key, n)  # the storage's lifetime, not the tensor's
        self.peak = max(self.peak, self.live)
        return out


class RMSNorm(nn.Module):
    """torchtitan's 2024 RMSNorm: normalised in fp32, cast back, times the weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """RoPE as a complex product on an fp32 copy (x: B, T, heads, head_dim)."""
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs.view(1, z.shape[1], 1, z.shape[-1])).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        self.wq, self.wo = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.wk, self.wv = (nn.Linear(h, kv_heads * self.hd, bias=False) for _ in range(2))
        self.w1, self.w3 = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(h), RMSNorm(h)

    def attention(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = rotate(self.wq(x).view(b, t, self.heads, self.hd), freqs)
        k = rotate(self.wk(x).view(b, t, self.kv_heads, self.hd), freqs)
        v = self.wv(x).view(b, t, self.kv_heads, self.hd)
        rep = self.heads // self.kv_heads  # repeat_kv: expand, then a copy at the query heads
        k, v = (y[:, :, :, None, :].expand(b, t, self.kv_heads, rep, self.hd).reshape(b, t, self.heads, self.hd)
                for y in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(b, t, -1))

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs)
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


# torchtitan's op-level policy saves these ops' outputs, matmuls but every second one per block.
SAVED_OPS = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
             torch.ops.aten._scaled_dot_product_efficient_attention.default,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def op_policy_context():
    count = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            count[key] += 1
        save = func in SAVED_OPS and not (func == torch.ops.aten.mm.default and count[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def torchtitan_layers(h: int, heads: int, kv_heads: int, ffn: int, seq: int, mode: str, layers: int = 2,
                      compiled: bool = False):
    """(module, run(x, mode), tensors that exist before) for torchtitan's blocks in bf16; compiled:
    each checkpointed block under torch.compile, as torchtitan applies them (AC, then compile)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(h, heads, kv_heads, ffn) for _ in range(layers)).to(torch.bfloat16)
    hd = h // heads
    angles = torch.outer(torch.arange(seq).float(), 10000.0 ** (-torch.arange(0, hd, 2).float() / hd))
    freqs = torch.polar(torch.ones_like(angles), angles)

    def layer(block: Block):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if mode == "none":
                return block(x, freqs)
            extra = {"context_fn": op_policy_context} if mode == "op" else {}
            return checkpoint(block, x, freqs, use_reentrant=False, **extra)

        return torch.compile(forward) if compiled else forward

    forwards = [layer(block) for block in blocks]

    def run(x: torch.Tensor, _mode: str) -> torch.Tensor:
        for forward in forwards:
            x = forward(x)
        return x

    return blocks, run, [freqs]


def reference_layers(spec, mode: str):
    """(module, run(x, mode), tensors that exist before) for the reference trainer's own layers
    (reference_trainer/model.py, recompute as reference_trainer/parallel.py applies it), fp32 as
    its CPU runs train."""
    from reference_trainer.model import GPT
    from reference_trainer.parallel import apply_recompute

    torch.manual_seed(0)
    module = GPT(spec, layer_ids=range(spec.layers), first=False, last=False, attention="flash")
    apply_recompute(module, {"op": "selective"}.get(mode, mode))
    return module, lambda x, _mode: module(x), []


def live_bytes(built, batch: int, seq: int, h: int, dtype: torch.dtype, mode: str, layers: int = 2) -> tuple[float, float]:
    """(kept per layer, working) in bytes: a forward and backward of ``built`` (module, run, known)."""
    module, run, known = built
    for p in module.parameters():
        p.grad = torch.zeros_like(p)  # accumulated in place, as FSDP2's sharded gradients are
    x0 = torch.randn(batch, seq, h, dtype=dtype, requires_grad=True)
    counter = LiveBytes([*known, *module.parameters(), *(p.grad for p in module.parameters()), *module.buffers()])
    with counter:
        x = x0 * 1.0
        before = counter.live
        y = run(x, mode)
        del x  # the input stays only if the layers keep it (the layer below's output, in a model)
        after = counter.live
        counter.peak = after
        y.backward(torch.randn_like(y))  # the gradient arriving from the layers above
    return (after - before) / layers, counter.peak - after


# The blocks measured: (name, the stack that describes them, precision, builder(dims, seq, mode)).
# dims = (h, heads, kv_heads, ffn); the reference trainer's MLP width is its preset rule's.
def _reference_spec(arch: str, dims, seq: int):
    from planner.core.model import ModelSpec

    h, heads, kv_heads, _ = dims
    # No dropout: with it, the CPU's SDPA leaves its flash kernel for the math one (s x s scores).
    return ModelSpec(arch=arch, layers=2, hidden=h, heads=heads, kv_heads=kv_heads if arch == "llama" else None,
                     seq_len=seq, vocab=1000, dropout=0.0)


CASES = {
    "torchtitan-2024": ("fsdp2-2024", "bf16", torch.bfloat16,
                        lambda dims, seq, mode: torchtitan_layers(*dims, seq, mode)),
    "reference-llama": ("reference", "fp32", torch.float32,
                        lambda dims, seq, mode: reference_layers(_reference_spec("llama", dims, seq), mode)),
    "reference-gpt": ("reference", "fp32", torch.float32,
                      lambda dims, seq, mode: reference_layers(_reference_spec("gpt", dims, seq), mode)),
}


def spec_for(case: str, dims, seq: int):
    from planner.core.model import ModelSpec

    if case.startswith("reference-"):
        return _reference_spec(case.split("-")[1], dims, seq)
    h, heads, kv_heads, ffn = dims
    return ModelSpec(arch="llama", layers=2, hidden=h, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn, seq_len=seq)


# torch.compile's kernels allocate their buffers below the dispatcher, where LiveBytes does not see
# them; a compiled block is measured by the process's resident memory instead, in a child process
# whose malloc maps every block of 64 KiB or more on its own and returns it to the system when
# freed (glibc: MALLOC_MMAP_THRESHOLD_), so that resident memory follows the live tensors, and whose
# peak is reset before the backward (/proc/self/clear_refs). Linux only.
RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _status_bytes(key: str) -> int:
    import re

    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def rss_bytes(dims, batch: int, seq: int, mode: str, layers: int = 2, working: bool = True) -> tuple[float, float | None]:
    """(kept per layer, working) in bytes of resident memory, torchtitan's blocks compiled; working
    None where not asked for: then no backward runs at all. What the forward keeps is fixed when it
    is compiled (AOTAutograd partitions the joint graph then, the input requiring a gradient), and on
    a CPU without native bf16 the backward's bf16 matmuls take nine tenths of the time. With and
    without backwards the kept bytes read the same (1 and 3 sequences of 512 tokens, two runs each
    way: at 3 sequences one reading, at 1 the same two readings a 128 KiB heap step apart)."""
    import gc

    module, run, _ = torchtitan_layers(*dims, seq, mode, layers, compiled=True)
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    x0 = torch.randn(batch, seq, dims[0], dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # compile, and reach the steady state of the allocator
        y = run(x0 * 1.0, mode)
        if working:
            y.backward(torch.randn_like(y))
        del y
    gc.collect()
    x = x0 * 1.0
    before = _status_bytes("VmRSS")
    y = run(x, mode)
    del x
    after = _status_bytes("VmRSS")
    if not working:
        return (after - before) / layers, None
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here
    y.backward(torch.randn_like(y))
    return (after - before) / layers, _status_bytes("VmHWM") - after


def compiled_per_token(dims, seq: int, mode: str, batches: tuple[int, int] = (1, 2),
                       working: bool = True) -> tuple[float, float | None] | None:
    """(kept per layer, working) in bytes per token of torchtitan's blocks under torch.compile, the
    slope between ``batches`` sequences (working None unless asked for: ``rss_bytes``), or None
    where that cannot be measured here (not Linux: no /proc/self/clear_refs; no C++ compiler).
    Resident memory also moves with the process's own heap, in steps of 128 KiB at a time: over one
    sequence of 512 tokens a step is 0.7% of a layer's kept bytes; a slope over two sequences
    halves it."""
    import json
    import os
    import shutil
    import subprocess

    if not Path("/proc/self/clear_refs").exists() or not (shutil.which("g++") or shutil.which("c++")):
        return None  # torch.compile on the CPU needs a C++ compiler
    low, high = batches
    args = [sys.executable, __file__, "--rss-child", "both" if working else "kept", mode, str(seq), str(low), str(high),
            *map(str, dims)]
    out = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **RSS_ENV}, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"activation_memory --rss-child: {out.stderr.strip().splitlines()[-1:]}")
    one, two = json.loads(out.stdout.strip().splitlines()[-1])
    tokens = (high - low) * seq
    return (two[0] - one[0]) / tokens, (two[1] - one[1]) / tokens if working else None


def _rss_child(argv: list[str]) -> int:
    import json
    import warnings

    warnings.filterwarnings("ignore")  # inductor's notes on complex operators (RoPE), not the figures
    parts, mode, seq, low, high, *dims = argv
    dims = tuple(int(d) for d in dims)
    print(json.dumps([rss_bytes(dims, int(b), int(seq), mode, working=parts == "both") for b in (low, high)]))
    return 0


@functools.cache  # deterministic (byte counts); docs/validation.py and the tests measure the same shapes
def measured_per_token(case: str, dims: tuple, seq: int, mode: str) -> tuple[float, float]:
    """(kept per layer, working) in bytes per token: the slope between 1 and 2 sequences."""
    _, _, dtype, build = CASES[case]
    one, two = (live_bytes(build(dims, seq, mode), b, seq, dims[0], dtype, mode) for b in (1, 2))
    return (two[0] - one[0]) / seq, (two[1] - one[1]) / seq


def predicted_per_token(case: str, dims, seq: int, mode: str, compiled: bool = False) -> tuple[float, float]:
    """The planner's (kept per layer, working) per token for the case's stack and precision."""
    from planner.core.layout import Candidates, Job, Layout
    from planner.core.memory import layer_activations_and_working
    from planner.stacks import software

    stack, precision, _, _ = CASES[case]
    job = Job(precision=precision, attention="flash", stack=stack, compile=compiled)
    recompute = {"none": "none", "op": "selective", "full": "full"}[mode]
    c = Candidates.from_layouts([Layout(dp=1, micro_batch=1, global_batch=1, recompute=recompute)])
    kept, working = layer_activations_and_working(spec_for(case, dims, seq), c, job, software(job))
    return float(kept[0]) / seq, float(working[0]) / seq


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024, help="h (heads of 128; 4 per K/V head; MLP 3.5 h)")
    ap.add_argument("--seq", type=int, default=1024)
    a = ap.parse_args(argv)
    if a.hidden % 512 or not 512 <= a.hidden <= 8192:
        print(f"activation_memory: --hidden {a.hidden}: a multiple of 512 from 512 to 8192", file=sys.stderr)
        return 2
    if not a.hidden <= a.seq <= 16384:  # tokens outweigh a weight's gradient at the peak, as in training
        print(f"activation_memory: --seq {a.seq}: from --hidden ({a.hidden}) to 16384", file=sys.stderr)
        return 2
    h = a.hidden
    heads = h // 128
    dims = (h, heads, heads // 4, 7 * h // 2)
    print(f"h={h}, {heads} heads, {heads // 4} K/V heads, seq {a.seq}; bytes per token in units of h")
    print(f"{'block':16} {'stack':10} {'recompute':10} {'kept/layer meas':>16} {'pred':>7} {'err':>7} | "
          f"{'working meas':>13} {'pred':>7} {'err':>7}")
    rows = {}
    for case, (stack, precision, _, _) in CASES.items():
        for mode in MODES:  # "op": the stack's selective recompute (the reference trainer's: the attention core)
            rows[case, mode] = measured_per_token(case, dims, a.seq, mode), predicted_per_token(case, dims, a.seq, mode)
            (mk, mw), (pk, pw) = rows[case, mode]
            print(f"{case:16} {stack:10} {mode:10} {mk / h:16.2f} {pk / h:7.2f} {pk / mk - 1:+7.1%} | "
                  f"{mw / h:13.2f} {pw / h:7.2f} {pw / mw - 1:+7.1%}")
    for mode in ("none", "full"):  # compiled; op-level: the CPU's compiled policy is not the GPU's (README)
        measured = compiled_per_token(dims, a.seq, mode)
        if measured is None:
            print("torchtitan-2024 compiled: not measurable here (needs Linux's /proc/self/clear_refs and g++)")
            break
        (mk, mw), (pk, pw) = measured, predicted_per_token("torchtitan-2024", dims, a.seq, mode, compiled=True)
        print(f"{'torchtitan-2024':16} {'+compile':10} {mode:10} {mk / h:16.2f} {pk / h:7.2f} {pk / mk - 1:+7.1%} | "
              f"{mw / h:13.2f} {pw / h:7.2f} {pw / mw - 1:+7.1%}")
    # The 8B rows of torchtitan's Table 1: 2 x 8192 tokens per GPU, 32 layers, h = 4096, op-level.
    (mk, mw), (pk, pw) = rows["torchtitan-2024", "op"]
    scale = 4096 / h * 16384 / 2**30
    print(f"Llama 3 8B in torchtitan 2024 eager, 16K tokens per GPU, op-level: kept {32 * mk * scale:.2f} GiB "
          f"measured, {32 * pk * scale:.2f} predicted; working {mw * scale:.2f} GiB measured, {pw * scale:.2f} predicted")
    return 0


if __name__ == "__main__":
    sys.exit(_rss_child(sys.argv[2:]) if sys.argv[1:2] == ["--rss-child"] else main())
