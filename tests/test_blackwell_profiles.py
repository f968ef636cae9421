"""Blackwell (B200, GB200) and Blackwell Ultra (B300, GB300) efficiency factors against the public
measurements each profile cites, recomputed here from the measured figures."""

from pathlib import Path

import pytest

from planner.core.layout import Job, Layout
from planner.core.presets import get_preset
from planner.hardware import get_profile
from tests.helpers import evaluate_one

PROFILES = Path(__file__).resolve().parent.parent / "hardware_profiles"
# Measured maximum achievable matmul TFLOP/s over the datasheet's dense peak (stas00/ml-engineering
# 744d01e18, compute/accelerator/README.md): (bf16 MAMF, bf16 peak, fp8 MAMF, fp8 peak).
MAMF = {"h100": (794.5, 989, 1402.6, 1979), "b200": (1745.0, 2250, 3432.5, 4500),
        "gb200": (1822.0, 2500, 3615.6, 5000), "b300": (1769.0, 2250, 3353.3, 4500)}
# FlashAttention-4 (arXiv 2603.05451): 1613 TFLOP/s on B200 bf16, 1.3x cuDNN 9.13, 2.7x Triton.
FA4, CUDNN_RATIO, TRITON_RATIO = 1613.0, 1.3, 2.7
ULTRA_ATTENTION = 1.35  # NVIDIA's Blackwell Ultra softmax blog: ~35% faster attention forward than GB200


def fraction(gpu: str, fp8: bool = False) -> float:
    bf16, bf16_peak, f8, f8_peak = MAMF[gpu]
    return f8 / f8_peak if fp8 else bf16 / bf16_peak


def expected() -> dict[str, tuple[float, float, float, float]]:
    """(matmul, fp8_matmul, fused_attention, flash_attention) by the rules the profiles state: the
    H100's in-training fractions (0.72, 0.65) times the MAMF fraction over the H100's."""
    def scaled(gpu):
        return 0.72 * fraction(gpu) / fraction("h100"), 0.65 * fraction(gpu, True) / fraction("h100", True)

    b200_fused, b200_flash = FA4 / CUDNN_RATIO / 2250, FA4 / TRITON_RATIO / 2250
    gb200 = fraction("gb200") / fraction("b200")
    ultra_bf16, ultra_fp8 = fraction("b300") / fraction("b200"), fraction("b300", True) / fraction("b200", True)
    (b2m, b2f), (g2m, g2f), (b3m, b3f) = scaled("b200"), scaled("gb200"), scaled("b300")
    return {"b200": (b2m, b2f, b200_fused, b200_flash),
            "gb200-nvl72": (g2m, g2f, b200_fused * gb200, b200_flash * gb200),
            "b300": (b3m, b3f, b200_fused * ULTRA_ATTENTION, b200_flash),
            "gb300-nvl72": (g2m * ultra_bf16, g2f * ultra_fp8, b200_fused * gb200 * ULTRA_ATTENTION, b200_flash * gb200)}


@pytest.mark.parametrize("name", ["b200", "gb200-nvl72", "b300", "gb300-nvl72"])
def test_blackwell_efficiency_follows_the_cited_measurements(name):
    e = get_profile(name).efficiency
    got = (e.matmul, e.fp8_matmul, e.fused_attention, e.flash_attention)
    assert got == pytest.approx(expected()[name], abs=0.0015)  # the files round to 3 decimals
    text = (PROFILES / f"{name}.toml").read_text()
    assert "ml-engineering 744d01e18" in text and "2603.05451" in text
    if name in ("b300", "gb300-nvl72"):
        assert "Blackwell Ultra" in text and "35%" in text


def test_gb300_and_gb200_differ_where_the_hardware_does():
    gb200, gb300 = get_profile("gb200-nvl72"), get_profile("gb300-nvl72")
    # The same dense bf16 / fp8 datasheet peaks; more HBM and faster attention exponentials on GB300.
    assert gb300.gpu.peak_flops["bf16"] == gb200.gpu.peak_flops["bf16"]
    assert gb300.gpu.peak_flops["fp8"] == gb200.gpu.peak_flops["fp8"]
    assert gb300.gpu.memory_bytes > 1.4 * gb200.gpu.memory_bytes
    assert gb300.efficiency.fused_attention == pytest.approx(1.35 * gb200.efficiency.fused_attention, abs=0.002)
    # ... and the planner uses them: at 32K tokens attention is a large share of the step, and the
    # GB300's step (megatron-core: TE's fused attention) is shorter, its GEMMs alike.
    model = get_preset("llama3-8b").replace(seq_len=32768)
    lay = Layout(dp=8, tp=1, micro_batch=1, global_batch=8, recompute="full")
    job = Job(precision="bf16", stack="megatron-core")
    t200, t300 = (float(evaluate_one(model, lay, job, gpu=g).time.compute[0]) for g in ("gb200-nvl72", "gb300-nvl72"))
    assert t300 < 0.95 * t200
