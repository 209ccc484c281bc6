"""Mixed steps batch their prompts (issue 32, item 1): a decode step that admits k prompts runs their k·isl tokens
as one prefill chunk of at most the max batched tokens beside the decode batch, not k separate prefills. Priced by
hand from the step function, checked never slower than separate prefills, and followed through the validated
model (``cost_models.serving.aggregated``), the search's grid, the fleet's capacity and ``paraplan serve``."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from test_serving_mechanics import BF16, small_model, small_moe
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.inference_step import (
    Sharding,
    admitted_prefill_s,
    prefill_chunk_tokens,
    step_time,
)
from paraplan.cost_models.serving import (
    ENGINE_TRAITS,
    admitted_s,
    aggregated,
    engine_decode_s,
    mixed_prefill_s,
    prefill_s,
    weight_precision,
)
from paraplan.hardware_profiles import load_cluster, quick_cluster
from paraplan.hardware_profiles.user_file import HARDWARE_ENV
from paraplan.model_specs.served import served_model
from paraplan.planner.serving import load as load_module
from paraplan.planner.serving.fleet import worker_capacity
from paraplan.planner.serving.pools import ServingSetup, admit_s, exact_admit_s, exact_decode_s, worker_costs
from paraplan.planner.serving.queueing import poisson
from paraplan.planner.serving.rank import quant_modes
from paraplan.planner.serving.search import PoolSide, interpolated_admit, price_setup
from paraplan.planner.serving.space import ServingChoices, ServingWorkload

OVERHEAD_S = 3e-3
ENGINE = replace(ENGINE_TRAITS["vllm"], step_overhead_s=OVERHEAD_S, dp_sync_s=0.0, max_batched_tokens=8192)
"""Admission mechanics alone: no attention-DP sync (tests/test_serving_dp_sync.py prices it)."""


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100", num_gpus=16)


def _causal_flops(isl: float) -> float:
    """Attention-core FLOPs of one prompt in one layer of the small model: QK^T and PV over 8 heads of 128,
    2 FLOPs a multiply-add, half the isl x isl scores (causal)."""
    return 2.0 * 8 * (128 + 128) * isl * isl / 2


def _chunk_s(model, cluster, tokens: float, prompts: float, isl: float) -> float:
    """One prefill step of ``tokens`` tokens carrying ``prompts`` (a token share of) prompts of ``isl`` tokens."""
    return float(step_time(model, cluster, BF16, Sharding.of(1), tokens_per_rank=tokens, sequences_per_rank=prompts,
                           attended_keys=(0.0, 0.0), attention_flops=(prompts * _causal_flops(isl), 0.0),
                           decode=False, moe_tokens=tokens).total_s)


def _alone_s(model, cluster, shard, isl: float, engine=ENGINE) -> np.ndarray:
    """One prompt's prefill alone with its step overhead: what k separate prefills pay k times."""
    return prefill_s(model, cluster, BF16, shard, isl) + engine.step_overhead_s


# --- by hand ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("isl", [1000.0 / 3, 265.52857142857147])  # the second: 3·M/isl·isl = 3·M + 2e-12
def test_whole_chunks_leave_no_rounding_chunk(h100, isl):
    # k = 3·M/isl prompts fill exactly three chunks of M tokens; k·isl/M computed in floats can leave a remainder
    # of a few ulps, which must not run as a fourth chunk re-reading every weight (it once cost 6-20% more).
    model, shard, budget = small_model(), Sharding.of(1), 4096.0
    three = admitted_prefill_s(model, h100, BF16, shard, prompts=3 * budget / isl, prompt_tokens=isl,
                               max_batched_tokens=budget)
    one = admitted_prefill_s(model, h100, BF16, shard, prompts=budget / isl, prompt_tokens=isl,
                             max_batched_tokens=budget)
    assert float(three) == pytest.approx(3 * float(one), rel=1e-9)


