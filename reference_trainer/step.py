"""One optimizer step: forward and backward over the micro-batches (or the pipeline schedule),
tied-embedding gradient sum, loss-scale check, global gradient norm and clipping, AdamW.

Mixed precision keeps fp32 master weights: bf16/fp16 run under autocast (FSDP2 also gathers
parameters in that dtype). fp16 uses a dynamic loss scaler whose overflow check is all-reduced
over every rank (``ShardedGradScaler`` with the world group, device passed explicitly), so all
pipeline stages and shards skip the same step.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from reference_trainer import faults
from reference_trainer.config import TrainingConfig
from reference_trainer.model import loss_fn
from reference_trainer.moe import MoE, expert_param_names, reduce_expert_grads
from reference_trainer.parallel import (
    Parts,
    build_schedule,
    is_dtensor,
    local_tensor,
    replication,
    settle_grads,
    unwrap,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(precision: str) -> torch.dtype | None:
    return DTYPES.get(precision)


def lr_at(step: int, tr: TrainingConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr`` at the
    last step (Loshchilov & Hutter 2017, as in GPT-3 and LLaMA). Steps count from 0: the first
    step after warm-up runs at ``lr`` and the last one (``steps - 1``) at the minimum."""
    if step < tr.warmup_steps:
        return tr.lr * (step + 1) / tr.warmup_steps
    progress = min(1.0, (step - tr.warmup_steps) / max(1, tr.steps - 1 - tr.warmup_steps))
    return tr.lr * (tr.min_lr_ratio + (1 - tr.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _signature(p: torch.Tensor) -> tuple:
    if is_dtensor(p):
        return ("dtensor", id(p.device_mesh), tuple(str(x) for x in p.placements))
    return ("tensor",)


def build_optimizers(modules: list[torch.nn.Module], tr: TrainingConfig, offload: str = "none",
                     device: torch.device | None = None) -> list:
    """One AdamW per model part (torchtitan's container). Weight decay on matrices and
    embeddings only; parameter groups also split plain tensors from DTensors of each mesh, so
    the foreach kernels never mix them. ``offload="optimizer"``: the states and fp32 masters in
    host memory, the step on the CPU (reference_trainer/offload.py)."""
    optimizers = []
    for module in modules:
        groups: dict[tuple, list] = {}
        for name, p in module.named_parameters():
            if not p.requires_grad:  # frozen (LoRA): no gradient, no optimizer state
                continue
            decay = p.dim() >= 2 and not name.endswith("bias")  # MoE experts' stacked biases are 2-D
            groups.setdefault((decay, _signature(p)), []).append(p)
        param_groups = [{"params": ps, "weight_decay": tr.weight_decay if key[0] else 0.0}
                        for key, ps in groups.items()]
        if offload == "optimizer":
            from reference_trainer.offload import HostOffloadAdamW

            optimizers.append(HostOffloadAdamW(param_groups, lr=tr.lr, betas=tr.betas, eps=tr.eps,
                                               device=device or torch.device("cpu")))
        else:
            optimizers.append(torch.optim.AdamW(param_groups, lr=tr.lr, betas=tr.betas, eps=tr.eps))
    return optimizers


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    loss_scale: float | None
    skipped: bool
    fwd_bwd_s: float = 0.0
    optimizer_s: float = 0.0
    # Seconds inside ``update``'s collectives across pipeline stages: their own cost (microseconds
    # for the packed all-reduce) plus waiting for the slowest rank (on a pipeline, the drain).
    sync_s: float = 0.0


class Stepper:
    """Holds what a step needs; ``forward_backward`` then ``update``."""

    def __init__(self, parts: Parts, optimizers: list, tr: TrainingConfig, layout, device: torch.device):
        self.parts, self.optimizers, self.tr, self.layout, self.device = parts, optimizers, tr, layout, device
        self.dtype = compute_dtype(tr.precision)
        self.m = layout.grad_accum
        self.scaler = None
        if tr.precision == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device.type, init_scale=tr.init_loss_scale,
                                            growth_interval=tr.loss_scale_growth_interval,
                                            process_group=dist.group.WORLD)
        self.mesh = parts.mesh
        self.tp_rank = self.mesh.get_local_rank("tp")
        self.stage_ranks = layout.dp * layout.cp * layout.tp  # ranks that run each pipeline stage
        self._raw_losses: list[torch.Tensor] = []
        self._inject = False
        self._sync_s = 0.0  # seconds in this update's cross-stage collectives
        self.norm_groups = self._norm_groups()
        self.moes = [m for module in parts.modules for m in module.modules() if isinstance(m, MoE)]
        for moe in self.moes:
            moe.aux_coef = tr.moe_aux_loss_coef
        if layout.pp > 1:
            parts.schedule = build_schedule(parts.modules, parts.stage_ids, parts.num_stages, parts.mesh, layout,
                                            self.m, self._pipeline_loss, device)

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward starts from: the micro-batch mean loss over m micro-batches, scaled."""
        out = loss / self.m
        if self._inject:
            out = out * float("inf")
        return self.scaler.scale(out) if self.scaler is not None else out

    def _pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._scaled(loss_fn(output, target))

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]], step: int) -> torch.Tensor:
        """Runs forward and backward; returns this rank's sum of micro-batch losses (zero on
        ranks that do not compute the loss)."""
        self._inject = faults.overflow(step + 1)  # steps count from 1 in logs, CSV and fault specs
        self._raw_losses = []
        parts = self.parts
        if parts.cp_positions is not None:  # context parallel: this rank's two chunks of each sequence
            idx = parts.cp_positions
            batches = [(x[:, idx], y[:, idx]) for x, y in batches]
        if parts.schedule is not None:
            x = torch.cat([b[0] for b in batches])
            y = torch.cat([b[1] for b in batches])
            losses: list[torch.Tensor] = []  # what _pipeline_loss returned, per micro-batch
            with self.autocast():
                if parts.first:
                    parts.schedule.step(x, target=y if parts.last else None, losses=losses)
                elif parts.last:
                    parts.schedule.step(target=y, losses=losses)
                else:
                    parts.schedule.step()
            unscale = self.m / (float(self.scaler.get_scale()) if self.scaler is not None else 1.0)
            self._raw_losses = [loss.detach().float() * unscale for loss in losses]
        else:
            model = parts.modules[0]
            for k, (x, y) in enumerate(batches):
                with self._sync(model, last=k == self.m - 1), self.autocast():
                    loss = loss_fn(model(x), y)
                    self._raw_losses.append(loss.detach() * (float("inf") if self._inject else 1.0))
                    if self.tr.moe_aux_loss_coef > 0:  # load balancing: in the gradient, not the reported loss
                        loss = loss + sum(m.aux_loss for m in self.moes if m.aux_loss is not None)
                self._scaled(loss).backward()
        if self._raw_losses and self.tp_rank == 0:
            return torch.stack(self._raw_losses).float().sum()
        return torch.zeros((), device=self.device)

    def _sync(self, model: torch.nn.Module, last: bool):
        """Gradient reduction on the last micro-batch only: DDP's no_sync (ZeRO 0); FSDP2 for
        ZeRO 1 and for ZeRO 0 with tensor parallel (FSDP2 with a shard group of one, see
        ``apply_dp``); ZeRO 2 and 3 reduce-scatter every micro-batch, keeping gradients sharded."""
        zero = self.layout.zero_stage
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last or zero >= 2)
        elif zero == 0 and hasattr(model, "no_sync") and not last:
            return model.no_sync()
        return contextlib.nullcontext()

    # --- after backward ------------------------------------------------------------------
    def _sum_tied_grads(self) -> None:
        """Embedding and its head copy get the sum of both gradients: across the first and last
        pipeline stages (all-reduce), or on this rank when it holds both."""
        tied = []
        for module in self.parts.modules:
            gpt = unwrap(module)
            if gpt.spec.tied_embeddings and gpt.embed is not None and (gpt.head is None or gpt.head_is_tied_copy):
                tied.append(gpt.embed.tok.weight)
            if gpt.head_is_tied_copy:
                tied.append(gpt.head.weight)
        grads = [local_tensor(p.grad) for p in tied if p.grad is not None]
        if self.parts.tied_group is not None:
            for g in grads:
                with self._timed_sync():
                    dist.all_reduce(g, group=self.parts.tied_group)
        elif len(grads) == 2:
            grads[0].add_(grads[1])
            grads[1].copy_(grads[0])

    def _norm_groups(self) -> dict[int, list[torch.Tensor]]:
        """Parameters by replication factor (how many ranks of their stage hold the same values),
        the tied head copy left out: each element of the model counted once."""
        groups: dict[int, list[torch.Tensor]] = {}
        ep = self.layout.ep
        for module in self.parts.modules:
            gpt = unwrap(module)
            tied_copy = gpt.head.weight if gpt.head_is_tied_copy else None
            experts = set(expert_param_names(module)) if ep > 1 else set()
            for name, p in module.named_parameters():
                if p is not tied_copy:  # expert parallel: 1/ep of the stage's ranks hold each expert
                    r = replication(p, self.stage_ranks) // (ep if name in experts else 1)
                    groups.setdefault(r, []).append(p)
        return groups

    def _local_sq_norm(self) -> torch.Tensor:
        """This rank's share of the squared global gradient norm (one foreach kernel per group)."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for r, params in self.norm_groups.items():
            grads = [local_tensor(p.grad) for p in params if p.grad is not None]
            if grads:
                norms = torch._foreach_norm(grads, 2.0)
                total += torch.stack(norms).double().pow(2).sum() / r
        return total

    @contextlib.contextmanager
    def _timed_sync(self):
        """Times a collective of ``update`` across pipeline stages (the tied gradients' all-reduce,
        the loss scaler's unscale and overflow flag, the packed loss and norm). A rank that
        finished backward early waits in the first of them for the slowest rank (and, on a loaded
        host, a little in the next): the record books its time beyond the fastest rank's as
        bubble (pp > 1) or other, not optimizer (planner.core.step_parts.sync_waits). The expert
        and tensor-parallel reductions before them stay inside a stage: not timed."""
        t0 = time.perf_counter()
        yield
        if self.device.type == "cuda":  # NCCL returns once queued: the wait is on the stream
            torch.cuda.synchronize(self.device)
        self._sync_s += time.perf_counter() - t0

    def update(self, loss_sum: torch.Tensor, step: int) -> StepResult:
        lr = lr_at(step, self.tr)
        self._sync_s = 0.0
        if self.parts.experts is not None:
            for module in self.parts.modules:
                reduce_expert_grads(module, self.parts.experts)
        settle_grads(self.parts.modules)
        self._sum_tied_grads()
        if self.scaler is not None:
            for opt in self.optimizers:
                with self._timed_sync():  # its local unscale too: about the same on every rank
                    self.scaler.unscale_(opt)  # the overflow flag is all-reduced over the world
        packed = torch.stack([loss_sum.double(), self._local_sq_norm()])
        with self._timed_sync():
            dist.all_reduce(packed)
        # Every (dp, cp) rank's micro-batch losses: cp ranks each hold the mean over T/cp tokens.
        loss = float(packed[0]) / (self.layout.dp * self.layout.cp * self.m)
        norm = math.sqrt(float(packed[1])) if math.isfinite(float(packed[1])) else float("nan")
        skipped = not (math.isfinite(norm) and math.isfinite(loss))
        if not skipped:
            if self.tr.grad_clip > 0 and norm > self.tr.grad_clip:
                coef = self.tr.grad_clip / (norm + 1e-6)
                grads = [local_tensor(p.grad) for m in self.parts.modules for p in m.parameters() if p.grad is not None]
                torch._foreach_mul_(grads, coef)
            for opt in self.optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr
                if self.scaler is not None:
                    self.scaler.step(opt)
                else:
                    opt.step()
        scale = None
        if self.scaler is not None:
            self.scaler.update()  # backs off after an overflow, grows after growth_interval clean steps
            scale = float(self.scaler.get_scale())
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return StepResult(loss=loss, grad_norm=norm, lr=lr, loss_scale=scale, skipped=skipped,
                          sync_s=self._sync_s)


class NonFiniteGuard:
    """Counts non-finite steps in a row; too many stop the run with a diagnosis."""

    def __init__(self, limit: int):
        self.limit, self.run, self.first = limit, 0, None

    def update(self, step: int, skipped: bool) -> bool:
        """True when the run must stop."""
        if not skipped:
            self.run, self.first = 0, None
            return False
        self.run += 1
        self.first = step if self.first is None else self.first
        return self.run >= self.limit

    def diagnosis(self, precision: str, loss_scale: float | None) -> str:
        causes = ["learning rate too high: lower training.lr or lengthen training.warmup_steps",
                  "exploding gradients: keep training.grad_clip on (1.0)",
                  "bad data: token ids outside the vocabulary, or corrupt samples"]
        if precision == "fp16":
            causes.insert(0, f"fp16 overflow the loss scaler cannot absorb (scale now {loss_scale:g}): "
                             "use bf16, which has fp32's exponent range")
        return (f"loss or gradients non-finite for {self.run} steps in a row (steps {self.first}.."
                f"{self.first + self.run - 1}); stopped instead of training a NaN model. Likely causes: "
                + "; ".join(causes))
