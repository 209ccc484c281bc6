"""Analytical time of compute kernels: roofline with a shape-dependent GEMM efficiency.

A GEMM of shape (M, N, K) runs at ``peak · frac · Π_d d / (d + d_half)`` for d in (M, N, K), the
saturating form fitted to measured GEMMs (efficiency.yaml), unless its bytes make it
memory-bound; each kernel adds a fixed launch overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.hardware_profiles import GPUSpec

# Fused (flash) attention backward executes 2.5x the forward FLOPs: five matmuls against two,
# because it recomputes QKᵀ (Dao 2023, FlashAttention-2, section 3.1.2).
ATTENTION_BACKWARD_OVER_FORWARD = 2.5

BYTES_PER_ELEMENT = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5, "tf32": 4.0}


@dataclass(frozen=True, slots=True)
class ComputeRates:
    """The rates one GPU offers for a job's GEMM dtype, already multiplied by efficiencies."""

    gemm_flops_per_s: float
    """Large-GEMM rate in the job's GEMM dtype."""
    gemm_half_dim: float
    """Half-saturation dimension of the GEMM efficiency curve."""
    gemm_element_bytes: float
    """Bytes per GEMM operand element in the job's dtype."""
    attention_flops_per_s: float
    """Fused attention rate (always 16-bit)."""
    memory_bytes_per_s: float
    """Achieved HBM bandwidth for element-wise kernels."""
    kernel_overhead_s: float
    """Fixed cost per kernel launch."""
    source: str
    """Which model produced these rates."""


def analytical_rates(gpu: GPUSpec, gemm_dtype: str) -> ComputeRates:
    """Rates from the datasheet and the calibrated fractions in efficiency.yaml."""
    eff = gpu.efficiency
    frac = eff.gemm_peak_frac.get(gemm_dtype, eff.gemm_peak_frac["bf16"])
    return ComputeRates(
        gemm_flops_per_s=gpu.peak(gemm_dtype) * frac,
        gemm_half_dim=eff.gemm_half_dim,
        gemm_element_bytes=BYTES_PER_ELEMENT[gemm_dtype],
        attention_flops_per_s=gpu.peak("bf16") * eff.attention_peak_frac,
        memory_bytes_per_s=gpu.hbm_bytes_per_s * eff.hbm_frac,
        kernel_overhead_s=eff.kernel_overhead_s,
        source=f"analytical roofline ({gpu.name}, efficiency.yaml)",
    )


def _saturation(dim, half_dim: float):
    dim = np.asarray(dim, dtype=float)
    return dim / (dim + half_dim)


def gemm_time_s(m, n, k, rates: ComputeRates):
    """Seconds for one GEMM C[m,n] = A[m,k] · B[k,n] on one GPU."""
    flops = 2.0 * np.asarray(m, dtype=float) * n * k
    shape_eff = _saturation(m, rates.gemm_half_dim) * _saturation(n, rates.gemm_half_dim) * _saturation(
        k, rates.gemm_half_dim
    )
    compute = flops / (rates.gemm_flops_per_s * shape_eff)
    memory = rates.gemm_element_bytes * (np.asarray(m, dtype=float) * k + k * n) / rates.memory_bytes_per_s
    memory = memory + 2.0 * np.asarray(m, dtype=float) * n / rates.memory_bytes_per_s  # 16-bit output
    return np.maximum(compute, memory) + rates.kernel_overhead_s


def attention_forward_time_s(flops, rates: ComputeRates):
    """Seconds for the fused attention forward kernel executing ``flops``."""
    return np.asarray(flops, dtype=float) / rates.attention_flops_per_s + rates.kernel_overhead_s


def memory_bound_time_s(num_bytes, num_kernels, rates: ComputeRates):
    """Seconds for element-wise kernels moving ``num_bytes`` through HBM."""
    return np.asarray(num_bytes, dtype=float) / rates.memory_bytes_per_s + num_kernels * rates.kernel_overhead_s
