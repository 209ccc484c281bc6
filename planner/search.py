"""Search: enumerate, estimate in one vectorized pass, keep what fits, rank, return the top K."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from paraplan.choices import CP_COMM_CODES, OBJECTIVES, Objective
from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.device_memory import usable_capacity_bytes
from paraplan.cost_models.estimate import EstimateTable, default_rates, estimate
from paraplan.cost_models.fp8_recipes import recipe_error
from paraplan.cost_models.layer import cp_comm_variants_per_layer_s
from paraplan.cost_models.learned.step_calibration import apply_step_factor
from paraplan.cost_models.table import ConfigTable, distinct_index
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import SearchSpace, enumerate_space

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
    """The evaluated candidates."""
    estimates: EstimateTable
    ranked: np.ndarray
    """Row indices of fitting candidates, best first."""
    rejected: dict[str, int]
    considered: int
    smallest_memory_bytes: float
    """Lowest peak memory seen among rule-valid candidates (for 'fits nowhere' messages)."""


def _objective_key(objective: Objective, job: TrainingJob, cluster: ClusterSpec, est: EstimateTable) -> np.ndarray:
    if objective == "throughput":
        return est.step_time_s
    if objective == "memory":
        return est.memory.peak_bytes
    if cluster.gpu.price_usd_per_gpu_hour is None:
        raise InputError(f"--objective cost needs a price for {cluster.gpu.name}; the catalog has none "
                         "(give --price-per-gpu-hour, or use --objective throughput or memory)")
    # Dollars for a fixed budget on one cluster = price x GPUs x steps x step time: the step time times a constant,
    # so rows rank exactly as by step time (planner/run/cost.py prices the run; a cheaper, slower GPU type can win
    # only between clusters, as in planner/run/sweep.py's best_per_size).
    return est.step_time_s


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
    no_fallback = np.full(len(table), -1, dtype=np.int64)
    if allowed is None or not np.any(allowed & (allowed - 1)):
        return table, no_fallback, rejected
    work = job.workload()
    rates = rates or default_rates(cluster, work)
    several = np.flatnonzero(allowed & (allowed - 1))
    # The variants' times read only CP_VARIANT_AXES: decide once per distinct combination and allowed mask.
    distinct, of_row = distinct_index([getattr(table, axis)[several] for axis in CP_VARIANT_AXES]
                                      + [allowed[several]])
    representative = several[distinct]
    times = cp_comm_variants_per_layer_s(job.model, work, table.take(representative), rates, cluster)
    codes = np.asarray(sorted(times))
    gathers = codes == ALL_GATHER
    permitted = np.stack([(allowed[representative] >> code & 1).astype(bool) for code in codes])
    if objective == "memory":
        key = np.stack([np.full(len(distinct), 1.0 if g else 0.0) for g in gathers])
    else:
        key = np.stack([times[code] for code in codes])
    cost = np.where(permitted, key, np.inf)
    chosen = codes[np.argmin(cost, axis=0)]
    others = np.where(gathers[:, None], np.inf, cost)
    next_best = np.where((chosen == ALL_GATHER) & np.isfinite(others.min(axis=0)), codes[np.argmin(others, axis=0)], -1)
    cp_comm = table.cp_comm.copy()
    cp_comm[several] = chosen[of_row]
    fallback = no_fallback.copy()
    fallback[several] = next_best[of_row]
    rows_per_distinct = np.bincount(of_row, minlength=len(distinct))
    rejected[DOMINATED_CP_REASON] = int(np.sum(rows_per_distinct * permitted.sum(axis=0)) - len(several))
    return dataclasses.replace(table, cp_comm=cp_comm), fallback, rejected


_Record = TypeVar("_Record", bound="DataclassInstance")


def _splice(whole: _Record, rows: np.ndarray, part: _Record) -> _Record:
    """``whole`` (an estimate table or one of its dataclasses) with ``rows`` replaced by ``part``'s rows."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(whole):
        value, new = getattr(whole, field.name), getattr(part, field.name)
        if isinstance(value, np.ndarray):
            value = value.copy()
            value[rows] = new
            changes[field.name] = value
        elif dataclasses.is_dataclass(value):
            changes[field.name] = _splice(value, rows, new)
    return dataclasses.replace(whole, **changes)


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


def search(job: TrainingJob, cluster: ClusterSpec, fixed: dict[str, list[int]] | None = None,
           objective: str = "throughput", rates: ComputeRates | None = None) -> SearchResult:
    """Every valid configuration of ``job`` on ``cluster``, ranked by ``objective``."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r} (choose {', '.join(OBJECTIVES)})")
    try:
        cluster.gpu.peak(job.precision)
    except ValueError as exc:
        raise InputError(f"{exc}; choose another --precision") from None
    if job.precision == "fp8":
        problem = recipe_error(job.fp8_recipe, cluster.gpu.architecture, cluster.gpu.name)
        if problem:
            raise InputError(problem)
    space = enumerate_space(job, cluster, engine_rules(job.engine), fixed, collapse_cp_comm=True)
    table, fallback, rejected = _fastest_cp_comm(job, cluster, space, rates, objective)
    est = _estimate(job, cluster, table, rates)
    capacity = usable_capacity_bytes(cluster.gpu.hbm_bytes) * (1.0 - job.memory_headroom_frac)
    # An all-gather row that does not fit falls back to its next fastest variant, whose memory is smaller.
    refit = np.flatnonzero((fallback >= 0) & (est.memory.required_bytes > capacity))
    if len(refit):
        cp_comm = table.cp_comm.copy()
        cp_comm[refit] = fallback[refit]
        table = dataclasses.replace(table, cp_comm=cp_comm)
        est = _splice(est, refit, _estimate(job, cluster, table.take(refit), rates))
    fits_gpu = est.memory.required_bytes <= capacity
    fits_host = est.memory.host_bytes <= cluster.host_memory_per_gpu
    fits = fits_gpu & fits_host
    for reason, failed in ((MEMORY_REASON, ~fits_gpu), (HOST_MEMORY_REASON, fits_gpu & ~fits_host)):
        if int(failed.sum()):
            rejected[reason] = int(failed.sum())
    key = _objective_key(objective, job, cluster, est)
    fitting = np.flatnonzero(fits)
    ranked = fitting[_rank(np.round(key[fitting], 12), table, fitting)]
    smallest = float(est.memory.required_bytes.min()) if len(table) else float("nan")
    return SearchResult(table=table, estimates=est, ranked=ranked, rejected=rejected,
                        considered=space.considered, smallest_memory_bytes=smallest)


def explain_no_fit(result: SearchResult, cluster: ClusterSpec) -> str:
    """One sentence on why nothing fits."""
    if len(result.table) == 0:
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
