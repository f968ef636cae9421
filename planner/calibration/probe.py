"""`planner probe`: micro-benchmarks of the machine at hand, written as a hardware profile.

Matmul FLOP/s over sizes and dtypes (the efficiency curve), memory bandwidth, and all-reduce,
all-gather and point-to-point bandwidth and latency across N local processes (gloo on CPU, NCCL on
GPU; bus bandwidth as nccl-tests defines it). torch is imported inside the functions only.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from planner.errors import PlannerError, require
from planner.hardware import HardwareProfile, driver_version, efficiency_to_table
from planner.units import GIB

CPU_SIZES = (64, 128, 256, 512, 1024)
GPU_SIZES = (256, 512, 1024, 2048, 4096, 8192)
COLLECTIVE_BYTES = (2**12, 2**16, 2**20, 2**22, 2**24)
HOST_PROCESSES = 64  # a CPU profile's "GPUs per node": any run on one host fits in one node


@dataclass
class ProbeResult:
    device: str  # "cpu" or "cuda"
    device_name: str
    matmul: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # dtype -> [(n, FLOP/s)]
    memory_bytes_per_s: float = 0.0
    collectives: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # op -> [(bytes, s)]
    nprocs: int = 1
    cores: int = 1
    memory_bytes: float = 0.0
    torch_version: str = ""
    cuda: str | None = None
    driver: str | None = None


def _timeit(fn, sync, min_seconds: float) -> float:
    """Median seconds per call over repeats filling ``min_seconds``."""
    fn()
    sync()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_seconds or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_matmul(device: str, dtypes: list[str], sizes: tuple[int, ...], seconds: float) -> dict:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, list[tuple[int, float]]] = {}
    for name in dtypes:
        dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        points = []
        for n in sizes:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            t = _timeit(lambda: torch.mm(a, b), sync, seconds)
            points.append((n, 2.0 * n**3 / t))
        out[name] = points
    return out


def probe_memory(device: str, seconds: float) -> float:
    """Copy bandwidth, counting read + write: 2 x bytes / time."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n = (256 if device == "cpu" else 2048) * 2**20 // 4
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    a.fill_(1.0)
    t = _timeit(lambda: b.copy_(a), sync, seconds)
    return 2 * a.numel() * 4 / t


def _collective_worker(rank: int, world: int, backend: str, port: int, sizes: tuple[int, ...], out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    results: dict[str, list[tuple[int, float]]] = {"all_reduce": [], "all_gather": [], "p2p": []}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        parts = [torch.empty_like(x) for _ in range(world)]

        def timed(fn) -> float:
            for _ in range(2):
                fn()
            sync()
            dist.barrier()
            reps, t0 = 5, time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            return (time.perf_counter() - t0) / reps

        results["all_reduce"].append((size, timed(lambda: dist.all_reduce(x))))
        results["all_gather"].append((size * world, timed(lambda: dist.all_gather(parts, x))))

        def pingpong() -> None:  # rank 0 <-> rank 1, one way per call on average
            if rank == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            elif rank == 1:
                dist.recv(x, 0)
                dist.send(x, 0)

        results["p2p"].append((size, timed(pingpong) / 2))
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def probe_collectives(nprocs: int, backend: str, sizes: tuple[int, ...]) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "collectives.json")
        mp.start_processes(_collective_worker, args=(nprocs, backend, port, sizes, out), nprocs=nprocs,
                           start_method="spawn")
        return json.loads(Path(out).read_text())


def fit_half_dim(points: list[tuple[int, float]], half_dim: float | None = None) -> tuple[float, float]:
    """Fit FLOP/s(n) = P * n / (n + d) over a grid of d (P in closed form, relative error);
    returns (P, d). With ``half_dim`` given, only P is fitted."""
    best = (math.inf, 0.0, 0.0)
    grid = [half_dim] if half_dim is not None else [0.0] + [2 ** (k / 4) for k in range(0, 60)]
    for d in grid:
        # minimise sum (P w/f - 1)^2 over P: P = sum(w/f) / sum((w/f)^2)
        w = [n / (n + d) for n, _ in points]
        p = sum(wi / f for wi, (_, f) in zip(w, points)) / sum((wi / f) ** 2 for wi, (_, f) in zip(w, points))
        err = sum((p * wi / f - 1) ** 2 for wi, (_, f) in zip(w, points))
        if err < best[0]:
            best = (err, p, d)
    return best[1], best[2]


