"""A scaling sweep: the best plan at each GPU count and GPU type, with its whole run, so a user sees where adding
GPUs stops paying. Each point is an ordinary search (planner/search.py) and an ordinary run cost.

Global batch co-tuning: within a stated range the sweep tries every power of two and keeps, per point, the batch
whose run is shortest. The token budget stays fixed: a larger batch changes convergence (tokens to reach a given
loss), which paraplan does not model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from paraplan.cost_models.compute import ComputeRates
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.job import TrainingJob
from paraplan.planner.plan import Plan, plan_at
from paraplan.planner.run.cost import RunCost, RunOptions, run_cost
from paraplan.planner.search import search


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepPoint:
    """The best plan (of rank ``plan.rank``) at one GPU count and type, and its run."""

    num_gpus: int
    """GPUs of the point."""
    gpu: str
    """Catalog name of the GPU type."""
    global_batch: int
    """Sequences per step the point was planned with (co-tuned within the range, or the one given)."""
    plan: Plan
    """The plan."""
    run: RunCost
    """Its whole run."""
    cost_model: str
    """Which cost model priced the plan (the plan JSON's provenance)."""


def batch_candidates(low: int, high: int) -> list[int]:
    """Powers of two in [low, high] (the range's ends when none is)."""
    if not 1 <= low <= high:
        raise InputError("--global-batch-range expects LOW:HIGH with 1 <= LOW <= HIGH (e.g. 512:2048), "
                         f"got {low}:{high}")
    powers = [1 << k for k in range(low.bit_length() - 1, high.bit_length()) if low <= 1 << k <= high]
    return powers or sorted({low, high})


def best_plans(job: TrainingJob, cluster: ClusterSpec, fixed: dict[str, list[int]], objective: str,
               rates: ComputeRates | None, top: int) -> tuple[list[Plan], str]:
    """The ``top`` best plans of one search (empty when nothing fits) and the cost model that priced them."""
    result = search(job, cluster, fixed, objective, rates)
    plans = [plan_at(job, cluster, result, int(row), rank) for rank, row in enumerate(result.ranked[:top], start=1)]
    return plans, result.estimates.cost_model


def sweep_point(job: TrainingJob, cluster: ClusterSpec, fixed: dict[str, list[int]], objective: str,
                rates: ComputeRates | None, options: RunOptions, batches: list[int], top: int = 1) -> list[SweepPoint]:
    """The best ``top`` plans at one point, for the batch (of ``batches``) whose best plan runs shortest."""
    chosen: list[SweepPoint] = []
    for batch in batches:
        batch_job = dataclasses.replace(job, global_batch=batch)
        plans, cost_model = best_plans(batch_job, cluster, fixed, objective, rates, top)
        points = [SweepPoint(num_gpus=cluster.num_gpus, gpu=cluster.gpu.name, global_batch=batch, plan=p,
                             run=run_cost(p, options), cost_model=cost_model) for p in plans]
        if points and (not chosen or points[0].run.wall_s < chosen[0].run.wall_s):
            chosen = points
    return chosen


def scaling(points: list[SweepPoint]) -> list[tuple[float, float] | None]:
    """Per point, (speedup, efficiency) against the previous GPU count of the same GPU type (rank-1 plans only):
    speedup = previous wall time / this wall time, efficiency = speedup / (GPUs / previous GPUs). None for the
    first point of a type, other ranks, and runs that never finish."""
    previous: dict[str, SweepPoint] = {}
    out: list[tuple[float, float] | None] = []
    for point in points:
        before = previous.get(point.gpu) if point.plan.rank == 1 else None
        if before is not None and math.isfinite(point.run.wall_s) and math.isfinite(before.run.wall_s):
            speedup = before.run.wall_s / point.run.wall_s
            out.append((speedup, speedup / (point.num_gpus / before.num_gpus)))
        else:
            out.append(None)
        if point.plan.rank == 1:
            previous[point.gpu] = point
    return out


def best_per_size(points: list[SweepPoint], objective: str) -> dict[int, SweepPoint]:
    """Per GPU count, the rank-1 point that wins across GPU types: the cheapest run under ``cost`` (unpriced runs
    last), the shortest under throughput, the smallest peak memory under memory."""
    def key(point: SweepPoint) -> tuple[float, float]:
        if objective == "cost":
            return (math.inf if point.run.usd is None else point.run.usd, point.run.wall_s)
        if objective == "memory":
            return (point.plan.estimate["peak_memory_bytes"], point.run.wall_s)
        return (point.run.wall_s, 0.0)

    best: dict[int, SweepPoint] = {}
    for point in points:
        if point.plan.rank == 1 and (point.num_gpus not in best or key(point) < key(best[point.num_gpus])):
            best[point.num_gpus] = point
    return best
