"""``paraplan serve``'s library entry: price every setup, keep the deployments that meet the targets, rank them by
the objective, price the shown ones exactly, and trace the throughput/interactivity Pareto front.

With several GPU types (each with its own count and price) a deployment runs on one type, or prefill on one
and decode on another, or (an open loop) as a fleet of aggregated workers over several types sized by an
integer program (planner/serving_fleet).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.cost_models.inference_mixers import MixerShapes
from paraplan.cost_models.model_spec import ModelSpec
from paraplan.cost_models.serving import ENGINE_TRAITS, held_tokens, weight_precision
from paraplan.errors import InputError
from paraplan.hardware_profiles import ClusterSpec
from paraplan.planner.serving_plan import (
    SECONDS_PER_HOUR,
    TOKENS_PER_MILLION,
    Pool,
    ServingPlan,
    exact_latency,
    make_pool,
    memory_of,
)
from paraplan.planner.serving_search import (
    MAX_UTILISATION_WITHOUT_TARGETS,
    Candidates,
    PoolSide,
    _load,
    price_across,
    price_setup,
)
from paraplan.planner.serving_space import ServingChoices, ServingWorkload

_PRECISION_MODES = {"bf16": "bf16", "fp8": "fp8", "fp4": "nvfp4"}
_CHECKPOINT_MODES = {"float8_e4m3fn": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "int4": "int4_wo"}
EXACT_POOL = 4
"""Candidates priced exactly per plan shown: the screening interpolates the decode step, so the top few times
the plans asked for are re-priced and re-ranked."""
PARETO_POINTS = 64
DISTINCT_REL = 0.01
"""Plans with the same engine, mode, KV dtype and worker layout whose TTFT, TPOT and throughput all agree within
1% show once (they differ only in a batch cap or chunk size that barely binds)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingProblem:
    """A model, the GPUs it may use (one or several types, each with its own count) and the traffic to serve."""

    model: ModelSpec
    mixers: MixerShapes
    clusters: tuple[ClusterSpec, ...]
    """The GPUs available, one cluster per GPU type; a plan uses at most each one's GPUs."""
    workload: ServingWorkload
    choices: ServingChoices
    prices_usd_per_gpu_hour: tuple[float | None, ...] = ()
    """Price per GPU-hour per cluster; () takes ``choices.price_usd_per_gpu_hour``, else the catalog's."""

    def price(self, index: int) -> float | None:
        """The price of cluster ``index``: the user's, else the catalog's list price, else None."""
        if self.prices_usd_per_gpu_hour:
            return self.prices_usd_per_gpu_hour[index]
        if self.choices.price_usd_per_gpu_hour is not None:
            return self.choices.price_usd_per_gpu_hour
        return self.clusters[index].gpu.price_usd_per_gpu_hour

    @property
    def gpus_text(self) -> str:
        return " + ".join(f"{c.num_gpus} {c.gpu.name}" for c in self.clusters)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingResult:
    """The ranked plans, the Pareto front and how many deployments the search priced."""

    plans: list[ServingPlan]
    pareto: list[dict]
    considered: int
    feasible: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Priced:
    """One setup's per-sharding costs and price."""

    setup_id: int
    cluster_id: int
    side: PoolSide | None
    """None where no sharding of the setup fits its GPUs."""


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


def setups(problem: ServingProblem) -> list[tuple[int, object]]:
    """(cluster index, setup) per GPU type, engine and KV dtype."""
    from paraplan.planner.serving_pools import ServingSetup

    gemm, experts = quant_modes(problem.model, problem.choices.precision)
    return [(ci, ServingSetup(model=problem.model, mixers=problem.mixers, cluster=cluster, engine=ENGINE_TRAITS[engine],
                              precision=weight_precision(problem.model, gemm, experts, kv), quant_modes=(gemm, experts),
                              kv_dtype=kv, isl=problem.workload.isl, osl=problem.workload.osl))
            for ci, cluster in enumerate(problem.clusters)
            for engine in problem.choices.engines for kv in problem.choices.kv_dtypes]


