"""Search: enumerate, price a block of rows at a time, keep what fits, rank, return the top K."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from paraplan.choices import CP_COMM_CODES, OBJECTIVES, Objective
from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.cost_models.estimate import (
    ROWS_PER_BLOCK,
    EstimateTable,
    SharedTerms,
    allocated_like,
    block_estimates,
    block_memory,
    default_rates,
    estimate,
    fill_rows,
    row_blocks,
    shared_terms,
    widened,
)
from paraplan.cost_models.fp8_recipes import recipe_error
from paraplan.cost_models.layer import cp_comm_variants_per_layer_s
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
from paraplan.cost_models.table import ConfigTable, DistinctIndex, distinct_index, distinct_index_by_parent, take_rows
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import SearchSpace, enumerate_space

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PRICING_THREADS = 4
"""Most blocks priced at once: numpy releases the GIL inside its array loops, where a block spends most of its time,
so blocks overlap on a multi-core machine; each block in flight holds its own arrays (a block of ROWS_PER_BLOCK rows:
tens of MB), so more threads buy little time for their memory."""
MEMORY_REASON = "does not fit in GPU memory"
HOST_MEMORY_REASON = "offloaded activations exceed host memory"
DOMINATED_CP_REASON = "another context-parallel variant of the same layout is faster"
ALL_GATHER = CP_COMM_CODES["allgather"]
# What layer.cp_comm_variants_per_layer_s reads: the variants' exposed times are equal wherever these are.
CP_VARIANT_AXES = ("tp", "cp", "mbs", "recompute")
# Equal predictions rank the simpler layout first: fewer kinds of parallelism and memory tricks
# to debug (context, pipeline, interleaving, tensor; offload, recompute, sharding), then the rest.
TIE_BREAK = ("cp", "cp_comm", "pp", "pp_schedule", "vpp", "tp", "offload", "recompute", "zero", "sp", "tp_overlap",
             "ep_overlap", "etp", "ep", "dp", "mbs")


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Ranked rows of the evaluated table and what was rejected."""

    table: ConfigTable
    """The evaluated candidates (a search told to ``keep`` the best: those, best first)."""
    estimates: EstimateTable
    """The predictions of ``table``'s rows."""
    ranked: np.ndarray
    """Row indices of fitting candidates, best first (a search told to ``keep`` the best: of those)."""
    rejected: dict[str, int]
    considered: int
    smallest_memory_bytes: float
    """Lowest peak memory seen among rule-valid candidates (for 'fits nowhere' messages)."""
    evaluated: int
    """Rule-valid candidates priced: ``len(table)`` unless the search kept only the best."""
    fitting: int
    """Candidates that fit: ``len(ranked)`` unless the search kept only the best."""


def _objective_key(objective: Objective, est: EstimateTable) -> np.ndarray:
    """What ``objective`` ranks by, per row (smaller first). Cost ranks as throughput: dollars for a fixed budget
    on one cluster = price x GPUs x steps x step time, the step time times a constant (planner/run/cost.py prices
    the run; a cheaper, slower GPU type can win only between clusters, as in planner/run/sweep.py's best_per_size)."""
    return est.memory.peak_bytes if objective == "memory" else est.step_time_s


def _check_request(job: TrainingJob, cluster: ClusterSpec, objective: Objective, keep: int | None) -> None:
    """Refuse what no search can answer: a precision or fp8 recipe the GPU lacks, a cost objective without a
    price, no row to keep."""
    try:
        cluster.gpu.peak(job.precision)
    except ValueError as exc:
        raise InputError(f"{exc}; choose another --precision") from None
    if job.precision == "fp8":
        problem = recipe_error(job.fp8_recipe, cluster.gpu.architecture, cluster.gpu.name)
        if problem:
            raise InputError(problem)
    if objective == "cost" and cluster.gpu.price_usd_per_gpu_hour is None:
        raise InputError(f"--objective cost needs a price for {cluster.gpu.name}; the catalog has none "
                         "(give --price-per-gpu-hour, or use --objective throughput or memory)")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be a positive number of rows, got {keep}")


