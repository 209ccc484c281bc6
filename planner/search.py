"""Search: enumerate, price a block of rows at a time, keep what fits, rank, return the top K.

The entry point (``search``, ``SearchResult``, ``explain_no_fit``) with the request's checks and the choice of each
layout's context-parallel variant. The parts it runs live beside it: search_ranking.py (ranking keys and the
tie-break), search_sinks.py (memory limits, the fit tally, where priced rows go), search_blocks.py (block pricing,
screening and its threads)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from paraplan.choices import CP_COMM_CODES, OBJECTIVES, Objective
from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.cost_models.estimate import (
    ROWS_PER_BLOCK,
    EstimateTable,
    default_rates,
    estimate,
    shared_terms,
    widened,
)
from paraplan.cost_models.fp8_recipes import recipe_error
from paraplan.cost_models.layer import cp_comm_variants_per_layer_s
from paraplan.cost_models.learned.step_calibration import apply_step_factor
from paraplan.cost_models.table import ConfigTable, DistinctIndex, distinct_index, distinct_index_by_parent
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search_blocks import _price_best_rows, _price_every_row
from paraplan.planner.search_ranking import TIE_BREAK as TIE_BREAK  # re-exported: callers and tests import it here
from paraplan.planner.search_ranking import _rank as _rank  # re-exported: tests rank with it
from paraplan.planner.search_sinks import _BestRows, _EveryRow, _fit, _Limits, _Tally
from paraplan.planner.space import SearchSpace, enumerate_space

MEMORY_REASON = "does not fit in GPU memory"
HOST_MEMORY_REASON = "offloaded activations exceed host memory"
DOMINATED_CP_REASON = "another context-parallel variant of the same layout is faster"
ALL_GATHER = CP_COMM_CODES["allgather"]
# What layer.cp_comm_variants_per_layer_s reads: the variants' exposed times are equal wherever these are.
CP_VARIANT_AXES = ("tp", "cp", "mbs", "recompute")


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
