"""What a user sees of a serving search beyond the ranked plans: the throughput/interactivity Pareto front, the
pools of a candidate, a short text of them, and which plans count as the same."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

from paraplan.planner.serving.plan import PricedPool, ServingPlan, make_pool
from paraplan.planner.serving.pool_shape import ServingPool
from paraplan.planner.serving.problem import Priced, ServingProblem, feasible, side_of
from paraplan.planner.serving.search import Candidates
from paraplan.planner.serving.space import DeploymentMode

PARETO_POINTS = 64
DISTINCT_REL = 0.01
"""Plans with the same engine, mode, KV dtype and worker layout whose TTFT, TPOT and throughput all agree within
1% show once (they differ only in a batch cap or chunk size that barely binds)."""


def pareto_front(tokens_per_gpu: np.ndarray, tokens_per_user: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, most throughput per GPU first."""
    order = np.lexsort((-tokens_per_user, -tokens_per_gpu))
    best = np.maximum.accumulate(tokens_per_user[order])
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = tokens_per_user[order][1:] > best[:-1]
    return order[keep]


def candidate_pools(c: Candidates, row: int, priced: list[Priced], max_model_len: int
                    ) -> tuple[DeploymentMode, tuple[PricedPool, ...]]:
    """The mode and pools of candidate ``row`` (``max_model_len``: the workload's longest request, tokens)."""
    i = c.index[row]
    decode = side_of(priced, c.setup)
    if c.kind[row] == 0:
        return "agg", (make_pool("aggregated", decode.setup, decode.costs, int(i[0]), int(i[1]), i[2], i[3],
                                 max_model_len),)
    prefill = side_of(priced, c.prefill_owner)
    decode_chunk = int(np.searchsorted(np.asarray(decode.costs.chunks, dtype=float), i[4]))
    return "disagg", (make_pool("prefill", prefill.setup, prefill.costs, int(i[0]), int(i[1]),
                                prefill.setup.engine.max_running, i[2], max_model_len),
                      make_pool("decode", decode.setup, decode.costs, int(i[3]), decode_chunk, i[4], i[5],
                                max_model_len))


def _layout(plan: ServingPlan) -> tuple[Hashable, ...]:
    """What two plans must share to count as the same: engine, KV dtype, mode and each pool's workers."""
    return (plan.setup.engine.name, plan.setup.kv_dtype, plan.mode,
            tuple((x.role, x.gpu, x.num_workers, x.tp, x.pp, x.dp_attention, x.moe_ep)
                  for x in (p.shape for p in plan.pools)))


def _same(a: ServingPlan, b: ServingPlan, q: str) -> bool:
    """Same layout, and TTFT, TPOT (at statistic ``q``) and throughput within DISTINCT_REL."""
    if _layout(a) != _layout(b):
        return False
    pairs = ((a.estimate["ttft_s"][q], b.estimate["ttft_s"][q]), (a.estimate["tpot_s"][q], b.estimate["tpot_s"][q]),
             (a.estimate["tokens_per_s"], b.estimate["tokens_per_s"]))
    return all(abs(x - y) <= DISTINCT_REL * max(abs(x), abs(y)) for x, y in pairs)


def distinct(plans: list[ServingPlan], q: str) -> list[ServingPlan]:
    """Plans that differ in their layout or their predictions (the first of equal ones)."""
    out: list[ServingPlan] = []
    for p in plans:
        if not any(_same(p, kept, q) for kept in out):
            out.append(p)
    return out


def pareto_points(problem: ServingProblem, priced: list[Priced], everything: list[Candidates]
                  ) -> list[dict[str, Any]]:
    """The non-dominated feasible deployments in output tokens/s per GPU against tokens/s per user (1 / mean
    TPOT), screening values, at most PARETO_POINTS of them."""
    rows = []
    for c in everything:
        ok = np.flatnonzero(feasible(c, problem.workload))
        rows += [(c, int(i), float(c.tokens_per_s[i] / c.gpus[i]), float(1.0 / c.tpot_mean_s[i])) for i in ok]
    if not rows:
        return []
    front = pareto_front(np.array([r[2] for r in rows]), np.array([r[3] for r in rows]))
    step = max(1, int(np.ceil(front.size / PARETO_POINTS)))
    out = []
    for i in front[::step]:
        c, row, per_gpu, per_user = rows[i]
        mode, pools = candidate_pools(c, row, priced, problem.workload.max_model_len)
        setup = side_of(priced, c.setup).setup
        shapes = [p.shape for p in pools]
        out.append({"tokens_per_s_per_gpu": per_gpu, "tokens_per_s_per_user": per_user,
                    "engine": setup.engine.name, "mode": mode, "kv_cache_dtype": setup.kv_dtype,
                    "num_gpus": int(sum(p.num_gpus for p in shapes)), "summary": describe_pools(shapes)})
    return out


def describe_pools(pools: Iterable[ServingPool]) -> str:
    """A short text of a deployment's pools: '2x tp4 ...' or 'prefill 1x tp8 ... + decode 2x tp1 dp8 ep8 ...', with
    the batch cap and max batched tokens per attention-DP rank."""
    parts = []
    for p in pools:
        axes = [f"tp{p.tp}"] + [f"dp{p.dp_attention}"] * (p.dp_attention > 1) + [f"pp{p.pp}"] * (p.pp > 1) \
            + [f"ep{p.moe_ep}"] * (p.moe_ep > 1)
        text = f"{p.num_workers}x {p.gpu} {' '.join(axes)} b{p.max_batch_per_rank} c{p.max_batched_tokens_per_rank}"
        parts.append(text if p.role == "aggregated" else f"{p.role} {text}")
    return " + ".join(parts)
