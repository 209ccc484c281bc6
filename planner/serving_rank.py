"""``paraplan serve``'s library entry: price every setup, keep the deployments that meet the targets, rank them by
the objective, price the shown ones exactly, and trace the throughput/interactivity Pareto front."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.cost_models.inference_mixers import MixerShapes
from paraplan.cost_models.model_spec import ModelSpec
from paraplan.cost_models.serving import ENGINE_TRAITS, held_tokens, weight_precision
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.serving_plan import (
    SECONDS_PER_HOUR,
    TOKENS_PER_MILLION,
    ServingPlan,
    exact_latency,
    make_pool,
    memory_of,
)
from paraplan.planner.serving_pools import ServingSetup, WorkerCosts
from paraplan.planner.serving_search import (
    MAX_UTILISATION_WITHOUT_TARGETS,
    Candidates,
    _load,
    price_setup,
)
from paraplan.planner.serving_space import ServingChoices, ServingWorkload

_PRECISION_MODES = {"bf16": "bf16", "fp8": "fp8", "fp4": "nvfp4"}
_CHECKPOINT_MODES = {"float8_e4m3fn": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "int4": "int4_wo"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingProblem:
    """A model, the GPUs it may use and the traffic it must serve."""

    model: ModelSpec
    mixers: MixerShapes
    cluster: ClusterSpec
    workload: ServingWorkload
    choices: ServingChoices


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingResult:
    """The ranked plans, the Pareto front and how many deployments the search priced."""

    plans: list[ServingPlan]
    pareto: list[dict]
    considered: int
    feasible: int


def quant_modes(model: ModelSpec, precision: str) -> tuple[str, str]:
    """(dense GEMM mode, routed-expert mode): the checkpoint's own format under ``auto`` (DeepSeek's 128x128 fp8
    blocks as fp8_block), else the precision asked for."""
    if precision != "auto":
        if precision not in _PRECISION_MODES:
            raise InputError(f"--precision {precision!r}: choose auto, bf16, fp8 or fp4")
        mode = _PRECISION_MODES[precision]
        return mode, mode
    weights = model.weights
    if weights is None:
        return "bf16", "bf16"
    mode = _CHECKPOINT_MODES.get(weights.weight_format, "bf16")
    if mode == "fp8" and weights.block_size:
        mode = "fp8_block"
    return mode, mode


def setups(problem: ServingProblem) -> list[ServingSetup]:
    """One setup per engine and KV dtype."""
    gemm, experts = quant_modes(problem.model, problem.choices.precision)
    return [ServingSetup(model=problem.model, mixers=problem.mixers, cluster=problem.cluster,
                         engine=ENGINE_TRAITS[engine], precision=weight_precision(problem.model, gemm, experts, kv),
                         quant_modes=(gemm, experts), kv_dtype=kv, isl=problem.workload.isl, osl=problem.workload.osl)
            for engine in problem.choices.engines for kv in problem.choices.kv_dtypes]


def _feasible(c: Candidates, workload: ServingWorkload) -> np.ndarray:
    ok = np.isfinite(c.ttft_s) & np.isfinite(c.tpot_s) & (c.tokens_per_s > 0)
    if workload.ttft_target_s is not None:
        ok &= c.ttft_s <= workload.ttft_target_s
    if workload.tpot_target_s is not None:
        ok &= c.tpot_s <= workload.tpot_target_s
    if workload.ttft_target_s is None and workload.tpot_target_s is None:
        ok &= c.busy <= MAX_UTILISATION_WITHOUT_TARGETS
    return ok


def price_per_gpu_hour(problem: ServingProblem) -> float | None:
    """The user's price, else the catalog's list price for the GPU, else None."""
    if problem.choices.price_usd_per_gpu_hour is not None:
        return problem.choices.price_usd_per_gpu_hour
    return getattr(problem.cluster.gpu, "price_usd_per_gpu_hour", None)


def objective_key(objective: str, tokens_per_s, gpus, ttft_s, tpot_s, osl: float, price: float | None) -> np.ndarray:
    """Lower is better: output tokens per GPU-second (throughput), dollars per token (cost) or a request's
    latency at the target percentile (latency)."""
    if objective == "latency":
        return ttft_s + osl * tpot_s
    per_gpu = tokens_per_s / gpus
    if objective == "cost":
        if price is None:
            raise InputError("--objective cost needs a price: pass --price-per-gpu-hour USD (the catalog has none "
                             "for this GPU)")
        return price / per_gpu
    return -per_gpu


def _pareto(tokens_per_gpu: np.ndarray, tokens_per_user: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, most throughput per GPU first."""
    order = np.lexsort((-tokens_per_user, -tokens_per_gpu))
    best = np.maximum.accumulate(tokens_per_user[order])
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = tokens_per_user[order][1:] > best[:-1]
    return order[keep]


