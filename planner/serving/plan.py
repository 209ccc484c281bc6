"""Serving plans: one deployment, its pools and its prediction, priced exactly and serialised as schema-checked JSON.

The search screens candidates with the decode step interpolated on a batch grid; a plan shown to the user is
priced again with the decode step computed at its own batch (``exact_latency``), at the mean and at p50, p90
and p99.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import numpy as np

from paraplan.cost_models.inference_step import Sharding
from paraplan.cost_models.serving import EngineTraits, engine_memory
from paraplan.model_specs.served import ServedModel
from paraplan.planner.json_schema import validate_own
from paraplan.planner.serving.load import (
    AdmitOf,
    Load,
    StepOf,
    aggregated_stats,
    decode_pool_stats,
    prefill_pool_ttft_s,
)
from paraplan.planner.serving.pool_shape import PoolRole, ServingPool, pool_json
from paraplan.planner.serving.pools import ServingSetup, WorkerCosts, exact_admit_s, exact_decode_s
from paraplan.planner.serving.problem import MeasuredTables, ServingProblem
from paraplan.planner.serving.space import DeploymentMode, ServingWorkload
from paraplan.planner.serving.tables import MEASURED_PROVENANCE, measured_json, pool_tables_json
from paraplan.version import __version__

SERVING_SCHEMA_VERSION = 1
STATISTICS = (("mean", None), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6
KV_TRANSFER_BACKENDS = {"vllm": "nixl", "sglang": "mooncake", "trtllm": "ucx"}
"""The KV-cache transfer each engine's disaggregated deployment is written with."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PricedPool:
    """A pool of the plan: its worker shape and where the search priced it."""

    shape: ServingPool
    """Its identical workers, as the plan document states them."""
    setup: ServingSetup
    """The GPU type, engine, precision and KV dtype of the pool."""
    costs: WorkerCosts
    """The per-sharding costs ``shard_index`` points into."""
    shard_index: int
    """Row of ``costs``: the workers' sharding."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingPlan:
    """One ranked deployment."""

    rank: int
    """1 for the best plan shown; 0 before ranking."""
    setup: ServingSetup
    """The setup of the (decode) pool: its engine and KV dtype are the deployment's."""
    mode: DeploymentMode
    """agg or disagg."""
    pools: tuple[PricedPool, ...]
    """Aggregated pools, or the prefill pool then the decode pool."""
    estimate: dict[str, Any]
    """Predictions in SI units (see serving_plan.schema.json)."""
    meets_targets: bool
    """Whether the exact pricing meets the targets at the bound percentile."""

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole deployment."""
        return sum(p.shape.num_gpus for p in self.pools)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingResult:
    """The ranked plans, the Pareto front and how many deployments the search priced."""

    plans: list[ServingPlan]
    """The best deployments that meet the targets, priced exactly, rank 1 first."""
    pareto: list[dict[str, Any]]
    """The throughput/interactivity Pareto front (front.pareto_points)."""
    considered: int
    """Deployments priced."""
    feasible: int
    """Deployments that qualified at the screening."""



def _sub(costs: WorkerCosts, index: int) -> Sharding:
    """Sharding ``index`` of ``costs`` alone (arrays of one entry)."""
    shard = costs.shard
    return Sharding(**{k: getattr(shard, k)[[index]] for k in ("tp", "dp", "moe_tp", "moe_ep", "pp")})


def make_pool(role: PoolRole, setup: ServingSetup, costs: WorkerCosts, shard: int, chunk: int, cap: float,
              workers: float, max_model_len: int, traffic_frac: float = 1.0) -> PricedPool:
    """A pool from one candidate's indices: sharding row ``shard``, chunk column ``chunk``, ``cap`` sequences per
    attention-DP rank and ``workers`` replicas (the plan states the worker's totals)."""
    s = costs.shard
    dp = int(s.dp[shard])
    shape = ServingPool(role=role, gpu=setup.cluster.gpu.name, num_node_gpus=setup.cluster.gpus_per_node,
                        num_workers=int(workers), tp=int(s.tp[shard]), pp=int(s.pp[shard]), dp_attention=dp,
                        moe_ep=int(s.moe_ep[shard]), moe_tp=int(s.moe_tp[shard]), max_batch=int(cap) * dp,
                        max_batched_tokens=int(costs.chunks[chunk]) * dp,
                        memory_frac=float(costs.memory_frac[shard, chunk]), max_model_len=max_model_len,
                        traffic_frac=traffic_frac)
    return PricedPool(shape=shape, setup=setup, costs=costs, shard_index=int(shard))


def _memo(step_of: StepOf) -> StepOf:
    """``step_of`` (a decode step or an admission) remembering its answers: the four statistics of a plan solve
    the same running batch."""
    seen: dict[bytes, np.ndarray] = {}

    def cached(batch: np.ndarray) -> np.ndarray:
        key = np.asarray(batch, dtype=float).tobytes()
        if key not in seen:
            seen[key] = step_of(batch)
        return seen[key]
    return cached


def _exact_step(pool: PricedPool) -> StepOf:
    """The pool's decode step priced directly at each batch asked (remembered)."""
    shard = _sub(pool.costs, pool.shard_index)
    return _memo(lambda batch: exact_decode_s(pool.setup, shard, batch))


def _exact_admit(pool: PricedPool) -> AdmitOf:
    """The prefill of the prompts a mixed step of the pool admits together, priced directly at its chunk size."""
    shard = _sub(pool.costs, pool.shard_index)
    return _memo(lambda prompts: exact_admit_s(pool.setup, shard, pool.shape.max_batched_tokens_per_rank, prompts))


def _fits(pool: PricedPool) -> np.ndarray:
    """Sequences one attention-DP rank of the pool holds at its chunk (an array of one entry)."""
    costs = pool.costs
    return costs.fits[[pool.shard_index], costs.chunks.index(pool.shape.max_batched_tokens_per_rank)]


def _aggregated_kw(pool: PricedPool) -> dict[str, Any]:
    """The keyword arguments of load.aggregated_stats for one aggregated pool."""
    shape = pool.shape
    return {"prefill_s": pool.costs.prefill_s[[pool.shard_index]], "step_of": _exact_step(pool), "fits": _fits(pool),
            "cap": shape.max_batch_per_rank, "chunk": float(shape.max_batched_tokens_per_rank),
            "replicas": float(shape.num_workers), "ranks": float(shape.dp_attention), "admit_of": _exact_admit(pool)}


def _stats(latencies: Iterable[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """{ttft_s: {mean, p50, p90, p99}, tpot_s: {...}} from (TTFT, TPOT) per statistic of STATISTICS."""
    out: dict[str, dict[str, float]] = {"ttft_s": {}, "tpot_s": {}}
    for (name, _), (ttft, tpot) in zip(STATISTICS, latencies):
        out["ttft_s"][name], out["tpot_s"][name] = float(ttft), float(tpot)
    return out


def exact_latency(load: Load, pools: tuple[PricedPool, ...]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """TTFT and TPOT at each statistic and the throughput, with the decode step priced at the plan's own batch."""
    qs = [q for _, q in STATISTICS]
    if len(pools) == 1:
        latencies = aggregated_stats(load, qs=qs, **_aggregated_kw(pools[0]))
        mean = latencies[0]
        return _stats((lat.ttft_s[0], lat.tpot_s[0]) for lat in latencies), \
            {"requests_per_s": float(mean.requests_per_s[0]), "running_batch": float(mean.running_batch[0])}
    prefill, decode = pools
    dec = decode.shape
    decodes = decode_pool_stats(load, qs=qs, step_of=_exact_step(decode), fits=_fits(decode),
                                cap=dec.max_batch_per_rank, workers=float(dec.num_workers),
                                ranks=float(dec.dp_attention))
    mean = decodes[0][0]
    p, pc, pre = prefill.shard_index, prefill.costs, prefill.shape
    pkw: dict[str, Any] = {
        "rate_per_s": mean.requests_per_s if load.closed else load.open_rate_per_s, "prefill_s": pc.prefill_s[[p]],
        "transfer_s": pc.kv_transfer_s[[p]], "chunk": float(pre.max_batched_tokens_per_rank),
        "step_overhead_s": pc.step_overhead_s[[p]], "workers": float(pre.num_workers),
        "ranks": float(pre.dp_attention), "arrival_cv2": 1.0 if load.closed else load.arrival_cv2}
    stats = _stats((prefill_pool_ttft_s(load, q=q, **pkw)[0] + wait[0], lat.tpot_s[0])
                   for q, (lat, wait) in zip(qs, decodes))
    rate = load.closed_concurrency / (stats["ttft_s"]["mean"] + load.osl * stats["tpot_s"]["mean"]) if load.closed \
        else load.open_rate_per_s
    return stats, {"requests_per_s": float(rate), "running_batch": float(mean.running_batch[0])}


def memory_of(pool: PricedPool, held_tokens: float) -> dict[str, float]:
    """One GPU of the pool under the engine's memory rule at the pool's knob (bytes)."""
    setup, shape = pool.setup, pool.shape
    engine = replace(setup.engine, max_batched_tokens=shape.max_batched_tokens_per_rank, memory_frac=shape.memory_frac)
    mem = engine_memory(setup.model, setup.cluster, engine, setup.precision, _sub(pool.costs, pool.shard_index),
                        held_tokens)
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
    transfer = None
    if plan.mode == "disagg":
        same = plan.pools[0].setup.cluster is plan.pools[1].setup.cluster
        link = "nvlink" if same and setup.cluster.domain_gpus >= plan.num_gpus else "rdma"
        transfer = {"backend": KV_TRANSFER_BACKENDS[setup.engine.name], "link": link}
    entry = {"rank": plan.rank, "engine": setup.engine.name, "mode": plan.mode,
             "quantization": {"weights": gemm, "experts": experts, "kv_cache_dtype": setup.kv_dtype},
             "num_gpus": plan.num_gpus, "pools": [pool_json(p.shape) for p in plan.pools], "kv_transfer": transfer,
             "estimate": {k: v for k, v in plan.estimate.items() if k != "max_model_len"},
             "meets_targets": plan.meets_targets}
    options = engine_options_json(setup.engine)
    return entry if options is None else {**entry, "engine_options": options}


def engine_options_json(engine: EngineTraits) -> dict[str, Any] | None:
    """The plan's ``engine_options`` (CUDA graphs, speculative decoding), or None at the engine's defaults
    (the memory fraction rides in each pool's ``memory_frac``)."""
    spec = engine.speculation
    if engine.cuda_graphs and spec is None:
        return None
    speculative = None if spec is None else {
        "method": spec.method, "num_tokens": spec.num_tokens, "acceptance_frac": spec.acceptance_frac,
        "draft_model": spec.draft_model, "expected_tokens_per_step": spec.expected_tokens}
    return {"cuda_graphs": engine.cuda_graphs, "speculative": speculative}


def serving_schema() -> dict[str, Any]:
    """The JSON Schema every serving plan document is checked against."""
    return json.loads(resources.files("paraplan.planner").joinpath("schemas/serving_plan.schema.json").read_text())


def serving_document(*, model: dict[str, Any], hardware: list[dict[str, Any]], workload: ServingWorkload,
                     plans: list[ServingPlan], pareto: list[dict[str, Any]], search: dict[str, Any],
                     measured: MeasuredTables | None = None) -> dict[str, Any]:
    """The whole ``serve --json`` document, checked against serving_plan.schema.json (``measured``: the engine
    tables that priced it, named in each plan and in the provenance)."""
    arrivals = workload.arrivals
    plan_entries = [plan_to_json(p) for p in plans]
    provenance: dict[str, Any] = {"cost_model": PROVENANCE, "queueing": QUEUEING}
    if measured is not None:
        for entry, plan in zip(plan_entries, plans):
            entry["kernel_tables"] = [pool_tables_json(measured, pool.shape.role, pool.setup,
                                                       _sub(pool.costs, pool.shard_index),
                                                       plan.estimate["running_batch"]) for pool in plan.pools]
        provenance = {"cost_model": MEASURED_PROVENANCE + PROVENANCE, "queueing": QUEUEING,
                      "kernel_tables": measured_json(measured)}
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
        "plans": plan_entries, "pareto": pareto, "search": search, "provenance": provenance}
    validate_own(document, serving_schema())
    return document


def serving_document_of(served: ServedModel, problem: ServingProblem, result: ServingResult) -> dict[str, Any]:
    """The ``serve --json`` document of a search result."""
    choices = problem.choices
    hardware = [{"gpu": c.gpu.name, "num_gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node,
                 "nvlink_domain_gpus": c.nvlink_domain_gpus, "cluster": c.name,
                 "price_usd_per_gpu_hour": problem.price(i)} for i, c in enumerate(problem.clusters)]
    search = {"considered": result.considered, "feasible": result.feasible, "objective": choices.objective,
              "engines": list(choices.engines), "modes": list(choices.modes)}
    return serving_document(model=served.to_json(), hardware=hardware, workload=problem.workload, plans=result.plans,
                            pareto=result.pareto, search=search, measured=problem.measured)


PROVENANCE = ("analytical serving model (cost_models/inference_step.py, serving.py) at the GPUs' kernel fractions "
              "(hardware_profiles/run_factor.py); engine step and request overheads, first-token steps and the "
              "attention-DP step sync "
              "fitted to the 4,168 of 5,221 measured deployments that state them without MTP (aiconfigurator 0.12 "
              "silicon sample; 1,676 with what InferenceX published of their deployments): "
              "TPOT median |error| 14.3% in sample, 16.0% leave-one-model-out; TTFT 38.3% / 42.2% over all 5,221 "
              "(paraplan validate --serving; "
              "docs/serving.md)")
"""Quoted figures: ``tests/test_serving_validation.py`` checks them against ``validate --serving``."""
QUEUEING = ("closed loop: fixed concurrency, steady state; open loop: Little's law for the running batch, "
            "G/G/c waits by Allen-Cunneen with exponential tails (exact for M/M/c), percentiles of TTFT as the sum "
            "of its parts' percentiles (an upper bound) (planner/serving/load.py, queueing.py)")