def test_k_prompts_within_the_budget_run_as_one_chunk_by_hand(h100):
    # 4 prompts of 512 tokens, 8,192 tokens a step: one step of 2,048 tokens carrying 4 prompts' attention, one
    # step overhead; separately they would pay 4 steps of 512 and 4 overheads.
    model, shard = small_moe(), Sharding.of(1)
    expected = _chunk_s(model, h100, 2048.0, 4.0, 512.0) + OVERHEAD_S
    assert prefill_chunk_tokens(4, 512, 8192) == 2048
    assert admitted_s(model, h100, ENGINE, BF16, shard, 512, 4, 8192) == pytest.approx(expected, rel=1e-12)
    assert mixed_prefill_s(model, h100, ENGINE, BF16, shard, 512, 4.0) == pytest.approx(expected, rel=1e-12)
    separate = 4 * (_chunk_s(model, h100, 512.0, 1.0, 512.0) + OVERHEAD_S)
    assert separate == pytest.approx(4 * _alone_s(model, h100, shard, 512), rel=1e-12)
    # The chunk saves three step overheads and reads each weight and hit expert once instead of four times.
    assert expected < separate - 3 * OVERHEAD_S


def test_k_prompts_past_the_budget_run_as_several_chunks_by_hand(h100):
    # 10 prompts of 1,000 tokens at 4,096 a step: floor(10,000 / 4,096) = 2 full chunks and one of 1,808 tokens,
    # each with its token share of the ten prompts' attention and one step overhead.
    model, shard = small_model(), Sharding.of(1)
    expected = 2 * (_chunk_s(model, h100, 4096.0, 4.096, 1000.0) + OVERHEAD_S) \
        + _chunk_s(model, h100, 1808.0, 1.808, 1000.0) + OVERHEAD_S
    got = admitted_s(model, h100, ENGINE, BF16, shard, 1000, 10, 4096)
    assert got == pytest.approx(expected, rel=1e-12)
    assert got < 10 * _alone_s(model, h100, shard, 1000)


def test_a_fraction_of_a_prompt_a_step_mixes_the_neighbouring_whole_counts(h100):
    model, shard = small_moe(), Sharding.of(1)
    alone = float(_alone_s(model, h100, shard, 700))

    def whole(n: int) -> float:
        return float(admitted_s(model, h100, ENGINE, BF16, shard, 700, n, 8192))
    # k = 2.5: half the steps admit two prompts, half three.
    assert mixed_prefill_s(model, h100, ENGINE, BF16, shard, 700, 2.5) \
        == pytest.approx(0.5 * whole(2) + 0.5 * whole(3), rel=1e-12)
    # k <= 1: a fraction k of the steps prefills one prompt alone, exactly as separate prefills are priced.
    for k in (0.0, 0.3, 1.0):
        assert mixed_prefill_s(model, h100, ENGINE, BF16, shard, 700, k) == pytest.approx(k * alone, rel=1e-12)
    assert whole(1) == pytest.approx(alone, rel=1e-12)


def test_a_lone_prompt_past_the_budget_keeps_its_price(h100):
    # The serving model prices a 12,000-token prompt as one step; admitting it alone or with another must not
    # cost more than that price per prompt.
    model, shard = small_moe(), Sharding.of(1)
    alone = float(_alone_s(model, h100, shard, 12_000))
    assert admitted_s(model, h100, ENGINE, BF16, shard, 12_000, 1, 8192) == pytest.approx(alone, rel=1e-12)
    assert admitted_s(model, h100, ENGINE, BF16, shard, 12_000, 2, 8192) <= 2 * alone * (1 + 1e-12)


