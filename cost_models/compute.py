"""Analytical time of compute kernels: roofline with a shape-dependent GEMM efficiency.

A GEMM of shape (M, N, K) runs at ``peak · frac · Π_d d / (d + d_half)`` for d in (M, N, K), the
saturating form fitted to measured GEMMs (efficiency.yaml), unless its bytes make it
memory-bound; each kernel adds a fixed launch overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from paraplan.arrays import Column
from paraplan.hardware_profiles import GPUSpec
from paraplan.hardware_profiles.run_factor import scale_note
from paraplan.hardware_profiles.specs import ATTENTION_KERNELS, DEFAULTED, FLASH_FAMILY_KERNELS

# Fused (flash) attention backward executes 2.5x the forward FLOPs: five matmuls against two,
# because it recomputes QKᵀ (Dao 2023, FlashAttention-2, section 3.1.2).
ATTENTION_BACKWARD_OVER_FORWARD = 2.5

BYTES_PER_ELEMENT: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5, "tf32": 4.0}

GemmTimeFn = Callable[[Column, Column, Column], np.ndarray]
"""Seconds of GEMMs (m, n, k), broadcast like :func:`gemm_time_s` (a learned model's predictor)."""
AttentionTimeFn = Callable[[Column], tuple[np.ndarray, np.ndarray]]
"""(forward, backward) seconds of flash attention for forward causal FLOPs, like :func:`flash_attention_time_s`."""
AttentionTableFn = Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Measured causal self-attention by shape: (sequences x heads per GPU, sequence length, head dim) ->
(forward seconds, backward seconds, covered); a measured kernel table's predictor (kernel_pricing.py)."""
MemoryTimeFn = Callable[[Column, Column], np.ndarray]
"""Seconds of memory-bound kernels (bytes moved, kernels), broadcast like :func:`memory_bound_time_s`: a measured
HBM bandwidth curve by bytes per kernel (kernel_pricing.py), the roofline outside it."""
ParameterTableFn = Callable[[Column], tuple[np.ndarray, np.ndarray]]
"""Measured seconds of the fused optimizer step over ``parameters`` (its own bytes only), and covered."""
GroupedGemmTableFn = Callable[[Column, Column, Column, Column], tuple[np.ndarray, np.ndarray]]
"""Measured seconds of grouped GEMMs (rows per group, groups, n, k), and covered (kernel_pricing.py)."""


@dataclass(frozen=True, slots=True)
class ComputeRates:
    """The rates one GPU offers for a job's GEMM dtype, already multiplied by efficiencies."""

    gemm_flops_per_s: float
    """Large-GEMM rate in the job's GEMM dtype."""
    gemm_half_dim: float
    """Half-saturation dimension of the GEMM efficiency curve."""
    gemm_element_bytes: float
    """Bytes per GEMM operand element in the job's dtype."""
    attention_kernel: str
    """Which attention implementation the rates describe (``ATTENTION_KERNELS``)."""
    attention_flops_per_s: float
    """Attention-core matmul rate, always 16-bit: the calibrated kernel rate for flash-family kernels,
    the large-GEMM bf16 rate for unfused attention (whose batched GEMMs then pay their shape)."""
    memory_bytes_per_s: float
    """Achieved HBM bandwidth for element-wise kernels."""
    kernel_overhead_s: float
    """Fixed cost per kernel launch."""
    source: str
    """Which model produced these rates."""
    gemm_time_fn: GemmTimeFn | None = None
    """A learned model of GEMM seconds for (m, n, k); when set, ``gemm_time_s`` defers to it."""
    attention_time_fn: AttentionTimeFn | None = None
    """A learned model of flash-attention (forward, backward) seconds for forward causal FLOPs; when set,
    ``flash_attention_time_s`` defers to it."""
    attention_table_fn: AttentionTableFn | None = None
    """A measured table of causal attention by shape; where it covers a layer's attention it prices it, ahead of
    ``attention_time_fn`` and the flash rate (layer.py)."""
    memory_time_fn: MemoryTimeFn | None = None
    """A measured HBM bandwidth curve; when set, ``memory_bound_time_s`` defers to it (it falls back to the roofline
    of ``memory_bytes_per_s`` itself)."""
    optimizer_table_fn: ParameterTableFn | None = None
    """A measured fused optimizer step by parameter count; where it covers a stage's update it prices it
    (estimate.optimizer_step_s)."""
    grouped_gemm_table_fn: GroupedGemmTableFn | None = None
    """A measured grouped GEMM (routed experts' forward and input gradients) by tokens per expert, experts and
    widths; where it covers a shape it prices it (moe.grouped_gemm_time_s)."""
    step_time_factor: float = 1.0
    """Learned step-level calibration (measured / predicted step of full runs), applied to the finished estimate."""
    fp8_recipe: str | None = None
    """The fp8 scaling recipe whose GEMM rate these rates carry (fp8_recipes.with_fp8_recipe); None = not yet
    applied (the per-tensor rate of efficiency.yaml)."""


def analytical_rates(gpu: GPUSpec, gemm_dtype: str, attention_kernel: str = "fused",
                     kernel_stack: str = "transformer_engine") -> ComputeRates:
    """Rates from the datasheet and the calibrated fractions in efficiency.yaml."""
    eff = gpu.efficiency
    fractions = {**eff.gemm_peak_frac, **eff.stack_gemm_peak_frac.get(kernel_stack, {})}
    frac = fractions.get(gemm_dtype, fractions["bf16"])
    if attention_kernel in FLASH_FAMILY_KERNELS:
        attention_frac = eff.attention_peak_frac[attention_kernel]
    elif attention_kernel == "unfused":
        attention_frac = fractions["bf16"]
    else:
        raise ValueError(f"attention kernel must be one of {', '.join(ATTENTION_KERNELS)}, got {attention_kernel!r}")
    return ComputeRates(
        gemm_flops_per_s=gpu.peak(gemm_dtype) * frac,
        gemm_half_dim=eff.gemm_half_dim,
        gemm_element_bytes=BYTES_PER_ELEMENT[gemm_dtype],
        attention_kernel=attention_kernel,
        attention_flops_per_s=gpu.peak("bf16") * attention_frac,
        memory_bytes_per_s=gpu.hbm_bytes_per_s * eff.hbm_frac,
        kernel_overhead_s=eff.kernel_overhead_s,
        source=f"analytical roofline ({gpu.name}, efficiency.yaml, {kernel_stack} GEMMs, {attention_kernel} attention: "
               f"{_calibration_detail(gpu, gemm_dtype, attention_kernel, kernel_stack)})",
    )


def _calibration_detail(gpu: GPUSpec, gemm_dtype: str, attention_kernel: str, kernel_stack: str) -> str:
    """Whether the fractions read were fitted, and which share of the distributed-run factor they carry."""
    calibration = gpu.calibration(gemm_dtype, attention_kernel, kernel_stack)
    note = scale_note(gpu.efficiency, DEFAULTED in (calibration.gemm, calibration.attention))
    return calibration.detail() + (f"; {note}" if note else "")


def _saturation(dim: Column, half_dim: float) -> np.ndarray:
    """The GEMM efficiency factor of one dimension: d / (d + d_half), between 0 and 1."""
    dim = np.asarray(dim, dtype=float)
    return dim / (dim + half_dim)


def gemm_time_s(m: Column, n: Column, k: Column, rates: ComputeRates) -> np.ndarray:
    """Seconds for one GEMM C[m,n] = A[m,k] · B[k,n] on one GPU."""
    if rates.gemm_time_fn is not None:
        return rates.gemm_time_fn(m, n, k)
    flops = 2.0 * np.asarray(m, dtype=float) * n * k
    shape_eff = _saturation(m, rates.gemm_half_dim) * _saturation(n, rates.gemm_half_dim) * _saturation(
        k, rates.gemm_half_dim
    )
    compute = flops / (rates.gemm_flops_per_s * shape_eff)
    memory = rates.gemm_element_bytes * (np.asarray(m, dtype=float) * k + k * n) / rates.memory_bytes_per_s
    memory = memory + 2.0 * np.asarray(m, dtype=float) * n / rates.memory_bytes_per_s  # 16-bit output
    return np.maximum(compute, memory) + rates.kernel_overhead_s


def flash_attention_time_s(causal_flops: Column, rates: ComputeRates) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of a flash-family kernel executing ``causal_flops`` forward."""
    if rates.attention_time_fn is not None:
        return rates.attention_time_fn(causal_flops)
    forward = np.asarray(causal_flops, dtype=float) / rates.attention_flops_per_s
    return forward + rates.kernel_overhead_s, ATTENTION_BACKWARD_OVER_FORWARD * forward + rates.kernel_overhead_s


def unfused_attention_time_s(score_elements: Column, seq_len: int, head_dim: int, dropout: bool,
                             rates: ComputeRates) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of attention with the score matrix materialised in HBM.

    ``score_elements`` = micro-batch x local heads x local queries x keys. Forward: QKᵀ and PV as
    batched GEMMs over every score (the causal mask is applied after, so nothing is skipped) at
    the shape efficiency of (s, s, d_head), then the fused scale-mask-softmax (read 2 B, write
    2 B per score) and, with attention dropout, the dropout kernel (read 2 B, write 2 B and a
    1 B mask). Backward: four batched GEMMs, dropout backward (read 2 B + mask 1 B, write 2 B)
    and softmax backward (read gradient and output 2 B each, write 2 B). Megatron-LM 2021
    (Narayanan et al. section 4.3) ran exactly this path with fused softmax kernels.
    """
    elements = np.asarray(score_elements, dtype=float)
    shape_eff = _saturation(seq_len, rates.gemm_half_dim) ** 2 * _saturation(head_dim, rates.gemm_half_dim)
    gemm = 2.0 * 2.0 * elements * head_dim / (rates.attention_flops_per_s * shape_eff)
    forward_bytes = 4.0 + (5.0 if dropout else 0.0)
    backward_bytes = 6.0 + (5.0 if dropout else 0.0)
    dropout_kernels = 1 if dropout else 0
    forward = gemm + elements * forward_bytes / rates.memory_bytes_per_s \
        + (3 + dropout_kernels) * rates.kernel_overhead_s
    backward = 2.0 * gemm + elements * backward_bytes / rates.memory_bytes_per_s \
        + (5 + dropout_kernels) * rates.kernel_overhead_s
    return forward, backward


def memory_bound_time_s(num_bytes: Column, num_kernels: Column, rates: ComputeRates) -> np.ndarray:
    """Seconds for element-wise kernels moving ``num_bytes`` through HBM."""
    if rates.memory_time_fn is not None:
        return rates.memory_time_fn(num_bytes, num_kernels)
    return np.asarray(num_bytes, dtype=float) / rates.memory_bytes_per_s + num_kernels * rates.kernel_overhead_s
