"""MoE training (issue 32, item 5): grouped expert GEMMs priced by their tiles, GPT-OSS's windows and sinks, and
DeepEP for the PyTorch-native engine (torchtitan; NeMo Automodel's FSDP2 + DeepEP stack).

Hand-derived grouped-GEMM times, exact metamorphic relations (whole tiles cost what the dense GEMM of the stacked
rows costs; torchtitan's DeepEP dispatch equals Megatron's in 16-bit), and a hand-derived DeepEP dispatch.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_table

from paraplan.cost_models.collectives import collective_latency_s
from paraplan.cost_models.compute import ComputeRates, analytical_rates, gemm_time_s
from paraplan.cost_models.layer import causal_keys_per_query
from paraplan.cost_models.moe import grouped_gemm_time_s, moe_block_times
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob

SEQ = 4096
QWEN3_30B = load_model("qwen3-30b-a3b")
GPT_OSS = load_model("gpt-oss-120b")


def _rates(element_bytes: float = 2.0, memory_bytes_per_s: float = 1e30) -> ComputeRates:
    """Round-number rates: 1 PFLOP/s, half-saturation at 100, 5 µs a launch; memory as given."""
    return ComputeRates(gemm_flops_per_s=1e15, gemm_half_dim=100.0, gemm_element_bytes=element_bytes,
                        attention_kernel="flash", attention_flops_per_s=1e15,
                        memory_bytes_per_s=memory_bytes_per_s, kernel_overhead_s=5e-6, source="test")


def _sat(d: float) -> float:
    return d / (d + 100.0)


def test_grouped_gemm_by_hand_pads_rows_per_group_and_the_width_to_whole_tiles():
    # 4 experts of 100 tokens, width 2,880 (GPT-OSS) out of 768 in (Qwen3-30B's expert width):
    # rows 4 x 128 = 512 executed, 2,880 = 22.5 tiles of 128 -> 23 tiles = 2,944, k = 768 = 12 x 64 (bf16).
    expected = 2 * 512 * 2944 * 768 / (1e15 * _sat(512) * _sat(2944) * _sat(768)) + 5e-6
    assert float(grouped_gemm_time_s(100, 4, 2880, 768, _rates())) == pytest.approx(expected, rel=1e-12)


def test_rows_within_one_tile_cost_the_same_and_whole_tiles_cost_the_dense_gemm():
    rates = _rates()
    def time(rows: int) -> float:
        return float(grouped_gemm_time_s(rows, 8, 1536, 2048, rates))

    assert time(129) == time(256) > time(128)
    # Qwen3's widths (768 and 1,536, up projection 2 x 768) and 128-multiples of tokens: no padding at all.
    for width in (768, 1536):
        assert float(grouped_gemm_time_s(4096, 16, 2 * width, 2048, rates)) == float(
            gemm_time_s(16 * 4096, 2 * width, 2048, rates))
        assert float(grouped_gemm_time_s(4096, 16, 2048, width, rates)) == float(
            gemm_time_s(16 * 4096, 2048, width, rates))


def test_the_reduction_step_is_128_bytes_so_fp8_pads_2880_and_bf16_does_not():
    bf16, fp8 = _rates(2.0), _rates(1.0)
    assert float(grouped_gemm_time_s(1024, 2, 2944, 2880, bf16)) == float(gemm_time_s(2048, 2944, 2880, bf16))
    assert float(grouped_gemm_time_s(1024, 2, 2944, 2880, fp8)) == float(gemm_time_s(2048, 2944, 2944, fp8))


def test_a_memory_bound_grouped_gemm_reads_every_expert_weight():
    # 64 experts of 8 tokens on a 1 TB/s memory: reading the 64 weights [2048, 768] dominates.
    rates = _rates(memory_bytes_per_s=1e12)
    weights_s = 64 * 2048 * 768 * 2.0 / 1e12
    rows_s = (2.0 * 64 * 8 * 2048 + 2.0 * 64 * 8 * 768) / 1e12
    assert float(grouped_gemm_time_s(8, 64, 768, 2048, rates)) == pytest.approx(weights_s + rows_s + 5e-6, rel=1e-12)


def test_grouped_gemm_batch_equals_one_at_a_time():
    rows, groups = np.array([100.0, 129.0, 4096.0, 7.5]), np.array([4.0, 8.0, 16.0, 64.0])
    rates = _rates(memory_bytes_per_s=3e12)
    batch = grouped_gemm_time_s(rows, groups, 2880, 2880, rates)
    single = [float(grouped_gemm_time_s(r, g, 2880, 2880, rates)) for r, g in zip(rows, groups)]
    np.testing.assert_array_equal(batch, single)


def test_gpt_oss_alternates_128_token_windows_and_prices_them():
    assert (GPT_OSS.num_layers, GPT_OSS.sliding_layers, GPT_OSS.sliding_window) == (36, 18, 128)
    assert GPT_OSS.attention_sinks
    assert GPT_OSS.attention_span(SEQ) == pytest.approx((18 * 128 + 18 * SEQ) / 36)
    keys = causal_keys_per_query(GPT_OSS, SEQ)
    assert keys == pytest.approx((18 * (128 - 128**2 / (2 * SEQ)) + 18 * SEQ / 2) / 36)
    # A sink is one more logit per query and head, with no value: under 0.1% of the keys, so it is not priced.
    assert 1.0 / keys < 1e-3


def _comm(engine: str, precision: str, dispatcher: str = "deepep") -> float:
    cluster = load_cluster("dgx-h100", num_gpus=16)
    job = TrainingJob(model=QWEN3_30B, seq_len=SEQ, global_batch=64, precision=precision, engine=engine,
                      dispatcher=dispatcher, expert_imbalance=1.0)
    table = make_table(ep=16, dp=16, mbs=1)
    rates = analytical_rates(cluster.gpu, precision)
    return float(moe_block_times(QWEN3_30B, job.workload(), table, rates, cluster).expert_comm_s[0])


def test_torchtitan_takes_deepep_and_prices_megatrons_dispatch():
    assert TrainingJob(model=QWEN3_30B, seq_len=SEQ, global_batch=64, engine="torchtitan",
                       dispatcher="deepep").token_dispatcher == "deepep"
    assert _comm("torchtitan", "bf16") == _comm("megatron", "bf16")
    assert _comm("torchtitan", "bf16") < _comm("torchtitan", "bf16", "alltoall")
    # torchtitan dispatches its bf16 hidden states (torchao casts inside the GEMM); Megatron's goes out in fp8.
    assert _comm("torchtitan", "fp8") == _comm("megatron", "bf16") > _comm("megatron", "fp8")


def test_torchtitan_deepep_dispatch_by_hand():
    """Qwen3-30B-A3B, ep 16 over two 8-GPU nodes, 4,096 tokens a rank, bf16: a token's 8 experts land on
    2·(1 − 2⁻⁸) distinct nodes, half of them remote, so it crosses the network 255/256 times and fans out to
    8 experts, 7/8 of them on other GPUs of their node. Four such passes (dispatch, combine; twice each)."""
    cluster = load_cluster("dgx-h100", num_gpus=16)
    eff = cluster.gpu.efficiency
    nvlink, nic = cluster.gpu.nvlink_bytes_per_s * eff.nvlink_frac, cluster.nic_bytes_per_s_per_gpu * eff.nic_frac
    token_bytes = SEQ * 2048 * 2.0
    one = max(token_bytes * 255 / 256 / nic, token_bytes * 8 * 7 / 8 / nvlink)
    latency = collective_latency_s("all_to_all", 16, 1, cluster)
    assert _comm("torchtitan", "bf16") == pytest.approx(4 * (one + latency), rel=1e-9)


def test_expert_backward_prices_input_and_weight_gradients_at_their_own_shapes():
    """Qwen3-30B-A3B (no shared expert), ep 8, one 4,096-token sequence: 16 local experts get 8 x 4,096 / 16 =
    2,048 copies each. Backward minus twice forward leaves the experts' gradient GEMMs minus twice their forward."""
    cluster = load_cluster("dgx-h100", num_gpus=8)
    rates = analytical_rates(cluster.gpu, "bf16")
    job = TrainingJob(model=QWEN3_30B, seq_len=SEQ, global_batch=64, expert_imbalance=1.0)
    moe = moe_block_times(QWEN3_30B, job.workload(), make_table(ep=8, dp=8, mbs=1), rates, cluster)
    m, e, h, f = 2048, 16, 2048, 768

    def grouped(rows: float, n: float, k: float) -> float:
        return float(grouped_gemm_time_s(rows, e, n, k, rates))

    forward = grouped(m, 2 * f, h) + grouped(m, h, f)
    input_grad = grouped(m, h, 2 * f) + grouped(m, f, h)
    weight_grad = grouped(h, 2 * f, m) + grouped(f, h, m)
    assert float(moe.backward_compute_s[0] - 2 * moe.forward_compute_s[0]) == pytest.approx(
        input_grad + weight_grad - 2 * forward, rel=1e-9, abs=1e-12)
    router = float(gemm_time_s(SEQ, 128, h, rates))
    assert float(moe.gemm_s[0]) == pytest.approx(router + weight_grad, rel=1e-12)