def _pools(c: Candidates, row: int, costs: WorkerCosts, engine_cap: int):
    i = c.index[row]
    if c.kind[row] == 0:
        return "agg", (make_pool("aggregated", costs, int(i[0]), int(i[1]), i[2], i[3]),)
    decode_chunk = int(np.searchsorted(np.asarray(costs.chunks, dtype=float), i[4]))
    return "disagg", (make_pool("prefill", costs, int(i[0]), int(i[1]), engine_cap, i[2]),
                      make_pool("decode", costs, int(i[3]), decode_chunk, i[4], i[5]))


def build_plan(problem: ServingProblem, setup: ServingSetup, costs: WorkerCosts, c: Candidates, row: int,
               rank: int) -> ServingPlan:
    """One candidate priced exactly, with its memory per pool and its price."""
    workload = problem.workload
    mode, pools = _pools(c, row, costs, setup.engine.max_running)
    stats, flow = exact_latency(setup, _load(workload, setup), costs, pools)
    gpus = sum(p.workers * p.gpus_per_worker for p in pools)
    tokens = flow["requests_per_s"] * workload.osl
    price = price_per_gpu_hour(problem)
    q = f"p{workload.percentile}"
    ttft, tpot = stats["ttft_s"][q], stats["tpot_s"][q]
    meets = np.isfinite(ttft) and np.isfinite(tpot) \
        and (workload.ttft_target_s is None or ttft <= workload.ttft_target_s * (1 + 1e-9)) \
        and (workload.tpot_target_s is None or tpot <= workload.tpot_target_s * (1 + 1e-9))
    held = float(held_tokens(setup.engine, workload.isl, workload.osl))
    estimate = {
        **stats, "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / gpus,
        "tokens_per_s_per_user": 1.0 / stats["tpot_s"]["mean"], "requests_per_s": flow["requests_per_s"],
        "running_batch": flow["running_batch"],
        "prefill_s": float(costs.prefill_s[pools[0].shard_index]),
        "kv_transfer_s": float(costs.kv_transfer_s[pools[0].shard_index]) if mode == "disagg" else 0.0,
        "memory": [memory_of(setup, costs, p, held) for p in pools],
        "price_usd_per_gpu_hour": price,
        "usd_per_million_output_tokens": None if price is None
        else price * gpus / SECONDS_PER_HOUR / tokens * TOKENS_PER_MILLION,
        "max_model_len": workload.max_model_len}
    return ServingPlan(rank=rank, setup=setup, mode=mode, pools=pools, estimate=estimate, meets_targets=bool(meets))


def _plan_key(problem: ServingProblem, plan: ServingPlan, price: float | None) -> float:
    e, q = plan.estimate, f"p{problem.workload.percentile}"
    return float(objective_key(problem.choices.objective, e["tokens_per_s"], plan.num_gpus, e["ttft_s"][q],
                               e["tpot_s"][q], problem.workload.osl, price))


