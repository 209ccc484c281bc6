"""Inference cost model: KV bytes, decode and prefill steps, engine memory and the steady state, by hand."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model

from paraplan.cost_models.inference_step import Sharding, kv_bytes_per_token_per_layer, step_time
from paraplan.cost_models.serving import (
    BENCHMARK_WAVES,
    ENGINE_TRAITS,
    aggregated,
    decode_step_s,
    engine_memory,
    kv_bytes_per_sequence,
    prefill_s,
    weight_bytes_per_gpu,
    weight_precision,
)
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_cluster

# H100 SXM constants the hand derivations use (gpus.yaml, efficiency.yaml): HBM 3.35 TB/s at 0.8 achieved,
# bf16 peak 989.4 TFLOP/s at the kernel fraction 0.78 (a serving engine's GEMMs pay no distributed-run factor:
# hardware_profiles/run_factor.py; H100's fitted training fraction is 0.58), GEMM half-saturation dimension 180,
# eager kernel overhead 5.2 us, fused attention at its kernel fraction 0.5 of the bf16 peak (0.4 fitted); CUDA-graph
# kernel gap 1.5 us (inference_step.GRAPH_KERNEL_OVERHEAD_S).
HBM = 3.35e12 * 0.8
GEMM = 989.4e12 * 0.78
HALF = 180.0
ATTN = 989.4e12 * 0.5
BF16 = weight_precision(make_model(), "bf16", "bf16", "bf16")


def small_model(**overrides):
    """2 layers, h 1024, 8 MHA heads of 128, gated MLP 4096, vocab 32000, RMSNorm, no biases."""
    fields = {"name": "tiny", "model_type": "llama", "num_layers": 2, "hidden_size": 1024, "num_heads": 8,
              "num_kv_heads": 8, "head_dim": 128, "ffn_size": 4096, "vocab_size": 32000, "gated_mlp": True,
              "tied_embeddings": False, "norm": "rmsnorm", "norm_bias": False, "qkv_bias": False,
              "linear_bias": False, "position": "rope", "dropout": False}
    return make_model(**{**fields, **overrides})


@pytest.fixture
def h100():
    return load_cluster("dgx-h100", num_gpus=8)


def test_kv_bytes_per_token_gqa_mla_and_sliding_window_by_hand():
    llama8b = small_model(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_size=14336)
    # K and V of 8 heads of 128 in bf16: 2 * 8 * 128 * 2 B = 4,096 B per layer, split over tp up to 8 ...
    assert kv_bytes_per_token_per_layer(llama8b, [1, 2, 8, 16], 2.0).tolist() == [4096, 2048, 512, 512]
    # ... and 32 layers of it per token.
    assert kv_bytes_per_sequence(llama8b, 1, 1, 2.0) == 131072
    # MLA (DeepSeek-V3): the 512-wide latent plus the 64-wide rotary key, fp8, whole on every TP rank.
    mla = small_model(num_heads=128, num_kv_heads=128, head_dim=192, kv_lora_rank=512, q_lora_rank=1536,
                      qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    assert kv_bytes_per_token_per_layer(mla, [1, 8], 1.0).tolist() == [576, 576]
    # GPT-OSS-like: 36 layers, half of them sliding over 128 tokens; 8 KV heads of 64: 2,048 B per layer-token.
    oss = small_model(num_layers=36, num_heads=64, num_kv_heads=8, head_dim=64, sliding_window=128,
                      sliding_layers=18)
    assert kv_bytes_per_sequence(oss, 1, 1000, 2.0) == 2048 * (18 * 1000 + 18 * 128)


def test_decode_step_by_hand(h100):
    model = small_model()
    attention = 1024 * (1024 + 2 * 1024) + 1024 * 1024  # QKV + output projection weights: 4,194,304
    mlp = 3 * 1024 * 4096  # gate, up, down: 12,582,912
    head = 32000 * 1024
    # Batch 1: every GEMM is memory-bound (compute at m = 1 runs at 1/181 of the rate: 2 * 4,194,304 * 181 /
    # GEMM = 2.0 us < 3.1 us of weights), so a layer costs its weights once through HBM.
    weights = 2 * (2 * (attention + mlp)) / HBM + 2 * head / HBM
    kv = 2 * 1000 * 4096 / HBM  # 1,000 cached tokens x 4,096 B, two layers
    elementwise = 2 * 1024 * 24 / HBM
    overhead = 2 * 12 * 1.5e-6
    expected = weights + kv + elementwise + overhead
    got = decode_step_s(model, h100, BF16, Sharding.of(1), 1, 1000)
    assert got == pytest.approx(expected, rel=1e-12)
    assert float(got) == pytest.approx(88.56e-6, rel=1e-3)


def test_prefill_by_hand(h100):
    model = small_model()
    s = 2048.0
    sat = s / (s + HALF)  # token dimension saturation; weights are not the bound at 2,048 tokens
    attention = 1024 * (1024 + 2 * 1024) + 1024 * 1024
    mlp = 3 * 1024 * 4096
    gemms = 2 * (2 * s * (attention + mlp)) / (GEMM * sat)
    head = max(2 * 32000 * 1024 / (GEMM / 181), 2 * 32000 * 1024 / HBM)  # one sampled row
    core = 2 * (2 * (s * s / 2) * 8 * (128 + 128)) / ATTN  # causal QKᵀ and AV, two layers
    elementwise = 2 * s * 1024 * 24 / HBM
    overhead = 2 * 12 * 5.2e-6
    got = prefill_s(model, h100, BF16, Sharding.of(1), s)
    assert got == pytest.approx(gemms + head + core + elementwise + overhead, rel=1e-12)


def test_tensor_parallel_halves_weights_and_adds_all_reduces(h100):
    model = small_model()
    one, two = weight_bytes_per_gpu(model, BF16, Sharding.of([1, 2]))
    # Halved: both layers' attention and MLP, the embedding and the output head with its final norm (the
    # per-layer norm weights stay whole on every GPU).
    assert one - two == pytest.approx((2 * (4194304 + 12582912) + 2 * 32000 * 1024 + 1024) * 2 / 2, rel=1e-12)
    steps = step_time(model, h100, BF16, Sharding.of([1, 2]), tokens_per_rank=1.0, sequences_per_rank=1.0,
                      attended_keys=(1000.0, 0.0), attention_flops=(0.0, 0.0), decode=True)
    assert steps.comm_s[0] == 0.0 and steps.comm_s[1] > 0.0
    assert steps.gemm_s[1] == pytest.approx(steps.gemm_s[0] / 2, rel=1e-9)


def test_moe_decode_reads_only_the_experts_hit(h100):
    moe = small_model(num_experts=64, experts_per_token=4, expert_ffn_size=512, moe_layers=(0, 1))
    expert_bytes = 3 * 1024 * 512 * 2
    b1 = step_time(moe, h100, BF16, Sharding.of(1), tokens_per_rank=1.0, sequences_per_rank=1.0,
                   attended_keys=(10.0, 0.0), attention_flops=(0.0, 0.0), decode=True)
    # One token, top-4 of 64: 64 * (1 - (63/64)^4) = 3.907 distinct experts read per layer, two layers.
    hit = 64 * (1 - (63 / 64) ** 4)
    assert b1.experts_s == pytest.approx(2 * hit * expert_bytes / HBM, rel=1e-12)
    big = step_time(moe, h100, BF16, Sharding.of(1), tokens_per_rank=4096.0, sequences_per_rank=4096.0,
                    attended_keys=(10.0, 0.0), attention_flops=(0.0, 0.0), decode=True)
    assert big.experts_s > 2 * 64 * expert_bytes / HBM * 0.999  # a big batch reads every expert (or computes longer)


def test_batch_answer_equals_one_at_a_time(h100):
    model = small_model(num_kv_heads=2)
    tp, batch, isl = np.array([1, 2, 4]), np.array([1, 16, 64]), np.array([128, 1024, 8192])
    together = aggregated(model, h100, ENGINE_TRAITS["vllm"], BF16, Sharding.of(tp), concurrency=batch, isl=isl,
                          osl=256)
    for i in range(3):
        alone = aggregated(model, h100, ENGINE_TRAITS["vllm"], BF16, Sharding.of(tp[i]), concurrency=batch[i],
                           isl=isl[i], osl=256)
        assert together.tpot_s[i] == pytest.approx(float(alone.tpot_s), rel=1e-12)
        assert together.ttft_s[i] == pytest.approx(float(alone.ttft_s), rel=1e-12)


def test_engine_memory_by_hand_trtllm_llama8b(h100):
    llama8b = small_model(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_size=14336,
                          vocab_size=128256)
    mem = engine_memory(llama8b, h100, ENGINE_TRAITS["trtllm"], BF16, Sharding.of(1), 2048)
    weights = llama8b.total_params() * 2.0
    assert mem.weights_bytes == pytest.approx(weights, rel=1e-12)
    # 8,192 tokens x (gate+up+down 43,008 + QKV 6,144 + 4 x 4,096) x 2 B = 1 GiB, plus 256 fp32 logit rows.
    activations = 8192 * (3 * 14336 + 6144 + 4 * 4096) * 2 + 256 * 128256 * 4
    fixed = (0.5 + 3 * 0.3 + 1.0) * 2**30
    pool = 0.9 * (80 * 2**30 * 0.987 - weights - activations - fixed)
    assert mem.kv_pool_bytes == pytest.approx(pool, rel=1e-12)
    assert mem.max_sequences == np.floor(pool / (2048 * 131072))


def test_concurrency_beyond_the_kv_pool_queues(h100):
    model = small_model()
    out = aggregated(model, h100, ENGINE_TRAITS["sglang"], BF16, Sharding.of(1), concurrency=[8, 10**6],
                     isl=1024, osl=1024, waves=np.inf)
    # SGLang caps the running batch at 4,096 (max_running_requests) even where more would fit.
    assert out.running_batch[0] == 8 and out.running_batch[1] == min(out.max_sequences[1], 4096)
    lifetime = 1024 * out.tpot_s[1] + out.prefill_s
    queued = (10**6 - out.running_batch[1]) / out.running_batch[1] * lifetime
    request = ENGINE_TRAITS["sglang"].request_overhead_s
    assert out.ttft_s[1] == pytest.approx(request + out.prefill_s + out.tpot_s[1] / 2 + queued, rel=1e-12)
    assert BENCHMARK_WAVES > 1


def test_unpriced_feature_and_fp8_on_ampere_are_refused():
    with pytest.raises(InputError, match="linear attention in 1 layers without its head shapes"):
        decode_step_s(small_model(linear_attention_layers=1, linear_attention_params=10,
                                  unpriced_features=("Gated DeltaNet linear attention in 1 of 2 layers",)),
                      load_cluster("dgx-h100", num_gpus=8), BF16, Sharding.of(1), 1, 10)
    fp8 = weight_precision(small_model(), "fp8", "fp8", "fp8")
    with pytest.raises(InputError, match="fp8"):
        decode_step_s(small_model(), load_cluster("dgx-a100", num_gpus=8), fp8, Sharding.of(1), 1, 10)
    with pytest.raises(InputError, match="quantization mode"):
        weight_precision(small_model(), "int3", "fp8", "bf16")


def test_linear_attention_state_and_dsa_indexer_by_hand(h100):
    from dataclasses import replace

    from paraplan.model_specs.mixers import mixer_shapes
    from paraplan.model_specs.model_spec import MixerShapes

    # Qwen3.5's Gated DeltaNet: 64 value heads of 128 x 128 fp32 states (4,194,304 B) plus a 3-step convolution
    # state of 2 x 16 x 128 + 64 x 128 channels in bf16 (73,728 B), per sequence per layer, split over tp.
    qwen = mixer_shapes({"text_config": {"linear_num_key_heads": 16, "linear_num_value_heads": 64,
                                         "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                                         "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32"}})
    assert qwen.linear_state_bytes([1, 4]).tolist() == [4268032, 4268032 / 4]
    hybrid = small_model(num_layers=4, linear_attention_layers=3, linear_attention_params=1000,
                         unpriced_features=("Gated DeltaNet linear attention in 3 of 4 layers",), mixers=qwen)
    # One softmax layer keeps 1,000 tokens x 4,096 B; three linear layers keep their state whatever the length.
    assert kv_bytes_per_sequence(hybrid, 1, 1000, 2.0) == 1000 * 4096 + 3 * 4268032
    # DSA: the indexer scans every cached key (fp8 key + 4-B scale, 2 x 32 x 128 FLOPs per key), attention reads
    # only the top 2,048 latents (576 B each in fp8).
    dsa = MixerShapes(index_heads=32, index_head_dim=128, index_topk=2048)
    mla = small_model(num_heads=16, num_kv_heads=16, head_dim=192, kv_lora_rank=512, q_lora_rank=256,
                      qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, indexer_params=10,
                      unpriced_features=("the sparse-attention indexer (DSA)",))
    fp8 = weight_precision(mla, "fp8", "fp8", "fp8")
    got = step_time(replace(mla, mixers=dsa), h100, fp8, Sharding.of(1), tokens_per_rank=1.0, sequences_per_rank=1.0,
                    attended_keys=(10000.0, 0.0), attention_flops=(0.0, 0.0), decode=True).attention_s
    latents = max(2048 * 576 / HBM, 2048 * 2 * 16 * (2 * 512 + 64) / ATTN)
    # ... after the indexer's own kernels, 30 us a layer (INDEXER_DECODE_FLOOR_S, measured in SGLang's DSA module).
    indexer = 30e-6 + 10000 * max(132 / HBM, 2 * 32 * 128 / ATTN)
    assert got == pytest.approx(2 * (latents + indexer), rel=1e-12)
    with pytest.raises(InputError, match="cannot price"):
        decode_step_s(mla, h100, fp8, Sharding.of(1), 1, 10)