def test_few_tokens_per_expert_slow_the_weight_gradient_more_than_the_forward():
    rates = _rates()
    for tokens in (128, 256, 512):
        forward = float(grouped_gemm_time_s(tokens, 16, 1536, 2048, rates))
        weight_grad = float(grouped_gemm_time_s(2048, 16, 1536, tokens, rates))
        assert weight_grad > forward  # the same FLOPs, the tokens now the reduction dimension
    assert float(grouped_gemm_time_s(2048, 16, 1536, 8192, rates)) == pytest.approx(
        float(grouped_gemm_time_s(8192, 16, 1536, 2048, rates)), rel=0.05)  # many tokens: alike


def test_a_model_with_attention_sinks_says_which_kernel_its_attention_is_priced_at() -> None:
    """GPT-OSS's sinks: FlashAttention-2 and SDPA lack them, Transformer Engine falls back to unfused attention."""
    import paraplan

    fused = paraplan.plan("gpt-oss-120b", gpu="h100-sxm", gpus=64, seq_len=4096, global_batch=512, top=1)
    said = "gpt-oss-120b has attention sinks: priced at the fused attention kernel's rate"
    assert any(said in note for note in fused.notes)
    unfused = paraplan.plan("gpt-oss-120b", gpu="h100-sxm", gpus=64, seq_len=4096, global_batch=512, top=1,
                            attention="unfused")
    assert not any("attention sinks" in n for n in unfused.notes)
    dense = paraplan.plan("llama-3.1-8b", gpu="h100-sxm", gpus=8, seq_len=4096, global_batch=64, top=1)
    assert not any("attention sinks" in n for n in dense.notes)
