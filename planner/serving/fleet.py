"""A serving fleet over several GPU types (Mélange, Griggs et al. 2024): aggregated workers of different types
behind one router, sized by an integer program to carry the request rate at the lowest cost.

Per GPU type, engine and KV dtype, each worker configuration (sharding, chunk, batch cap) has a capacity: the
highest request rate one worker carries while meeting the latency targets at the bound percentile (latency
grows with load, so bisection finds it). Per worker size (GPUs) only the configuration with the highest capacity
is kept. The integer program chooses worker counts x_k ≥ 0:

    minimise  Σ_k price_k · gpus_k · x_k          (dollars per hour; GPUs when the objective is throughput)
    subject to Σ_k capacity_k · x_k ≥ rate,        Σ_{k of type t} gpus_k · x_k ≤ GPUs of type t.

The router sends each pool requests in proportion to its capacity, so no worker is loaded beyond the rate it
was sized for. Solved with PuLP's CBC (the allowed MILP solver); tests check it against brute force.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paraplan.planner.serving.estimate import plan_estimate, prices_by_gpu
from paraplan.planner.serving.load import Latency, aggregated
from paraplan.planner.serving.plan import STATISTICS, PricedPool, ServingPlan, exact_latency, make_pool
from paraplan.planner.serving.pools import MAX_GRID_BATCH, admit_s
from paraplan.planner.serving.problem import Priced, ServingProblem
from paraplan.planner.serving.search import (
    PoolSide,
    interpolated_admit,
    interpolated_step,
    load_for,
    qualifies,
    target_quantile,
)
from paraplan.planner.serving.space import ServingWorkload, batch_caps

BISECTION_STEPS = 40
"""Halvings of the rate bracket (a factor 1e4 wide in log space): 40 steps leave 2e-11 of it."""
SOLVER_TIME_LIMIT_S = 10.0
"""CBC's limit for one fleet: far above what they take (measured: 7-21 variables, 6-28 ms a program with two and
three GPU types on the 2-core machine)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetOption:
    """One kind of worker the fleet may hold."""

    side: PoolSide
    """The GPU type, engine and KV dtype, with their costs."""
    shard: int
    """Row of the side's costs: the worker's sharding."""
    chunk: int
    """Column of the side's chunk sizes."""
    cap: float
    """Running-batch cap per attention-DP rank."""
    gpus: int
    """GPUs of one worker."""
    capacity_per_s: float
    """Requests per second one worker carries within the targets."""
    usd_per_hour: float | None
    """One worker's GPUs at their price."""


def _meets(latency: Latency, workload: ServingWorkload) -> np.ndarray:
    """Stable and within the targets, or without targets with the prefill queue at most 85% busy."""
    return latency.stable & qualifies(workload, latency.ttft_s, latency.tpot_s, latency.prefill_busy)


def worker_capacity(side: PoolSide, workload: ServingWorkload, s: np.ndarray, k: np.ndarray, cap: np.ndarray
                    ) -> np.ndarray:
    """Highest request rate one worker of each configuration (sharding row ``s``, chunk column ``k``, batch cap
    ``cap``) carries within the targets (0 if none)."""
    costs = side.costs
    base = load_for(workload, side.setup)
    kw: dict[str, Any] = {"prefill_s": costs.prefill_s[s], "step_of": interpolated_step(costs, s),
                          "fits": costs.fits[s, k], "cap": cap, "chunk": np.asarray(costs.chunks, dtype=float)[k],
                          "replicas": 1.0, "ranks": costs.shard.dp[s], "admit_of": interpolated_admit(costs, s, k)}
    lo = costs.shard.dp[s] / costs.prefill_s[s] * 1e-4
    # Prefill alone saturates the GPUs beyond this rate, its prompts batched as many a step as a rank can run.
    most = float(MAX_GRID_BATCH)
    hi = costs.shard.dp[s] / np.minimum(costs.prefill_s[s], admit_s(costs, s, k, most) / most)
    q = target_quantile(workload)

    def ok(rate: np.ndarray) -> np.ndarray:
        load = replace(base, rate_per_s=rate)
        return _meets(aggregated(load, q=q, **kw), workload)
    good = ok(lo)
    for _ in range(BISECTION_STEPS):
        mid = np.sqrt(lo * hi)
        fine = ok(mid)
        lo, hi = np.where(fine, mid, lo), np.where(fine, hi, mid)
    return np.where(good, lo, 0.0)


def fleet_options(side: PoolSide, workload: ServingWorkload, fixed: dict[str, tuple[int, ...]]) -> list[FleetOption]:
    """Per worker size on one GPU type, the configuration with the highest capacity."""
    costs = side.costs
    caps = batch_caps(side.setup.engine.max_running, fixed)
    s, k, c = (a.ravel() for a in np.meshgrid(np.arange(costs.gpus.size), np.arange(len(costs.chunks)),
                                              np.arange(caps.size), indexing="ij"))
    keep = (caps[c] <= np.asarray(costs.chunks, dtype=float)[k]) & (costs.fits[s, k] >= 1.0) \
        & (costs.gpus[s] <= side.budget)
    s, k, c = s[keep], k[keep], c[keep]
    capacity = worker_capacity(side, workload, s, k, caps[c])
    out = []
    for gpus in np.unique(costs.gpus[s]):
        rows = np.flatnonzero((costs.gpus[s] == gpus) & (capacity > 0))
        if rows.size:
            best = rows[np.argmax(capacity[rows])]
            out.append(FleetOption(side=side, shard=int(s[best]), chunk=int(k[best]), cap=float(caps[c[best]]),
                                   gpus=int(gpus), capacity_per_s=float(capacity[best]),
                                   usd_per_hour=None if side.price is None else side.price * float(gpus)))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSolution:
    """Worker counts per option, the objective and the solver's status."""

    counts: tuple[int, ...]
    """Workers of each option, in the options' order."""
    objective: float
    """USD per hour (cost) or GPUs (throughput) of the fleet."""
    status: str
    """The solver's status: optimal."""


