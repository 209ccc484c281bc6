"""How the search prices a table a block of rows at a time: each block priced in full (a search without ``keep``)
or screened (memory decided, step time bounded) and only the rows that may rank timed (a search with ``keep``),
several blocks at once on threads, in block order. The underscored names are the search's internals, imported only
by planner/search*.py."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from paraplan.cost_models.estimate import (
    EstimateTable,
    SharedTerms,
    block_estimates,
    block_memory,
    row_blocks,
)
from paraplan.cost_models.learned.step_calibration import apply_step_factor
from paraplan.cost_models.memory import RankHoldings
from paraplan.cost_models.screening import (
    LayerBoundTerms,
    layer_bound_terms,
    screen_rows,
    stage_holdings,
    stage_memory_floor_bytes,
    step_lower_bound_s,
)
from paraplan.cost_models.table import ConfigTable
from paraplan.planner.search_sinks import _BestRows, _EveryRow, _Fit, _fit, _Limits, _Tally

PRICING_THREADS = 4
"""Most blocks priced at once: numpy releases the GIL inside its array loops, where a block spends most of its time,
so blocks overlap on a multi-core machine; each block in flight holds its own arrays (a block of ROWS_PER_BLOCK rows:
tens of MB), so more threads buy little time for their memory."""
FIRST_TIMED_ROWS = 4096
"""Candidates a search that keeps its best rows times first, those with the smallest step-time bounds: the keep-th
best step among them is the bound every other candidate must not pass to be timed."""
# A bound "passes" a step by more than the rounding of two sums of the same terms in different orders.
BOUND_SLACK_FRAC = 1e-9
BOUND_SLACK_S = 1e-9

_Block = TypeVar("_Block")
"""What pricing one block of rows gives."""


@dataclass(frozen=True, slots=True)
class _PricedBlock:
    """One block of rows, priced."""

    rows: slice
    fit: _Fit
    refit: np.ndarray
    """Per row: an all-gather row that does not fit, to price again with its fallback CP variant."""
    estimates: EstimateTable


def _price_block(shared: SharedTerms, table: ConfigTable, fallback: np.ndarray, limits: _Limits, factor: float,
                 rows: slice) -> _PricedBlock:
    """Price every row of ``rows`` of ``table``."""
    block = block_memory(shared, table, rows)
    return _PricedBlock(rows=rows, fit=_fit(block.memory.required_bytes, block.memory.host_bytes, limits),
                        refit=(fallback[rows] >= 0) & (block.memory.required_bytes > limits.gpu_bytes),
                        estimates=apply_step_factor(block_estimates(shared, block), factor))


@dataclass(frozen=True, slots=True)
class _ScreenedBlock:
    """One block of rows with the fit decided and nothing timed yet."""

    rows: slice
    fit: _Fit
    refit: np.ndarray
    """Per row: an all-gather row that does not fit, to price again with its fallback CP variant."""
    candidates: np.ndarray
    """The rows of the table (not positions in the block) that fit with their own CP variant: those to time."""
    lower_bound_s: np.ndarray
    """Per candidate: a lower bound on its step seconds, step-time factor applied (NaN: none; -inf: no pruning)."""


@dataclass(frozen=True, slots=True)
class _Screening:
    """What screening a table's blocks shares: SharedTerms and what is worked out once from them."""

    shared: SharedTerms
    holdings: RankHoldings | None
    """screening.stage_holdings."""
    bounds: LayerBoundTerms | None
    """The step-time bound's per-layer terms (None: no bound)."""
    over: np.ndarray | None
    """Per distinct stage combination: its memory floor passes the GPU's limit (None: no floor)."""


