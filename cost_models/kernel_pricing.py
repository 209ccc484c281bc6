"""Kernel tables as the compute rates' GEMM model: measured where a table covers the shape, analytical elsewhere.

``table_gemm_fn`` turns a GEMM :class:`KernelTable` into the ``gemm_time_fn`` of :class:`ComputeRates`, so every
GEMM the step model prices (attention and MLP projections, experts, the output layer; forward, and backward as
twice the forward shape, as ``layer.py`` prices it) reads the table. ``gemm_coverage`` says, for a set of GEMM
shapes, how much of their time the table priced: the per-term provenance a plan reports. ``table_attention_fn``
does the same for causal self-attention, forward and backward, from tables measured per head dim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from paraplan.arrays import Column
from paraplan.cost_models.compute import (
    AttentionTableFn,
    ComputeRates,
    GemmTimeFn,
    GroupedGemmTableFn,
    MemoryTimeFn,
    ParameterTableFn,
    gemm_time_s,
)
from paraplan.cost_models.kernel_tables import KernelTable, lookup


def distinct_queries(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of equal-length float ``columns`` in lexicographic order, the inverse index back to every
    row): what ``np.unique(..., axis=0, return_inverse=True)`` gives, by one lexsort instead of its structured-dtype
    sort (a serving search's table lookups: 2.45 -> 0.75 s for DeepSeek-R1 on 64 H200)."""
    order = np.lexsort(columns[::-1])
    ordered = [column[order] for column in columns]
    starts = np.ones(len(order), dtype=bool)
    for column in ordered:
        starts[1:] &= column[1:] == column[:-1]
    starts = ~starts
    starts[0] = True
    inverse = np.empty(len(order), dtype=np.intp)
    inverse[order] = np.cumsum(starts) - 1
    return np.column_stack([column[starts] for column in ordered]), inverse


def _distinct_shapes(m: Column, n: Column, k: Column) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """(distinct (m, n, k) rows, the inverse index back to the broadcast queries, the broadcast shape)."""
    m, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k)))
    distinct, inverse = distinct_queries([m.ravel(), n.ravel(), k.ravel()])
    return distinct, inverse, m.shape


def table_seconds(table: KernelTable, *axes: Column) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, covered) of queries at ``axes`` (one column per table axis, broadcast), each distinct query looked up
    once; seconds NaN where the table does not cover the query."""
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in axes))
    if arrays[0].size == 0:
        return np.full(arrays[0].shape, np.nan), np.zeros(arrays[0].shape, dtype=bool)
    distinct, inverse = distinct_queries([a.ravel() for a in arrays])
    seconds, covered = lookup(table, distinct)
    return seconds[inverse].reshape(arrays[0].shape), covered[inverse].reshape(arrays[0].shape)


def table_gemm_seconds(table: KernelTable, analytical: ComputeRates, m: Column, n: Column,
                       k: Column) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, priced by the table) of GEMMs (m, n, k), broadcast; shapes the table does not cover take
    ``analytical``'s roofline (whose own ``gemm_time_fn`` is ignored)."""
    distinct, inverse, shape = _distinct_shapes(m, n, k)
    measured, covered = lookup(table, distinct)
    fallback = gemm_time_s(distinct[:, 0], distinct[:, 1], distinct[:, 2],
                           dataclasses.replace(analytical, gemm_time_fn=None))
    seconds = np.where(covered, measured, fallback)
    return seconds[inverse].reshape(shape), covered[inverse].reshape(shape)


def table_gemm_fn(table: KernelTable, analytical: ComputeRates, run_factor: float = 1.0) -> GemmTimeFn:
    """A ``gemm_time_fn``: the table's seconds divided by ``run_factor`` (the distributed-run factor a job on many
    GPUs pays on measured kernels: hardware_profiles/run_factor.py) where it covers the shape, ``analytical``'s
    (whose fractions already carry it) elsewhere."""
    def predict(m: Column, n: Column, k: Column) -> np.ndarray:
        seconds, covered = table_gemm_seconds(table, analytical, m, n, k)
        return seconds if run_factor == 1.0 else np.where(covered, seconds / run_factor, seconds)

    return predict


def gemm_coverage(table: KernelTable, analytical: ComputeRates, shapes: np.ndarray,
                  counts: np.ndarray | None = None) -> float:
    """Share (0-1) of the time of GEMMs ``shapes`` (rows of m, n, k; each run ``counts`` times) the table priced."""
    shapes = np.atleast_2d(np.asarray(shapes, dtype=float))
    seconds, covered = table_gemm_seconds(table, analytical, shapes[:, 0], shapes[:, 1], shapes[:, 2])
    weights = seconds * (1.0 if counts is None else np.asarray(counts, dtype=float))
    total = float(weights.sum())
    return float(weights[covered].sum()) / total if total > 0 else 0.0


def table_attention_fn(tables: dict[int, tuple[KernelTable, KernelTable]],
                       run_factor: float = 1.0) -> AttentionTableFn:
    """An ``attention_table_fn``: measured (forward, backward) seconds of causal self-attention from tables per head
    dim, each over (sequence length, sequences x heads), divided by ``run_factor``; covered only where both passes
    are."""
    def predict(sequences_heads: np.ndarray, seq_len: int, head_dim: int) -> tuple[np.ndarray, np.ndarray,
                                                                                     np.ndarray]:
        shape = np.shape(sequences_heads)
        pair = tables.get(int(head_dim))
        if pair is None:
            return np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=bool)
        distinct, inverse = np.unique(np.ravel(sequences_heads), return_inverse=True)
        queries = np.column_stack([np.full(len(distinct), float(seq_len)), distinct])
        forward, forward_covered = lookup(pair[0], queries)
        backward, backward_covered = lookup(pair[1], queries)
        covered = forward_covered & backward_covered
        return (forward[inverse].reshape(shape) / run_factor, backward[inverse].reshape(shape) / run_factor,
                covered[inverse].reshape(shape))

    return predict


