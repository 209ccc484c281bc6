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

from dataclasses import dataclass, replace

import numpy as np

from paraplan.planner.serving.load import aggregated
from paraplan.planner.serving.plan import ServingPlan, exact_latency, make_pool
from paraplan.planner.serving.search import (
    MAX_UTILISATION_WITHOUT_TARGETS,
    PoolSide,
    interpolated_step,
    load_for,
    target_quantile,
)
from paraplan.planner.serving.space import batch_caps

BISECTION_STEPS = 40
"""Halvings of the rate bracket (a factor 1e4 wide in log space): 40 steps leave 2e-11 of it."""
SOLVER_TIME_LIMIT_S = 10.0
"""CBC's limit for one fleet: far above what they take (measured: 7-21 variables, 6-28 ms a program with two and
three GPU types on the 2-core machine)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetOption:
    """One kind of worker the fleet may hold."""

    side: PoolSide
    shard: int
    chunk: int
    cap: float
    gpus: int
    """GPUs of one worker."""
    capacity_per_s: float
    """Requests per second one worker carries within the targets."""
    usd_per_hour: float | None
    """One worker's GPUs at their price."""


def _meets(latency, workload, prefill_busy) -> np.ndarray:
    """Within the targets, or without targets with the prefill queue at most 85% busy."""
    ok = latency.stable & np.isfinite(latency.ttft_s) & np.isfinite(latency.tpot_s)
    if workload.ttft_target_s is not None:
        ok &= latency.ttft_s <= workload.ttft_target_s
    if workload.tpot_target_s is not None:
        ok &= latency.tpot_s <= workload.tpot_target_s
    if workload.ttft_target_s is None and workload.tpot_target_s is None:
        ok &= prefill_busy <= MAX_UTILISATION_WITHOUT_TARGETS
    return ok


def worker_capacity(side: PoolSide, workload, s, k, cap) -> np.ndarray:
    """Highest request rate one worker of each configuration carries within the targets (0 if none)."""
    costs = side.costs
    base = load_for(workload, side.setup)
    kw = {"prefill_s": costs.prefill_s[s], "step_of": interpolated_step(costs, s), "fits": costs.fits[s, k], "cap": cap,
          "chunk": np.asarray(costs.chunks, dtype=float)[k], "replicas": 1.0, "ranks": costs.shard.dp[s]}
    hi = costs.shard.dp[s] / costs.prefill_s[s]  # prefill alone saturates the GPUs beyond this rate
    lo = hi * 1e-4
    q = target_quantile(workload)

    def ok(rate):
        load = replace(base, rate_per_s=rate)
        return _meets(aggregated(load, q=q, **kw), workload, rate / costs.shard.dp[s] * costs.prefill_s[s])
    good = ok(lo)
    for _ in range(BISECTION_STEPS):
        mid = np.sqrt(lo * hi)
        fine = ok(mid)
        lo, hi = np.where(fine, mid, lo), np.where(fine, hi, mid)
    return np.where(good, lo, 0.0)


def fleet_options(side: PoolSide, workload, fixed) -> list[FleetOption]:
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
    objective: float
    status: str


def solve_fleet(options: list[FleetOption], rate_per_s: float, available: dict[str, int], by_cost: bool
                ) -> FleetSolution | None:
    """The cheapest (or fewest-GPU) integer worker counts that carry ``rate_per_s`` within each type's GPUs;
    None when no counts can."""
    import pulp

    if not options:
        return None
    problem = pulp.LpProblem("serving_fleet", pulp.LpMinimize)
    x = [pulp.LpVariable(f"workers_{n}", lowBound=0, cat="Integer") for n in range(len(options))]
    weight = [o.usd_per_hour if by_cost else float(o.gpus) for o in options]
    problem += pulp.lpSum(w * v for w, v in zip(weight, x))
    problem += pulp.lpSum(o.capacity_per_s * v for o, v in zip(options, x)) >= rate_per_s
    for gpu, limit in available.items():
        problem += pulp.lpSum(o.gpus * v for o, v in zip(options, x) if o.side.setup.cluster.gpu.name == gpu) <= limit
    status = problem.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=SOLVER_TIME_LIMIT_S))
    if pulp.LpStatus[status] != "Optimal":
        return None
    counts = tuple(round(v.value() or 0) for v in x)
    return FleetSolution(counts=counts, objective=float(sum(w * n for w, n in zip(weight, counts))), status="optimal")


def fleet_plan(problem, options: list[FleetOption], solution: FleetSolution) -> ServingPlan:
    """The fleet as a plan: one aggregated pool per option used, each priced exactly at its share of the rate."""
    from paraplan.planner.serving.rank import _prices, plan_estimate

    rate = problem.workload.arrivals.rate_per_s
    used = [(o, n) for o, n in zip(options, solution.counts) if n > 0]
    total = sum(o.capacity_per_s * n for o, n in used)
    pools, parts = [], []
    for o, n in used:
        share = o.capacity_per_s * n / total
        pool = make_pool("aggregated", o.side.setup, o.side.costs, o.shard, o.chunk, o.cap, n, traffic_frac=share)
        base = load_for(problem.workload, o.side.setup)
        stats, flow = exact_latency(replace(base, rate_per_s=rate * share), (pool,))
        pools.append(pool)
        parts.append((share, stats, flow))
    stats = {m: {name: (sum(w * st[m][name] for w, st, _ in parts) if name == "mean"
                        else max(st[m][name] for _, st, _ in parts)) for name in ("mean", "p50", "p90", "p99")}
             for m in ("ttft_s", "tpot_s")}
    flow = {"requests_per_s": rate, "running_batch": max(f["running_batch"] for _, _, f in parts)}
    estimate, meets = plan_estimate(problem, "agg", tuple(pools), stats, flow, _prices(problem))
    return ServingPlan(rank=0, setup=pools[0].setup, mode="agg", pools=tuple(pools), estimate=estimate,
                       meets_targets=meets)


def fleet_plans(problem, priced) -> list[ServingPlan]:
    """One fleet per engine and KV dtype over every GPU type (open loop only)."""
    if problem.choices.objective == "latency":
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
        solution = solve_fleet(options, problem.workload.arrivals.rate_per_s, available, by_cost)
        if solution is not None:
            plans.append(fleet_plan(problem, options, solution))
    return plans
