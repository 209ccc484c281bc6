"""The mechanics measured serving engines show (issue 32): mixed steps batch their admitted prompts into one
chunk, attention data parallelism waits for its busiest rank, expert parallelism pays its dispatch and combine
all-to-all and its routing imbalance. Hand derivations and metamorphic checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_model

from paraplan.cost_models.collectives import all_to_all_time_s
from paraplan.cost_models.inference_step import (
    Sharding,
    admitted_prefill_s,
    busiest_expert_rank_copies,
    expert_dispatch_s,
    prefill_chunk_tokens,
    step_time,
)
from paraplan.cost_models.serving import decode_step_s, prefill_s, weight_precision
from paraplan.hardware_profiles import load_cluster
from paraplan.planner.serving.load import Load, admission_s, aggregated

BF16 = weight_precision(make_model(), "bf16", "bf16", "bf16")


def small_model(**overrides):
    """2 layers, h 1024, 8 MHA heads of 128, gated MLP 4096, vocab 32000 (tests/test_serving_cost.py's)."""
    fields = {"name": "tiny", "model_type": "llama", "num_layers": 2, "hidden_size": 1024, "num_heads": 8,
              "num_kv_heads": 8, "head_dim": 128, "ffn_size": 4096, "vocab_size": 32000, "gated_mlp": True,
              "tied_embeddings": False, "norm": "rmsnorm", "norm_bias": False, "qkv_bias": False,
              "linear_bias": False, "position": "rope", "dropout": False}
    return make_model(**{**fields, **overrides})


def small_moe():
    """The small model with two MoE layers of 64 experts, top-4, width 512."""
    return small_model(num_experts=64, experts_per_token=4, expert_ffn_size=512, moe_layers=(0, 1))


@pytest.fixture
def h100():
    return load_cluster("dgx-h100", num_gpus=16)


def _decode(model, cluster, shard, seqs, ctx=1000.0, moe_tokens=None):
    return step_time(model, cluster, BF16, shard, tokens_per_rank=seqs, sequences_per_rank=seqs,
                     attended_keys=(np.asarray(seqs) * ctx, 0.0), attention_flops=(0.0, 0.0), decode=True,
                     moe_tokens=moe_tokens)


# --- 1. mixed steps batch their prompts -------------------------------------------------------------------------

def test_chunk_size_rule_by_hand():
    # k prompts of isl tokens run as one chunk of min(k·isl, max batched tokens).
    assert prefill_chunk_tokens(3, 1000, 8192) == 3000
    assert prefill_chunk_tokens(10, 1000, 8192) == 8192
    assert prefill_chunk_tokens([1, 8, 9], 1024, 8192).tolist() == [1024, 8192, 8192]


def test_one_chunk_is_the_prompts_prefilled_together(h100):
    model = small_moe()
    shard = Sharding.of(1)
    # 4 prompts of 512 within an 8,192-token chunk: one step of 2,048 tokens, each weight and expert read once.
    got = admitted_prefill_s(model, h100, BF16, shard, prompts=4, prompt_tokens=512, max_batched_tokens=8192)
    assert got == pytest.approx(prefill_s(model, h100, BF16, shard, 512, prompts=4), rel=1e-12)
    # Prompts as long as the chunk: one chunk each, exactly k single prefills.
    got = admitted_prefill_s(model, h100, BF16, shard, prompts=3, prompt_tokens=2048, max_batched_tokens=2048)
    assert got == pytest.approx(3 * prefill_s(model, h100, BF16, shard, 2048), rel=1e-12)


def test_chunk_count_by_hand(h100):
    # 10 prompts of 1,000 at 4,096 tokens a step: floor(10,000/4,096) = 2 full chunks, then 1,808 tokens, each
    # chunk with its token share of the ten prompts' attention FLOPs and head rows.
    model = small_model()
    shard = Sharding.of(1)
    per_prompt_flops = 2.0 * 8 * (128 + 128) * 1000 * 1000 / 2  # causal, all heads, one layer

    def chunk(tokens: float) -> float:
        share = tokens / 10_000
        return float(step_time(model, h100, BF16, shard, tokens_per_rank=tokens, sequences_per_rank=10 * share,
                               attended_keys=(0.0, 0.0), attention_flops=(10 * per_prompt_flops * share, 0.0),
                               decode=False, moe_tokens=tokens).total_s)
    got = admitted_prefill_s(model, h100, BF16, shard, prompts=10, prompt_tokens=1000, max_batched_tokens=4096)
    assert got == pytest.approx(2 * chunk(4096) + chunk(1808), rel=1e-12)


@pytest.mark.parametrize("isl", [32, 256, 1024, 4096])
@pytest.mark.parametrize("k", [2, 4, 16])
def test_batching_is_never_slower_than_separate_prefills(h100, isl, k):
    for model in (small_model(), small_moe()):
        for shard in (Sharding.of(1), Sharding.of(2), Sharding.of(1, dp=2, moe_ep=2)):
            one = admitted_prefill_s(model, h100, BF16, shard, prompts=1, prompt_tokens=isl, max_batched_tokens=8192)
            many = admitted_prefill_s(model, h100, BF16, shard, prompts=k, prompt_tokens=isl, max_batched_tokens=8192)
            assert many <= k * one * (1 + 1e-12)


def test_weight_bound_small_prompts_are_strictly_faster_batched(h100):
    # 16 prompts of 32 tokens: 512 tokens in one chunk read the weights and experts once instead of 16 times.
    model = small_moe()
    shard = Sharding.of(1)
    one = admitted_prefill_s(model, h100, BF16, shard, prompts=1, prompt_tokens=32, max_batched_tokens=8192)
    many = admitted_prefill_s(model, h100, BF16, shard, prompts=16, prompt_tokens=32, max_batched_tokens=8192)
    assert many < 0.5 * 16 * one


def _closed(concurrency: float, osl: float) -> Load:
    return Load(isl=1024, osl=osl, isl_cv=0.0, osl_cv=0.0, concurrency=concurrency, rate_per_s=None,
                arrival_cv2=1.0, request_overhead_s=0.0)


def test_mixed_step_admission_by_hand():
    # k = B/osl prompts a step: below one, a fraction k of the steps admits one prompt (k·P); from one up, the
    # prompts share one chunk: admit_of prices every k (a chunk whose weights cost 0.05 s, 0.01 s a prompt more).
    admit = lambda k: np.where(k < 1.0, 0.05 * k, 0.05 + 0.01 * (k - 1.0))  # noqa: E731
    assert admission_s(np.array([0.25, 1.0, 4.0]), 0.05, admit).tolist() == pytest.approx([0.0125, 0.05, 0.08])
    assert admission_s(4.0, 0.05, None) == pytest.approx(0.2)
    step = lambda b: 0.02 + 0.0 * b  # noqa: E731
    kw = {"prefill_s": np.array([0.05]), "step_of": step, "fits": np.array([1e6]), "cap": 1e6, "chunk": 8192.0,
          "replicas": 1.0, "ranks": 1.0}
    batched = aggregated(_closed(512, 128), admit_of=admit, **kw)  # B = 512, k = 4
    separate = aggregated(_closed(512, 128), **kw)
    assert batched.tpot_s[0] == pytest.approx(0.02 + 0.08, rel=1e-12)
    assert separate.tpot_s[0] == pytest.approx(0.02 + 4 * 0.05, rel=1e-12)
    # k <= 1 (B = 64, osl 128): batching changes nothing.
    assert aggregated(_closed(64, 128), admit_of=admit, **kw).tpot_s[0] \
        == pytest.approx(aggregated(_closed(64, 128), **kw).tpot_s[0], rel=1e-12)


# --- 2. attention data parallelism waits for its busiest rank ---------------------------------------------------

def test_busiest_attention_rank_by_hand(h100):
    # 10 sequences round-robin over 4 attention-DP ranks: 2.5 a rank on average, 3 on the fullest. The step
    # runs the fullest rank's attention (and its projections) while the MoE layers see all 10 tokens.
    model = small_moe()
    dp4 = Sharding.of(1, dp=4, moe_ep=4)
    mean = _decode(model, h100, dp4, 2.5)
    fullest = _decode(model, h100, dp4, 3.0, moe_tokens=10.0)
    for part in ("attention_s", "gemm_s", "elementwise_s", "experts_s"):
        assert getattr(mean, part) == pytest.approx(getattr(fullest, part), rel=1e-12), part
    # Attention reads 3 x 1,000 cached keys a layer: 3,000 x 4,096 B x 2 layers at HBM x 0.8 (memory-bound).
    assert mean.attention_s == pytest.approx(2 * 3000 * 4096 / (3.35e12 * 0.8), rel=1e-12)
    # Without attention DP the rank's mean batch is the rank (no rounding up), and a whole batch stays whole.
    one = Sharding.of(1)
    assert _decode(model, h100, one, 2.5).attention_s == pytest.approx(
        2.5 / 3 * _decode(model, h100, one, 3.0).attention_s, rel=1e-12)
    assert _decode(model, h100, dp4, 2.0).attention_s == pytest.approx(
        _decode(model, h100, one, 2.0).attention_s, rel=1e-12)


def test_moe_layers_see_every_rank_tokens(h100):
    # Default moe_tokens: every rank's tokens, dp x the rank's (the expert GEMMs saturate on the global count).
    model = small_moe()
    dp4 = Sharding.of(1, dp=4, moe_ep=4)
    assert _decode(model, h100, dp4, 8.0).experts_s == pytest.approx(
        _decode(model, h100, dp4, 8.0, moe_tokens=32.0).experts_s, rel=1e-12)
    assert _decode(model, h100, dp4, 8.0, moe_tokens=8.0).experts_s < _decode(model, h100, dp4, 8.0).experts_s


# --- 3. expert parallelism: dispatch and combine, routing imbalance -------------------------------------------

def test_busiest_expert_rank_by_hand():
    # 1,024 copies over 8 ranks: mean 128, variance 128 x 7/8 = 112, max ~ 128 + sqrt(2 ln 8 x 112).
    assert busiest_expert_rank_copies(1024, 8) == pytest.approx(128 + math.sqrt(2 * math.log(8) * 112), rel=1e-12)
    assert busiest_expert_rank_copies(1024, 1) == 1024  # one rank: all of them, no imbalance
    assert busiest_expert_rank_copies(2, 64) <= 2  # never more than every copy
    # Relative imbalance shrinks as the batch grows (sqrt(c) against c).
    small, large = busiest_expert_rank_copies([64, 65536], 8) / (np.array([64, 65536]) / 8)
    assert small > large > 1.0


def test_dispatch_by_hand(h100):
    # tp 1 x dp 16, ep 16: each GPU sends its 1/16 of 256 tokens, top-4 copies of 1,024 bf16 values, and gets
    # as many back: two all-to-alls of 16 x 4 x 1,024 x 2 B over 16 GPUs.
    model = small_moe()
    shard = Sharding.of(1, dp=16, moe_ep=16)
    size = 256 / 16 * 4 * 1024 * 2.0
    assert expert_dispatch_s(model, 256.0, shard, h100) == pytest.approx(
        2 * all_to_all_time_s(size, 16, 1, h100), rel=1e-12)
    # Across the two 8-GPU nodes 8/16 of each GPU's bytes leave over its NIC, concurrently with 7/16 over NVLink.
    h100_nic = h100.nic_bytes_per_s_per_gpu * h100.gpu.efficiency.nic_frac
    assert expert_dispatch_s(model, 256.0, shard, h100) >= 2 * 8 / 16 * size / h100_nic


def test_expert_parallel_changes_serving_predictions(h100):
    # Before: ep 1 and ep = world priced identically. Now the busiest EP rank's routed copies cost more.
    model = small_moe()
    ep1 = decode_step_s(model, h100, BF16, Sharding.of(8, moe_ep=1), 64, 1000)
    ep8 = decode_step_s(model, h100, BF16, Sharding.of(8, moe_ep=8), 64, 1000)
    assert ep8 > ep1
    # Without attention DP the tp ranks hold every token: no dispatch, the same all-reduces.
    a = _decode(model, h100, Sharding.of(8, moe_ep=1), 64.0)
    b = _decode(model, h100, Sharding.of(8, moe_ep=8), 64.0)
    assert a.comm_s == pytest.approx(b.comm_s, rel=1e-12)


def test_dispatch_across_nodes_costs_more_than_inside_nvlink(h100):
    model = small_moe()
    tokens = 4096.0  # per rank: a prefill-sized step, so bandwidth shows
    inside = _decode(model, h100, Sharding.of(1, dp=8, moe_ep=8), tokens)  # one 8-GPU node
    across = _decode(model, h100, Sharding.of(1, dp=16, moe_ep=16), tokens)  # two nodes over the NICs
    assert across.comm_s > inside.comm_s
    # The same 16-rank expert group inside one NVL72 NVLink domain: cheaper than across two DGX nodes.
    nvl72 = load_cluster("gb200-nvl72", num_gpus=72)
    shard = Sharding.of(1, dp=16, moe_ep=16)
    assert expert_dispatch_s(model, 16 * tokens, shard, nvl72) < expert_dispatch_s(model, 16 * tokens, shard, h100)