def feasible(c: Candidates, workload: ServingWorkload) -> np.ndarray:
    """Candidates that meet the targets (or, without targets, keep every queue at most 85% busy)."""
    ok = np.isfinite(c.ttft_s) & np.isfinite(c.tpot_s) & (c.tokens_per_s > 0)
    if workload.ttft_target_s is not None:
        ok &= c.ttft_s <= workload.ttft_target_s
    if workload.tpot_target_s is not None:
        ok &= c.tpot_s <= workload.tpot_target_s
    if workload.ttft_target_s is None and workload.tpot_target_s is None:
        ok &= c.busy <= MAX_UTILISATION_WITHOUT_TARGETS
    return ok


def objective_key(objective: str, tokens_per_s, gpus, ttft_s, tpot_s, osl: float, usd_per_hour) -> np.ndarray:
    """Lower is better: GPU-seconds per output token (throughput), dollars per output token (cost) or a request's
    latency at the target percentile (latency)."""
    if objective == "latency":
        return ttft_s + osl * tpot_s
    with np.errstate(divide="ignore", invalid="ignore"):  # a deployment that carries nothing ranks last
        if objective == "cost":
            return np.asarray(usd_per_hour, dtype=float) / tokens_per_s
        return -tokens_per_s / gpus


def _check_prices(problem: ServingProblem) -> None:
    if problem.choices.objective != "cost":
        return
    missing = [c.gpu.name for i, c in enumerate(problem.clusters) if problem.price(i) is None]
    if missing:
        raise InputError(f"--objective cost needs a price for {', '.join(missing)}: pass --price-per-gpu-hour USD "
                         "(one value, or one per --gpu type) (the catalog has none)")


