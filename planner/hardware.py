"""What the job runs on: a GPU, its node and network, and the efficiency factors of the model.

Profiles are TOML files in ``hardware_profiles/`` (calibrated ones in ``hardware_profiles/calibrated/``).
Keys carry their units (``memory_gib``, ``hbm_gb_per_s``, ``inter_node_gbit_per_s``); they are
converted to SI base units (bytes, FLOP/s, bytes/s, seconds) once, here, at load.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerError, closest_names, require
from planner.memo import fast_init, replace
from planner.schema import Key, check_table
from planner.units import GB, GIB, TERA

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class GPU:
    model: str
    memory_bytes: float
    hbm_bytes_per_s: float
    tdp_watts: float
    peak_flops: dict[str, float]  # dense FLOP/s per matmul precision: fp32, tf32, fp16, bf16, fp8

    def supports(self, precision: str) -> bool:
        return self.peak_flops.get(precision, 0.0) > 0


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    gpus_per_node: int
    intra_bytes_per_s: float  # per GPU, per direction, inside a node (NVLink/NVSwitch or PCIe)
    inter_bytes_per_s: float  # per GPU, per direction, between nodes (the node's NICs / gpus_per_node)
    intra_latency_s: float  # per collective step (NCCL-level alpha)
    inter_latency_s: float
    description: str = ""
    # GPUs under one operating system (a Slurm or Kubernetes node: what the launchers count; the
    # host whose memory offload uses). None: the node's. A rack-scale NVLink domain (GB200 NVL72:
    # 72 GPUs) is a "node" to the cost model and 18 hosts of 4 GPUs to the scheduler.
    gpus_per_host: int | None = None
    # Devices of a node that can compute at the same time. GPUs: all of them (None). A CPU host
    # shares its cores among its processes (a probed CPU profile sets this to the core count).
    compute_slots: int | None = None
    # The host, for offload (ZeRO-Offload, FSDP CPU offload): each GPU's PCIe link to it (per
    # direction), the host's memory and the bandwidth the CPU optimizer step reaches in it.
    # Defaults (assumptions, stated in the profile listing): PCIe Gen4 x16 at 80% of its 32 GB/s;
    # 512 GiB and 100 GB/s for the host.
    pcie_bytes_per_s: float = 25e9
    host_memory_bytes: float = 512 * GIB
    host_memory_bytes_per_s: float = 100e9
    # Point-to-point (a pipeline stage's send to the next), achieved, inside a node. None: the
    # collectives' link figures (on GPUs NCCL's send/recv runs over the same NVLink at the same
    # latency). A probed CPU host sets both: gloo's send costs ~80 us where its all-reduce costs ~1 ms.
    p2p_bytes_per_s: float | None = None
    p2p_latency_s: float | None = None

    @property
    def host_gpus(self) -> int:
        """GPUs per host (operating-system node): ``gpus_per_host``, or the node's."""
        return self.gpus_per_host or self.gpus_per_node