def table_collective_fn(tables: dict[str, KernelTable]) -> Callable[[str, Column, Column, Column],
                                                                     tuple[np.ndarray, np.ndarray]]:
    """A ``ClusterSpec.collective_time_fn``: (kind, buffer bytes, group size, members per NVLink domain) ->
    (priced by a table, its seconds) for groups inside one NVLink domain whose size and group size a measured
    table covers (time linear in bytes past the largest buffer; no group larger than measured)."""
    def predict(kind: str, size_bytes: Column, group_size: Column,
                members_per_domain: Column) -> tuple[np.ndarray, np.ndarray]:
        size, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in
                                           (size_bytes, group_size, members_per_domain)))
        if kind not in tables:
            return np.zeros(size.shape, dtype=bool), np.zeros(size.shape)
        seconds, covered = lookup(tables[kind], np.column_stack([size.ravel(), n.ravel()]))
        inside = (n > 1) & (k >= n) & covered.reshape(size.shape)
        return inside, np.where(inside, seconds.reshape(size.shape), 0.0)

    return predict


def curve_seconds(table: KernelTable, values: Column) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, covered) of a one-axis table at ``values``: ``lookup``'s interpolation (linear in log2 value and log
    seconds), as one ``np.interp`` over the grid instead of a sort of the queries; past the largest grid line time
    grows as the axis's ``exponent_above`` (None: not covered), below the smallest it is not covered."""
    (axis,) = table.axes
    values = np.asarray(values, dtype=float)
    logs = np.log2(np.where(values > 0, values, 1.0))
    log_s = np.interp(logs, axis.log2_points, table.log_seconds)
    above = logs > axis.log2_points[-1]
    if axis.exponent_above is not None:
        log_s = log_s + np.where(above, axis.exponent_above * (logs - axis.log2_points[-1]) * np.log(2.0), 0.0)
    covered = (values > 0) & (logs >= axis.log2_points[0]) & (~above | (axis.exponent_above is not None))
    return np.where(covered, np.exp(log_s), np.nan), covered


def table_memory_seconds(table: KernelTable, analytical: ComputeRates, num_bytes: Column,
                         num_kernels: Column) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, priced by the table) of ``num_kernels`` memory-bound kernels moving ``num_bytes`` between them, each
    priced at its share of the bytes by the measured curve of one kernel's seconds by bytes (launch included), or by
    ``analytical``'s roofline (bytes / bandwidth + one launch) outside the measured bytes. Time never falls as bytes
    grow: below the curve the roofline is capped at the curve's smallest time, above it raised to the largest."""
    size, kernels = np.broadcast_arrays(np.asarray(num_bytes, dtype=float), np.asarray(num_kernels, dtype=float))
    per_kernel = size / np.where(kernels > 0, kernels, 1.0)
    measured, covered = curve_seconds(table, per_kernel)
    roofline = per_kernel / analytical.memory_bytes_per_s + analytical.kernel_overhead_s
    lowest, highest = np.exp(table.log_seconds[0]), np.exp(table.log_seconds[-1])
    below = per_kernel < 2.0 ** table.axes[0].log2_points[0]
    fallback = np.where(below, np.minimum(roofline, lowest), np.maximum(roofline, highest))
    seconds = kernels * np.where(covered, measured, fallback)
    covered = covered & (kernels > 0)
    return np.where(kernels > 0, seconds, size / analytical.memory_bytes_per_s), covered


def table_memory_fn(table: KernelTable, analytical: ComputeRates) -> MemoryTimeFn:
    """A ``memory_time_fn``: memory-bound kernels priced by a measured bandwidth curve, the roofline outside it."""
    def predict(num_bytes: Column, num_kernels: Column) -> np.ndarray:
        return table_memory_seconds(table, analytical, num_bytes, num_kernels)[0]

    return predict


def memory_coverage(table: KernelTable, analytical: ComputeRates, num_bytes: np.ndarray,
                    num_kernels: np.ndarray) -> float:
    """Share (0-1) of the time of memory-bound kernel sets (``num_bytes`` over ``num_kernels``) the curve priced."""
    seconds, covered = table_memory_seconds(table, analytical, num_bytes, num_kernels)
    total = float(seconds.sum())
    return float(seconds[covered].sum()) / total if total > 0 else 0.0


def table_parameter_fn(table: KernelTable) -> ParameterTableFn:
    """An ``optimizer_table_fn``: the measured step's seconds by parameter count, and covered."""
    def predict(parameters: Column) -> tuple[np.ndarray, np.ndarray]:
        return curve_seconds(table, parameters)

    return predict


def table_grouped_gemm_fn(table: KernelTable, run_factor: float = 1.0) -> GroupedGemmTableFn:
    """A ``grouped_gemm_table_fn``: measured seconds of grouped GEMMs (rows per group, groups, n, k) from a table over
    (tokens per expert, experts, n, k), each distinct shape looked up once, divided by ``run_factor``, and
    covered."""
    def predict(rows_per_group: Column, groups: Column, n: Column, k: Column) -> tuple[np.ndarray, np.ndarray]:
        seconds, covered = table_seconds(table, rows_per_group, groups, n, k)
        return seconds / run_factor, covered

    return predict