def test_aggregated_tpot_carries_one_chunk_a_step_by_hand(h100):
    # 512 sequences each replaced once per 128 steps: every step admits k = 4 prompts of 512 tokens.
    model, shard = small_moe(), Sharding.of(1)
    out = aggregated(model, h100, ENGINE, BF16, shard, concurrency=512, isl=512, osl=128, waves=np.inf)
    assert float(out.running_batch) == 512
    step = engine_decode_s(model, h100, ENGINE, BF16, shard, 512, 512 + 64)
    chunk = _chunk_s(model, h100, 2048.0, 4.0, 512.0) + OVERHEAD_S
    assert float(out.tpot_steady_s) == pytest.approx(step + chunk, rel=1e-12)
    separate = step + 512 * _alone_s(model, h100, shard, 512) / 128
    assert float(out.tpot_steady_s) < separate
    # k = 0.5 (64 sequences): half the steps prefill one prompt alone, as before.
    out = aggregated(model, h100, ENGINE, BF16, shard, concurrency=64, isl=512, osl=128, waves=np.inf)
    step = engine_decode_s(model, h100, ENGINE, BF16, shard, 64, 512 + 64)
    assert float(out.tpot_steady_s) == pytest.approx(step + 64 * _alone_s(model, h100, shard, 512) / 128, rel=1e-12)


# --- metamorphic: batching is never slower than separate prefills --------------------------------------------------

@pytest.fixture(scope="module")
def models():
    return {"small": small_model(), "small-moe": small_moe(), "llama-3.1-8b": served_model("llama-3.1-8b").spec,
            "qwen3-30b-a3b": served_model("qwen3-30b-a3b").spec}


