"""CPU offload of the optimizer (``layout.offload: optimizer``): ZeRO-Offload's split (Ren et al.
2021, "ZeRO-Offload", Sec. 4) as FSDP's ``CPUOffload`` and DeepSpeed's ``offload_optimizer`` run it.

The AdamW moments and an fp32 master copy of this rank's (shard of the) weights live in host
memory (pinned when training on a GPU, so the copies are DMA transfers); the device keeps only the
weights the model computes with and their gradients. Each step:
  1. gradients device -> host, into per-parameter host buffers (after clipping and unscaling,
     which run on the device gradients as without offload);
  2. AdamW on the host, on the fp32 masters;
  3. the updated masters host -> device, into the parameters (their local shard under FSDP2).
The device never allocates optimizer state: its 8 bytes per parameter of AdamW moments are in
host memory. On a CPU-only machine host and device are the same memory, but the mechanism is the
same: a separate host copy of states and weights, gradients copied out, weights copied back.

The device weights stay fp32 (the trainer's mixed precision casts per op under autocast), so the
host master is a second fp32 copy, not a replacement of a 16-bit device copy as in ZeRO-Offload.
Checkpointing is not supported with offload (the host states are not DTensors DCP could shard).
"""

from __future__ import annotations

import torch

from reference_trainer.parallel import local_tensor as _local


class HostOffloadAdamW:
    """AdamW whose states and fp32 master weights are host tensors.

    ``param_groups`` are the device parameters' groups (what the trainer sets ``lr`` on and the
    loss scaler unscales); ``host`` is a ``torch.optim.AdamW`` over the host masters, group by
    group. ``step`` and ``zero_grad`` are the only calls the trainer makes (``torch.amp``'s
    scaler calls ``step`` after its overflow check)."""

    def __init__(self, param_groups: list[dict], *, lr: float, betas: tuple[float, float], eps: float,
                 device: torch.device):
        self.param_groups = param_groups
        self.device = device
        pin = device.type == "cuda"
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device parameter, host master)
        host_groups = []
        for group in param_groups:
            masters = []
            for p in group["params"]:
                local = _local(p).detach()
                master = torch.empty(local.shape, dtype=torch.float32, device="cpu", pin_memory=pin)
                master.copy_(local)
                master.grad = torch.zeros_like(master, pin_memory=pin)  # the host gradient buffer
                masters.append(master)
                self.pairs.append((p, master))
            host_groups.append({"params": masters, "weight_decay": group["weight_decay"]})
        self.host = torch.optim.AdamW(host_groups, lr=lr, betas=betas, eps=eps)
        self.state: dict = {}  # the device holds no optimizer state

    @torch.no_grad()
    def step(self) -> None:
        for group, host_group in zip(self.param_groups, self.host.param_groups):
            host_group["lr"] = group["lr"]
        blocking = self.device.type != "cuda"
        for p, master in self.pairs:  # 1. gradients out
            if p.grad is None:
                master.grad.zero_()
            else:
                master.grad.copy_(_local(p.grad), non_blocking=not blocking)
        if not blocking:
            torch.cuda.synchronize(self.device)
        self.host.step()  # 2. AdamW on the host
        for p, master in self.pairs:  # 3. weights back
            _local(p).copy_(master, non_blocking=not blocking)
        if not blocking:
            torch.cuda.synchronize(self.device)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def host_state_bytes(self) -> int:
        """Bytes of host memory held: masters, gradient buffers and the two AdamW moments."""
        total = 0
        for _, master in self.pairs:
            total += 2 * master.numel() * master.element_size()
            state = self.host.state.get(master, {})
            total += sum(state[k].numel() * state[k].element_size() for k in ("exp_avg", "exp_avg_sq") if k in state)
        return total

    def state_dict(self) -> dict:
        raise NotImplementedError("checkpoints with layout.offload=optimizer are refused by the config check")