def _pareto(tokens_per_gpu: np.ndarray, tokens_per_user: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, most throughput per GPU first."""
    order = np.lexsort((-tokens_per_user, -tokens_per_gpu))
    best = np.maximum.accumulate(tokens_per_user[order])
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = tokens_per_user[order][1:] > best[:-1]
    return order[keep]


def _pools(c: Candidates, row: int, priced: list[Priced]) -> tuple[str, tuple[Pool, ...]]:
    i = c.index[row]
    decode = priced[c.setup].side
    if c.kind[row] == 0:
        return "agg", (make_pool("aggregated", decode.setup, decode.costs, int(i[0]), int(i[1]), i[2], i[3]),)
    prefill = priced[c.prefill_owner].side
    decode_chunk = int(np.searchsorted(np.asarray(decode.costs.chunks, dtype=float), i[4]))
    return "disagg", (make_pool("prefill", prefill.setup, prefill.costs, int(i[0]), int(i[1]),
                                prefill.setup.engine.max_running, i[2]),
                      make_pool("decode", decode.setup, decode.costs, int(i[3]), decode_chunk, i[4], i[5]))


def plan_estimate(problem: ServingProblem, mode: str, pools: tuple[Pool, ...], stats: dict, flow: dict,
                  prices: dict[str, float | None]) -> tuple[dict, bool]:
    """The estimate block of a plan (SI units) and whether it meets the targets at the bound percentile."""
    workload = problem.workload
    gpus = sum(p.workers * p.gpus_per_worker for p in pools)
    tokens = flow["requests_per_s"] * workload.osl
    costs = [prices.get(p.gpu) for p in pools]
    usd = None if any(c is None for c in costs) else sum(c * p.workers * p.gpus_per_worker for c, p in zip(costs, pools))
    q = f"p{workload.percentile}"
    ttft, tpot = stats["ttft_s"][q], stats["tpot_s"][q]
    meets = bool(np.isfinite(ttft) and np.isfinite(tpot)
                 and (workload.ttft_target_s is None or ttft <= workload.ttft_target_s * (1 + 1e-9))
                 and (workload.tpot_target_s is None or tpot <= workload.tpot_target_s * (1 + 1e-9)))
    first = pools[0]
    estimate = {
        **stats, "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / gpus,
        "tokens_per_s_per_user": 1.0 / stats["tpot_s"]["mean"], "requests_per_s": flow["requests_per_s"],
        "running_batch": flow["running_batch"], "prefill_s": float(first.costs.prefill_s[first.shard_index]),
        "kv_transfer_s": float(first.costs.kv_transfer_s[first.shard_index]) if mode == "disagg" else 0.0,
        "memory": [memory_of(p, float(held_tokens(p.setup.engine, workload.isl, workload.osl))) for p in pools],
        "price_usd_per_gpu_hour": None if usd is None else usd / gpus, "usd_per_hour": usd,
        "usd_per_million_output_tokens": None if usd is None else usd / SECONDS_PER_HOUR / tokens * TOKENS_PER_MILLION,
        "max_model_len": workload.max_model_len}
    return estimate, meets


def _prices(problem: ServingProblem) -> dict[str, float | None]:
    return {c.gpu.name: problem.price(i) for i, c in enumerate(problem.clusters)}


def build_plan(problem: ServingProblem, priced: list[Priced], c: Candidates, row: int) -> ServingPlan:
    """One candidate priced exactly, with its memory per pool and its price."""
    mode, pools = _pools(c, row, priced)
    decode = priced[c.setup].side
    stats, flow = exact_latency(_load(problem.workload, decode.setup), pools)
    estimate, meets = plan_estimate(problem, mode, pools, stats, flow, _prices(problem))
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
    side = priced[c.setup].side
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
    _check_prices(problem)
    priced, everything = price_all(problem)
    considered = sum(c.kind.size for c in everything)
    feasible_count = sum(int(feasible(c, problem.workload).sum()) for c in everything)
    plans = [build_plan(problem, priced, c, row) for c, row in _select(problem, everything, top, priced)] \
        if feasible_count else []
    if len(problem.clusters) > 1 and problem.workload.arrivals is not None and "agg" in problem.choices.modes:
        from paraplan.planner.serving_fleet import fleet_plans

        plans += fleet_plans(problem, priced)
    plans = sorted((p for p in plans if p.meets_targets), key=lambda p: plan_key(problem, p))
    plans = [replace(p, rank=n) for n, p in enumerate(_distinct(plans, f"p{problem.workload.percentile}")[:top],
                                                       start=1)]
    if not plans:
        raise no_fit(problem, everything, considered)
    return ServingResult(plans=plans, pareto=pareto_points(problem, priced, everything), considered=considered,
                         feasible=feasible_count)


def _same(a: ServingPlan, b: ServingPlan, q: str) -> bool:
    def layout(p: ServingPlan):
        return (p.setup.engine.name, p.setup.kv_dtype, p.mode,
                tuple((x.role, x.gpu, x.workers, x.tp, x.pp, x.dp_attention, x.moe_ep) for x in p.pools))
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


def pareto_points(problem: ServingProblem, priced: list[Priced], everything: list[Candidates]) -> list[dict]:
    """The non-dominated feasible deployments in output tokens/s per GPU against tokens/s per user (1 / mean
    TPOT), screening values, at most PARETO_POINTS of them."""
    rows = []
    for c in everything:
        ok = np.flatnonzero(feasible(c, problem.workload))
        rows += [(c, int(i), float(c.tokens_per_s[i] / c.gpus[i]), float(1.0 / c.tpot_mean_s[i])) for i in ok]
    if not rows:
        return []
    front = _pareto(np.array([r[2] for r in rows]), np.array([r[3] for r in rows]))
    step = max(1, int(np.ceil(front.size / PARETO_POINTS)))
    out = []
    for i in front[::step]:
        c, row, per_gpu, per_user = rows[i]
        mode, pools = _pools(c, row, priced)
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
