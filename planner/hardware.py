"""What the job runs on: a GPU, its node and network, and the efficiency factors of the model.

Profiles are TOML files in ``hardware_profiles/`` (calibrated ones in ``hardware_profiles/calibrated/``).
Keys carry their units (``memory_gib``, ``hbm_gb_per_s``, ``inter_node_gbit_per_s``); they are
converted to SI base units (bytes, FLOP/s, bytes/s, seconds) once, here, at load.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerError, closest_names, require
from planner.units import GB, GIB, TERA

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True, kw_only=True, slots=True)
class GPU:
    model: str
    memory_bytes: float
    hbm_bytes_per_s: float
    tdp_watts: float
    peak_flops: dict[str, float]  # dense FLOP/s per matmul precision: fp32, tf32, fp16, bf16, fp8

    def supports(self, precision: str) -> bool:
        return self.peak_flops.get(precision, 0.0) > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    gpus_per_node: int
    intra_bytes_per_s: float  # per GPU, per direction, inside a node (NVLink/NVSwitch or PCIe)
    inter_bytes_per_s: float  # per GPU, per direction, between nodes (the node's NICs / gpus_per_node)
    intra_latency_s: float  # per collective step (NCCL-level alpha)
    inter_latency_s: float
    description: str = ""
    # Devices of a node that can compute at the same time. GPUs: all of them (None). A CPU host
    # shares its cores among its processes (a probed CPU profile sets this to the core count).
    compute_slots: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """Named efficiency factors: calibration replaces these, never the formulas.

    ``matmul``, ``memory`` and ``intra_node_bw`` are the A100 fit to Megatron-LM 2021 Table 1
    (benchmarks/fit_megatron.py: 1.9% mean error in sample, 2.6% leave-one-out); the others are
    public figures or assumptions, named where they are set. Each profile may override them, and
    ``planner calibrate`` writes fitted ones.
    """

    matmul: float = 0.7025  # fraction of dense peak a large GEMM reaches (compute-bound roof)
    matmul_half_dim: float = 64.0  # GEMM dimension at which efficiency is half of ``matmul``
    memory: float = 0.8351  # fraction of HBM bandwidth reached by element-wise kernels
    # FlashAttention-2 reaches 50-73% of A100 peak forward and backward (Dao 2023, Sec. 4.1).
    flash_attention: float = 0.60
    intra_node_bw: float = 0.8732  # achieved NCCL bus bandwidth / link bandwidth, inside a node
    inter_node_bw: float = 0.85  # the same between nodes
    dp_overlap: float = 1.0  # fraction of the last backward pass that can hide DP communication
    zero3_overlap: float = 0.8  # fraction of compute that can hide ZeRO-3 parameter gathers
    tp_overlap: float = 0.0  # fraction of TP communication hidden behind GEMMs (0: Megatron 2021)
    layer_overhead_s: float = 0.0  # fixed per layer per micro-batch per pass (launch, framework)
    # Fixed cost of one tensor-parallel collective on the critical path (kernel launch, framework
    # dispatch: DTensor redistribution in eager PyTorch); TP issues 4-6 per layer per micro-batch.
    tp_collective_overhead_s: float = 0.0
    # Parallel efficiency of the extra threads when a process has a CPU host's cores to itself
    # (1: two threads run twice as fast as one). Only profiles with compute_slots use it.
    thread_scaling: float = 1.0
    step_overhead_s: float = 0.0  # fixed per optimizer step (data, logging, synchronisation)
    power_fraction: float = 1.0  # average GPU power / TDP while training (1.0: Llama 2 convention)
    cuda_context_bytes: float = 0.75 * GIB  # CUDA context, cuBLAS/cuDNN workspaces, kernels
    comm_buffer_bytes: float = 0.5 * GIB  # NCCL/gloo buffers when any group has > 1 rank
    fragmentation: float = 0.05  # allocator fragmentation, fraction of activations + gradients

    def replace(self, **changes: float) -> "Efficiency":
        return dataclasses.replace(self, **changes)


EFFICIENCY_UNITS = {"cuda_context_bytes": ("cuda_context_gib", GIB), "comm_buffer_bytes": ("comm_buffer_gib", GIB)}


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareProfile:
    name: str
    description: str
    gpu: GPU
    network: Network
    efficiency: Efficiency = field(default_factory=Efficiency)
    price_usd_per_gpu_hour: float = 2.0
    source: str = ""
    path: str = ""
    calibrated: bool = False

    def with_gpus_per_node(self, gpus_per_node: int) -> "HardwareProfile":
        require(gpus_per_node >= 1, "gpus_per_node", gpus_per_node, "a positive integer")
        # The node's NIC bandwidth is shared by its GPUs: keep the per-node total fixed.
        per_node = self.network.inter_bytes_per_s * self.network.gpus_per_node
        network = dataclasses.replace(self.network, gpus_per_node=gpus_per_node,
                                      inter_bytes_per_s=per_node / gpus_per_node)
        return dataclasses.replace(self, network=network)

    def with_efficiency(self, efficiency: Efficiency) -> "HardwareProfile":
        return dataclasses.replace(self, efficiency=efficiency)


def _profile_dirs() -> list[Path]:
    root = Path(__file__).resolve().parent.parent / "hardware_profiles"
    if not root.is_dir():  # installed without the source tree: the package copy
        import hardware_profiles

        root = Path(hardware_profiles.__file__).resolve().parent
    return [root, root / "calibrated"]


def _get(table: dict, key: str, where: str) -> float:
    if key not in table:
        raise PlannerError(where, "missing", f"profile needs key '{key}'")
    return table[key]


def load_profile_file(path: str | Path) -> HardwareProfile:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PlannerError("gpu", str(path), f"not a readable TOML hardware profile ({exc})") from None
    g, n = data.get("gpu", {}), data.get("node", {})
    peaks = {p: float(g.get(f"{p}_tflops", 0.0)) * TERA for p in PRECISIONS}
    gpu = GPU(model=g.get("model", data.get("name", path.stem)),
              memory_bytes=float(_get(g, "memory_gib", str(path))) * GIB,
              hbm_bytes_per_s=float(_get(g, "hbm_gb_per_s", str(path))) * GB,
              tdp_watts=float(_get(g, "tdp_w", str(path))), peak_flops=peaks)
    gpn = int(_get(n, "gpus_per_node", str(path)))
    network = Network(gpus_per_node=gpn,
                      intra_bytes_per_s=float(_get(n, "intra_node_gb_per_s", str(path))) * GB,
                      inter_bytes_per_s=float(_get(n, "inter_node_gbit_per_s", str(path))) * 1e9 / 8 / gpn,
                      intra_latency_s=float(n.get("intra_node_latency_us", 5.0)) * 1e-6,
                      inter_latency_s=float(n.get("inter_node_latency_us", 10.0)) * 1e-6,
                      description=n.get("description", ""),
                      compute_slots=int(n["compute_slots"]) if "compute_slots" in n else None)
    return HardwareProfile(name=data.get("name", path.stem), description=data.get("description", ""),
                           gpu=gpu, network=network, efficiency=efficiency_from_table(data.get("efficiency", {})),
                           price_usd_per_gpu_hour=float(data.get("price_usd_per_gpu_hour", 2.0)),
                           source=g.get("source", ""), path=str(path), calibrated="provenance" in data)


def efficiency_from_table(table: dict) -> Efficiency:
    values: dict[str, float] = {}
    names = {f.name for f in dataclasses.fields(Efficiency)}
    file_keys = {EFFICIENCY_UNITS.get(k, (k, 1.0))[0]: k for k in names}
    for key, value in table.items():
        if key in ("source", "note"):
            continue
        if key not in file_keys:
            raise PlannerError("efficiency", key, f"unknown factor; allowed: {', '.join(sorted(file_keys))}")
        attr = file_keys[key]
        values[attr] = float(value) * EFFICIENCY_UNITS.get(attr, (key, 1.0))[1]
    return Efficiency(**values)


def efficiency_to_table(eff: Efficiency) -> dict[str, float]:
    out = {}
    for f in dataclasses.fields(Efficiency):
        key, scale = EFFICIENCY_UNITS.get(f.name, (f.name, 1.0))
        out[key] = getattr(eff, f.name) / scale
    return out


@functools.cache
def _index() -> dict[str, str]:
    """name and alias -> file path, for every profile file."""
    index: dict[str, str] = {}
    for folder in _profile_dirs():
        for path in sorted(folder.glob("*.toml")):
            data = tomllib.loads(path.read_text())
            for key in [data.get("name", path.stem), *data.get("aliases", [])]:
                index.setdefault(key.lower(), str(path))
    return index


def profile_names() -> list[str]:
    """Canonical names, built-in first then calibrated."""
    seen: list[str] = []
    for path in dict.fromkeys(_index().values()):
        seen.append(tomllib.loads(Path(path).read_text()).get("name", Path(path).stem))
    return seen


def gpu_profile_names() -> list[str]:
    """Profile names without CPU hosts (profiles with compute_slots): what hardware comparisons list."""
    return [n for n in profile_names() if get_profile(n).network.compute_slots is None]


@functools.cache
def get_profile(name: str) -> HardwareProfile:
    """A profile by name or alias, or by the path of a TOML file."""
    if name.endswith(".toml") or "/" in name:
        if not Path(name).is_file():
            raise PlannerError("gpu", name, "no such profile file")
        return load_profile_file(name)
    key = name.strip().lower()
    index = _index()
    if key not in index:
        hint = closest_names(key, list(index))
        raise PlannerError("gpu", name, f"unknown GPU profile; {hint + ' ' if hint else ''}"
                                        "`planner profiles` lists them")
    return load_profile_file(index[key])
