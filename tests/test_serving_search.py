"""The serving search: its load model against the validated steady state and closed forms, its choices against
brute force, its rules per engine, its front, and its plans' JSON."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cost_models.inference_step import Sharding
from paraplan.cost_models.serving import ENGINE_TRAITS, weight_precision
from paraplan.cost_models.serving import aggregated as validated_aggregated
from paraplan.errors import InputError
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.served import served_model
from paraplan.planner.serving.load import Load, aggregated, decode_pool, prefill_pool_ttft_s
from paraplan.planner.serving.pools import ServingSetup, batch_grid, decode_s, exact_decode_s, worker_costs
from paraplan.planner.serving.queueing import poisson
from paraplan.planner.serving.rank import ServingProblem, pareto_front, quant_modes, search_serving
from paraplan.planner.serving.space import ServingChoices, ServingWorkload, worker_shardings


@pytest.fixture(scope="module")
def llama8b():
    return served_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def h100x8():
    return quick_cluster("h100-sxm", 8)


def _setup(served, cluster, engine="vllm", kv="bf16", isl=1024, osl=1024) -> ServingSetup:
    gemm, experts = quant_modes(served.spec, "auto")
    return ServingSetup(model=served.spec, cluster=cluster, engine=ENGINE_TRAITS[engine],
                        precision=weight_precision(served.spec, gemm, experts, kv), quant_modes=(gemm, experts),
                        kv_dtype=kv, isl=isl, osl=osl)


def _closed(setup: ServingSetup, concurrency: float) -> Load:
    return Load(isl=setup.isl, osl=setup.osl, isl_cv=0.0, osl_cv=0.0, concurrency=concurrency, rate_per_s=None,
                arrival_cv2=1.0, request_overhead_s=setup.engine.request_overhead_s,
                first_token_steps=setup.engine.first_token_steps)


def _open(rate: float, *, overhead=0.0, isl=1024, osl=1024) -> Load:
    return Load(isl=isl, osl=osl, isl_cv=0.0, osl_cv=0.0, concurrency=None, rate_per_s=rate, arrival_cv2=1.0,
                request_overhead_s=overhead)


@pytest.mark.parametrize("concurrency", [1, 16, 64, 400])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_closed_loop_equals_the_validated_steady_state(llama8b, h100x8, concurrency, tp):
    """With pp 1 and a prompt within one chunk, the search's closed loop is cost_models.serving.aggregated's
    steady state (waves = inf), the model measured against 5,221 deployments, to rounding."""
    setup = _setup(llama8b, h100x8)
    shard = Sharding.of(np.array([tp]))
    costs = worker_costs(setup, shard, max_model_len=2048, chunks=(8192,))
    ours = aggregated(_closed(setup, concurrency), prefill_s=costs.prefill_s,
                      step_of=lambda b: exact_decode_s(setup, shard, b),
                      fits=costs.fits[:, 0], cap=setup.engine.max_running, chunk=8192.0, replicas=1.0, ranks=1.0)
    theirs = validated_aggregated(setup.model, setup.cluster, setup.engine, setup.precision, shard,
                                  concurrency=concurrency, isl=1024, osl=1024, waves=np.inf)
    assert ours.tpot_s[0] == pytest.approx(theirs.tpot_s[0], rel=1e-12)
    assert ours.ttft_s[0] == pytest.approx(theirs.ttft_s[0], rel=1e-12)


def test_decode_grid_interpolation_within_one_percent(llama8b, h100x8):
    setup = _setup(llama8b, h100x8)
    shard = Sharding.of(np.array([1, 2, 4, 8]))
    costs = worker_costs(setup, shard, max_model_len=2048, chunks=(8192,))
    batch = np.geomspace(1, 3000, 57)
    for i in range(4):
        exact = exact_decode_s(setup, Sharding.of(np.array([shard.tp[i]])), batch)
        assert np.allclose(decode_s(costs, np.full(batch.size, i), batch), exact, rtol=0.01)
        grid = batch_grid()  # on grid points the interpolation is exact
        assert np.allclose(decode_s(costs, np.full(grid.size, i), grid), costs.decode_grid_s[i], rtol=1e-12)


def _constant_step(step: float):
    return lambda b: np.full(np.shape(b), step)


def test_open_loop_degenerates_to_md1_and_littles_law():
    """A constant decode step D, prefill P, Poisson arrivals and ample slots: TPOT = D/(1 − λP) exactly; the
    prompt waits behind other prefills as in M/D/1 (Pollaczek-Khinchine: ρP/(2(1 − ρ))); the running batch
    obeys Little's law, B = λ·osl·TPOT."""
    lam, prefill, step, osl = 5.0, 0.05, 0.02, 100
    load = _open(lam, overhead=0.01, osl=osl, isl=1000)
    out = aggregated(load, prefill_s=np.array([prefill]), step_of=_constant_step(step), fits=np.array([1e6]),
                     cap=1e6, chunk=8192.0, replicas=1.0, ranks=1.0)
    rho = lam * prefill
    tpot = step / (1 - rho)
    assert out.tpot_s[0] == pytest.approx(tpot, rel=1e-12)
    assert out.running_batch[0] == pytest.approx(lam * osl * tpot, rel=1e-9)
    md1_wait = rho * prefill / (2 * (1 - rho))
    assert out.ttft_s[0] == pytest.approx(0.01 + md1_wait + prefill + step / 2, rel=1e-9)


