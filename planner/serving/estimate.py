"""The estimate block of a serving plan: its latencies, throughput, memory per pool and price, in SI units, and
whether it meets the targets (serving_plan.schema.json's ``estimate``)."""

from __future__ import annotations

from typing import Any

from paraplan.cost_models.serving import attention_dp_sync_s, held_tokens
from paraplan.planner.serving.plan import SECONDS_PER_HOUR, TOKENS_PER_MILLION, PricedPool, memory_of
from paraplan.planner.serving.problem import ServingProblem
from paraplan.planner.serving.space import DeploymentMode


def _usd_per_hour(pools: tuple[PricedPool, ...], prices: dict[str, float | None]) -> float | None:
    """The pools' GPUs at their prices, USD per hour; None where a GPU type has no price."""
    known = [price for price in (prices.get(p.shape.gpu) for p in pools) if price is not None]
    if len(known) < len(pools):
        return None
    return sum(price * p.shape.num_workers * p.shape.gpus_per_worker for price, p in zip(known, pools))


def plan_estimate(problem: ServingProblem, mode: DeploymentMode, pools: tuple[PricedPool, ...],
                  stats: dict[str, dict[str, float]], flow: dict[str, float], prices: dict[str, float | None]
                  ) -> tuple[dict[str, Any], bool]:
    """The estimate block of a plan (SI units) and whether it meets the targets at the bound percentile."""
    workload = problem.workload
    gpus = sum(p.shape.num_gpus for p in pools)
    tokens = flow["requests_per_s"] * workload.osl
    usd = _usd_per_hour(pools, prices)
    q = f"p{workload.percentile}"
    meets = workload.meets(stats["ttft_s"][q], stats["tpot_s"][q])
    first, decoder = pools[0], pools[-1]  # aggregated: one pool; disaggregated: (prefill, decode)
    host_s = float(decoder.costs.step_overhead_s[decoder.shard_index])  # serving.engine_step_overhead_s
    sync_s = float(attention_dp_sync_s(decoder.setup.engine, decoder.shape.dp_attention))
    engine = decoder.setup.engine  # the load's (search.load_for): the decode pool streams the first token
    estimate = {
        **stats, "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / gpus,
        "tokens_per_s_per_user": 1.0 / stats["tpot_s"]["mean"], "requests_per_s": flow["requests_per_s"],
        "running_batch": flow["running_batch"], "prefill_s": float(first.costs.prefill_s[first.shard_index]),
        "kv_transfer_s": float(first.costs.kv_transfer_s[first.shard_index]) if mode == "disagg" else 0.0,
        "step_overhead_s": host_s, "dp_sync_s": sync_s, "request_overhead_s": engine.request_overhead_s,
        "first_token_steps_s": engine.first_token_steps * stats["tpot_s"]["mean"],
        "memory": [memory_of(p, float(held_tokens(p.setup.engine, workload.isl, workload.osl))) for p in pools],
        "price_usd_per_gpu_hour": None if usd is None else usd / gpus, "usd_per_hour": usd,
        "usd_per_million_output_tokens": None if usd is None else usd / SECONDS_PER_HOUR / tokens * TOKENS_PER_MILLION,
        "max_model_len": workload.max_model_len}
    return estimate, meets


def prices_by_gpu(problem: ServingProblem) -> dict[str, float | None]:
    """Price per GPU-hour by GPU name (None where unknown)."""
    return {c.gpu.name: problem.price(i) for i, c in enumerate(problem.clusters)}
