"""Where a step's time goes, from torch.profiler traces of a few steps; memory; an NVML sampler.

A traced step is cut into intervals (profiler timestamps, one clock per process):
- busy: compute: ``aten::`` ops on the CPU (gloo), or non-NCCL kernels on the GPU (copies and fills,
  ``Memcpy``/``Memset``, are neither compute nor communication);
- collectives: ``gloo:*`` events on gloo's worker threads (the main thread's ``c10d::allreduce_``
  only records the enqueue), or NCCL collective kernels;
- receives: ``gloo:recv``, or NCCL SendRecv kernels (pipeline parallel) that no all-to-all launched;
- waits: DTensor's ``_c10d_functional::wait_tensor`` (tensor parallel's collectives). It can sit
  inside another op (``aten::add`` of a residual whose input is still being all-reduced), so its
  span is cut out of the compute intervals: the innermost op decides, and waiting is never compute.
An operation that ends while compute runs was hidden. One that ends while nothing computes was
waited for, from the end of the last computation before it (or its own start, if later) until
it completed: its "waiting tail". Inside the forward-backward window, exposed communication is
the union of the collectives' tails and the waits, and pipeline idle (bubble) the union of the
receives' tails. Exposed tensor-parallel communication is the part spent in functional-collective
waits (on the CPU, where a wait blocks the thread); the rest of the exposed communication is data
parallel's (DDP's and FSDP2's collectives do not go through ``wait_tensor``).
A receive lasts until its peer has sent, so the idle time includes the transfer, which neither
gloo nor NCCL lets us tell apart from waiting; with small activations it is a small part.

NCCL runs an all-to-all as grouped sends and receives (one ``SendRecv`` kernel, the kernel of pipeline
point-to-point too): the communication op around the kernel's launch (``launching_op``) tells them
apart, so a SendRecv launched by an all-to-all is a collective and one launched by send/recv stays a
receive. The same rules (``classify``, ``book``, ``launching_op``) read a recorded trace
(reference_trainer/trace.py: ``python -m reference_trainer trace FILE``).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import NamedTuple

# torch is imported where it is used, so reading a recorded trace (``python -m reference_trainer
# trace FILE``) starts without it.

STEP_MARK = "rt:step"
FWD_BWD_MARK = "rt:fwd_bwd"
P2P_GLOO = ("gloo:send", "gloo:recv")
RECV_GLOO = "gloo:recv"
WAIT_OPS = ("_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")
# The trainer's own blocking exchanges (reference_trainer/exchange.py): context parallel's K/V
# gather and expert parallel's all-to-all. Their marks span the wait on the training thread.
EXCHANGE_MARKS = ("rt:cp_comm", "rt:all_to_all")
# GPU memory traffic (the names torch.profiler and Kineto give copies and fills): neither compute
# nor communication, as HolisticTraceAnalysis books them ("MEMORY" kernels).
GPU_MEMORY_OPS = ("Memcpy", "Memset")
# Collectives that NCCL runs as grouped sends and receives (one SendRecv kernel): the op that
# launched the kernel tells them from pipeline point-to-point (send, recv, batch_isend_irecv).
GROUPED_P2P_COLLECTIVES = ("all_to_all", "alltoall")
# CPU ops that launch communication: ProcessGroupNCCL's annotations (``nccl:all_to_all``, ``nccl:send
# 0->1``), the c10d ops (``c10d::alltoall_base_``, ``c10d::recv_``) and functional collectives.
COMM_OPS = ("nccl:", "c10d::", "_c10d_functional::", "c10d_functional::")


class Span(NamedTuple):
    """One traced event: name, start and end (microseconds), whether it ran on the GPU, and for
    an NCCL kernel the communication op that launched it (``launching_op``; in a recorded trace
    also Kineto's ``Collective name``), else None."""

    name: str
    start: float
    end: float
    gpu: bool = False
    launcher: str | None = None


def launching_op(ops: list[tuple[str, float, float]], launch_us: float) -> str | None:
    """The innermost communication op (a name starting with ``COMM_OPS``) among ``ops`` (name,
    start, end: the CPU ops of the thread that launched a kernel) whose span holds the launch;
    None when no communication op was running (innermost: the latest to start). The one rule for
    live and recorded traces."""
    around = [(a, name) for name, a, b in ops if a <= launch_us <= b and name.startswith(COMM_OPS)]
    return max(around)[1] if around else None


def spans(events) -> list[Span]:
    """torch.profiler FunctionEvents (``prof.events()``) as spans. A GPU kernel's
    ``linked_correlation_id`` is the id of the CPU op that was innermost when it was launched
    (torch/autograd/profiler.py ``_parse_kineto_results`` fills ``FunctionEvent.kernels`` from the
    same link; those ``Kernel`` records carry no start time): an NCCL kernel's launcher is the
    communication op around that op's start on its thread (``launching_op``)."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    link = lambda e: getattr(e, "linked_correlation_id", 0)  # noqa: E731 (absent before torch 2.1)
    ops = {getattr(e, "id", None): e for e in events if e.device_type != cuda and not link(e)}
    comm: dict[int, list[tuple[str, float, float]]] = {}
    for e in ops.values():
        if e.name.startswith(COMM_OPS):
            comm.setdefault(getattr(e, "thread", 0), []).append((e.name, float(e.time_range.start), float(e.time_range.end)))

    def launcher(kernel) -> str | None:
        op = ops.get(link(kernel)) if link(kernel) else None
        return None if op is None else launching_op(comm.get(getattr(op, "thread", 0), []), float(op.time_range.start))

    out = []
    for e in events:
        gpu = e.device_type == cuda
        who = launcher(e) if gpu and "nccl" in e.name.lower() else None
        out.append(Span(e.name, float(e.time_range.start), float(e.time_range.end), gpu, who))
    return out


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the (merged) intervals ``a`` not covered by the (merged) intervals ``b``."""
    out, j = [], 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def waiting_tails(ops: list[tuple[float, float]], busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """For each operation (a, b) that ends outside the (merged, sorted) busy intervals: the span
    from max(a, end of the last busy interval before b) to b."""
    import bisect

    starts = [x for x, _ in busy]
    out = []
    for a, b in ops:
        i = bisect.bisect_right(starts, b) - 1  # the last busy interval starting at or before b
        if i >= 0 and busy[i][1] >= b:
            continue  # completed while computing: hidden
        last_end = busy[i][1] if i >= 0 else a
        out.append((max(a, last_end), b))
    return union(out)


def clip(intervals: list[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float]]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def classify(spans: list[Span], device_type: str) -> dict[str, list[tuple[float, float]]]:
    """Busy, collective, point-to-point and wait intervals (microseconds) plus the marks' windows.
    The one definition of what a traced event is, for the live profiler and recorded traces."""
    busy, coll, p2p, waits, exch, marks = [], [], [], [], [], {}
    for s in spans:
        span, name = (s.start, s.end), s.name
        if name in (STEP_MARK, FWD_BWD_MARK):
            marks[name] = span
        elif name in EXCHANGE_MARKS:
            exch.append(span)
        elif device_type == "cuda" and s.gpu:
            kind = nccl_kind(name, s.launcher)
            if kind == "p2p":
                p2p.append(span)
            elif kind == "collective":
                coll.append(span)
            elif kind is None and not name.startswith(GPU_MEMORY_OPS):
                busy.append(span)
        elif device_type == "cpu":
            if name == RECV_GLOO:
                p2p.append(span)
            elif name.startswith("gloo:") and name not in P2P_GLOO:
                coll.append(span)
            elif name in WAIT_OPS:
                waits.append(span)
            elif name.startswith("aten::"):
                busy.append(span)
    waits, exch = union(waits), union(exch)
    return {"busy": subtract(subtract(union(busy), waits), exch), "coll": sorted(coll), "p2p": sorted(p2p),
            "waits": waits, "exchange": exch, "marks": marks}


def nccl_kind(kernel: str, launcher: str | None = None) -> str | None:
    """An NCCL kernel's role from its name (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``,
    ``ncclDevKernel_SendRecv``, ``ncclKernel_ReduceScatter_...``): "p2p" for receives and
    send-receives (pipeline parallel), "send" for a lone send (the receiver books the wait),
    "collective" for the rest, and for any NCCL kernel that an all-to-all launched (``launcher``:
    the op that launched it, ``launching_op``); None for a kernel that is not NCCL's (compute)."""
    if "nccl" not in kernel.lower():
        return None
    if launcher is not None and any(c in launcher.lower() for c in GROUPED_P2P_COLLECTIVES):
        return "collective"
    if "SendRecv" in kernel or "Recv" in kernel:
        return "p2p"
    return "send" if "Send" in kernel else "collective"


def analyse(events, device_type: str) -> dict[str, float]:
    """Seconds of one step traced live (torch.profiler FunctionEvents), in the windows of the
    trainer's marks (rt:step, rt:fwd_bwd); empty without them."""
    c = classify(spans(events), device_type)
    step, fb = c["marks"].get(STEP_MARK), c["marks"].get(FWD_BWD_MARK)
    return {} if step is None or fb is None else book(c, step, fb)


def book(c: dict, step: tuple[float, float], fb: tuple[float, float]) -> dict[str, float]:
    """Seconds of one step from classified intervals: communication total/exposed (and its
    tensor-parallel part), communication while nothing computes, pipeline idle, the windows."""
    coll_step = clip(c["coll"], step)
    coll_fb, p2p_fb, busy_fb, waits_fb = clip(c["coll"], fb), clip(c["p2p"], fb), clip(c["busy"], fb), clip(
        c["waits"], fb)
    idle = waiting_tails(p2p_fb, busy_fb)
    exch_fb = clip(c["exchange"], fb)
    exposed = subtract(union(waiting_tails(coll_fb, busy_fb) + waits_fb + exch_fb), idle)
    tp_exposed = subtract(waits_fb, idle)
    alone = subtract(union(coll_step), clip(c["busy"], step))  # HolisticTraceAnalysis's non-overlapped comm
    # All the communication of the step: the collectives, and the waits and timed exchanges that
    # ``exposed`` also counts (a DTensor wait is on the training thread, not a gloo:* event), so that
    # exposed, a part of them inside the forward-backward window, is never more than the total.
    total = union(coll_step + clip(c["waits"], step) + clip(c["exchange"], step))
    return {"comm_total_s": length(total) / 1e6, "comm_exposed_s": length(exposed) / 1e6,
            "comm_exposed_tp_s": length(tp_exposed) / 1e6, "bubble_s": length(idle) / 1e6,
            "fwd_bwd_s": (fb[1] - fb[0]) / 1e6, "busy_s": length(busy_fb) / 1e6,
            "step_window_s": (step[1] - step[0]) / 1e6, "comm_alone_s": length(alone) / 1e6}


class _Range(NamedTuple):
    start: float
    end: float


class TracedEvent(NamedTuple):
    """One event of a live trace with what ``spans`` reads of a torch.profiler FunctionEvent."""

    name: str
    id: int
    thread: int
    time_range: _Range
    device_type: object
    linked_correlation_id: int


def traced_events(prof) -> list:
    """The events of a live trace as ``prof.events()`` lists them (the same names, ids, threads
    and microseconds since the trace's start), read from Kineto's raw results.

    ``prof.events()`` also builds each event's memory use, kernel lists and the call tree, which
    nothing here reads: 1.8-2.4 s for 34,000 events on this 2-core CPU, against 0.13-0.2 s read raw
    (``python benchmarks/trace_read_speed.py``). Building the tree, it also drops an op that is its
    same-named parent's only child (an op that dispatches to itself); the raw read keeps it, inside
    its parent's span, where no booking sees it: compute and waits are unions, and communication
    ops do not nest so. Where this torch lacks what the raw read needs, the events are
    ``prof.events()``'s."""
    try:
        from torch.autograd.profiler_util import StringTable, _filter_name

        result = prof.profiler.kineto_results
        raw, t0 = result.events(), result.trace_start_ns()
    except (ImportError, AttributeError):
        return prof.events()
    names = StringTable()  # demangled names, as FunctionEvent's (torch's _rewrite_name, no wildcard)
    out = []
    for e in raw:
        name = e.name()
        if _filter_name(name) or getattr(e, "is_hidden_event", lambda: False)():
            continue
        out.append(TracedEvent(names[name], e.correlation_id(), e.start_thread_id(),
                               _Range((e.start_ns() - t0) / 1000, (e.end_ns() - t0) / 1000), e.device_type(),
                               e.linked_correlation_id()))
    return out


# Kineto (libkineto's Logger, inside torch) writes a "USDT:... SyncActivityProfilerHandler.cpp:52]
# profiler_start" and a "profiler_stop" line on stderr at every traced step, at its highest log
# level: with torch 2.13.0, KINETO_LOG_LEVEL=5 still prints them and 6 prints nothing (so Kineto's
# errors go too). It reads the variable when the first trace starts. A run's own setting wins.
KINETO_QUIET_LEVEL = "6"


def tracer(device_type: str):
    import os

    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    return profile(activities=activities)


def mark(name: str):
    from torch.profiler import record_function

    return record_function(name)


# --- memory and CPU ---------------------------------------------------------------------------
def peak_memory(device) -> dict[str, object]:
    import torch

    if device.type == "cuda":
        # num_alloc_retries: how often the caching allocator found no free block, released its cache
        # (a device synchronisation) and asked CUDA again: a run near its memory limit slows down
        # there while max_memory_reserved reads as the ceiling it hit.
        stats = torch.cuda.memory_stats(device)
        return {"kind": "cuda", "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
                "capacity_bytes": int(torch.cuda.get_device_properties(device).total_memory),
                "alloc_retries": int(stats.get("num_alloc_retries", 0))}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"kind": "cpu_rss", "peak_allocated_bytes": int(rss), "peak_reserved_bytes": None, "capacity_bytes": None,
            "alloc_retries": None}


def cpu_times() -> float:
    t = os.times()
    return t.user + t.system


# --- NVML ---------------------------------------------------------------------------------
class NvmlSampler:
    """A daemon thread sampling GPU utilisation, memory used and power; energy from the
    counter's difference. ``start`` returns a reason string instead when NVML is unavailable."""

    def __init__(self, device, interval_s: float):
        self.device, self.interval_s = device, interval_s
        self.samples: list[tuple[float, float, float]] = []  # (utilisation %, memory used bytes, power W)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._energy0_mj: float | None = None
        self._t0 = 0.0

    def start(self) -> str | None:
        if self.device.type != "cuda":
            return "no GPU: NVML not used (CPU run)"
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = self._find_handle(pynvml)
            try:
                self._energy0_mj = float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
            except pynvml.NVMLError:
                self._energy0_mj = None
        except Exception as exc:  # ImportError, pynvml.NVMLError (no driver, no library), torch errors
            return f"NVML unavailable: {type(exc).__name__}: {exc}"
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return None

    def _find_handle(self, pynvml):
        """The NVML handle of this process's GPU: by PCI bus id (right under CUDA_VISIBLE_DEVICES),
        else by CUDA index."""
        import torch

        props = torch.cuda.get_device_properties(self.device)
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            pci = f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
            try:
                return pynvml.nvmlDeviceGetHandleByPciBusId(pci.encode())
            except pynvml.NVMLError:
                pass
        return pynvml.nvmlDeviceGetHandleByIndex(self.device.index or 0)

    def _run(self) -> None:
        import pynvml

        while not self._stop.wait(self.interval_s):
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
                mem = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
                power = pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
                self.samples.append((float(util), float(mem), float(power)))
            except pynvml.NVMLError:
                return

    def latest_memory_bytes(self) -> float | None:
        return self.samples[-1][1] if self.samples else None

    def latest(self) -> dict[str, float | None]:
        """The newest sample, for the per-step CSV (empty values without NVML)."""
        util, _, power = self.samples[-1] if self.samples else (None, None, None)
        return {"gpu_util_percent": util, "power_w": power}

    def stop(self) -> dict[str, object] | None:
        if self._thread is None:
            return None
        import pynvml

        self._stop.set()
        self._thread.join()
        elapsed = time.perf_counter() - self._t0
        energy = None
        if self._energy0_mj is not None:
            try:
                energy = (float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) - self._energy0_mj) / 1e3
            except pynvml.NVMLError:
                energy = None
        n = len(self.samples)
        mean = (lambda i: sum(s[i] for s in self.samples) / n) if n else (lambda i: None)
        peak = (lambda i: max(s[i] for s in self.samples)) if n else (lambda i: None)
        return {"samples": n, "interval_s": self.interval_s, "duration_s": elapsed,
                "gpu_util_mean_percent": mean(0), "gpu_util_max_percent": peak(0),
                "memory_used_max_bytes": peak(1), "power_mean_w": mean(2), "power_max_w": peak(2),
                "energy_j": energy}