def test_open_loop_beyond_capacity_is_unstable():
    load = _open(30.0, osl=100)
    out = aggregated(load, prefill_s=np.array([0.05]), step_of=_constant_step(0.02), fits=np.array([1e6]), cap=1e6,
                     chunk=8192.0, replicas=1.0, ranks=1.0)  # λP = 1.5: prefills alone exceed the GPU
    assert not out.stable[0] and out.ttft_s[0] == np.inf


def test_replicas_split_the_rate():
    """Two replicas at rate 2λ behave as one at λ."""
    kw = {"prefill_s": np.array([0.04]), "step_of": _constant_step(0.015), "fits": np.array([500.0]), "cap": 256.0,
              "chunk": 8192.0, "ranks": 1.0}
    one = aggregated(_open(3.0), replicas=1.0, **kw)
    two = aggregated(_open(6.0), replicas=2.0, **kw)
    assert two.ttft_s[0] == pytest.approx(one.ttft_s[0], rel=1e-12)
    assert two.tpot_s[0] == pytest.approx(one.tpot_s[0], rel=1e-12)


def test_disaggregated_pools_by_hand():
    """Decode with nothing mixed in: TPOT = D; the prefill pool at utilisation ρ = λP/servers (M/D/1 for one
    server) plus the KV transfer."""
    lam, prefill, step, transfer = 4.0, 0.1, 0.02, 0.003
    load = _open(lam, overhead=0.0)
    dec, _wait = decode_pool(load, step_of=_constant_step(step), fits=np.array([1e6]), cap=1e6, workers=1.0,
                            ranks=1.0)
    assert dec.tpot_s[0] == step and dec.running_batch[0] == pytest.approx(lam * 1024 * step, rel=1e-9)
    ttft = prefill_pool_ttft_s(load, rate_per_s=lam, prefill_s=np.array([prefill]), transfer_s=transfer,
                               chunk=8192.0, step_overhead_s=0.0, workers=1.0, ranks=1.0, arrival_cv2=1.0)
    rho = lam * prefill
    assert ttft[0] == pytest.approx(rho * prefill / (2 * (1 - rho)) + prefill + transfer, rel=1e-9)


def test_first_token_steps_add_that_many_tpots_to_the_ttft():
    """``Load.first_token_steps`` = k adds k TPOTs to an aggregated request's TTFT (open loop) and to the decode
    pool's share of a disaggregated one, closed loop and open; TPOT and the running batch do not move."""
    kw = {"prefill_s": np.array([0.04]), "step_of": _constant_step(0.015), "fits": np.array([500.0]), "cap": 256.0,
          "chunk": 8192.0, "replicas": 1.0, "ranks": 1.0}
    base, hops = _open(3.0), replace(_open(3.0), first_token_steps=6.0)
    a, b = aggregated(base, **kw), aggregated(hops, **kw)
    assert b.tpot_s[0] == a.tpot_s[0] and b.running_batch[0] == a.running_batch[0]
    assert b.ttft_s[0] - a.ttft_s[0] == pytest.approx(6.0 * a.tpot_s[0], rel=1e-9)
    pool = {"step_of": _constant_step(0.02), "fits": np.array([1e6]), "cap": 1e6, "workers": 1.0, "ranks": 1.0}
    closed = Load(isl=1024, osl=1024, isl_cv=0.0, osl_cv=0.0, concurrency=64.0, rate_per_s=None, arrival_cv2=1.0,
                  request_overhead_s=0.0)
    for load in (base, closed):
        (dec, wait), (dec_k, wait_k) = decode_pool(load, **pool), decode_pool(replace(load, first_token_steps=6.0),
                                                                                **pool)
        assert dec_k.tpot_s[0] == dec.tpot_s[0] and dec_k.requests_per_s[0] == pytest.approx(dec.requests_per_s[0])
        assert wait_k[0] - wait[0] == pytest.approx(6.0 * 0.02, rel=1e-9)