def _fastest_cp_comm(job: TrainingJob, cluster: ClusterSpec, space: SearchSpace, rates: ComputeRates | None,
                     objective: Objective) -> tuple[ConfigTable, np.ndarray, dict[str, int]]:
    """Each collapsed row gets the best CP variant its rules allow: the fastest (ties: the lowest code,
    p2p first), or under the memory objective the lowest code that does not gather the whole sequence's
    K, V. Variants change only the exposed CP time and, for all-gather, one layer's transient K, V, so
    the others are dominated; they are counted, not estimated. Also returned, per row: the fastest
    allowed variant other than all-gather (-1 where there is none or the row did not pick all-gather),
    the next best when the all-gather row does not fit in memory."""
    rejected = dict(space.rejected)
    allowed, table = space.cp_comm_allowed, space.table
    no_fallback = np.full(len(table), -1, dtype=np.int8)  # a CP code (0-3) or -1
    if allowed is None or not np.any(allowed & (allowed - 1)):
        return table, no_fallback, rejected
    work = job.workload()
    rates = rates or default_rates(cluster, work)
    # The variants' times read only CP_VARIANT_AXES: decide once per distinct combination and allowed mask (over
    # every row: most have several variants, and masks over the whole table cost less than their row indices).
    representative, of_row = _distinct_finder(space, table)(CP_VARIANT_AXES + ("cp_comm_allowed",))
    times = cp_comm_variants_per_layer_s(job.model, work, widened(table.take(representative)), rates, cluster)
    codes = np.asarray(sorted(times))
    gathers = codes == ALL_GATHER
    masks = allowed[representative]
    permitted = np.stack([(masks >> code & 1).astype(bool) for code in codes])
    if objective == "memory":
        key = np.stack([np.full(len(representative), 1.0 if g else 0.0) for g in gathers])
    else:
        key = np.stack([times[code] for code in codes])
    cost = np.where(permitted, key, np.inf)
    chosen = codes[np.argmin(cost, axis=0)]
    others = np.where(gathers[:, None], np.inf, cost)
    next_best = np.where((chosen == ALL_GATHER) & np.isfinite(others.min(axis=0)), codes[np.argmin(others, axis=0)], -1)
    several = (allowed & (allowed - 1)) != 0  # rows with a choice; the others keep their one variant
    cp_comm = np.where(several, chosen.astype(table.cp_comm.dtype)[of_row], table.cp_comm)
    fallback = np.where(several, next_best.astype(np.int8)[of_row], no_fallback)
    rows_per_distinct = np.bincount(of_row, minlength=len(representative)) * ((masks & (masks - 1)) != 0)
    rejected[DOMINATED_CP_REASON] = int(np.sum(rows_per_distinct * permitted.sum(axis=0)) - np.sum(rows_per_distinct))
    return dataclasses.replace(table, cp_comm=cp_comm), fallback, rejected