def fit_alpha_beta(points: list[tuple[int, float]], factor: float) -> tuple[float, float]:
    """Fit t = alpha + factor * bytes / bw to measured (bytes, seconds); returns (alpha seconds, bw bytes/s).

    Relative-error weighted least squares: minimise sum(((predicted - measured) / measured)^2), i.e.
    each residual weighted by 1/measured. A collective's time spans orders of magnitude across message
    sizes (here ~0.1 ms to ~15 ms); a fit on absolute times is set by the largest messages and ignores
    the small ones that carry the latency (on benchmarks/runs/cpu-2core/probed.toml it gave 779 us per
    hop against 255 us with this weighting). Non-negative: a negative alpha is refitted at alpha = 0
    (the constrained optimum then lies on that bound). Raises PlannerError when the points cannot
    determine both: fewer than two distinct sizes, a time or size that is not positive and finite, or
    times that do not grow with size (no bandwidth to fit).
    """
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    require(math.isfinite(factor) and factor > 0, "alpha-beta factor", factor, "a positive number")
    require(bool(np.all(np.isfinite(b)) and np.all(b > 0) and np.all(np.isfinite(t)) and np.all(t > 0)),
            "collective points", points, "positive, finite (bytes, seconds) pairs")
    require(len(np.unique(b)) >= 2, "collective points", points,
            "at least two distinct message sizes to fit both latency and bandwidth")
    x = factor * b
    # Rows (1/t, x/t) . (alpha, 1/bw) = 1; columns scaled to unit norm so lstsq sees a well-conditioned 2x2.
    cols = np.stack([1.0 / t, x / t], axis=1)
    norms = np.linalg.norm(cols, axis=0)
    scaled, _, rank, _ = np.linalg.lstsq(cols / norms, np.ones_like(t), rcond=None)
    require(rank == 2, "collective points", points, "message sizes far enough apart to separate latency and bandwidth")
    alpha, slope = scaled / norms
    if alpha < 0:  # constrained optimum on alpha = 0: slope = sum(x/t) / sum((x/t)^2)
        alpha, slope = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    require(slope > 0, "collective points", points,
            "times that grow with message size (these do not, so no bandwidth can be fitted)")
    return float(alpha), float(1.0 / slope)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInfo:
    """The device a probe or a run measures, and the software it measured with."""

    kind: str  # "cpu" or "cuda"
    name: str  # torch.cuda.get_device_name (what NVML reports), or the CPU's model
    memory_bytes: float  # the GPU's total memory; on a CPU, host memory / processes
    torch: str
    cuda: str | None = None  # torch.version.cuda
    driver: str | None = None  # NVML's driver version


