"""What a user sees of a serving search beyond the ranked plans: the throughput/interactivity Pareto front, the
pools of a candidate, a short text of them, and which plans count as the same."""

from __future__ import annotations

import numpy as np

from paraplan.planner.serving.plan import Pool, ServingPlan, make_pool
from paraplan.planner.serving.problem import Priced, ServingProblem, feasible
from paraplan.planner.serving.search import Candidates

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


def candidate_pools(c: Candidates, row: int, priced: list[Priced]) -> tuple[str, tuple[Pool, ...]]:
    i = c.index[row]
    decode = priced[c.setup].side
    if c.kind[row] == 0:
        return "agg", (make_pool("aggregated", decode.setup, decode.costs, int(i[0]), int(i[1]), i[2], i[3]),)
    prefill = priced[c.prefill_owner].side
    decode_chunk = int(np.searchsorted(np.asarray(decode.costs.chunks, dtype=float), i[4]))
    return "disagg", (make_pool("prefill", prefill.setup, prefill.costs, int(i[0]), int(i[1]),
                                prefill.setup.engine.max_running, i[2]),
                      make_pool("decode", decode.setup, decode.costs, int(i[3]), decode_chunk, i[4], i[5]))


def _same(a: ServingPlan, b: ServingPlan, q: str) -> bool:
    def layout(p: ServingPlan):
        return (p.setup.engine.name, p.setup.kv_dtype, p.mode,
                tuple((x.role, x.gpu, x.workers, x.tp, x.pp, x.dp_attention, x.moe_ep) for x in p.pools))
    if layout(a) != layout(b):
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


def pareto_points(problem: ServingProblem, priced: list[Priced], everything: list[Candidates]) -> list[dict]:
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
        mode, pools = candidate_pools(c, row, priced)
        setup = priced[c.setup].side.setup
        out.append({"tokens_per_s_per_gpu": per_gpu, "tokens_per_s_per_user": per_user,
                    "engine": setup.engine.name, "mode": mode, "kv_cache_dtype": setup.kv_dtype,
                    "num_gpus": int(sum(p.workers * p.gpus_per_worker for p in pools)),
                    "summary": describe_pools(pools)})
    return out


def describe_pools(pools) -> str:
    """A short text of a deployment's pools: '2x tp4 ...' or 'prefill 1x tp8 ... + decode 2x tp1 dp8 ep8 ...'."""
    parts = []
    for p in pools:
        axes = [f"tp{p.tp}"] + [f"dp{p.dp_attention}"] * (p.dp_attention > 1) + [f"pp{p.pp}"] * (p.pp > 1) \
            + [f"ep{p.moe_ep}"] * (p.moe_ep > 1)
        text = f"{p.workers}x {p.gpu} {' '.join(axes)} b{p.max_batch} c{p.max_batched_tokens}"
        parts.append(text if p.role == "aggregated" else f"{p.role} {text}")
    return " + ".join(parts)