def _screen_block(screening: _Screening, table: ConfigTable, fallback: np.ndarray, limits: _Limits, factor: float,
                  rows: slice) -> _ScreenedBlock:
    """Decide which rows of ``rows`` fit and bound the step time of those to time. A row whose stage combination is
    ``over`` (its memory floor passes the GPU's limit) does not fit: its memory is not worked out, and it counts as
    requiring infinitely many bytes."""
    shared, bounds, over = screening.shared, screening.bounds, screening.over
    stages = rows if shared.stage_of_row is None else shared.stage_of_row[rows]
    worked = np.arange(rows.stop - rows.start) if over is None else np.flatnonzero(~over[stages])
    screened = screen_rows(shared, table, rows.start + worked, screening.holdings)
    required = np.full(rows.stop - rows.start, np.inf)
    required[worked] = screened.required_bytes
    host = np.zeros(rows.stop - rows.start)
    host[worked] = screened.host_bytes
    fit = _fit(required, host, limits)
    refit = (fallback[rows] >= 0) & (required > limits.gpu_bytes)
    chosen = np.flatnonzero((fit.fits & ~refit)[worked])  # positions in ``screened``
    lower = np.full(len(chosen), -np.inf) if bounds is None else \
        step_lower_bound_s(shared, bounds, screened, chosen) * factor
    return _ScreenedBlock(rows=rows, fit=fit, refit=refit, candidates=rows.start + worked[chosen],
                          lower_bound_s=lower)


def _exact_smallest_bytes(screening: _Screening, table: ConfigTable, fallback: np.ndarray, limits: _Limits,
                          rows_per_block: int) -> float:
    """The least memory a row of ``table`` requires, over the rows a tally counts (not the all-gather rows priced
    again): what _Tally.smallest_bytes is when every row's memory is worked out."""
    smallest = math.inf
    for rows in row_blocks(len(table), rows_per_block):
        required = screen_rows(screening.shared, table, rows, screening.holdings).required_bytes
        counted = required[~((fallback[rows] >= 0) & (required > limits.gpu_bytes))]
        if counted.size:
            smallest = float(np.minimum(smallest, counted.min()))
    return smallest


def _pricing_threads() -> int:
    """Threads for block pricing: the cores this process may run on, at most PRICING_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(PRICING_THREADS, cores))


def _priced_in_order(price: Callable[[slice], _Block], blocks: list[slice]) -> Iterator[_Block]:
    """``price`` of each block, in block order. Several blocks are priced at once on threads (memory holds as many
    blocks as there are threads, never the table: the next block is submitted once the caller has taken one in);
    every block's numbers are its own elementwise arithmetic, so they do not depend on the threads."""
    threads = min(_pricing_threads(), len(blocks))
    if threads == 1:
        yield from map(price, blocks)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="paraplan-price") as pool:
        pending = [pool.submit(price, rows) for rows in blocks[:threads]]
        for rows in blocks[threads:]:
            yield pending.pop(0).result()  # the caller takes this block in while the others are priced
            pending.append(pool.submit(price, rows))
        for future in pending:
            yield future.result()


def _price_every_row(shared: SharedTerms, table: ConfigTable, fallback: np.ndarray, limits: _Limits, sink: _EveryRow,
                     tally: _Tally, rows_per_block: int, factor: float) -> np.ndarray:
    """Price every row of ``table``, ``rows_per_block`` at a time, into ``sink``; return the rows to price again with
    their fallback CP variant: the all-gather rows that do not fit."""
    again = []
    price = functools.partial(_price_block, shared, table, fallback, limits, factor)
    for priced in _priced_in_order(price, row_blocks(len(table), rows_per_block)):
        tally.add(priced.fit, final=~priced.refit)
        sink.add(priced.rows, priced.estimates, priced.fit.fits)
        again.append(priced.rows.start + np.flatnonzero(priced.refit))
        del priced  # freed before the next block is awaited, so memory holds the blocks in flight and no more
    return np.concatenate(again)