def test_engine_rules_in_the_shardings(h100x8):
    moe = served_model("qwen3-30b-a3b").spec
    cluster = quick_cluster("h100-sxm", 64)
    trt = worker_shardings(moe, cluster, "trtllm", {}, 64)
    assert np.all((trt.tp == 1) | (trt.dp == 1)) and trt.tp.size > 0
    vllm = worker_shardings(moe, cluster, "vllm", {}, 64)
    assert np.all((vllm.moe_ep == 1) | (vllm.moe_ep == vllm.tp * vllm.dp))
    sgl = worker_shardings(moe, cluster, "sglang", {}, 64)
    assert np.all(sgl.moe_tp * sgl.moe_ep == sgl.tp * sgl.dp) and np.any((sgl.moe_ep > 1) & (sgl.moe_tp > 1))
    dense = worker_shardings(served_model("llama-3.1-8b").spec, h100x8, "sglang", {"tp": (2, 4)}, 8)
    assert set(dense.tp.tolist()) == {2.0, 4.0} and np.all(dense.dp == 1)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3", "llama-3.1-70b"])
def test_every_searched_sharding_is_one_the_engine_can_launch(engine, model):
    """The search's engine rules agree with the exporter's, which were checked against each engine's parser."""
    from paraplan.exporters.serving_engines import expressible

    spec = served_model(model).spec
    cluster = quick_cluster("h200-sxm", 128)
    shard = worker_shardings(spec, cluster, engine, {}, 128)
    assert shard.tp.size > 0
    for i in range(shard.tp.size):
        pool = {"tp": shard.tp[i], "dp_attention": shard.dp[i], "moe_ep": shard.moe_ep[i], "pp": shard.pp[i],
                "gpu": "h200-sxm", "gpus_per_node": 8}
        assert expressible(engine, pool) is None, (engine, pool)


def test_pareto_front_against_brute_force():
    rng = np.random.default_rng(0)
    x, y = rng.random(400), rng.random(400)
    front = set(pareto_front(x, y).tolist())
    brute = {i for i in range(400) if not np.any((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i])))}
    assert front == brute


def _problem(served, cluster, workload, **choices) -> ServingProblem:
    return ServingProblem(model=served.spec, clusters=(cluster,), workload=workload,
                          choices=ServingChoices(**choices))


