"""A fixed-concurrency benchmark's waves: the first arrives as a burst, whose prompts share the GPU with the rest of
the burst's prefills after their first token (``burst_tpot_s``); under a fixed-length protocol a prefill-first engine
(SGLang) runs every wave as that burst (``benchmark_waves``). Expected numbers by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_serving_mechanics import BF16, small_model
from test_serving_mechanics2 import OVERHEAD_S, SGLANG, VLLM

from paraplan.cost_models.inference_step import Sharding
from paraplan.cost_models.serving import (
    ENGINE_TRAITS,
    aggregated,
    benchmark_waves,
    burst_prefill_s,
    burst_tpot_s,
    engine_decode_s,
    prefill_s,
    wave_mean,
)
from paraplan.hardware_profiles import load_cluster


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100", num_gpus=8)


def test_only_sglang_is_prefill_first():
    """SGLang's scheduler runs a prefill batch whenever one can be formed; vLLM V1 and TRT-LLM schedule the running
    decodes first and fill the token budget with prefill chunks."""
    assert {name: traits.prefill_first for name, traits in ENGINE_TRAITS.items()} == \
        {"vllm": False, "sglang": True, "trtllm": False}


def test_a_burst_of_whole_prompts_ends_after_all_its_steps(h100):
    """20 prompts of 1,000 tokens at 8,192 tokens a step: 8 a step, 3 steps (8, 8, 4); the k-th step's prompts get
    their first token after k steps, a mean over steps of (3 + 1)/2 = 2 steps as ``burst_ttft_s`` prices it, and the
    last prefill ends after 3."""
    model, shard, isl = small_model(), Sharding.of(1), 1000.0
    step = float(prefill_s(model, h100, BF16, shard, isl, 8.0, all_ranks=True)) + OVERHEAD_S
    ttft, wave = burst_prefill_s(model, h100, VLLM, BF16, shard, isl, 20.0)
    assert float(ttft) == pytest.approx(2.0 * step, rel=1e-12)
    assert float(wave) == pytest.approx(3.0 * step, rel=1e-12)


def test_a_burst_below_one_prompt_a_step_ends_with_its_last_chunk(h100):
    """Four prompts of 1,024 tokens at 256 tokens a step: 16 steps of a quarter prompt each, the last prefill done
    after all 16, the mean first token after (16 + 4)/2 = 10 (tests/test_serving_mechanics2.py)."""
    model, shard, isl = small_model(), Sharding.of(1), 1024.0
    step = float(prefill_s(model, h100, BF16, shard, isl, 0.25, all_ranks=True)) + OVERHEAD_S
    ttft, wave = burst_prefill_s(model, h100, VLLM, BF16, shard, isl, 4.0, max_batched_tokens=256.0)
    assert (float(ttft), float(wave)) == pytest.approx((10.0 * step, 16.0 * step), rel=1e-12)


def test_burst_tpot_spreads_the_prefills_after_the_first_token():
    # Decode step 10 ms; first token a mean 0.3 s in, the last prefill 0.5 s in: 0.2 s more over 100 later tokens.
    assert float(burst_tpot_s(0.010, 0.3, 0.5, 101.0)) == pytest.approx(0.012, rel=1e-12)
    # One prompt (the wave is its own prefill): the decode step alone; a one-token output divides by one, not zero.
    assert float(burst_tpot_s(0.010, 0.3, 0.3, 101.0)) == pytest.approx(0.010, rel=1e-12)
    assert float(burst_tpot_s(0.010, 0.3, 0.5, 1.0)) == pytest.approx(0.210, rel=1e-12)


def test_a_fixed_length_protocol_makes_every_wave_a_burst_only_for_a_prefill_first_engine():
    waves = np.array([5.0, 5.0, 10.0])
    fixed = np.array([True, False, True])
    assert benchmark_waves(SGLANG, waves, fixed).tolist() == [1.0, 5.0, 1.0]
    assert benchmark_waves(VLLM, waves, fixed).tolist() == [5.0, 5.0, 10.0]
    assert benchmark_waves(SGLANG, 5.0).tolist() == 5.0  # lengths not stated fixed: the waves as given


def test_wave_mean_weighs_the_first_wave_once():
    assert float(wave_mean(1.0, 3.0, 4.0)) == pytest.approx(1.5)  # one wave of four at 3, three at 1
    assert float(wave_mean(1.0, 3.0, 1.0)) == pytest.approx(3.0)  # every wave a burst
    assert float(wave_mean(1.0, 3.0, np.inf)) == pytest.approx(1.0)  # the steady state


def test_aggregated_sglang_with_fixed_lengths_prices_every_wave_as_the_burst(h100):
    """16 prompts of 2,000 tokens a replica: SGLang prefills 4 a step (8,192 tokens), 4 steps, the mean first token
    after 2.5 steps and the last prefill after 4, so each prompt waits 1.5 steps more over its 499 later tokens. With
    fixed lengths TTFT and TPOT are those of that burst, whatever the wave count."""
    model, shard, isl, osl = small_model(), Sharding.of(1), 2000.0, 500.0
    kw = dict(concurrency=16.0, isl=isl, osl=osl, waves=5.0)
    fixed = aggregated(model, h100, SGLANG, BF16, shard, fixed_lengths=True, **kw)
    step = float(prefill_s(model, h100, BF16, shard, isl, 4.0, all_ranks=True)) + OVERHEAD_S
    decode = float(engine_decode_s(model, h100, SGLANG, BF16, shard, 16.0, isl + osl / 2.0))
    assert float(fixed.ttft_s) == pytest.approx(SGLANG.request_overhead_s + 2.5 * step, rel=1e-12)
    assert float(fixed.tpot_s) == pytest.approx(decode + 1.5 * step / 499.0, rel=1e-12)
    # Metamorphic: the same benchmark with spread lengths weighs the burst once in five waves, and a
    # chunk-mixing engine (vLLM) prices a fixed-length protocol as any other.
    spread = aggregated(model, h100, SGLANG, BF16, shard, **kw)
    assert float(spread.ttft_s) == pytest.approx(SGLANG.request_overhead_s + float(
        spread.ttft_steady_s + (spread.ttft_burst_s - spread.ttft_steady_s) / 5.0), rel=1e-12)
    assert float(spread.ttft_s) < float(fixed.ttft_s)
    vllm_fixed = aggregated(model, h100, VLLM, BF16, shard, fixed_lengths=True, **kw)
    vllm_spread = aggregated(model, h100, VLLM, BF16, shard, **kw)
    assert (float(vllm_fixed.ttft_s), float(vllm_fixed.tpot_s)) == (float(vllm_spread.ttft_s),
                                                                   float(vllm_spread.tpot_s))


def test_a_larger_burst_never_shortens_its_tpot(h100):
    """More prompts in the first wave leave each more prefills to share the GPU with."""
    model, shard = small_model(), Sharding.of(1)
    tpots = [float(aggregated(model, h100, SGLANG, BF16, shard, concurrency=c, isl=2000.0, osl=200.0,
                              waves=1.0).tpot_burst_s) for c in (1.0, 4.0, 16.0, 64.0)]
    assert tpots == sorted(tpots) and tpots[-1] > tpots[0]


def test_a_receive_interval_delays_each_arrival_by_half_of_it_in_decode_steps(h100):
    """SGLang's scheduler reading new requests every N = 30 decode steps: an arrival waits a mean (N − 1)/2 = 14.5
    decode steps more than when it reads every step; TPOT and the first wave's burst do not change."""
    model, shard = small_model(), Sharding.of(1)
    kw = dict(concurrency=32.0, isl=1024.0, osl=1024.0, waves=np.inf)
    every = aggregated(model, h100, SGLANG, BF16, shard, **kw)
    thirty = aggregated(model, h100, replace(SGLANG, scheduler_recv_interval=30), BF16, shard, **kw)
    step = float(engine_decode_s(model, h100, SGLANG, BF16, shard, 32.0, 1024.0 + 512.0))
    assert float(thirty.ttft_steady_s - every.ttft_steady_s) == pytest.approx(14.5 * step, rel=1e-12)
    assert float(thirty.tpot_s) == float(every.tpot_s) and float(thirty.ttft_burst_s) == float(every.ttft_burst_s)