@pytest.mark.parametrize("name", ["small", "small-moe", "llama-3.1-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("isl", [64, 1000, 4096])
@pytest.mark.parametrize("budget", [2048, 8192])
def test_batching_k_prompts_is_never_slower_than_k_separate_prefills(h100, models, name, isl, budget):
    model = models[name]
    engine = replace(ENGINE, max_batched_tokens=budget)
    shards = [Sharding.of(1), Sharding.of(2)] + ([Sharding.of(1, dp=2, moe_ep=2)] if model.is_moe else [])
    for shard in shards:
        alone = float(_alone_s(model, h100, shard, isl, engine))
        for k in (2, 3, 7, 16, 50):
            batched = float(admitted_s(model, h100, engine, BF16, shard, isl, k, budget))
            assert batched <= k * alone * (1 + 1e-12)
            if k * isl <= budget:  # one chunk: the bound is not what keeps it below, it saves k - 1 overheads
                unbounded = float(admitted_prefill_s(model, h100, BF16, shard, prompts=k, prompt_tokens=isl,
                                                     max_batched_tokens=budget)) + OVERHEAD_S
                assert batched == pytest.approx(unbounded, rel=1e-12)
                assert unbounded <= k * alone - (k - 1) * OVERHEAD_S + 1e-12
        # The mean admission grows with k and never passes k separate prefills, fractional k included.
        k = np.linspace(0.0, 20.0, 161)
        mixed = mixed_prefill_s(model, h100, engine, BF16, shard, isl, k)
        assert np.all(np.diff(mixed) >= -1e-12 * mixed[1:])
        assert np.all(mixed <= k * alone * (1 + 1e-12))


def test_small_weight_bound_prompts_batch_far_better(h100):
    # 16 prompts of 32 tokens on the MoE model: the 512-token chunk reads the weights and experts once.
    model, shard = small_moe(), Sharding.of(1)
    batched = admitted_s(model, h100, ENGINE, BF16, shard, 32, 16, 8192)
    assert batched < 0.25 * 16 * _alone_s(model, h100, shard, 32)


# --- the search, its plans and the fleet price the same admissions -------------------------------------------------

@pytest.fixture(scope="module")
def llama8b():
    return served_model("llama-3.1-8b")


def _setup(served, isl=1024, osl=64) -> ServingSetup:
    gemm, experts = quant_modes(served.spec, "auto")
    return ServingSetup(model=served.spec, cluster=quick_cluster("h100-sxm", 8), engine=ENGINE_TRAITS["vllm"],
                        precision=weight_precision(served.spec, gemm, experts, "bf16"), quant_modes=(gemm, experts),
                        kv_dtype="bf16", isl=isl, osl=osl)


def test_admission_on_the_chunk_grid_equals_the_exact_price(llama8b):
    # isl 1,024 at 8,192 tokens a step: 1, 2, 4 and 8 prompts make chunks of 1,024 ... 8,192 tokens, grid points
    # (powers of two), so the search's admission is the direct price to rounding.
    setup = _setup(llama8b)
    shard = Sharding.of(np.array([1, 2, 4]))
    costs = worker_costs(setup, shard, max_model_len=2048, chunks=(2048, 8192))
    k = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    for i in range(3):
        got = admit_s(costs, np.full(k.size, i), np.full(k.size, 1), k)
        exact = exact_admit_s(setup, Sharding.of(np.array([shard.tp[i]])), 8192, k)
        assert np.allclose(got, exact, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_search_admission_waits_for_the_busiest_attention_dp_rank(engine):
    # 4 attention-DP ranks each admitting a prompt every 8th step (k = 1/8): on vLLM a step waits for whichever rank
    # prefills, min(1, 4/8) = half the steps, not 1/8 of them; TRT-LLM balances the ranks and pays the mean. The
    # search's admission (pools.admit_s) is the validated model's (serving.mixed_prefill_s with admission_ranks).
    served = served_model("qwen3-30b-a3b")
    setup = replace(_setup(served), engine=ENGINE_TRAITS[engine])
    shard = Sharding.of(np.array([1.0]), dp=np.array([4.0]), moe_ep=np.array([4.0]))
    costs = worker_costs(setup, shard, max_model_len=2048, chunks=(8192,))
    k = np.array([0.125, 0.5, 2.5])
    got = admit_s(costs, np.zeros(k.size, dtype=int), np.zeros(k.size, dtype=int), k)
    exact = exact_admit_s(setup, shard, 8192, k)
    assert np.allclose(got[:2], exact[:2], rtol=1e-12, atol=0.0)  # 0 or 1 prompt a step: no chunk interpolated
    assert np.allclose(got[2:], exact[2:], rtol=5e-3, atol=0.0)  # 2 or 3 prompts: chunks between grid points
    alone = float(costs.prefill_s[0])
    expected = 0.5 * alone if engine == "vllm" else 0.125 * alone
    assert float(got[0]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize(("isl", "osl"), [(64, 2), (1000.5, 10), (3000, 100), (12_000, 50)])
def test_admission_between_chunk_grid_points_within_half_a_percent(name, isl, osl):
    # Every prompt count a step can admit on average (up to 4,096/osl), every chunk size searched, prompts
    # shorter and longer than a chunk, a mean prompt length that is not whole.
    served = served_model(name)
    setup = _setup(served, isl=isl, osl=osl)
    chunks = (2048, 4096, 8192, 16384)
    for tp in (1, 8):
        shard = Sharding.of(np.array([tp]))
        costs = worker_costs(setup, shard, max_model_len=16384, chunks=chunks)
        k = np.linspace(0.0, 4096 / osl, 701)
        for c, chunk in enumerate(chunks):
            got = admit_s(costs, np.zeros(k.size, dtype=int), np.full(k.size, c), k)
            assert np.allclose(got, exact_admit_s(setup, shard, chunk, k), rtol=0.005, atol=0.0)


@pytest.mark.parametrize("concurrency", [32, 256, 1000])
def test_search_closed_loop_equals_the_validated_model_when_steps_admit_several(llama8b, concurrency):
    """serve (load.aggregated with the search's admission) and validate (cost_models.serving.aggregated) price the
    same TPOT and TTFT when a step admits k = B/osl = 0.5, 4 and 15.6 prompts."""
    setup = _setup(llama8b)
    shard = Sharding.of(np.array([1]))
    costs = worker_costs(setup, shard, max_model_len=2048, chunks=(8192,))
    load = load_module.Load(isl=1024, osl=64, isl_cv=0.0, osl_cv=0.0, concurrency=concurrency, rate_per_s=None,
                            arrival_cv2=1.0, request_overhead_s=setup.engine.request_overhead_s,
                            first_token_steps=setup.engine.first_token_steps)
    kw = {"prefill_s": costs.prefill_s, "step_of": lambda b: exact_decode_s(setup, shard, b), "fits": costs.fits[:, 0],
          "cap": setup.engine.max_running, "chunk": 8192.0, "replicas": 1.0, "ranks": 1.0}
    theirs = aggregated(setup.model, setup.cluster, setup.engine, setup.precision, shard, concurrency=concurrency,
                        isl=1024, osl=64, waves=np.inf)
    searched = load_module.aggregated(load, admit_of=interpolated_admit(costs, np.array([0]), np.array([0])), **kw)
    exact = load_module.aggregated(load, admit_of=lambda k: exact_admit_s(setup, shard, 8192, k), **kw)
    separate = load_module.aggregated(load, **kw)
    rel = 1e-12 if concurrency / 64 <= 16 else 0.01
    assert searched.tpot_s[0] == pytest.approx(theirs.tpot_s[0], rel=rel)
    assert exact.tpot_s[0] == pytest.approx(theirs.tpot_s[0], rel=1e-12)
    assert exact.ttft_s[0] == pytest.approx(theirs.ttft_s[0], rel=1e-12)
    if concurrency > 64:
        assert exact.tpot_s[0] < separate.tpot_s[0]
    else:
        assert exact.tpot_s[0] == pytest.approx(separate.tpot_s[0], rel=1e-12)


def test_open_loop_batches_only_where_a_step_admits_several(llama8b):
    """Poisson arrivals on one H100 (osl 64): at 2 requests/s a step admits well under one prompt and batching
    changes nothing, to the last bit; at 25/s steps admit about one and TPOT falls; at 30/s prompts prefilled one
    by one (28.7 ms each) would take 86% of the GPU's time and, with the decode steps between them, the queue grows
    without bound, while batched they take less of it and the deployment is stable."""
    setup = _setup(llama8b)
    shard = Sharding.of(np.array([1]))
    costs = worker_costs(setup, shard, max_model_len=2048, chunks=(8192,))
    kw = {"prefill_s": costs.prefill_s, "step_of": lambda b: exact_decode_s(setup, shard, b), "fits": costs.fits[:, 0],
          "cap": 1024.0, "chunk": 8192.0, "replicas": 1.0, "ranks": 1.0}
    admit = interpolated_admit(costs, np.array([0]), np.array([0]))

    def both(rate: float):
        load = load_module.Load(isl=1024, osl=64, isl_cv=0.0, osl_cv=0.0, concurrency=None, rate_per_s=rate,
                                arrival_cv2=1.0, request_overhead_s=0.0)
        return load_module.aggregated(load, q=0.9, admit_of=admit, **kw), load_module.aggregated(load, q=0.9, **kw)
    batched, separate = both(2.0)
    assert (batched.tpot_s[0], batched.ttft_s[0]) == (separate.tpot_s[0], separate.ttft_s[0])
    batched, separate = both(25.0)
    assert batched.stable[0] and separate.stable[0] and batched.tpot_s[0] < separate.tpot_s[0]
    batched, separate = both(30.0)
    assert batched.stable[0] and not separate.stable[0]
    assert batched.prefill_busy[0] < separate.prefill_busy[0]


def test_search_screens_with_the_batched_admissions(llama8b):
    """The search's own price of the deployment serve shows below (tp 1, 256 sequences, osl 64: 4 prompts a
    step): the validated model's TPOT up to the decode grid's interpolation, not 4 separate prefills a step."""
    setup = replace(_setup(llama8b), cluster=quick_cluster("h100-sxm", 1))
    workload = ServingWorkload(isl=1024, osl=64, concurrency=256)
    choices = ServingChoices(engines=("vllm",), kv_dtypes=("bf16",), modes=("agg",),
                             fixed={"tp": (1,), "batch": (256,), "chunk": (8192,)})
    costs, (candidates,) = price_setup(0, setup, workload, choices, budget=1, price=None)
    assert candidates.tpot_mean_s.size == 1
    theirs = aggregated(setup.model, setup.cluster, setup.engine, setup.precision, Sharding.of(1), concurrency=256,
                        isl=1024, osl=64, waves=np.inf)
    assert candidates.tpot_mean_s[0] == pytest.approx(float(theirs.tpot_steady_s), rel=0.01)
    separate = float(theirs.decode_step_s) + 4 * costs.prefill_s[0]
    assert candidates.tpot_mean_s[0] < 0.9 * separate


def test_fleet_capacity_counts_the_batched_admissions(llama8b):
    # Short outputs (osl 16): a worker's capacity under a p90 TPOT target is bound by the prefills mixed into
    # every step; batched, a worker carries more requests, and never fewer.
    setup = _setup(llama8b, isl=2048, osl=16)
    costs = worker_costs(setup, Sharding.of(np.array([1, 2])), max_model_len=4096, chunks=(8192,))
    side = PoolSide(setup_id=0, setup=setup, costs=costs, budget=8, price=None)
    workload = ServingWorkload(isl=2048, osl=16, arrivals=poisson(1.0), ttft_target_s=3.0, tpot_target_s=0.15,
                               percentile=90)
    s, k, cap = np.array([0, 1]), np.array([0, 0]), np.array([256.0, 256.0])
    batched = worker_capacity(side, workload, s, k, cap)
    with pytest.MonkeyPatch.context() as patch:  # every admitted prompt its own prefill
        patch.setattr("paraplan.planner.serving.fleet.interpolated_admit", lambda *_: None)
        separate = worker_capacity(side, workload, s, k, cap)
    assert np.all(separate > 0)
    assert np.all(batched > separate * 1.05)


# --- paraplan serve ------------------------------------------------------------------------------------------------

def _serve_tpot_ttft(tmp_path, name: str) -> tuple[float, float, dict]:
    runner = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: ""})
    out = tmp_path / f"{name}.json"
    result = runner.invoke(app, ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--isl", "1024",
                                 "--osl", "64", "--concurrency", "256", "--engine", "vllm", "--mode", "agg", "--tp",
                                 "1", "--batch", "256", "--chunk", "8192", "--kv-dtype", "bf16", "--top", "1",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())["plans"][0]
    return plan["estimate"]["tpot_s"]["mean"], plan["estimate"]["ttft_s"]["mean"], plan


def test_serve_prices_the_batched_admissions(tmp_path, monkeypatch, llama8b):
    """256 sequences on one H100, each replaced once per 64 steps: 4 prompts a step. The plan's TPOT is the
    validated model's, below the price of 4 separate prefills a step (what serve predicted before)."""
    tpot, ttft, plan = _serve_tpot_ttft(tmp_path, "batched")
    pool = plan["pools"][0]
    assert (pool["max_batch"], pool["max_batched_tokens"], plan["estimate"]["running_batch"]) == (256, 8192, 256)
    setup = _setup(llama8b)
    theirs = aggregated(setup.model, setup.cluster, setup.engine, setup.precision, Sharding.of(1), concurrency=256,
                        isl=1024, osl=64, waves=np.inf)
    assert tpot == pytest.approx(float(theirs.tpot_steady_s), rel=1e-9)
    # The same deployment with every admitted prompt its own prefill.
    monkeypatch.setattr("paraplan.planner.serving.search.interpolated_admit", lambda *_: None)
    monkeypatch.setattr("paraplan.planner.serving.plan._exact_admit", lambda _: None)
    separate_tpot, separate_ttft, _ = _serve_tpot_ttft(tmp_path, "separate")
    assert tpot < 0.9 * separate_tpot
    assert ttft < separate_ttft  # the first token waits half a (shorter) step