@fast_init
@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """Named efficiency factors: calibration replaces these, never the formulas.

    ``matmul``, ``memory`` and ``intra_node_bw`` are the A100 fit to Megatron-LM 2021 Table 1
    (benchmarks/fit_megatron.py: 1.9% mean error in sample, 2.6% leave-one-out); the others are
    public figures or assumptions, named where they are set. Each profile may override them, and
    ``planner calibrate`` writes fitted ones.
    """

    matmul: float = 0.7178  # fraction of dense peak a large GEMM reaches (compute-bound roof)
    matmul_half_dim: float = 64.0  # GEMM dimension at which efficiency is half of ``matmul``
    memory: float = 0.8292  # fraction of HBM bandwidth reached by element-wise kernels
    # FlashAttention-2 reaches 50-73% of A100 peak forward and backward (Dao 2023, Sec. 4.1).
    flash_attention: float = 0.60
    # The GPU generation's own fused attention (FlashAttention-3 / cuDNN on Hopper: 60-75% of peak
    # forward, Shah et al. 2024, FlashAttention-3, Fig. 5); on older GPUs it is FlashAttention-2.
    fused_attention: float = 0.60
    # Fraction of the fp8 dense peak a large fp8 GEMM reaches (Hopper: ~65-70%, cuBLASLt).
    fp8_matmul: float = 0.65
    intra_node_bw: float = 0.9000  # achieved NCCL bus bandwidth / link bandwidth, inside a node
    # The same for tensor-parallel collectives alone, where runs measured them apart from the data-
    # parallel reduction (`planner calibrate`): small blocking all-reduces on the critical path
    # reach less of the link than large bucketed ones. None: intra_node_bw.
    tp_intra_node_bw: float | None = None
    inter_node_bw: float = 0.85  # the same between nodes
    dp_overlap: float = 1.0  # fraction of the last backward pass that can hide DP communication
    zero3_overlap: float = 0.8  # fraction of compute that can hide ZeRO-3 parameter gathers
    tp_overlap: float = 0.0  # fraction of TP communication hidden behind GEMMs (0: Megatron 2021)
    layer_overhead_s: float = 0.0  # fixed per layer per micro-batch per pass (launch, framework)
    # Fixed cost of one tensor-parallel collective on the critical path (kernel launch, framework
    # dispatch: DTensor redistribution in eager PyTorch); TP issues 4-6 per layer per micro-batch.
    tp_collective_overhead_s: float = 0.0
    # Host work per parameter tensor per optimizer step (an eager optimizer's per-tensor ops: the
    # gradient norm, clipping, AdamW's single-tensor loop, zero_grad); 0 for fused optimizers.
    optimizer_tensor_overhead_s: float = 0.0
    # Parallel efficiency of the extra threads when a process has a CPU host's cores to itself
    # (1: two threads run twice as fast as one). Only profiles with compute_slots use it.
    thread_scaling: float = 1.0
    step_overhead_s: float = 0.0  # fixed per optimizer step (data, logging, synchronisation)
    # Stragglers: each GPU's step time varies from step to step (coefficient of variation
    # ``step_jitter``); a synchronous step waits for the slowest of N, on average sqrt(2 ln N)
    # standard deviations above the mean (the expected maximum of N normal variables, Gumbel 1958).
    # 0.005 is an assumption (0.5% jitter): +1.3% at 32 GPUs, +2.2% at 16,384.
    step_jitter: float = 0.005
    power_fraction: float = 1.0  # average GPU power / TDP while training (1.0: Llama 2 convention)
    cuda_context_bytes: float = 0.75 * GIB  # CUDA context, cuBLAS/cuDNN workspaces, kernels
    comm_buffer_bytes: float = 0.5 * GIB  # NCCL/gloo buffers when any group has > 1 rank
    fragmentation: float = 0.05  # allocator fragmentation, fraction of activations + gradients

    def replace(self, **changes: float) -> Efficiency:
        return replace(self, **changes)


EFFICIENCY_UNITS = {"cuda_context_bytes": ("cuda_context_gib", GIB), "comm_buffer_bytes": ("comm_buffer_gib", GIB)}
EFFICIENCY_UNITS_BY_FILE_KEY = {key: attr for attr, (key, _) in EFFICIENCY_UNITS.items()}


@fast_init
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
    # A calibrated profile's own check (its [provenance]): how many runs or published rows it was
    # fitted to, and its mean |error| on them in sample and leave-one-out (None where not recorded).
    calibration: tuple[int, float | None, float | None] | None = None
    # The efficiency factors the file itself sets: those a software stack may not replace
    # (planner/stacks.py `effective`).
    efficiency_keys: frozenset[str] = frozenset()

    def with_gpus_per_node(self, gpus_per_node: int) -> HardwareProfile:
        require(gpus_per_node >= 1, "gpus_per_node", gpus_per_node, "a positive integer")
        # The node's NIC bandwidth is shared by its GPUs: keep the per-node total fixed.
        per_node = self.network.inter_bytes_per_s * self.network.gpus_per_node
        # A host of a rack-scale domain stays a host where it divides the new node; else the node is one.
        host = self.network.gpus_per_host
        host = host if host and gpus_per_node % host == 0 else None
        network = replace(self.network, gpus_per_node=gpus_per_node, gpus_per_host=host,
                          inter_bytes_per_s=per_node / gpus_per_node)
        return replace(self, network=network)

    def with_efficiency(self, efficiency: Efficiency) -> HardwareProfile:
        """The profile with these factors (``with_factors`` of every one)."""
        return self.with_factors({f.name: getattr(efficiency, f.name) for f in dataclasses.fields(Efficiency)})

    def with_factors(self, changes: dict[str, float]) -> HardwareProfile:
        """The profile with these factors (name -> value); those that changed count as set by the
        profile (a software stack no longer replaces them: planner.stacks.effective). Nothing
        changed: the profile itself."""
        old = self.efficiency
        changed = {k: v for k, v in changes.items() if v != getattr(old, k)}
        if not changed:
            return self
        return replace(self, efficiency=replace(old, **changed),
                       efficiency_keys=self.efficiency_keys | frozenset(changed))


