"""``paraplan serve``'s library entry: price every setup, keep the deployments that meet the targets, rank them by
the objective, price the shown ones exactly, and trace the throughput/interactivity Pareto front.

With several GPU types (each with its own count and price) a deployment runs on one type, or prefill on one
and decode on another, or (an open loop) as a fleet of aggregated workers over several types sized by an
integer program (planner/serving/fleet.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paraplan.errors import InputError
from paraplan.planner.serving.estimate import plan_estimate, prices_by_gpu
from paraplan.planner.serving.fleet import fleet_plans
from paraplan.planner.serving.front import candidate_pools, distinct, pareto_front, pareto_points
from paraplan.planner.serving.plan import ServingPlan, ServingResult, exact_latency
from paraplan.planner.serving.problem import (
    Priced,
    ServingProblem,
    check_prices,
    feasible,
    objective_key,
    quant_modes,
    setups,
    side_of,
)
from paraplan.planner.serving.search import Candidates, PoolSide, load_for, price_across, price_setup

__all__ = ["ServingProblem", "ServingResult", "pareto_front", "quant_modes", "search_serving"]
EXACT_POOL = 4
"""Candidates priced exactly per plan shown: the screening interpolates the decode step, so the top few times
the plans asked for are re-priced and re-ranked."""


def build_plan(problem: ServingProblem, priced: list[Priced], c: Candidates, row: int) -> ServingPlan:
    """One candidate priced exactly, with its memory per pool and its price."""
    mode, pools = candidate_pools(c, row, priced, problem.workload.max_model_len)
    decode = side_of(priced, c.setup)
    stats, flow = exact_latency(load_for(problem.workload, decode.setup), pools)
    estimate, meets = plan_estimate(problem, mode, pools, stats, flow, prices_by_gpu(problem))
    return ServingPlan(rank=0, setup=decode.setup, mode=mode, pools=pools, estimate=estimate, meets_targets=meets)


def plan_key(problem: ServingProblem, plan: ServingPlan) -> float:
    """The objective of a plan priced exactly (lower is better)."""
    e, q = plan.estimate, f"p{problem.workload.percentile}"
    usd = np.nan if e["usd_per_hour"] is None else e["usd_per_hour"]
    return float(objective_key(problem.choices.objective, e["tokens_per_s"], plan.num_gpus, e["ttft_s"][q],
                               e["tpot_s"][q], problem.workload.osl, usd))


def no_fit(problem: ServingProblem, everything: list[Candidates], considered: int) -> InputError:
    """The one-line reason no deployment qualifies, with the lowest latencies reached."""
    w = problem.workload
    ttft = min((c.ttft_s[np.isfinite(c.ttft_s)].min(initial=np.inf) for c in everything), default=np.inf)
    tpot = min((c.tpot_s[np.isfinite(c.tpot_s)].min(initial=np.inf) for c in everything), default=np.inf)
    where = f"{problem.model.name[:60]} on {problem.gpus_text}"
    if not np.isfinite(ttft):
        return InputError(f"no deployment of {where} fits and keeps up ({considered} priced): add GPUs, lower the "
                          "rate or the lengths, or quantize")
    return InputError(f"no deployment of {where} meets the targets at p{w.percentile} ({considered} priced); the "
                      f"lowest reachable are TTFT {1e3 * ttft:.0f} ms and TPOT {1e3 * tpot:.1f} ms (not together): "
                      "relax a target, add GPUs or lower the load")


def _tweaks(priced: list[Priced], c: Candidates) -> np.ndarray:
    """Knobs a candidate sets away from its engine's defaults (max batched tokens, batch cap, an fp8 KV cache)."""
    side = side_of(priced, c.setup)
    engine, chunks = side.setup.engine, np.asarray(side.costs.chunks, dtype=float)
    agg = c.kind == 0
    chunk = np.where(agg, chunks[np.clip(c.index[:, 1].astype(int), 0, chunks.size - 1)], engine.max_batched_tokens)
    cap = np.where(agg, c.index[:, 2], c.index[:, 4])
    return (chunk != engine.max_batched_tokens).astype(int) + (cap != engine.max_running) \
        + int(side.setup.kv_dtype != "bf16")


def _select(problem: ServingProblem, everything: list[Candidates], top: int, priced: list[Priced]
            ) -> list[tuple[Candidates, int]]:
    """(candidates, row) of the best ``top * EXACT_POOL`` deployments by the screening key."""
    w = problem.workload
    flat = np.concatenate([np.where(feasible(c, w), objective_key(problem.choices.objective, c.tokens_per_s, c.gpus,
                                                                  c.ttft_s, c.tpot_s, w.osl, c.usd_per_hour), np.inf)
                           for c in everything])
    owner = np.concatenate([np.full(c.kind.size, n) for n, c in enumerate(everything)])
    offsets = np.cumsum([0] + [c.kind.size for c in everything])
    tweaks = np.concatenate([_tweaks(priced, c) for c in everything])
    latency = np.concatenate([c.ttft_s + w.osl * c.tpot_s for c in everything])
    # Equal objectives (to float32's 7 digits) go to the lower latency, then to the deployment closest to the
    # engine's defaults.
    order = np.lexsort((tweaks, latency.astype(np.float32), flat.astype(np.float32)))
    order = order[np.isfinite(flat[order])][: top * EXACT_POOL]
    return [(everything[int(owner[i])], int(i - offsets[int(owner[i])])) for i in order]


def price_all(problem: ServingProblem) -> tuple[list[Priced], list[Candidates]]:
    """Every setup priced on its own GPU type, and prefill/decode pairs across GPU types."""
    priced, everything = [], []
    for n, (ci, setup) in enumerate(setups(problem)):
        budget = problem.clusters[ci].num_gpus
        costs, cands = price_setup(n, setup, problem.workload, problem.choices, budget, problem.price(ci))
        side = None if costs is None else PoolSide(setup_id=n, setup=setup, costs=costs, budget=budget,
                                                   price=problem.price(ci))
        priced.append(Priced(setup_id=n, cluster_id=ci, side=side))
        everything += cands
    if "disagg" in problem.choices.modes:
        for a, b in ((a, b) for a in priced for b in priced if a.cluster_id != b.cluster_id):
            if a.side and b.side and (a.side.setup.engine.name, a.side.setup.kv_dtype) == \
                    (b.side.setup.engine.name, b.side.setup.kv_dtype):
                everything.append(price_across(a.side, b.side, problem.workload, problem.choices))
    return priced, everything


def search_serving(problem: ServingProblem, top: int = 5) -> ServingResult:
    """Every deployment of the problem priced; the best ``top`` meeting the targets, priced exactly."""
    check_prices(problem)
    priced, everything = price_all(problem)
    considered = sum(c.kind.size for c in everything)
    feasible_count = sum(int(feasible(c, problem.workload).sum()) for c in everything)
    plans = [build_plan(problem, priced, c, row) for c, row in _select(problem, everything, top, priced)] \
        if feasible_count else []
    if len(problem.clusters) > 1 and problem.workload.arrivals is not None and "agg" in problem.choices.modes:
        plans += fleet_plans(problem, priced)
    plans = sorted((p for p in plans if p.meets_targets), key=lambda p: plan_key(problem, p))
    plans = [replace(p, rank=n) for n, p in enumerate(distinct(plans, f"p{problem.workload.percentile}")[:top],
                                                       start=1)]
    if not plans:
        raise no_fit(problem, everything, considered)
    return ServingResult(plans=plans, pareto=pareto_points(problem, priced, everything), considered=considered,
                         feasible=feasible_count)


