"""Search: enumerate, estimate in one vectorized pass, keep what fits, rank, return the top K."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from paraplan.cost_models.compute import ComputeRates
from paraplan.cost_models.estimate import EstimateTable, default_rates, estimate
from paraplan.cost_models.layer import cp_comm_variants_per_layer_s
from paraplan.cost_models.learned.step_calibration import apply_step_factor
from paraplan.cost_models.table import ConfigTable
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.units import BYTES_PER_GIB, SECONDS_PER_HOUR
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import SearchSpace, enumerate_space

Objective = Literal["throughput", "cost", "memory"]
OBJECTIVES = ("throughput", "cost", "memory")
MEMORY_REASON = "does not fit in GPU memory"
HOST_MEMORY_REASON = "offloaded activations exceed host memory"
DOMINATED_CP_REASON = "another context-parallel variant of the same layout is faster"
# Equal predictions rank the simpler layout first: fewer kinds of parallelism and memory tricks
# to debug (context, pipeline, interleaving, tensor; offload, recompute, sharding), then the rest.
TIE_BREAK = ("cp", "cp_comm", "pp", "vpp", "tp", "offload", "recompute", "zero", "sp", "ep_overlap", "etp", "ep", "dp", "mbs")


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Ranked rows of the evaluated table and what was rejected."""

    table: object
    """The evaluated ConfigTable."""
    estimates: EstimateTable
    ranked: np.ndarray
    """Row indices of fitting candidates, best first."""
    rejected: dict[str, int]
    considered: int
    smallest_memory_bytes: float
    """Lowest peak memory seen among rule-valid candidates (for 'fits nowhere' messages)."""


def _objective_key(objective: str, job: TrainingJob, cluster: ClusterSpec, est: EstimateTable) -> np.ndarray:
    if objective == "throughput":
        return est.step_time_s
    if objective == "memory":
        return est.memory.peak_bytes
    price = cluster.gpu.price_usd_per_gpu_hour
    if price is None:
        raise InputError(f"--objective cost needs a price for {cluster.gpu.name}; the catalog has none "
                         "(use --objective throughput or memory)")
    usd_per_s = price * cluster.num_gpus / SECONDS_PER_HOUR
    return usd_per_s / est.tokens_per_s  # dollars per token


def _fastest_cp_comm(job: TrainingJob, cluster: ClusterSpec, space: SearchSpace,
                     rates: ComputeRates | None) -> tuple[ConfigTable, dict[str, int]]:
    """Each collapsed row gets the fastest CP variant its rules allow (ties: the lowest code, p2p first).
    The variant changes only the exposed CP time, which every objective ranks the same way or not at
    all (memory), so the others are dominated; they are counted, not estimated."""
    rejected = dict(space.rejected)
    allowed, table = space.cp_comm_allowed, space.table
    if allowed is None or not np.any(allowed & (allowed - 1)):
        return table, rejected
    work = job.workload()
    rates = rates or default_rates(cluster, work)
    several = np.flatnonzero(allowed & (allowed - 1))
    subset = table.take(several)
    times = cp_comm_variants_per_layer_s(job.model, work, subset, rates, cluster)
    codes = sorted(times)
    cost = np.stack([np.where(allowed[several] >> code & 1, times[code], np.inf) for code in codes])
    cp_comm = table.cp_comm.copy()
    cp_comm[several] = np.asarray(codes)[np.argmin(cost, axis=0)]
    dominated = int(np.sum(np.isfinite(cost)) - len(several))
    rejected[DOMINATED_CP_REASON] = dominated
    return dataclasses.replace(table, cp_comm=cp_comm), rejected


def search(job: TrainingJob, cluster: ClusterSpec, fixed: dict[str, list[int]] | None = None,
           objective: str = "throughput", rates: ComputeRates | None = None) -> SearchResult:
    """Every valid configuration of ``job`` on ``cluster``, ranked by ``objective``."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r} (choose {', '.join(OBJECTIVES)})")
    try:
        cluster.gpu.peak(job.precision)
    except ValueError as exc:
        raise InputError(f"{exc}; choose another --precision") from None
    space = enumerate_space(job, cluster, engine_rules(job.engine), fixed, collapse_cp_comm=True)
    table, rejected = _fastest_cp_comm(job, cluster, space, rates)
    est = estimate(job.model, cluster, job.workload(), table, rates)
    est = apply_step_factor(est, rates.step_time_factor) if rates is not None else est
    capacity = cluster.gpu.hbm_bytes * (1.0 - job.memory_headroom_frac)
    fits_gpu = est.memory.peak_bytes <= capacity
    fits_host = est.memory.host_bytes <= cluster.host_memory_per_gpu
    fits = fits_gpu & fits_host
    for reason, failed in ((MEMORY_REASON, ~fits_gpu), (HOST_MEMORY_REASON, fits_gpu & ~fits_host)):
        if int(failed.sum()):
            rejected[reason] = int(failed.sum())
    key = _objective_key(objective, job, cluster, est)
    # Deterministic ties: the objective, then TIE_BREAK, smaller values first.
    fitting = np.flatnonzero(fits)
    ranked = fitting[np.lexsort(tuple(getattr(table, axis)[fitting] for axis in reversed(TIE_BREAK))
                                + (np.round(key[fitting], 12),))]
    smallest = float(est.memory.peak_bytes.min()) if len(table) else float("nan")
    return SearchResult(table=table, estimates=est, ranked=ranked, rejected=rejected,
                        considered=space.considered, smallest_memory_bytes=smallest)


def explain_no_fit(result: SearchResult, cluster: ClusterSpec) -> str:
    """One sentence on why nothing fits."""
    if len(result.table) == 0:
        top = max(result.rejected.items(), key=lambda item: item[1])[0] if result.rejected else "no candidates"
        return f"no configuration satisfies the engine rules and your constraints (most common reason: {top})"
    need = result.smallest_memory_bytes / BYTES_PER_GIB
    have = cluster.gpu.hbm_bytes / BYTES_PER_GIB
    return (f"no configuration fits: the smallest memory need is {need:.1f} GiB per GPU but "
            f"{cluster.gpu.name} has {have:.0f} GiB; use more GPUs, a shorter sequence or a larger GPU")