def profile_dirs() -> list[Path]:
    """The project's profile folders: built-in, then calibrated."""
    root = Path(__file__).resolve().parent.parent / "hardware_profiles"
    if not root.is_dir():  # installed without the source tree: the package copy
        import hardware_profiles

        root = Path(hardware_profiles.__file__).resolve().parent
    return [root, root / "calibrated"]


# --- the profile file schema (planner/schema.py): units in the key names, converted at load -----

_FRACTION = {"lo": 1e-3, "hi": 1.0}  # a share of a peak: [0.001, 1] (below, nothing would run)
_SHARE = {"lo": 0.0, "hi": 1.0}  # a share that may be zero: [0, 1]
TOP_KEYS = {
    "name": Key(str, default=None), "aliases": Key(list, default=[]), "description": Key(str, default=""),
    "price_usd_per_gpu_hour": Key(float, 0, 1e4, unit="USD", default=2.0),
    "gpu": Key(dict), "node": Key(dict), "efficiency": Key(dict, default={}),
    "provenance": Key(dict, default=None),  # calibrated profiles: how they were fitted (free-form)
}
GPU_KEYS = {
    "model": Key(str, default=None), "source": Key(str, default=""),
    "memory_gib": Key(float, 1e-3, 1e5, unit="GiB", scale=GIB),
    "hbm_gb_per_s": Key(float, 1e-2, 1e6, unit="GB/s", scale=GB),
    "tdp_w": Key(float, 0.1, 1e5, unit="W"),
    # 0: the precision is not supported; else at least 0.1 GFLOP/s (a slow CPU core)
    **{f"{p}_tflops": Key(float, 1e-4, 1e6, unit="TFLOP/s dense", scale=TERA, default=0.0, zero_ok=True)
       for p in PRECISIONS},
}
NODE_KEYS = {
    "gpus_per_node": Key(int, 1, 1024),
    "intra_node_gb_per_s": Key(float, 1e-3, 1e6, unit="GB/s per GPU per direction", scale=GB),
    "inter_node_gbit_per_s": Key(float, 1e-3, 1e8, unit="Gbit/s per node", scale=1e9 / 8),
    "intra_node_latency_us": Key(float, 0, 1e6, unit="us", scale=1e-6, default=5e-6),
    "inter_node_latency_us": Key(float, 0, 1e6, unit="us", scale=1e-6, default=10e-6),
    "description": Key(str, default=""), "compute_slots": Key(int, 1, 4096, default=None),
    "gpus_per_host": Key(int, 1, 1024, default=None, help="GPUs per operating-system node, when the NVLink "
                                                          "domain (gpus_per_node) spans several"),
    "pcie_gb_per_s": Key(float, 0.1, 1e4, unit="GB/s per GPU per direction, achieved", scale=GB, default=25e9),
    "host_memory_gib": Key(float, 1, 1e6, unit="GiB per host", scale=GIB, default=512 * GIB),
    "host_memory_gb_per_s": Key(float, 1, 1e5, unit="GB/s per host", scale=GB, default=100e9),
    "p2p_gb_per_s": Key(float, 1e-3, 1e6, unit="GB/s per GPU per direction, achieved", scale=GB, default=None),
    "p2p_latency_us": Key(float, 0, 1e6, unit="us", scale=1e-6, default=None),
}
# Physical ranges of the efficiency factors (the fit's bounds, planner/calibration/calibrate.py,
# lie inside them). Defaults are the Efficiency dataclass's, filled in by efficiency_from_table.
EFFICIENCY_KEYS = {
    "matmul": Key(float, **_FRACTION), "memory": Key(float, **_FRACTION),
    "flash_attention": Key(float, **_FRACTION), "intra_node_bw": Key(float, **_FRACTION),
    "tp_intra_node_bw": Key(float, **_FRACTION),
    "fused_attention": Key(float, **_FRACTION), "fp8_matmul": Key(float, **_FRACTION),
    "inter_node_bw": Key(float, **_FRACTION), "power_fraction": Key(float, 0.0, 2.0, lo_open=True),
    "matmul_half_dim": Key(float, 0, 1e6), "dp_overlap": Key(float, **_SHARE),
    "zero3_overlap": Key(float, **_SHARE), "tp_overlap": Key(float, **_SHARE),
    "thread_scaling": Key(float, **_SHARE), "fragmentation": Key(float, 0.0, 10.0),
    "layer_overhead_s": Key(float, 0, 10, unit="s"), "tp_collective_overhead_s": Key(float, 0, 10, unit="s"),
    "optimizer_tensor_overhead_s": Key(float, 0, 10, unit="s"),
    "step_overhead_s": Key(float, 0, 3600, unit="s"), "step_jitter": Key(float, 0.0, 1.0),
    "cuda_context_gib": Key(float, 0, 1e3, unit="GiB", scale=GIB),
    "comm_buffer_gib": Key(float, 0, 1e3, unit="GiB", scale=GIB),
    "source": Key(str, default=""), "note": Key(str, default=""),
}
EFFICIENCY_KEYS = {k: dataclasses.replace(v, default=None) if v.kind is float else v
                   for k, v in EFFICIENCY_KEYS.items()}