def _weight(option: FleetOption, by_cost: bool) -> float:
    """What one worker of ``option`` costs the objective: USD per hour by cost, else its GPUs."""
    if not by_cost:
        return float(option.gpus)
    if option.usd_per_hour is None:  # check_prices refuses the cost objective without every price
        raise ValueError("the cost objective needs every GPU type's price")
    return option.usd_per_hour


def solve_fleet(options: list[FleetOption], rate_per_s: float, available: dict[str, int], by_cost: bool
                ) -> FleetSolution | None:
    """The cheapest (or fewest-GPU) integer worker counts that carry ``rate_per_s`` within each type's GPUs;
    None when no counts can."""
    import pulp

    if not options:
        return None
    weight = [_weight(o, by_cost) for o in options]
    problem = pulp.LpProblem("serving_fleet", pulp.LpMinimize)
    x = [pulp.LpVariable(f"workers_{n}", lowBound=0, cat="Integer") for n in range(len(options))]
    problem += pulp.lpSum(w * v for w, v in zip(weight, x))
    problem += pulp.lpSum(o.capacity_per_s * v for o, v in zip(options, x)) >= rate_per_s
    for gpu, limit in available.items():
        problem += pulp.lpSum(o.gpus * v for o, v in zip(options, x) if o.side.setup.cluster.gpu.name == gpu) <= limit
    status = problem.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=SOLVER_TIME_LIMIT_S))
    if pulp.LpStatus[status] != "Optimal":
        return None
    counts = tuple(round(v.value() or 0) for v in x)
    return FleetSolution(counts=counts, objective=float(sum(w * n for w, n in zip(weight, counts))), status="optimal")


def _combined(parts: Sequence[tuple[float, dict[str, dict[str, float]]]]) -> dict[str, dict[str, float]]:
    """The fleet's latencies from its pools' (share, statistics): the mean weighted by each pool's share of the
    requests, a percentile the worst pool's (an upper bound)."""
    return {m: {name: (sum(w * st[m][name] for w, st in parts) if name == "mean"
                       else max(st[m][name] for _, st in parts)) for name, _ in STATISTICS}
            for m in ("ttft_s", "tpot_s")}


def fleet_plan(problem: ServingProblem, options: list[FleetOption], solution: FleetSolution, rate_per_s: float
               ) -> ServingPlan:
    """The fleet as a plan: one aggregated pool per option used, each priced exactly at its share of the rate
    ``rate_per_s`` (requests per second)."""
    used = [(o, n) for o, n in zip(options, solution.counts) if n > 0]
    total = sum(o.capacity_per_s * n for o, n in used)
    pools: list[PricedPool] = []
    parts: list[tuple[float, dict[str, dict[str, float]]]] = []
    batches: list[float] = []
    for o, n in used:
        share = o.capacity_per_s * n / total
        pool = make_pool("aggregated", o.side.setup, o.side.costs, o.shard, o.chunk, o.cap, n,
                         problem.workload.max_model_len, traffic_frac=share)
        base = load_for(problem.workload, o.side.setup)
        stats, flow = exact_latency(replace(base, rate_per_s=rate_per_s * share), (pool,))
        pools.append(pool)
        parts.append((share, stats))
        batches.append(flow["running_batch"])
    flow = {"requests_per_s": rate_per_s, "running_batch": max(batches)}
    estimate, meets = plan_estimate(problem, "agg", tuple(pools), _combined(parts), flow, prices_by_gpu(problem))
    return ServingPlan(rank=0, setup=pools[0].setup, mode="agg", pools=tuple(pools), estimate=estimate,
                       meets_targets=meets)


def fleet_plans(problem: ServingProblem, priced: list[Priced]) -> list[ServingPlan]:
    """One fleet per engine and KV dtype over every GPU type (open loop only: none for a closed loop)."""
    arrivals = problem.workload.arrivals
    if problem.choices.objective == "latency" or arrivals is None:
        return []
    available = {c.gpu.name: c.num_gpus for c in problem.clusters}
    by_cost = problem.choices.objective == "cost"
    groups: dict[tuple[str, str], list[FleetOption]] = {}
    for p in priced:
        if p.side is not None:
            key = (p.side.setup.engine.name, p.side.setup.kv_dtype)
            groups.setdefault(key, []).extend(fleet_options(p.side, problem.workload, problem.choices.fixed))
    plans = []
    for options in groups.values():
        solution = solve_fleet(options, arrivals.rate_per_s, available, by_cost)
        if solution is not None:
            plans.append(fleet_plan(problem, options, solution, arrivals.rate_per_s))
    return plans