def device_info(device: str | None = None, nprocs: int = 1) -> DeviceInfo:
    """What this machine is (torch imported here): the first GPU, or the CPU host."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        return DeviceInfo(kind="cuda", name=torch.cuda.get_device_name(0), torch=torch.__version__,
                          memory_bytes=float(torch.cuda.get_device_properties(0).total_memory),
                          cuda=torch.version.cuda, driver=driver_version())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / max(nprocs, 1)
    return DeviceInfo(kind="cpu", name=platform.processor() or platform.machine(), memory_bytes=float(memory),
                      torch=torch.__version__)


# A base profile's memory may differ from what the driver reports by this much: the datasheet's
# "80GB" H100 reports 79.6 GiB (81,559 MiB, KINDS.md), the "141GB" H200 140.4 GiB against the
# profile's 140. Another GPU of the same name differs by 17% or more (H100 80 vs 94/96 GiB).
MEMORY_MATCH = 0.05


def _norm(name: str) -> str:
    return " ".join(name.lower().replace("nvidia", " ").split())


def base_for(info: DeviceInfo) -> HardwareProfile:
    """The datasheet profile of this device: the one whose ``[gpu] model`` is the device's own name
    (NVML's, as torch reports it), else whose model names it in part, with memory within
    MEMORY_MATCH; a PlannerError naming the device when none is."""
    from planner.hardware import get_profile, profile_names

    datasheets = [hw for hw in map(get_profile, profile_names()) if not hw.calibrated]
    profiles = [hw for hw in datasheets if abs(hw.gpu.memory_bytes / info.memory_bytes - 1) <= MEMORY_MATCH]
    name = _norm(info.name)
    for match in (lambda m: m == name, lambda m: m in name or name in m):
        hits = [hw for hw in profiles if match(_norm(hw.gpu.model))]
        if hits:
            return min(hits, key=lambda hw: abs(hw.gpu.memory_bytes - info.memory_bytes))
    raise PlannerError("base", info.name, f"no profile in hardware_profiles/ is this device "
                                          f"({info.memory_bytes / GIB:.1f} GiB); name one with --base")


def check_base(base: HardwareProfile, info: DeviceInfo) -> None:
    """Refuse a base profile whose memory is not the device's (within MEMORY_MATCH): estimates with
    it would fit layouts into memory the device does not have."""
    ratio = base.gpu.memory_bytes / info.memory_bytes
    if abs(ratio - 1) > MEMORY_MATCH:
        try:
            hint = f"; this device is {base_for(info).name}"
        except PlannerError:
            hint = ""
        raise PlannerError("base", base.name, f"its {base.gpu.memory_bytes / GIB:g} GiB is not the device's "
                                              f"{info.memory_bytes / GIB:.1f} GiB ({info.name}){hint}")


def run_probe(nprocs: int, quick: bool = False, device: str | None = None,
              info: DeviceInfo | None = None) -> ProbeResult:
    import torch

    info = info or device_info(device, nprocs)
    device = info.kind
    seconds = 0.05 if quick else 0.3
    if device == "cuda":
        dtypes, sizes = ["fp32", "tf32", "bf16", "fp16"], GPU_SIZES
    else:
        dtypes, sizes = ["fp32", "bf16"], CPU_SIZES
        torch.set_num_threads(1)  # as under torchrun: one thread per process
    if quick:
        sizes = sizes[:-1]
    result = ProbeResult(device=device, device_name=info.name, nprocs=nprocs, memory_bytes=info.memory_bytes,
                         cores=len(os.sched_getaffinity(0)), torch_version=info.torch, cuda=info.cuda,
                         driver=info.driver)
    result.matmul = probe_matmul(device, dtypes, sizes, seconds)
    result.memory_bytes_per_s = probe_memory(device, seconds)
    if nprocs > 1:
        backend = "nccl" if device == "cuda" else "gloo"
        result.collectives = probe_collectives(nprocs, backend, COLLECTIVE_BYTES[:-1] if quick else COLLECTIVE_BYTES)
    return result


def _links(r: ProbeResult) -> tuple[float, float, str, tuple[float, float] | None]:
    """All-reduce bus bandwidth and latency per hop (0 and 10 us where not fitted), how, and the
    point-to-point (latency, bandwidth) where probed."""
    n = max(r.nprocs, 2)
    link, lat, note = 0.0, 10e-6, "fitted alpha-beta, relative-error weighted"
    if r.collectives:
        try:  # ring all-reduce: 2(n-1) steps, bus bytes 2(n-1)/n x size (nccl-tests' busbw)
            lat_total, bw = fit_alpha_beta(r.collectives["all_reduce"], 2 * (n - 1) / n)
            link, lat = bw, lat_total / (2 * (n - 1))
        except PlannerError as e:
            note = "not fitted: copy bandwidth / 4 and 10 us"
            print(f"warning: all-reduce latency/bandwidth not fitted ({e}); the profile keeps "
                  f"copy bandwidth / 4 and 10 us", file=sys.stderr)
    else:
        note = "no collectives probed: copy bandwidth / 4 and 10 us"
    p2p = None
    if r.collectives.get("p2p"):
        try:  # one send of the message: t = alpha + bytes / bw (half a ping-pong)
            p2p = fit_alpha_beta(r.collectives["p2p"], 1.0)
        except PlannerError as e:
            print(f"warning: point-to-point latency/bandwidth not fitted ({e}); sends cost the "
                  f"all-reduce's figures", file=sys.stderr)
    return link, lat, note, p2p


def profile_toml(r: ProbeResult, name: str, base: HardwareProfile | None = None) -> str:
    """A hardware profile from probe results. With a base (datasheet) profile, the datasheet peaks
    and memory stay and the measurements become efficiency factors; without one (a CPU), the fitted
    peaks are the peaks and the factors are 1. Written by a TOML writer (planner.toml_text): any
    name or device string stays one string."""
    import planner.toml_text as toml_text

    main_dtype = "bf16" if r.device == "cuda" else "fp32"
    peak, half = fit_half_dim(r.matmul.get(main_dtype) or next(iter(r.matmul.values())))
    # One half-size per profile: the other dtypes' peaks are fitted with the main dtype's.
    fits = {dt: fit_half_dim(points, half) for dt, points in r.matmul.items()}
    notes = [f"Probed by `planner probe` on {socket.gethostname()} ({r.device_name}), "
             f"{datetime.date.today().isoformat()}, torch {r.torch_version}, CUDA {r.cuda or '-'}, "
             f"driver {r.driver or '-'}."]
    gpu: dict = {"model": r.device_name}
    if base is not None:
        g = base.gpu
        gpu |= {"memory_gib": g.memory_bytes / GIB, "hbm_gb_per_s": g.hbm_bytes_per_s / 1e9, "tdp_w": g.tdp_watts}
        gpu |= {f"{p}_tflops": v / 1e12 for p, v in g.peak_flops.items() if v}
        eff = base.efficiency.replace(matmul=min(1.0, peak / g.peak_flops[main_dtype]), matmul_half_dim=half,
                                      memory=min(1.0, r.memory_bytes_per_s / g.hbm_bytes_per_s))
        notes.append(f"Peaks, memory and power: the datasheet profile {base.name}; efficiencies: measured.")
    else:
        gpu |= {"memory_gib": round(r.memory_bytes / GIB, 1), "tdp_w": 15 * r.cores,
                "hbm_gb_per_s": float(f"{r.memory_bytes_per_s / 1e9:.4g}")}
        gpu |= {f"{dt}_tflops": float(f"{fits[dt][0] / 1e12:.6g}") for dt in ("fp32", "tf32", "fp16", "bf16")
                if dt in fits}
        notes.append("memory_gib: host memory / processes; hbm_gb_per_s: measured copy bandwidth; tdp_w: an "
                     "assumption, 15 W per core; *_tflops: fitted from the matmul curve.")
        eff = None
    link, lat, note, p2p = _links(r)
    intra = link or r.memory_bytes_per_s / 4
    # A CPU host runs any number of processes ("devices"); they share its cores (compute_slots).
    per_node = HOST_PROCESSES if r.device == "cpu" else r.nprocs
    latency_us = float(f"{lat * 1e6:.4g}")
    node: dict = {"gpus_per_node": per_node, "intra_node_gb_per_s": float(f"{intra / 1e9:.4g}"),
                  "inter_node_gbit_per_s": float(f"{intra * 8 / 1e9 * per_node:.4g}"),
                  "intra_node_latency_us": latency_us, "inter_node_latency_us": latency_us}
    notes.append(f"intra_node_gb_per_s: all-reduce bus bandwidth ({note}); inter-node: loopback, the same.")
    if p2p is not None:
        node |= {"p2p_gb_per_s": float(f"{p2p[1] / 1e9:.4g}"), "p2p_latency_us": float(f"{p2p[0] * 1e6:.4g}")}
        notes.append("p2p_*: one send (half a ping-pong; fitted alpha-beta).")
    if r.device == "cpu":
        node["compute_slots"] = r.cores  # cores, shared by the processes of a run
    table = efficiency_to_table(eff) if eff is not None else {"matmul": 1.0, "matmul_half_dim": half, "memory": 1.0,
                                                               "intra_node_bw": 1.0, "inter_node_bw": 1.0}
    data = {"name": name, "description": f"probed: {r.device_name} ({r.device}, {r.nprocs} processes)",
            "gpu": gpu, "node": node, "efficiency": {k: float(f"{v:.6g}") for k, v in table.items()},
            "provenance": {"kind": "probe", "date": datetime.datetime.now().isoformat(timespec="seconds"),
                           "device": r.device_name, "torch": r.torch_version, "cuda": r.cuda, "driver": r.driver,
                           "base": base.name if base is not None else None, "matmul_json": json.dumps(r.matmul),
                           "memory_bytes_per_s": float(f"{r.memory_bytes_per_s:.6g}"),
                           "collectives_json": json.dumps(r.collectives)}}
    return toml_text.dumps(data, head="\n".join(notes))
