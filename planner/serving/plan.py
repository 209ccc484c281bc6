"""Serving plans: one deployment, its pools and its prediction, priced exactly and serialised as schema-checked JSON.

The search screens candidates with the decode step interpolated on a batch grid; a plan shown to the user is
priced again with the decode step computed at its own batch (``exact_latency``), at the mean and at p50, p90
and p99.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import numpy as np

from paraplan.cost_models.inference_step import Sharding
from paraplan.cost_models.serving import engine_memory
from paraplan.planner.json_schema import validate_own
from paraplan.planner.serving.load import Load, aggregated_stats, decode_pool_stats, prefill_pool_ttft_s
from paraplan.planner.serving.pools import ServingSetup, WorkerCosts, exact_decode_s
from paraplan.planner.serving.space import ServingWorkload
from paraplan.version import __version__

SERVING_SCHEMA_VERSION = 1
STATISTICS = (("mean", None), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6
ROLE_NAMES = {"agg": ("aggregated",), "disagg": ("prefill", "decode")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """Identical workers of one role."""

    role: str
    """aggregated, prefill or decode."""
    workers: int
    """Engine instances (replicas)."""
    tp: int
    pp: int
    dp_attention: int
    moe_ep: int
    moe_tp: int
    max_batch: int
    """Running-batch cap per attention-DP rank (vLLM max_num_seqs, TRT-LLM max_batch_size; SGLang's
    max_running_requests is the worker's total, dp_attention times this)."""
    max_batched_tokens: int
    """Tokens per step per attention-DP rank (vLLM max_num_batched_tokens, TRT-LLM max_num_tokens; SGLang's
    chunked_prefill_size is the worker's total)."""
    memory_frac: float
    """The engine's memory knob (vLLM gpu_memory_utilization, SGLang mem_fraction_static, TRT-LLM
    free_gpu_memory_fraction)."""
    shard_index: int
    """Row of the setup's WorkerCosts."""
    setup: ServingSetup
    """The GPU type, engine, precision and KV dtype of the pool."""
    costs: WorkerCosts
    """The per-sharding costs ``shard_index`` points into."""
    traffic_frac: float = 1.0
    """Share of the deployment's requests this pool serves (a mixed fleet splits them by capacity)."""

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.dp_attention * self.pp

    @property
    def gpu(self) -> str:
        return self.setup.cluster.gpu.name


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingPlan:
    """One ranked deployment."""

    rank: int
    setup: ServingSetup
    mode: str
    """agg or disagg."""
    pools: tuple[Pool, ...]
    estimate: dict[str, Any]
    """Predictions in SI units (see serving_plan.schema.json)."""
    meets_targets: bool

    @property
    def num_gpus(self) -> int:
        return sum(p.workers * p.gpus_per_worker for p in self.pools)


def _sub(costs: WorkerCosts, index: int) -> Sharding:
    shard = costs.shard
    return Sharding(**{k: getattr(shard, k)[[index]] for k in ("tp", "dp", "moe_tp", "moe_ep", "pp")})


def make_pool(role: str, setup: ServingSetup, costs: WorkerCosts, shard: int, chunk: int, cap: float, workers: float,
              traffic_frac: float = 1.0) -> Pool:
    """A pool from one candidate's indices."""
    s = costs.shard
    return Pool(role=role, workers=int(workers), tp=int(s.tp[shard]), pp=int(s.pp[shard]), dp_attention=int(s.dp[shard]),
                moe_ep=int(s.moe_ep[shard]), moe_tp=int(s.moe_tp[shard]), max_batch=int(cap),
                max_batched_tokens=int(costs.chunks[chunk]), memory_frac=float(costs.memory_frac[shard, chunk]),
                shard_index=int(shard), setup=setup, costs=costs, traffic_frac=traffic_frac)


def _memo(step_of):
    """``step_of`` remembering its answers: the four statistics of a plan solve the same running batch."""
    seen: dict[bytes, np.ndarray] = {}

    def cached(batch):
        key = np.asarray(batch, dtype=float).tobytes()
        if key not in seen:
            seen[key] = step_of(batch)
        return seen[key]
    return cached


def _aggregated_kw(pool: Pool) -> dict[str, Any]:
    costs, i = pool.costs, pool.shard_index
    shard = _sub(costs, i)
    return {"prefill_s": costs.prefill_s[[i]], "step_of": _memo(lambda b: exact_decode_s(pool.setup, shard, b)),
            "fits": costs.fits[[i], costs.chunks.index(pool.max_batched_tokens)], "cap": pool.max_batch,
            "chunk": float(pool.max_batched_tokens), "replicas": float(pool.workers), "ranks": float(pool.dp_attention)}


def _stats(latencies) -> dict[str, dict[str, float]]:
    """{ttft_s: {mean, p50, p90, p99}, tpot_s: {...}} from (TTFT, TPOT) per statistic of STATISTICS."""
    out: dict[str, dict[str, float]] = {"ttft_s": {}, "tpot_s": {}}
    for (name, _), (ttft, tpot) in zip(STATISTICS, latencies):
        out["ttft_s"][name], out["tpot_s"][name] = float(ttft), float(tpot)
    return out


def exact_latency(load: Load, pools: tuple[Pool, ...]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """TTFT and TPOT at each statistic and the throughput, with the decode step priced at the plan's own batch."""
    qs = [q for _, q in STATISTICS]
    if len(pools) == 1:
        latencies = aggregated_stats(load, qs=qs, **_aggregated_kw(pools[0]))
        mean = latencies[0]
        return _stats((lat.ttft_s[0], lat.tpot_s[0]) for lat in latencies), \
            {"requests_per_s": float(mean.requests_per_s[0]), "running_batch": float(mean.running_batch[0])}
    prefill, decode = pools
    shard = _sub(decode.costs, decode.shard_index)
    decodes = decode_pool_stats(load, qs=qs, step_of=_memo(lambda b: exact_decode_s(decode.setup, shard, b)),
                                fits=decode.costs.fits[[decode.shard_index],
                                                       decode.costs.chunks.index(decode.max_batched_tokens)],
                                cap=decode.max_batch, workers=float(decode.workers), ranks=float(decode.dp_attention))
    mean = decodes[0][0]
    p, pc = prefill.shard_index, prefill.costs
    pkw = {"rate_per_s": mean.requests_per_s if load.closed else load.rate_per_s, "prefill_s": pc.prefill_s[[p]],
           "transfer_s": pc.kv_transfer_s[[p]], "chunk": float(prefill.max_batched_tokens),
           "step_overhead_s": prefill.setup.engine.step_overhead_s, "workers": float(prefill.workers),
           "ranks": float(prefill.dp_attention), "arrival_cv2": 1.0 if load.closed else load.arrival_cv2}
    stats = _stats((prefill_pool_ttft_s(load, q=q, **pkw)[0] + wait[0], lat.tpot_s[0])
                   for q, (lat, wait) in zip(qs, decodes))
    rate = load.concurrency / (stats["ttft_s"]["mean"] + load.osl * stats["tpot_s"]["mean"]) if load.closed \
        else load.rate_per_s
    return stats, {"requests_per_s": float(rate), "running_batch": float(mean.running_batch[0])}


def memory_of(pool: Pool, held_tokens: float) -> dict[str, float]:
    """One GPU of the pool under the engine's memory rule at the pool's knob (bytes)."""
    setup = pool.setup
    engine = replace(setup.engine, max_batched_tokens=pool.max_batched_tokens, memory_frac=pool.memory_frac)
    mem = engine_memory(setup.model, setup.cluster, engine, setup.precision, _sub(pool.costs, pool.shard_index),
                        held_tokens, setup.mixers)
    per_token = mem.kv_bytes_per_sequence[0] / held_tokens
    return {"weights_bytes": float(mem.weights_bytes[0]), "activation_bytes": float(mem.activation_bytes[0]),
            "fixed_bytes": float(mem.fixed_bytes[0]), "kv_pool_bytes": float(max(mem.kv_pool_bytes[0], 0.0)),
            "capacity_bytes": float(setup.cluster.gpu.hbm_bytes),
            "kv_capacity_tokens": float(np.floor(max(mem.kv_pool_bytes[0], 0.0) / per_token)),
            "max_sequences": float(mem.max_sequences[0])}


def plan_to_json(plan: ServingPlan) -> dict[str, Any]:
    """The plan as the ``plans`` entry of the serving document. Batch and token limits are the worker's totals
    (the exporters divide them per attention-DP rank where an engine sets them per rank)."""
    setup = plan.setup
    gemm, experts = setup.quant_modes
    pools = [{"role": p.role, "gpu": p.gpu, "gpus_per_node": p.setup.cluster.gpus_per_node, "workers": p.workers,
              "traffic_frac": p.traffic_frac,
              "gpus_per_worker": p.gpus_per_worker, "tp": p.tp, "pp": p.pp, "dp_attention": p.dp_attention,
              "moe_ep": p.moe_ep, "moe_tp": p.moe_tp, "max_batch": p.max_batch * p.dp_attention,
              "max_batched_tokens": p.max_batched_tokens * p.dp_attention, "memory_frac": p.memory_frac,
              "max_model_len": int(plan.estimate["max_model_len"])} for p in plan.pools]
    transfer = None
    if plan.mode == "disagg":
        same = plan.pools[0].setup.cluster is plan.pools[1].setup.cluster
        link = "nvlink" if same and setup.cluster.domain_gpus >= plan.num_gpus else "rdma"
        transfer = {"backend": {"vllm": "nixl", "sglang": "mooncake", "trtllm": "ucx"}[setup.engine.name], "link": link}
    return {"rank": plan.rank, "engine": setup.engine.name, "mode": plan.mode,
            "quantization": {"weights": gemm, "experts": experts, "kv_cache_dtype": setup.kv_dtype},
            "num_gpus": plan.num_gpus, "pools": pools, "kv_transfer": transfer,
            "estimate": {k: v for k, v in plan.estimate.items() if k != "max_model_len"},
            "meets_targets": plan.meets_targets}


def serving_schema() -> dict[str, Any]:
    """The JSON Schema every serving plan document is checked against."""
    return json.loads(resources.files("paraplan.planner").joinpath("schemas/serving_plan.schema.json").read_text())


def serving_document(*, model: dict[str, Any], hardware: list[dict[str, Any]], workload: ServingWorkload,
                     plans: list[ServingPlan], pareto: list[dict[str, float]], search: dict[str, Any]) -> dict[str, Any]:
    """The whole ``serve --json`` document, checked against serving_plan.schema.json."""
    arrivals = workload.arrivals
    document = {
        "schema_version": SERVING_SCHEMA_VERSION, "kind": "serving", "paraplan_version": __version__,
        "model": model, "hardware": hardware,
        "workload": {"isl": workload.isl, "osl": workload.osl, "isl_cv": workload.isl_cv, "osl_cv": workload.osl_cv,
                     "concurrency": workload.concurrency,
                     "rate_per_s": None if arrivals is None else arrivals.rate_per_s,
                     "arrival": None if arrivals is None else arrivals.source,
                     "arrival_cv2": None if arrivals is None else arrivals.cv2,
                     "ttft_target_s": workload.ttft_target_s, "tpot_target_s": workload.tpot_target_s,
                     "percentile": workload.percentile},
        "plans": [plan_to_json(p) for p in plans], "pareto": pareto, "search": search,
        "provenance": {"cost_model": PROVENANCE, "queueing": QUEUEING}}
    validate_own(document, serving_schema())
    return document


def serving_document_of(served, problem, result) -> dict[str, Any]:
    """The ``serve --json`` document of a search result (``served``: model_specs.served.ServedModel, ``problem``:
    serving.rank.ServingProblem, ``result``: serving.rank.ServingResult)."""
    choices = problem.choices
    hardware = [{"gpu": c.gpu.name, "num_gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node,
                 "nvlink_domain_gpus": c.nvlink_domain_gpus, "cluster": c.name, "price_usd_per_gpu_hour": problem.price(i)}
                for i, c in enumerate(problem.clusters)]
    search = {"considered": result.considered, "feasible": result.feasible, "objective": choices.objective,
              "engines": list(choices.engines), "modes": list(choices.modes)}
    return serving_document(model=served.to_json(), hardware=hardware, workload=problem.workload, plans=result.plans,
                            pareto=result.pareto, search=search)


PROVENANCE = ("analytical serving model (cost_models/inference_step.py, serving.py) on the training model's GPU "
              "rates; engine step and request overheads fitted to 5,221 measured deployments (aiconfigurator "
              "0.12 silicon sample): TPOT median |error| 19.2% in sample, 21.8% leave-one-model-out; TTFT 40.4% / "
              "44.6% (docs/serving.md)")
QUEUEING = ("closed loop: fixed concurrency, steady state; open loop: Little's law for the running batch, "
            "G/G/c waits by Allen-Cunneen with exponential tails (exact for M/M/c), percentiles of TTFT as the sum "
            "of its parts' percentiles (an upper bound) (planner/serving/load.py, queueing.py)")