def _distinct_finder(space: SearchSpace, table: ConfigTable) -> DistinctIndex:
    """How to number the distinct combinations of some axes (table's columns, cp_comm_allowed from ``space``) over
    the rows of ``table``: what a shape decides is numbered once per shape where ``space`` has its shapes
    (table.distinct_index_by_parent)."""
    def column(axis: str) -> np.ndarray:
        values = space.cp_comm_allowed if axis == "cp_comm_allowed" else getattr(table, axis)
        assert values is not None  # cp_comm_allowed is asked for only where the CP variants were collapsed
        return values

    def find(axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        if space.shapes is None or space.shape_of_row is None:
            return distinct_index([column(axis) for axis in axes])
        on_shape = [axis for axis in axes if axis in space.shapes]
        return distinct_index_by_parent(space.shape_of_row, [space.shapes[axis] for axis in on_shape],
                                        [column(axis) for axis in axes if axis not in on_shape])
    return find


def _estimate(job: TrainingJob, cluster: ClusterSpec, table: ConfigTable, rates: ComputeRates | None) -> EstimateTable:
    est = estimate(job.model, cluster, job.workload(), table, rates)
    return apply_step_factor(est, rates.step_time_factor) if rates is not None else est


def _rank(key: np.ndarray, table: ConfigTable, rows: np.ndarray) -> np.ndarray:
    """Order of ``rows`` of ``table`` by ``key`` (one value per row), ties by TIE_BREAK (smaller values first),
    then by position: what np.lexsort over all of them gives, without sorting every row by every column.
    Ties are few, so the rows are sorted by ``key`` alone and only the tied runs by the rest."""
    by_key = np.argsort(key)
    sorted_key = key[by_key]
    tied = sorted_key[1:] == sorted_key[:-1]  # position i ties with i + 1
    if np.isnan(sorted_key[-1:]).any():  # NaN never equals itself: leave such keys to the full sort
        return np.lexsort(tuple(getattr(table, axis)[rows] for axis in reversed(TIE_BREAK)) + (key,))
    if not tied.any():
        return by_key
    in_run = np.zeros(len(key), dtype=bool)
    in_run[:-1] |= tied
    in_run[1:] |= tied
    positions = np.flatnonzero(in_run)
    run = np.cumsum(np.r_[True, sorted_key[positions[1:]] != sorted_key[positions[:-1]]])
    tied_rows = by_key[positions]
    within = np.lexsort((tied_rows,) + tuple(getattr(table, axis)[rows[tied_rows]] for axis in reversed(TIE_BREAK))
                        + (run,))
    by_key[positions] = tied_rows[within]
    return by_key


_Record = TypeVar("_Record", bound="DataclassInstance")
"""An estimate table or one of the dataclasses of per-row arrays it holds."""
_Block = TypeVar("_Block")
"""What pricing one block of rows gives."""


@dataclass(frozen=True, slots=True)
class _Limits:
    """What a row's memory must fit in, per GPU (bytes)."""

    gpu_bytes: float | np.ndarray
    """Usable HBM less the job's headroom."""
    host_bytes: float
    """Host memory for offloaded activations."""


@dataclass(frozen=True, slots=True)
class _Fit:
    """The fit decision on some rows."""

    required_bytes: np.ndarray
    """Memory each row requires on its GPU."""
    gpu: np.ndarray
    """Whether it fits in the GPU's memory."""
    fits: np.ndarray
    """Whether it fits in the GPU's memory and its offloaded activations in host memory."""


def _fit(required_bytes: np.ndarray, host_bytes: np.ndarray, limits: _Limits) -> _Fit:
    """Which rows, requiring ``required_bytes`` on the GPU and ``host_bytes`` of host memory, fit within ``limits``."""
    gpu = required_bytes <= limits.gpu_bytes
    return _Fit(required_bytes=required_bytes, gpu=gpu, fits=gpu & np.broadcast_to(host_bytes <= limits.host_bytes,
                                                                                  gpu.shape))


@dataclass(slots=True)
class _Tally:
    """What the fit decision found over the rows priced so far, each row counted once (with its final CP variant)."""

    over_gpu: int = 0
    over_host: int = 0
    """Rows that fit the GPU but whose offloaded activations exceed host memory."""
    fitting: int = 0
    smallest_bytes: float = math.inf
    """Least memory a row requires (NaN if any row's is NaN, as numpy's min says)."""

    def add(self, fit: _Fit, final: np.ndarray | None = None) -> None:
        """Count the rows of ``fit`` (those where ``final`` is set)."""
        counted = slice(None) if final is None else final
        self.over_gpu += int(np.count_nonzero(~fit.gpu[counted]))
        self.over_host += int(np.count_nonzero((fit.gpu & ~fit.fits)[counted]))
        self.fitting += int(np.count_nonzero(fit.fits[counted]))
        if fit.required_bytes[counted].size:
            self.smallest_bytes = float(np.minimum(self.smallest_bytes, fit.required_bytes[counted].min()))


def _per_row(record: _Record, size: int) -> _Record:
    """``record`` with every array broadcast to ``size`` rows (a term the cost model left scalar)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, np.ndarray):
            changes[field.name] = np.broadcast_to(value, (size,))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = _per_row(value, size)
    return dataclasses.replace(record, **changes)


def _joined(first: _Record, second: _Record) -> _Record:
    """The rows of ``first``, then those of ``second`` (records of per-row arrays)."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(first):
        value = getattr(first, field.name)
        if isinstance(value, np.ndarray):
            changes[field.name] = np.concatenate([value, getattr(second, field.name)])
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes[field.name] = _joined(value, getattr(second, field.name))
    return dataclasses.replace(first, **changes)


def _within_best(keys: np.ndarray, keep: int) -> np.ndarray:
    """Per key, whether it may rank among the ``keep`` best: it is no worse than the keep-th smallest. NaN sorts
    last, as in numpy's sorts (where fewer than ``keep`` keys are numbers, every key stays); keys tied with the
    keep-th stay, for the tie-break to decide."""
    if len(keys) <= keep:
        return np.ones(len(keys), dtype=bool)
    bound = np.partition(keys, keep - 1)[keep - 1]
    return np.ones(len(keys), dtype=bool) if np.isnan(bound) else keys <= bound


class _EveryRow:
    """Collects the estimates of every row: a search without ``keep``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fits = np.zeros(size, dtype=bool)
        self.estimates: EstimateTable | None = None
        self.owned = False  # whether ``estimates`` holds arrays of its own, to write rows into

    def add(self, rows: np.ndarray | slice, est: EstimateTable, fits: np.ndarray) -> None:
        """Take the estimates and the fit of ``rows`` (a row given again takes its later numbers)."""
        self.fits[rows] = fits
        if self.estimates is None and rows == slice(0, self.size):
            self.estimates = est  # one block covers the table: nothing to copy
            return
        if self.estimates is None or not self.owned:
            whole = allocated_like(est, self.size)
            if self.estimates is not None:
                fill_rows(whole, slice(0, self.size), self.estimates)
            self.estimates, self.owned = whole, True
        fill_rows(self.estimates, rows, est)

    def ranked(self, table: ConfigTable, objective: Objective) -> tuple[ConfigTable, EstimateTable, np.ndarray]:
        """The whole table (int64 columns), its estimates and the fitting rows, best first."""
        assert self.estimates is not None  # every search prices a block, if empty
        fitting = np.flatnonzero(self.fits)
        key = _objective_key(objective, self.estimates)
        return widened(table), self.estimates, fitting[_rank(np.round(key[fitting], 12), table, fitting)]


class _BestRows:
    """Keeps, of the rows priced so far, those that fit and may still rank among the best ``keep``: a search with
    ``keep``. Their estimates are the ones their blocks priced, so the kept numbers are the full search's."""

    def __init__(self, keep: int, objective: Objective) -> None:
        self.keep, self.objective = keep, objective
        self.rows = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros(0)
        self.estimates: EstimateTable | None = None

    def add(self, rows: np.ndarray | slice, est: EstimateTable, fits: np.ndarray) -> None:
        """Join the fitting ones of ``rows`` (estimates ``est``) and drop every row that can no longer rank."""
        chosen = np.flatnonzero(fits)
        est = take_rows(_per_row(est, len(fits)), chosen)
        ids = (np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows)[chosen]
        keys = np.round(_objective_key(self.objective, est), 12)
        if self.estimates is not None:
            if len(self.keys) >= self.keep:  # already worse than the kept rows' keep-th: skip before joining
                near = _within_best(np.concatenate([self.keys, keys]), self.keep)[len(self.keys):]
                ids, keys, est = ids[near], keys[near], take_rows(est, np.flatnonzero(near))
            ids, keys = np.concatenate([self.rows, ids]), np.concatenate([self.keys, keys])
            est = _joined(self.estimates, est)
        stay = _within_best(keys, self.keep)
        self.rows, self.keys, self.estimates = ids[stay], keys[stay], take_rows(est, np.flatnonzero(stay))

    def keep_th(self) -> float:
        """The keep-th smallest key kept (inf while fewer rows are kept; NaN where fewer are numbers): a row whose
        key is larger can no longer rank."""
        return float(np.partition(self.keys, self.keep - 1)[self.keep - 1]) if len(self.keys) >= self.keep \
            else math.inf

    def ranked(self, table: ConfigTable, objective: Objective) -> tuple[ConfigTable, EstimateTable, np.ndarray]:
        """The kept rows best first (int64 columns), their estimates and ranks 0, 1, ...: ranked as the full
        search ranks them, since its tie-break by position follows the row order restored here."""
        assert self.estimates is not None  # every search prices a block, if empty
        by_row = np.argsort(self.rows)
        order = by_row[_rank(self.keys[by_row], table.take(self.rows[by_row]), np.arange(len(by_row)))][:self.keep]
        return widened(table.take(self.rows[order])), take_rows(self.estimates, order), np.arange(len(order))


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


FIRST_TIMED_ROWS = 4096
"""Candidates a search that keeps its best rows times first, those with the smallest step-time bounds: the keep-th
best step among them is the bound every other candidate must not pass to be timed."""
# A bound "passes" a step by more than the rounding of two sums of the same terms in different orders.
BOUND_SLACK_FRAC = 1e-9
BOUND_SLACK_S = 1e-9


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


def search(job: TrainingJob, cluster: ClusterSpec, fixed: dict[str, list[int]] | None = None,
           objective: str = "throughput", rates: ComputeRates | None = None, *, keep: int | None = None,
           rows_per_block: int = ROWS_PER_BLOCK) -> SearchResult:
    """Every valid configuration of ``job`` on ``cluster``, ranked by ``objective``.

    ``keep``: return only the best ``keep`` fitting rows, best first (``evaluated``, ``fitting`` and the rejections
    still count every row). The rows are priced ``rows_per_block`` at a time, each block freed once its rows are
    ranked against the best so far, and rows that do not fit are never timed: memory follows the block and the kept
    rows instead of the table (DeepSeek-V3 on 2,048 GPUs: 2.7 million rows, 0.76 GB of estimates), and the kept
    rows and their numbers are those of the full search, bit for bit."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r} (choose {', '.join(OBJECTIVES)})")
    _check_request(job, cluster, objective, keep)
    space = enumerate_space(job, cluster, engine_rules(job.engine), fixed, collapse_cp_comm=True, compact=True)
    table, fallback, rejected = _fastest_cp_comm(job, cluster, space, rates, objective)
    limits = _Limits(gpu_bytes=usable_capacity_bytes(cluster.gpu.hbm_bytes) * (1.0 - job.memory_headroom_frac),
                     host_bytes=cluster.host_memory_per_gpu)
    sink: _EveryRow | _BestRows = _EveryRow(len(table)) if keep is None else _BestRows(keep, objective)
    tally = _Tally()
    shared = shared_terms(job.model, cluster, job.workload(), table, rates, _distinct_finder(space, table))
    factor = rates.step_time_factor if rates is not None else 1.0
    if isinstance(sink, _EveryRow):
        refit = _price_every_row(shared, table, fallback, limits, sink, tally, rows_per_block, factor)
    else:
        refit = _price_best_rows(shared, table, fallback, limits, sink, tally, rows_per_block, factor)
    # An all-gather row that does not fit falls back to its next fastest variant, whose memory is smaller.
    if len(refit):
        cp_comm = table.cp_comm.copy()
        cp_comm[refit] = fallback[refit]
        table = dataclasses.replace(table, cp_comm=cp_comm)
        est = _estimate(job, cluster, table.take(refit), rates)
        fit = _fit(est.memory.required_bytes, est.memory.host_bytes, limits)
        tally.add(fit)
        sink.add(refit, est, fit.fits)
    for reason, failed in ((MEMORY_REASON, tally.over_gpu), (HOST_MEMORY_REASON, tally.over_host)):
        if failed:
            rejected[reason] = failed
    kept, est, ranked = sink.ranked(table, objective)
    return SearchResult(table=kept, estimates=est, ranked=ranked, rejected=rejected, considered=space.considered,
                        smallest_memory_bytes=tally.smallest_bytes if len(table) else float("nan"),
                        evaluated=len(table), fitting=tally.fitting)


def explain_no_fit(result: SearchResult, cluster: ClusterSpec) -> str:
    """One sentence on why nothing fits."""
    if result.evaluated == 0:
        if not result.rejected:
            return "no configuration satisfies the engine rules and your constraints (no candidates)"
        # Rules run in order and each candidate counts against the first it breaks, so the last rule that
        # removed any is the one the furthest candidates met: the one that removed the user's constraint
        # (most candidates fall to tp·pp·cp not dividing the GPU count, which explains nothing).
        last, removed = list(result.rejected.items())[-1]
        top = max(result.rejected.items(), key=lambda item: item[1])[0]
        most = "" if top == last else f"; most candidates fell earlier, to: {top}"
        return (f"no configuration satisfies the engine rules and your constraints: the last {removed:,} "
                f"candidates fell to: {last}{most}")
    need = result.smallest_memory_bytes / BYTES_PER_GIB
    have = cluster.gpu.hbm_bytes / BYTES_PER_GIB
    return (f"no configuration fits: the smallest memory need is {need:.1f} GiB per GPU but "
            f"{cluster.gpu.name} has {have:.0f} GiB; use more GPUs, a shorter sequence or a larger GPU")