def _no_fit(problem: ServingProblem, everything: list[tuple[int, Candidates]], considered: int) -> InputError:
    w = problem.workload
    finite = [(c.ttft_s[np.isfinite(c.ttft_s)].min(initial=np.inf), c.tpot_s[np.isfinite(c.tpot_s)].min(initial=np.inf))
              for _, c in everything]
    ttft = min((f[0] for f in finite), default=np.inf)
    tpot = min((f[1] for f in finite), default=np.inf)
    if not np.isfinite(ttft):
        return InputError(f"no deployment of {problem.model.name[:60]} on {problem.cluster.num_gpus} {problem.cluster.gpu.name} fits and keeps "
                          f"up ({considered} priced): add GPUs, lower the rate or the lengths, or quantize")
    return InputError(f"no deployment of {problem.model.name[:60]} on {problem.cluster.num_gpus} {problem.cluster.gpu.name} meets the targets "
                      f"at p{w.percentile} ({considered} priced); the lowest reachable are TTFT {1e3 * ttft:.0f} ms and "
                      f"TPOT {1e3 * tpot:.1f} ms (not together): relax a target, add GPUs or lower the load")


EXACT_POOL = 4
"""Candidates priced exactly per plan shown: the screening interpolates the decode step, so the top few times
the plans asked for are re-priced and re-ranked."""
PARETO_POINTS = 64


def _tweaks(priced_setup, c: Candidates) -> np.ndarray:
    """Knobs a candidate sets away from its engine's defaults (max batched tokens, batch cap, an fp8 KV cache)."""
    setup, costs, _ = priced_setup
    chunks = np.asarray(costs.chunks, dtype=float)
    agg = c.kind == 0
    chunk = np.where(agg, chunks[np.clip(c.index[:, 1].astype(int), 0, chunks.size - 1)], setup.engine.max_batched_tokens)
    cap = np.where(agg, c.index[:, 2], c.index[:, 4])
    return (chunk != setup.engine.max_batched_tokens).astype(int) + (cap != setup.engine.max_running) \
        + int(setup.kv_dtype != "bf16")


def _select(problem: ServingProblem, everything, top: int, price, priced) -> list[tuple[int, Candidates, int]]:
    """(setup, candidates, row) of the best ``top * EXACT_POOL`` distinct deployments by the screening key."""
    w = problem.workload
    keys = [objective_key(problem.choices.objective, c.tokens_per_s, c.gpus, c.ttft_s, c.tpot_s, w.osl, price)
            for _, c in everything]
    feasible = [_feasible(c, w) for _, c in everything]
    flat = np.concatenate([np.where(f, k, np.inf) for f, k in zip(feasible, keys)]) if keys else np.array([])
    owner = np.concatenate([np.full(c.kind.size, n) for n, (_, c) in enumerate(everything)]) if keys else flat
    offsets = np.cumsum([0] + [c.kind.size for _, c in everything])
    tweaks = np.concatenate([_tweaks(priced[n], c) for n, c in everything]) if keys else flat
    # Equal objectives (to float32's 7 digits) go to the lower latency, then to the deployment closest to the engine's
    # defaults.
    latency = np.concatenate([c.ttft_s + w.osl * c.tpot_s for _, c in everything]) if keys else flat
    order = np.lexsort((tweaks, latency.astype(np.float32), flat.astype(np.float32)))
    order = order[np.isfinite(flat[order])][: top * EXACT_POOL]
    return [(int(owner[i]), everything[int(owner[i])][1], int(i - offsets[int(owner[i])])) for i in order]


def search_serving(problem: ServingProblem, top: int = 5) -> ServingResult:
    """Every deployment of the problem priced; the best ``top`` meeting the targets, priced exactly."""
    budget = problem.cluster.num_gpus
    price = price_per_gpu_hour(problem)
    if problem.choices.objective == "cost" and price is None:
        objective_key("cost", 1.0, 1.0, 0.0, 0.0, 1.0, None)  # raises the one-line reason
    priced = [(setup, *price_setup(n, setup, problem.workload, problem.choices, budget))
              for n, setup in enumerate(setups(problem))]
    everything = [(n, c) for n, (_, costs, cands) in enumerate(priced) for c in cands if costs is not None]
    considered = sum(c.kind.size for _, c in everything)
    feasible_count = sum(int(_feasible(c, problem.workload).sum()) for _, c in everything)
    if feasible_count == 0:
        raise _no_fit(problem, everything, considered)
    chosen = _select(problem, everything, top, price, priced)
    plans = [build_plan(problem, priced[setup_of(everything, o)][0], priced[setup_of(everything, o)][1], c, row, 0)
             for o, c, row in chosen]
    plans = sorted((p for p in plans if p.meets_targets), key=lambda p: _plan_key(problem, p, price))
    plans = [ServingPlan(rank=n, setup=p.setup, mode=p.mode, pools=p.pools, estimate=p.estimate,
                         meets_targets=p.meets_targets) for n, p in enumerate(_distinct(plans, f"p{problem.workload.percentile}")[:top], start=1)]
    if not plans:
        raise _no_fit(problem, everything, considered)
    return ServingResult(plans=plans, pareto=pareto_points(problem, priced, everything), considered=considered,
                         feasible=feasible_count)


