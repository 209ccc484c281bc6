"""Measured kernel times as tables: vectorised interpolation in log-shape space, with coverage per query.

A :class:`KernelTable` holds one op's measured seconds (one GPU, one software stack, one dtype and kernel) on
a grid over log2 of each shape axis: the distinct measured values of each axis are its grid lines, and a cell
holds the median log-seconds of the rows measured there (NaN where none was). A query interpolates
multilinearly in (log2 shape, log seconds), which is exact on grid points and follows power laws between them.

Physics the table keeps:

- **Monotone.** More work never takes less time: along every axis whose ``monotone`` flag is set, each cell is
  lowered to the smallest measured value above it (a running minimum from the largest shape down). A smaller
  kernel could always run as the larger one on zero-padded operands, so the larger shape's time bounds it; and
  timing noise is one-sided: a clock dip or a neighbour's interference makes a point slow, never fast (rows 391-395
  of paraplan's H100 GEMM suite ran at 9-21 TFLOP/s for a few seconds, beside 550 at the shapes around them).
  Raising dips to the running maximum instead would spread one slow glitch to every larger shape. Multilinear
  interpolation of a grid monotone in each axis is monotone in each axis.
- **Scaling past the largest measured size.** Above an axis's largest grid line a kernel is saturated and its
  time grows as a power of that axis: GEMM time is linear in m, n and k; causal attention over s new tokens
  grows as s². The table extrapolates with the axis's ``exponent_above`` (None: not covered).
- **Coverage.** A query below an axis's smallest grid line, on an axis with no exponent above its largest, or
  whose interpolation touches an unmeasured cell, is not covered: ``lookup`` says so per query and the caller
  prices it another way (the analytical model), naming which model priced what.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np


@dataclass(frozen=True, slots=True)
class TableAxis:
    """One shape axis of a kernel table."""

    name: str
    """What the axis measures, e.g. ``m`` or ``seq_len``."""
    log2_points: np.ndarray
    """Grid lines: log2 of the distinct measured values, strictly increasing."""
    monotone: bool = True
    """Time never falls as this axis grows."""
    exponent_above: float | None = 1.0
    """Time ∝ value ** exponent above the largest grid line; None: queries there are not covered."""


@dataclass(frozen=True, slots=True)
class KernelTable:
    """Measured seconds of one op on a grid over its shape axes."""

    op: str
    """The op priced, e.g. ``gemm`` or ``attention_forward``."""
    axes: tuple[TableAxis, ...]
    log_seconds: np.ndarray
    """Natural log of seconds per grid cell (shape: one entry per axis's grid lines); NaN where unmeasured."""
    label: str
    """Provenance: GPU, stack, kernel and dtype the rows were measured with, and how many."""
    num_rows: int
    """Measured rows the table was built from."""


def build_table(op: str, axis_names: tuple[str, ...], shapes: np.ndarray, seconds: np.ndarray, label: str,
                monotone: tuple[bool, ...] | None = None,
                exponents_above: tuple[float | None, ...] | None = None) -> KernelTable:
    """A table from measured rows: ``shapes`` (rows x axes, every value > 0) and their ``seconds`` (> 0)."""
    shapes = np.asarray(shapes, dtype=float).reshape(len(seconds), len(axis_names))
    seconds = np.asarray(seconds, dtype=float)
    if len(seconds) == 0 or np.any(shapes <= 0) or np.any(~np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError(f"{op} table needs rows with positive shapes and seconds")
    monotone = monotone or (True,) * len(axis_names)
    exponents_above = exponents_above or (1.0,) * len(axis_names)
    logs = np.log2(shapes)
    points = [np.unique(logs[:, d]) for d in range(len(axis_names))]
    index = tuple(np.searchsorted(points[d], logs[:, d]) for d in range(len(axis_names)))
    grid = _cell_medians(index, np.log(seconds), tuple(len(p) for p in points))
    for d, flag in enumerate(monotone):
        if flag:
            grid = _running_min_from_above(grid, d)
    axes = tuple(TableAxis(name, p, flag, exponent)
                 for name, p, flag, exponent in zip(axis_names, points, monotone, exponents_above, strict=True))
    return KernelTable(op=op, axes=axes, log_seconds=grid, label=label, num_rows=len(seconds))


def _cell_medians(index: tuple[np.ndarray, ...], values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The median of ``values`` per grid cell (NaN where no row falls)."""
    flat = np.ravel_multi_index(index, shape)
    order = np.lexsort((values, flat))
    flat, values = flat[order], values[order]
    cells, starts, counts = np.unique(flat, return_index=True, return_counts=True)
    lower = values[starts + (counts - 1) // 2]
    upper = values[starts + counts // 2]
    grid = np.full(int(np.prod(shape)), np.nan)
    grid[cells] = 0.5 * (lower + upper)
    return grid.reshape(shape)


def _running_min_from_above(grid: np.ndarray, axis: int) -> np.ndarray:
    """Each measured cell lowered to the smallest measured cell above it along ``axis``; unmeasured stay NaN."""
    lowered = np.flip(np.fmin.accumulate(np.flip(grid, axis=axis), axis=axis), axis=axis)
    return np.where(np.isnan(grid), np.nan, lowered)


def lookup(table: KernelTable, shapes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, covered) for each query row of ``shapes`` (queries x axes); seconds are NaN where not covered."""
    shapes = np.atleast_2d(np.asarray(shapes, dtype=float))
    covered = np.all(shapes > 0, axis=1)
    logs = np.log2(np.where(shapes > 0, shapes, 1.0))
    lows, weights, extra = [], [], np.zeros(len(shapes))
    for d, axis in enumerate(table.axes):
        low, weight, scaled, ok = _axis_position(axis, logs[:, d])
        lows.append(low)
        weights.append(weight)
        extra += scaled
        covered &= ok
    log_s = np.zeros(len(shapes))
    for corner in product((0, 1), repeat=len(table.axes)):
        idx = tuple(np.minimum(low + c, len(axis.log2_points) - 1)
                    for low, c, axis in zip(lows, corner, table.axes, strict=True))
        w = np.prod([wt if c else 1.0 - wt for wt, c in zip(weights, corner, strict=True)], axis=0)
        value = table.log_seconds[idx]
        covered &= ~(np.isnan(value) & (w > 0))
        log_s += np.where(w > 0, np.nan_to_num(value) * w, 0.0)
    seconds = np.exp(log_s + extra)
    return np.where(covered, seconds, np.nan), covered


def _axis_position(axis: TableAxis, log2_values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per query on one axis: (lower grid index, weight of the upper line, log-seconds added above the largest
    line, covered). A one-line axis covers only its own value (and what it scales to above)."""
    points = axis.log2_points
    top = len(points) - 1
    clipped = np.clip(log2_values, points[0], points[-1])
    low = np.clip(np.searchsorted(points, clipped, side="right") - 1, 0, max(top - 1, 0))
    span = points[np.minimum(low + 1, top)] - points[low]
    weight = np.where(span > 0, (clipped - points[low]) / np.where(span > 0, span, 1.0), 0.0)
    above = log2_values > points[-1] + 1e-12
    exponent = axis.exponent_above if axis.exponent_above is not None else 0.0
    scaled = np.where(above, exponent * (log2_values - points[-1]) * np.log(2.0), 0.0)
    ok = (log2_values >= points[0] - 1e-12) & (~above | (axis.exponent_above is not None))
    return low, weight, scaled, ok