def _price_best_rows(shared: SharedTerms, table: ConfigTable, fallback: np.ndarray, limits: _Limits,
                     sink: _BestRows, tally: _Tally, rows_per_block: int, factor: float) -> np.ndarray:
    """Decide the fit of every row of ``table``, ``rows_per_block`` at a time, then time only the rows that fit and
    may rank among the sink's best (:func:`_time_best`); return the rows to price again with their fallback CP
    variant. Ranking by memory, or with a step-time factor that is not positive, bounds nothing: every fitting row
    is timed."""
    over = stage_memory_floor_bytes(shared) * (1 - BOUND_SLACK_FRAC) > limits.gpu_bytes \
        if np.ndim(limits.gpu_bytes) == 0 else None
    screening = _Screening(shared=shared, holdings=stage_holdings(shared), over=over,
                           bounds=layer_bound_terms(shared) if sink.objective != "memory" and factor > 0 else None)
    screen = functools.partial(_screen_block, screening, table, fallback, limits, factor)
    again, candidates, lower = [], [], []
    for screened in _priced_in_order(screen, row_blocks(len(table), rows_per_block)):
        tally.add(screened.fit, final=~screened.refit)
        candidates.append(screened.candidates)
        lower.append(screened.lower_bound_s)
        again.append(screened.rows.start + np.flatnonzero(screened.refit))
        del screened
    if over is not None and np.any(over) and not tally.smallest_bytes <= limits.gpu_bytes:
        # Nothing fits: the least memory may be a row the floor ruled out, so work every row's out.
        tally.smallest_bytes = _exact_smallest_bytes(screening, table, fallback, limits, rows_per_block)
    _time_best(shared, table, sink, np.concatenate(candidates), np.concatenate(lower), rows_per_block, factor)
    return np.concatenate(again)


def _may_rank(lower_bound_s: np.ndarray, keep_th_s: float) -> np.ndarray:
    """Per row, whether a step of at least ``lower_bound_s`` may still be no worse than ``keep_th_s`` (a NaN bound
    or keep-th: yes)."""
    return ~(lower_bound_s - np.abs(lower_bound_s) * BOUND_SLACK_FRAC - BOUND_SLACK_S > keep_th_s)


def _time_best(shared: SharedTerms, table: ConfigTable, sink: _BestRows, rows: np.ndarray, lower_bound_s: np.ndarray,
               rows_per_block: int, factor: float) -> None:
    """Time the candidates ``rows`` (step bounds ``lower_bound_s``) that may rank among the sink's best: the
    FIRST_TIMED_ROWS with the smallest bounds, then every other whose bound does not pass the keep-th best step
    found. Every row left out has a step above that keep-th, so the kept rows are those timing every row keeps."""
    first = np.ones(len(rows), dtype=bool)
    if len(rows) > FIRST_TIMED_ROWS:
        first = lower_bound_s <= np.partition(lower_bound_s, FIRST_TIMED_ROWS - 1)[FIRST_TIMED_ROWS - 1]
    bounded = _time_rows(shared, table, sink, rows[first], lower_bound_s[first], rows_per_block, factor)
    # A timed step below its bound would mean the bound is none for this cost model: then every row is timed.
    rest = ~first & (_may_rank(lower_bound_s, sink.keep_th()) if bounded else True)
    _time_rows(shared, table, sink, rows[rest], lower_bound_s[rest], rows_per_block, factor)


def _time_rows(shared: SharedTerms, table: ConfigTable, sink: _BestRows, rows: np.ndarray, lower_bound_s: np.ndarray,
               rows_per_block: int, factor: float) -> bool:
    """Price the rows ``rows`` of ``table`` into ``sink``, ``rows_per_block`` at a time; whether no row's step came
    out below its bound ``lower_bound_s``."""
    bounded = True
    for block in row_blocks(len(rows), rows_per_block):
        est = apply_step_factor(block_estimates(shared, block_memory(shared, table, rows[block])), factor)
        bounded &= not np.any(est.step_time_s < lower_bound_s[block] - np.abs(lower_bound_s[block])
                              * BOUND_SLACK_FRAC - BOUND_SLACK_S)
        sink.add(rows[block], est, np.ones(len(est.step_time_s), dtype=bool))
    return bounded
