"""The SKUs added for issue 15 (H100 96GB HBM2e, H100 NVL, GH200 96GB, H20, MI325X): datasheet numbers in SI."""

from __future__ import annotations

import pytest

from paraplan.hardware_profiles import gpu_names, load_gpu
from paraplan.hardware_profiles.catalog import architecture_bases

# name: (dense bf16 TFLOP/s, dense fp8, HBM GiB, HBM TB/s, NVLink GB/s one direction, host link GB/s)
ADDED = {
    "h100-sxm-96gb": (989.4, 1978.9, 96, 2.4, 450, 64),  # torchtitan Grand Teton: 96GB HBM2e, 2.4 TB/s
    "h100-nvl": (835.5, 1670.5, 94, 3.9, 64, 64),        # datasheet 1,671 / 3,341 sparse; PCIe between cards
    "gh200-96gb": (989.4, 1978.9, 96, 4.0, 450, 450),    # NVLink-C2C 900 GB/s bidirectional
    "h20": (148.0, 296.0, 96, 4.0, 450, 64),
    "mi325x": (1307.4, 2614.9, 256, 6.0, 448, 64),
}


@pytest.mark.parametrize("name", sorted(ADDED))
def test_added_sku_numbers_in_si(name: str):
    bf16, fp8, hbm_gib, hbm_tb_s, nvlink_gb_s, host_gb_s = ADDED[name]
    gpu = load_gpu(name)
    assert gpu.peak("bf16") == pytest.approx(bf16 * 1e12, rel=1e-12)
    assert gpu.peak("fp8") == pytest.approx(fp8 * 1e12, rel=1e-12)
    assert gpu.hbm_bytes == hbm_gib * 2**30
    assert gpu.hbm_bytes_per_s == pytest.approx(hbm_tb_s * 1e12, rel=1e-12)
    assert gpu.nvlink_bytes_per_s == pytest.approx(nvlink_gb_s * 1e9, rel=1e-12)
    assert gpu.host_link_bytes_per_s == pytest.approx(host_gb_s * 1e9, rel=1e-12)
    assert "dense" in gpu.sources["dense_tflops"]


def test_h100_96gb_is_h100_compute_with_its_own_memory():
    h100, grand_teton = load_gpu("h100-sxm"), load_gpu("h100-sxm-96gb")
    assert grand_teton.peak_flops_per_s == h100.peak_flops_per_s
    assert grand_teton.hbm_bytes - h100.hbm_bytes == 16 * 2**30
    assert grand_teton.hbm_bytes_per_s < h100.hbm_bytes_per_s  # HBM2e 2.4 TB/s vs HBM3 3.35 TB/s


@pytest.mark.parametrize("name", ["h100-sxm-96gb", "h100-nvl", "gh200-96gb", "h20"])
def test_added_hopper_parts_use_the_h100_fractions(name: str):
    h100 = load_gpu("h100-sxm").efficiency
    eff = load_gpu(name).efficiency
    assert (eff.gemm_peak_frac, eff.stack_gemm_peak_frac, eff.attention_peak_frac, eff.gemm_half_dim) == (
        h100.gemm_peak_frac, h100.stack_gemm_peak_frac, h100.attention_peak_frac, h100.gemm_half_dim)
    assert "not fitted" in eff.source


def test_architecture_bases_name_built_in_gpus_of_that_architecture():
    bases = architecture_bases()
    assert bases == {"ampere": "a100-sxm-80gb", "hopper": "h100-sxm", "blackwell": "b200"}
    for architecture, name in bases.items():
        assert name in gpu_names() and load_gpu(name).architecture == architecture