def test_best_closed_loop_deployment_equals_brute_force(llama8b):
    """Llama 3.1 8B on 4 H100, concurrency 32, TPOT ≤ 12 ms: the search's best tokens/s per GPU is the best of
    every (engine, KV dtype, tp, pp, replicas, batch cap, chunk) priced one at a time with the exact step."""
    cluster = quick_cluster("h100-sxm", 4)
    workload = ServingWorkload(isl=1024, osl=256, concurrency=32, tpot_target_s=0.012)
    best = search_serving(_problem(llama8b, cluster, workload, modes=("agg",)), top=1).plans[0]
    brute = 0.0
    for engine, kv, tp, pp, chunk in itertools.product(ENGINE_TRAITS, ("bf16", "fp8"), (1, 2, 4), (1, 2, 4),
                                                       (2048, 4096, 8192, 16384)):
        if tp * pp > 4:
            continue
        setup = _setup(llama8b, cluster, engine, kv, 1024, 256)
        shard = Sharding.of(np.array([tp]), pp=np.array([pp]))
        costs = worker_costs(setup, shard, max_model_len=workload.max_model_len, chunks=(chunk,))
        if costs.fits[0, 0] < 1:
            continue
        for replicas in range(1, 4 // (tp * pp) + 1):
            for cap in [c for c in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if c <= chunk]:
                if cap > setup.engine.max_running:
                    continue
                out = aggregated(_closed(setup, 32), prefill_s=costs.prefill_s, fits=costs.fits[:, 0], cap=cap,
                                 step_of=lambda b, s=setup, sh=shard: exact_decode_s(s, sh, b), chunk=float(chunk),
                                 replicas=float(replicas), ranks=1.0)
                if out.tpot_s[0] <= 0.012:
                    brute = max(brute, out.requests_per_s[0] * 256 / (replicas * tp * pp))
    assert brute > 0
    # The search screens with the decode step interpolated (within 1%), then prices its finalists exactly.
    assert best.estimate["tokens_per_s_per_gpu"] == pytest.approx(brute, rel=0.01)


def test_every_plan_meets_its_targets_and_tighter_targets_never_help(llama8b):
    cluster = quick_cluster("h100-sxm", 16)
    loose = ServingWorkload(isl=2048, osl=512, arrivals=poisson(8.0), ttft_target_s=1.0, tpot_target_s=0.04,
                            percentile=90)
    tight = ServingWorkload(isl=2048, osl=512, arrivals=poisson(8.0), ttft_target_s=0.5, tpot_target_s=0.015,
                            percentile=90)
    a = search_serving(_problem(llama8b, cluster, loose), top=5)
    b = search_serving(_problem(llama8b, cluster, tight), top=5)
    for result, w in ((a, loose), (b, tight)):
        for plan in result.plans:
            assert plan.meets_targets
            assert plan.estimate["ttft_s"]["p90"] <= w.ttft_target_s
            assert plan.estimate["tpot_s"]["p90"] <= w.tpot_target_s
            assert plan.num_gpus <= 16
    assert a.plans[0].estimate["tokens_per_s_per_gpu"] >= b.plans[0].estimate["tokens_per_s_per_gpu"]
    assert a.feasible >= b.feasible


def test_more_gpus_never_lower_the_best_throughput_at_a_fixed_rate(llama8b):
    workload = ServingWorkload(isl=1024, osl=512, arrivals=poisson(6.0), ttft_target_s=1.0, tpot_target_s=0.03)
    small = search_serving(_problem(llama8b, quick_cluster("h100-sxm", 8), workload), top=1).plans[0]
    large = search_serving(_problem(llama8b, quick_cluster("h100-sxm", 32), workload), top=1).plans[0]
    assert large.estimate["tokens_per_s_per_gpu"] >= small.estimate["tokens_per_s_per_gpu"] * (1 - 1e-9)


def test_percentiles_are_ordered_and_closed_fixed_lengths_have_no_spread(llama8b, h100x8):
    rate = search_serving(_problem(llama8b, h100x8, ServingWorkload(isl=1024, osl=512, arrivals=poisson(10.0),
                                                                     percentile=99)), top=1).plans[0]
    for metric in ("ttft_s", "tpot_s"):
        s = rate.estimate[metric]
        assert s["p50"] <= s["p90"] <= s["p99"] and s["p99"] > s["p50"]
    closed = search_serving(_problem(llama8b, h100x8, ServingWorkload(isl=1024, osl=512, concurrency=64)),
                            top=1).plans[0]
    s = closed.estimate["tpot_s"]
    assert s["p50"] == pytest.approx(s["p99"], rel=1e-9) == pytest.approx(s["mean"], rel=1e-9)


def test_unreachable_targets_are_one_line(llama8b, h100x8):
    workload = ServingWorkload(isl=1024, osl=512, concurrency=64, tpot_target_s=0.0001)
    with pytest.raises(InputError, match="meets the targets") as info:
        search_serving(_problem(llama8b, h100x8, workload))
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_a_model_that_fits_nowhere_is_refused():
    workload = ServingWorkload(isl=1024, osl=1024, concurrency=8)
    with pytest.raises(InputError, match="fits and keeps up|meets the targets"):
        search_serving(_problem(served_model("llama-3.1-405b"), quick_cluster("h100-sxm", 2), workload,
                                precision="bf16"))


def test_workload_validation_messages():
    with pytest.raises(InputError, match="one of --concurrency"):
        ServingWorkload(isl=10, osl=10)
    with pytest.raises(InputError, match="positive token counts"):
        ServingWorkload(isl=0, osl=10, concurrency=1)
    with pytest.raises(InputError, match="50, 90 or 99"):
        ServingWorkload(isl=10, osl=10, concurrency=1, percentile=75)
    with pytest.raises(InputError, match="choose from"):
        ServingChoices(engines=("tgi",))


# -- several GPU types --------------------------------------------------------------------------------------------

def _option(gpu: str, gpus: int, capacity: float, price: float):
    from types import SimpleNamespace

    from paraplan.planner.serving.fleet import FleetOption

    side = SimpleNamespace(setup=SimpleNamespace(cluster=SimpleNamespace(gpu=SimpleNamespace(name=gpu))))
    return FleetOption(side=side, shard=0, chunk=0, cap=1.0, gpus=gpus, capacity_per_s=capacity,
                       usd_per_hour=price * gpus)


@pytest.mark.parametrize("seed", range(6))
def test_fleet_program_equals_brute_force(seed):
    """The integer program's cheapest worker counts equal an exhaustive search over every count vector."""
    from paraplan.planner.serving.fleet import solve_fleet

    rng = np.random.default_rng(seed)
    options = [_option("a", 1, rng.uniform(0.5, 2), 2.0), _option("a", 2, rng.uniform(1, 5), 2.0),
               _option("b", 1, rng.uniform(0.5, 3), 3.1), _option("b", 4, rng.uniform(2, 12), 3.1)]
    available, rate = {"a": 6, "b": 8}, float(rng.uniform(3, 12))
    best = np.inf
    for counts in itertools.product(range(7), range(4), range(9), range(3)):
        used = {"a": counts[0] + 2 * counts[1], "b": counts[2] + 4 * counts[3]}
        if any(used[g] > available[g] for g in used):
            continue
        if sum(o.capacity_per_s * n for o, n in zip(options, counts)) >= rate:
            best = min(best, sum(o.usd_per_hour * n for o, n in zip(options, counts)))
    solution = solve_fleet(options, rate, available, by_cost=True)
    if not np.isfinite(best):
        assert solution is None
    else:
        assert solution.objective == pytest.approx(best, rel=1e-9)
        assert sum(o.capacity_per_s * n for o, n in zip(options, solution.counts)) >= rate - 1e-9


def test_mixed_gpu_types_fleet_and_cross_type_disaggregation(llama8b):
    """Two GPU types at their prices: every plan keeps within each type's GPUs and meets the targets; the cost
    objective's best is no dearer than the best on either type alone."""
    a, b = quick_cluster("h100-sxm", 8), quick_cluster("h200-sxm", 4)
    workload = ServingWorkload(isl=1024, osl=512, arrivals=poisson(12.0), ttft_target_s=0.8, tpot_target_s=0.03,
                               percentile=90)

    def best(clusters, prices):
        problem = ServingProblem(model=llama8b.spec, clusters=clusters, workload=workload,
                                 choices=ServingChoices(objective="cost"), prices_usd_per_gpu_hour=prices)
        return search_serving(problem, top=5)
    mixed = best((a, b), (2.0, 2.2))
    for plan in mixed.plans:
        assert plan.meets_targets
        used: dict[str, int] = {}
        for pool in (p.shape for p in plan.pools):
            used[pool.gpu] = used.get(pool.gpu, 0) + pool.num_workers * pool.gpus_per_worker
        assert used.get("h100-sxm", 0) <= 8 and used.get("h200-sxm", 0) <= 4
        if len(plan.pools) > 1 and plan.mode == "agg":
            assert sum(p.shape.traffic_frac for p in plan.pools) == pytest.approx(1.0)
    alone = [best((a,), (2.0,)), best((b,), (2.2,))]
    cheapest_alone = min(r.plans[0].estimate["usd_per_million_output_tokens"] for r in alone)
    assert mixed.plans[0].estimate["usd_per_million_output_tokens"] <= cheapest_alone * (1 + 1e-9)


def test_varying_lengths_admit_each_lengths_p99():
    """Exponential prompt lengths (cv 1) have their p99 at ln(100) = 4.605 times the mean; fixed ones at the mean."""
    workload = ServingWorkload(isl=1000, osl=200, concurrency=1, isl_cv=1.0, osl_cv=0.0)
    assert workload.max_model_len == pytest.approx(1000 * np.log(100) + 200, rel=0.005)
    assert ServingWorkload(isl=1000, osl=200, concurrency=1).max_model_len == 1200
