"""Issue 32, "the mechanics measured engines show" (second part): attention-DP ranks step together, so a step waits for
the busiest rank's admitted prefill; SGLang splits its chunked-prefill budget over its DP ranks; and measured rows
whose ``tp_size`` no engine can launch are read as the deployment they state; weight-only 4-bit GEMMs reach their
ridge at fewer tokens. Expected numbers by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_serving_mechanics import BF16, small_model, small_moe

from paraplan.cost_models.inference_step import Sharding, rates_for, step_time, weight_only_half_dim
from paraplan.cost_models.serving import (
    ENGINE_TRAITS,
    aggregated,
    burst_ttft_s,
    busiest_admission_frac,
    chunked_prefill_s,
    disaggregated,
    engine_decode_s,
    mixed_admission_s,
    mixed_prefill_s,
    prefill_chunk_s,
    prefill_s,
    rank_batched_tokens,
    weight_precision,
)
from paraplan.hardware_profiles import load_cluster
from paraplan.validation.serving_runs import _implied_attention_dp, _launchable

OVERHEAD_S = 3e-3
VLLM = replace(ENGINE_TRAITS["vllm"], step_overhead_s=OVERHEAD_S, dp_sync_s=0.0)
TRTLLM = replace(ENGINE_TRAITS["trtllm"], step_overhead_s=OVERHEAD_S, dp_sync_s=0.0)
SGLANG = replace(ENGINE_TRAITS["sglang"], step_overhead_s=OVERHEAD_S, dp_sync_s=0.0)
"""The engines without their attention-DP sync: these tests price admission (tests/test_serving_dp_sync.py the sync)."""


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100", num_gpus=16)


def _linear_chunk_s(tokens: np.ndarray) -> np.ndarray:
    """A made-up chunk price, 0.1 ms a token, so the admission arithmetic can be followed by hand."""
    return np.asarray(tokens, dtype=float) * 1e-4


# --- the busiest attention-DP rank's admission -----------------------------------------------------------------

def test_busiest_rank_admits_in_ranks_times_more_of_the_steps():
    assert busiest_admission_frac(0.25, 1.0) == pytest.approx(0.25)  # one rank: its own mean
    assert busiest_admission_frac(0.1, 4.0) == pytest.approx(0.4)  # four ranks' extra prompts on distinct ranks
    # 72 ranks each admitting a 1024-token prompt every 18.3 steps (B = 56, osl 1024): some rank prefills every step.
    assert busiest_admission_frac(56.0 / 1024.0, 72.0) == 1.0


def test_mixed_admission_waits_for_the_busiest_rank():
    alone = 0.2  # one prompt's prefill alone, overhead included (s)
    args = dict(isl=1000.0, max_batched_tokens=8192.0, chunk_s=_linear_chunk_s, alone_s=alone, step_overhead_s=0.0)
    # k = 1/4 prompt a step per rank: one rank prefills in 1/4 of the steps, the busiest of two in 1/2, of eight in all.
    assert mixed_admission_s(0.25, **args) == pytest.approx(0.25 * alone, rel=1e-12)
    assert mixed_admission_s(0.25, ranks=2.0, **args) == pytest.approx(0.5 * alone, rel=1e-12)
    assert mixed_admission_s(0.25, ranks=8.0, **args) == pytest.approx(alone, rel=1e-12)
    # k = 2.5: each rank admits 2 or 3 prompts (one chunk of 2000 or 3000 tokens); with two ranks the busiest
    # admits 3 in min(1, 2 x 0.5) = every step: 3000 tokens x 0.1 ms.
    assert mixed_admission_s(2.5, **args) == pytest.approx(0.5 * 0.2 + 0.5 * 0.3, rel=1e-12)
    assert mixed_admission_s(2.5, ranks=2.0, **args) == pytest.approx(0.3, rel=1e-12)


def test_aggregated_prices_the_busiest_rank_except_where_the_engine_balances(h100):
    model, isl, osl = small_moe(), 512.0, 1024.0
    shard = Sharding.of(1, 4, moe_ep=4)  # four attention-DP ranks, experts over all four
    concurrency = 4 * 64.0  # 64 sequences a rank: k = 64/1024 = 1/16 prompt a step per rank
    alone = prefill_s(model, h100, BF16, shard, isl) + OVERHEAD_S
    for engine, frac in ((VLLM, 4.0 / 16.0), (TRTLLM, 1.0 / 16.0)):  # vLLM: busiest of 4; TRT-LLM: the mean
        out = aggregated(model, h100, engine, BF16, shard, concurrency=concurrency, isl=isl, osl=osl, waves=np.inf)
        step = engine_decode_s(model, h100, engine, BF16, shard, 64.0, isl + osl / 2.0)
        assert float(out.tpot_steady_s) == pytest.approx(float(step + frac * alone), rel=1e-12)
    one_rank = Sharding.of(1)  # dp = 1: unchanged for every engine
    for engine in (VLLM, TRTLLM):
        got = mixed_prefill_s(model, h100, engine, BF16, one_rank, isl, 0.25, ranks=one_rank.dp)
        assert float(got) == pytest.approx(float(0.25 * (prefill_s(model, h100, BF16, one_rank, isl) + OVERHEAD_S)))


# --- SGLang's chunk budget over its DP ranks -------------------------------------------------------------------

def test_sglang_splits_its_chunk_budget_over_dp_ranks():
    wide = Sharding.of(1, 72, moe_ep=72)
    assert float(rank_batched_tokens(SGLANG, wide)) == 113.0  # floor(8192 / 72): SGLang's chunked_prefill_size // dp
    assert float(rank_batched_tokens(VLLM, wide)) == 8192.0  # each vLLM DP engine core has its own 8192
    assert float(rank_batched_tokens(TRTLLM, wide)) == 8192.0
    assert float(rank_batched_tokens(SGLANG, Sharding.of(8))) == 8192.0  # no attention DP: the whole budget


def test_a_prompt_longer_than_the_budget_is_prefilled_chunk_by_chunk(h100):
    model, shard, isl = small_model(), Sharding.of(1), 1000.0
    # Within one chunk: the prefill alone plus one step overhead.
    assert float(chunked_prefill_s(model, h100, BF16, shard, isl, 8192.0, OVERHEAD_S)) == pytest.approx(
        float(prefill_s(model, h100, BF16, shard, isl) + OVERHEAD_S), rel=1e-12)
    # 1000 tokens at 400 a step: chunks of 400, 400 and 200, each its own step with its overhead.
    full, rest = (float(prefill_chunk_s(model, h100, BF16, shard, isl, t)) for t in (400.0, 200.0))
    got = float(chunked_prefill_s(model, h100, BF16, shard, isl, 400.0, OVERHEAD_S))
    assert got == pytest.approx(2 * (full + OVERHEAD_S) + rest + OVERHEAD_S, rel=1e-12)
    assert got > float(prefill_s(model, h100, BF16, shard, isl) + OVERHEAD_S)  # three weight reads, three overheads


def test_chunked_admission_counts_chunk_steps_of_the_busiest_rank(h100):
    model, shard, isl = small_moe(), Sharding.of(1, 8, moe_ep=8), 1000.0
    # A 1000-token prompt in chunks of 250: 4 chunk steps of 250 tokens. k = 1/32 prompt a step per rank gives
    # 1/8 chunk step per rank; the busiest of 8 ranks carries a chunk in min(1, 8/8) = every step.
    chunk = float(prefill_chunk_s(model, h100, BF16, shard, isl, 250.0)) + OVERHEAD_S
    got = mixed_prefill_s(model, h100, SGLANG, BF16, shard, isl, 1.0 / 32.0, ranks=8.0, max_batched_tokens=250.0)
    assert float(got) == pytest.approx(chunk, rel=1e-12)
    one = mixed_prefill_s(model, h100, SGLANG, BF16, shard, isl, 1.0 / 32.0, ranks=1.0, max_batched_tokens=250.0)
    assert float(one) == pytest.approx(chunk / 8.0, rel=1e-12)  # one rank: its mean, 4/32 chunk steps a step


def test_burst_below_one_prompt_a_step(h100):
    model, shard, isl = small_model(), Sharding.of(1), 1024.0
    # Four prompts of 1024 tokens at 256 tokens a step: 16 steps, the j-th prompt done after 4(j+1) steps, a mean
    # of 10 steps = (16 + 4)/2, each step a quarter prompt's prefill plus the overhead.
    step = float(prefill_s(model, h100, BF16, shard, isl, 0.25, all_ranks=True)) + OVERHEAD_S
    got = burst_ttft_s(model, h100, VLLM, BF16, shard, isl, 4.0, max_batched_tokens=256.0)
    assert float(got) == pytest.approx(10.0 * step, rel=1e-12)
    # At the engine's own budget (8192 tokens: all four prompts in one step) the formula is the one before.
    whole = float(prefill_s(model, h100, BF16, shard, isl, 4.0, all_ranks=True)) + OVERHEAD_S
    assert float(burst_ttft_s(model, h100, VLLM, BF16, shard, isl, 4.0)) == pytest.approx(whole, rel=1e-12)


def test_aggregated_ttft_carries_the_chunk_steps(h100):
    model, shard, isl, osl = small_model(), Sharding.of(1), 1000.0, 500.0
    out = aggregated(model, h100, VLLM, BF16, shard, concurrency=1.0, isl=isl, osl=osl, waves=np.inf,
                     max_batched_tokens=400.0)
    step = float(engine_decode_s(model, h100, VLLM, BF16, shard, 1.0, isl + osl / 2.0))
    prefill = float(chunked_prefill_s(model, h100, BF16, shard, isl, 400.0, OVERHEAD_S))
    # Three chunks: two mixed steps before the last chunk's, then half a step; TPOT spreads one prompt's chunk
    # steps (k = 1/500 a step, 3 chunk steps) over the steps; the request's hops through vLLM's processes add
    # first_token_steps TPOTs.
    tpot, hops = float(out.tpot_steady_s), VLLM.first_token_steps
    assert hops > 0.0
    assert float(out.ttft_steady_s) == pytest.approx(prefill + 2 * step + tpot / 2 + hops * tpot, rel=1e-12)
    plain = aggregated(model, h100, VLLM, BF16, shard, concurrency=1.0, isl=isl, osl=osl, waves=np.inf)
    plain_tpot = float(plain.tpot_steady_s)
    assert float(plain.ttft_steady_s) == pytest.approx(
        float(prefill_s(model, h100, BF16, shard, isl)) + OVERHEAD_S + plain_tpot / 2 + hops * plain_tpot, rel=1e-12)


def test_first_token_steps_scale_with_the_decode_step(h100):
    # The hops term is the engine's steps times TPOT: doubling first_token_steps adds exactly that many TPOTs more,
    # and neither TPOT nor the burst's prefill moves.
    model, shard = small_model(), Sharding.of(1)
    base = replace(VLLM, first_token_steps=0.0)
    more = replace(VLLM, first_token_steps=5.0)
    a = aggregated(model, h100, base, BF16, shard, concurrency=32.0, isl=1000.0, osl=500.0, waves=np.inf)
    b = aggregated(model, h100, more, BF16, shard, concurrency=32.0, isl=1000.0, osl=500.0, waves=np.inf)
    assert float(b.tpot_steady_s) == float(a.tpot_steady_s)
    extra = 5.0 * float(a.tpot_steady_s)
    assert float(b.ttft_steady_s) - float(a.ttft_steady_s) == pytest.approx(extra, rel=1e-9)
    assert float(b.ttft_burst_s) - float(a.ttft_burst_s) == pytest.approx(extra, rel=1e-9)
    # Disaggregated: the same steps at the decode pool's step, which the first token waits on.
    pools = dict(concurrency=64.0, prefill_workers=1.0, decode_workers=1.0, isl=1000.0, osl=500.0)
    c = disaggregated(model, h100, base, BF16, shard, shard, **pools)
    d = disaggregated(model, h100, more, BF16, shard, shard, **pools)
    assert float(d.tpot_steady_s) == float(c.tpot_steady_s)
    assert float(d.ttft_steady_s) - float(c.ttft_steady_s) == pytest.approx(5.0 * float(c.decode_step_s), rel=1e-9)


# --- rows whose tp_size no engine launches -----------------------------------------------------------------------

def _launch(model, tp, dp, moe_tp, moe_ep):
    arrays = (np.array([float(v)]) for v in (tp, dp, moe_tp, moe_ep))
    return tuple(float(v[0]) for v in _launchable(*arrays, model))


def test_tp_the_heads_do_not_divide_is_read_as_the_deployment_it_states():
    moe = small_moe()  # 8 heads
    # tp 8 divides the heads: as stated.
    assert _launch(moe, 8, 1, 8, 1) == (8.0, 1.0, 8.0, 1.0)
    # tp 12, ep 1 (DeepSeek-R1 on 12 GB200s states tp 12): the wide-EP layout, DP attention on all 12 GPUs.
    assert _launch(moe, 12, 1, 12, 1) == (1.0, 12.0, 1.0, 12.0)
    # tp 32 = attention TP 4 x ep 8 (Qwen3.5-397B states tp 64, ep 8 on 8 H200s): 4 heads' TP, experts 8 ways.
    assert _launch(moe, 32, 1, 4, 8) == (4.0, 1.0, 1.0, 8.0)
    # A dense model at tp 12: attention DP over the 12 GPUs, its MLP with it.
    assert _launch(small_model(), 12, 1, 12, 1) == (1.0, 12.0, 12.0, 1.0)


def test_moe_group_wider_than_attention_tp_implies_attention_dp():
    # vLLM at tp 1 with --data-parallel-size 2 and no expert parallelism: its MoE layers span both GPUs (moe_tp 2);
    # rows that leave attention DP unstated run dp 2. Stated DP, groups that do not divide, and matched groups stay.
    implied = _implied_attention_dp(np.array([1.0, 1.0, 2.0, 4.0, 1.0, 2.0]),
                                    np.array([np.nan, 0.0, np.nan, np.nan, 2.0, np.nan]),
                                    np.array([2.0, 4.0, 8.0, 4.0, 2.0, 3.0]))
    np.testing.assert_array_equal(implied, [2.0, 4.0, 4.0, 1.0, 2.0, 1.0])


# --- weight-only quantization's ridge ----------------------------------------------------------------------------

def test_weight_only_half_dimension_scales_with_bytes_per_weight(h100):
    bf16 = rates_for(h100, "bf16")
    # 4-bit weights (0.5 B + a bf16 scale per 32 = 0.5625 B) in bf16 math: the ridge at 0.5625/2 of bf16's.
    assert weight_only_half_dim(bf16, 0.5625) == pytest.approx(bf16.gemm_half_dim * 0.5625 / 2.0, rel=1e-12)
    assert weight_only_half_dim(bf16, 2.0) == bf16.gemm_half_dim  # 16-bit weights: the calibrated value
    fp8 = rates_for(h100, "fp8")
    assert weight_only_half_dim(fp8, 1.0) == fp8.gemm_half_dim  # fp8 tensor cores: half the bytes, twice the peak
    assert weight_only_half_dim(fp8, 2.0) == fp8.gemm_half_dim  # never above the calibrated value
    b200 = load_cluster("dgx-b200", num_gpus=8)
    fp4 = rates_for(b200, "fp4")
    assert weight_only_half_dim(fp4, 0.5 + 1.0 / 16) == fp4.gemm_half_dim  # nvfp4 on fp4 tensor cores


def test_weight_only_experts_at_two_tokens_each_are_priced_by_hand(h100):
    model = small_moe()  # 64 experts of 3 x 1024 x 512, top-4
    prec = weight_precision(model, "int4_wo", "int4_wo", "bf16")  # 0.5625 B a weight, bf16 GEMMs
    rates = rates_for(h100, "bf16")
    tokens = 32.0  # 128 routed copies over 64 experts
    step = step_time(model, h100, prec, Sharding.of(1), tokens_per_rank=tokens, sequences_per_rank=tokens,
                     attended_keys=(0.0, 0.0), attention_flops=(0.0, 0.0), decode=True)
    copies, weights = tokens * 4, 3 * 1024 * 512
    hit = 64 * (1 - (1 - 1 / 64) ** copies)
    m = copies / hit
    half = rates.gemm_half_dim * 0.5625 / 2.0
    compute = 2 * copies * weights / (rates.gemm_flops_per_s * m / (m + half))
    reads = hit * weights * 0.5625 / rates.memory_bytes_per_s
    assert float(step.experts_s) == pytest.approx(2 * max(compute, reads), rel=1e-12)  # two MoE layers