def setup_of(everything, owner: int) -> int:
    return everything[owner][0]


DISTINCT_REL = 0.01
"""Plans with the same engine, mode, KV dtype and worker layout whose TTFT, TPOT and throughput all agree within
1% show once (they differ only in a batch cap or chunk size that barely binds)."""


def _same(a: ServingPlan, b: ServingPlan, q: str) -> bool:
    def layout(p: ServingPlan):
        return (p.setup.engine.name, p.setup.kv_dtype, p.mode,
                tuple((x.role, x.workers, x.tp, x.pp, x.dp_attention, x.moe_ep) for x in p.pools))
    if layout(a) != layout(b):
        return False
    pairs = ((a.estimate["ttft_s"][q], b.estimate["ttft_s"][q]), (a.estimate["tpot_s"][q], b.estimate["tpot_s"][q]),
             (a.estimate["tokens_per_s"], b.estimate["tokens_per_s"]))
    return all(abs(x - y) <= DISTINCT_REL * max(abs(x), abs(y)) for x, y in pairs)


def _distinct(plans: list[ServingPlan], q: str) -> list[ServingPlan]:
    """Plans that differ in their layout or their predictions (the first of equal ones)."""
    out: list[ServingPlan] = []
    for p in plans:
        if not any(_same(p, kept, q) for kept in out):
            out.append(p)
    return out


def pareto_points(problem: ServingProblem, priced, everything) -> list[dict]:
    """The non-dominated feasible deployments in output tokens/s per GPU against tokens/s per user (1 / mean
    TPOT), screening values, at most PARETO_POINTS of them."""
    rows = []
    for owner, (n, c) in enumerate(everything):
        ok = np.flatnonzero(_feasible(c, problem.workload))
        rows += [(owner, int(i), float(c.tokens_per_s[i] / c.gpus[i]), float(1.0 / c.tpot_mean_s[i])) for i in ok]
    if not rows:
        return []
    per_gpu = np.array([r[2] for r in rows])
    per_user = np.array([r[3] for r in rows])
    front = _pareto(per_gpu, per_user)
    step = max(1, int(np.ceil(front.size / PARETO_POINTS)))
    out = []
    for i in front[::step]:
        owner, row = rows[i][0], rows[i][1]
        setup, costs, _ = priced[everything[owner][0]]
        mode, pools = _pools(everything[owner][1], row, costs, setup.engine.max_running)
        out.append({"tokens_per_s_per_gpu": rows[i][2], "tokens_per_s_per_user": rows[i][3],
                    "engine": setup.engine.name, "mode": mode, "kv_cache_dtype": setup.kv_dtype,
                    "num_gpus": int(sum(p.workers * p.gpus_per_worker for p in pools)),
                    "summary": describe_pools(pools)})
    return out


def describe_pools(pools) -> str:
    """A short text of a deployment's pools: '2x tp4' or 'prefill 1x tp8 ep8 + decode 2x dp8 ep8'."""
    parts = []
    for p in pools:
        axes = [f"tp{p.tp}"] + [f"dp{p.dp_attention}"] * (p.dp_attention > 1) + [f"pp{p.pp}"] * (p.pp > 1) \
            + [f"ep{p.moe_ep}"] * (p.moe_ep > 1)
        text = f"{p.workers}x {' '.join(axes)} b{p.max_batch} c{p.max_batched_tokens}"
        parts.append(text if p.role == "aggregated" else f"{p.role} {text}")
    return " + ".join(parts)