def read_toml(path: str | Path, what: str) -> dict:
    """A TOML file as a dict; an unreadable, non-UTF-8 or malformed file is one PlannerError line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PlannerError(what, str(path), f"cannot read ({exc.strerror or exc})") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PlannerError(what, str(path), f"not a UTF-8 text file (byte {exc.start}); a TOML {what} file") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlannerError(what, str(path), f"not valid TOML ({exc})") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise PlannerError(what, str(path), "nested too deeply for a TOML file of settings") from None


def load_profile_file(path: str | Path) -> HardwareProfile:
    """A hardware profile file, every key checked against the schema above (one-line errors naming
    the file, the key, the value and the allowed range) and converted to SI base units."""
    path = Path(path)
    data = read_toml(path, "hardware profile")
    top = check_table(data, TOP_KEYS, str(path))
    g = check_table(top["gpu"], GPU_KEYS, f"{path} [gpu]")
    n = check_table(top["node"], NODE_KEYS, f"{path} [node]")
    name = top["name"] or path.stem
    require(any(g[f"{p}_tflops"] > 0 for p in PRECISIONS), f"{path} [gpu] {'/'.join(PRECISIONS)}_tflops", 0,
            "at least one precision's peak must be positive (0 marks a precision unsupported)")
    gpu = GPU(model=g["model"] or name, memory_bytes=g["memory_gib"], hbm_bytes_per_s=g["hbm_gb_per_s"],
              tdp_watts=g["tdp_w"], peak_flops={p: g[f"{p}_tflops"] for p in PRECISIONS})
    gpn = n["gpus_per_node"]
    if n["gpus_per_host"] is not None:
        require(gpn % n["gpus_per_host"] == 0, f"{path} [node] gpus_per_host", n["gpus_per_host"],
                f"must divide gpus_per_node={gpn} (an NVLink domain is whole hosts)")
    network = Network(gpus_per_node=gpn, intra_bytes_per_s=n["intra_node_gb_per_s"],
                      inter_bytes_per_s=n["inter_node_gbit_per_s"] / gpn,
                      intra_latency_s=n["intra_node_latency_us"], inter_latency_s=n["inter_node_latency_us"],
                      description=n["description"], compute_slots=n["compute_slots"], gpus_per_host=n["gpus_per_host"],
                      pcie_bytes_per_s=n["pcie_gb_per_s"], host_memory_bytes=n["host_memory_gib"],
                      host_memory_bytes_per_s=n["host_memory_gb_per_s"],
                      p2p_bytes_per_s=n["p2p_gb_per_s"], p2p_latency_s=n["p2p_latency_us"])
    return HardwareProfile(name=name, description=top["description"], gpu=gpu, network=network,
                           efficiency=efficiency_from_table(top["efficiency"], f"{path} [efficiency]"),
                           price_usd_per_gpu_hour=top["price_usd_per_gpu_hour"], source=g["source"],
                           path=str(path), calibrated=top["provenance"] is not None,
                           calibration=_calibration(top["provenance"]),
                           efficiency_keys=frozenset(EFFICIENCY_UNITS_BY_FILE_KEY.get(k, k) for k in top["efficiency"]))


def _calibration(provenance: dict | None) -> tuple[int, float | None, float | None] | None:
    """(runs fitted to, mean |error| in sample, leave-one-out) from a [provenance] table as
    `planner calibrate` writes it; None when it names no runs. The table is free-form: a value that
    is not a finite number is left out, not refused."""
    if not provenance:
        return None
    fitted = provenance.get("runs", provenance.get("rows"))
    if not isinstance(fitted, list) or not fitted:
        return None

    def number(key: str) -> float | None:
        x = provenance.get(key)
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
        return float(x) if ok else None

    return len(fitted), number("fit_mean_abs_error"), number("loo_mean_abs_error")


def efficiency_from_table(table: dict, where: str = "[efficiency]") -> Efficiency:
    """The factors a table sets (file keys, file units), checked and converted; the rest default."""
    values = check_table(table, EFFICIENCY_KEYS, where)
    file_keys = {EFFICIENCY_UNITS.get(f.name, (f.name, 1.0))[0]: f.name for f in dataclasses.fields(Efficiency)}
    return Efficiency(**{file_keys[k]: v for k, v in values.items() if k in file_keys and v is not None})


def efficiency_to_table(eff: Efficiency) -> dict[str, float]:
    """The factors as file keys in file units; a factor that follows another (None) is left out."""
    out = {}
    for f in dataclasses.fields(Efficiency):
        key, scale = EFFICIENCY_UNITS.get(f.name, (f.name, 1.0))
        if getattr(eff, f.name) is not None:
            out[key] = getattr(eff, f.name) / scale
    return out


@functools.cache
def _index() -> dict[str, str]:
    """name and alias -> file path, for every profile file."""
    index: dict[str, str] = {}
    for folder in profile_dirs():
        for path in sorted(folder.glob("*.toml")):
            top = check_table(read_toml(path, "hardware profile"), TOP_KEYS, str(path))
            for key in [top["name"] or path.stem, *top["aliases"]]:
                index.setdefault(key.lower(), str(path))
    return index


def profile_names() -> list[str]:
    """Canonical names, built-in first then calibrated."""
    seen: list[str] = []
    for path in dict.fromkeys(_index().values()):
        seen.append(read_toml(path, "hardware profile").get("name", Path(path).stem))
    return seen


def gpu_profile_names() -> list[str]:
    """Profile names without CPU hosts (profiles with compute_slots): what hardware comparisons list."""
    return [n for n in profile_names() if get_profile(n).network.compute_slots is None]


@functools.cache
def get_profile(name: str) -> HardwareProfile:
    """A profile by name or alias, or by the path of a TOML file."""
    if not name.strip():
        raise PlannerError("gpu", name, "expected a profile name or a .toml file (`planner profiles` lists them)")
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


def profile_limits_markdown() -> str:
    """docs/cli.md's table of profile keys and their ranges (a test keeps the two equal)."""
    from planner.schema import limits_markdown

    spec = {**TOP_KEYS, **{f"[gpu] {k}": v for k, v in GPU_KEYS.items()},
            **{f"[node] {k}": v for k, v in NODE_KEYS.items()},
            **{f"[efficiency] {k}": v for k, v in EFFICIENCY_KEYS.items()}}
    return limits_markdown(spec)


def driver_version() -> str | None:
    """The NVIDIA driver's version through NVML (pynvml), or None where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, NVMLError (no driver, no library)
        return None
    return version.decode() if isinstance(version, bytes) else str(version)
