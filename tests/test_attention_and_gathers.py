"""Attention kernels (fused, flash, unfused), kernel stacks, ring latency of all-gather and
reduce-scatter, and per-tensor ZeRO-3 gathers. Expected values are derived by hand from the
constants the code exposes, never copied from its output."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import make_model, make_table
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models import collectives
from paraplan.cost_models.collectives import collective_latency_s, collective_time_s
from paraplan.cost_models.compute import (
    ATTENTION_BACKWARD_OVER_FORWARD,
    analytical_rates,
    flash_attention_time_s,
    unfused_attention_time_s,
)
from paraplan.cost_models.dp_sync import dp_exposed_s
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.memory import attention_scores_bytes_per_token
from paraplan.cost_models.recipes import DEEPSPEED_MIXED, FSDP2_MIXED
from paraplan.cost_models.table import Workload
from paraplan.hardware_profiles import load_cluster, quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import enumerate_space

SIZE = 256e6


@pytest.fixture(scope="module")
def a100():
    return load_cluster("dgx-a100", num_nodes=4)


def _work(attention="fused", recipe=DEEPSPEED_MIXED, seq_len=2048, stack="transformer_engine"):
    return Workload(seq_len=seq_len, global_batch=64, precision="bf16", recipe=recipe, attention=attention,
                    kernel_stack=stack)


# -- attention kernels ----------------------------------------------------------------------------
def test_flash_attention_is_the_calibrated_rate_with_backward_at_2_5x(a100):
    rates = analytical_rates(a100.gpu, "bf16", "flash")
    flops = 3e12
    forward, backward = flash_attention_time_s(flops, rates)
    assert float(forward) == pytest.approx(flops / rates.attention_flops_per_s + rates.kernel_overhead_s)
    assert float(backward) == pytest.approx(ATTENTION_BACKWARD_OVER_FORWARD * flops / rates.attention_flops_per_s
                                            + rates.kernel_overhead_s)


def test_unfused_attention_by_hand(a100):
    rates = analytical_rates(a100.gpu, "bf16", "unfused")
    s, d, elements = 2048, 128, 4 * 16 * 2048 * 2048

    def sat(x):
        return x / (x + rates.gemm_half_dim)

    gemm = 4.0 * elements * d / (rates.attention_flops_per_s * sat(s) ** 2 * sat(d))
    hbm, overhead = rates.memory_bytes_per_s, rates.kernel_overhead_s
    forward, backward = unfused_attention_time_s(elements, s, d, True, rates)
    # forward: QKᵀ, softmax (r2 w2), dropout (r2 w2 + 1 B mask), PV: 4 kernels
    assert float(forward) == pytest.approx(gemm + 9 * elements / hbm + 4 * overhead, rel=1e-12)
    # backward: 4 GEMMs, dropout backward (r2 + r1 w2), softmax backward (r2 r2 w2): 6 kernels
    assert float(backward) == pytest.approx(2 * gemm + 11 * elements / hbm + 6 * overhead, rel=1e-12)
    no_dropout_fwd, _ = unfused_attention_time_s(elements, s, d, False, rates)
    assert float(no_dropout_fwd) == pytest.approx(gemm + 4 * elements / hbm + 3 * overhead, rel=1e-12)


def test_unfused_attention_is_slower_and_stores_scores(a100):
    model = make_model()
    table = make_table(dp=32, mbs=2)  # global batch 64: one micro-batch per step
    fused = estimate(model, a100, _work("fused"), table)
    unfused = estimate(model, a100, _work("unfused"), table)
    assert unfused.compute_s[0] > fused.compute_s[0]
    tokens = 2 * 2048
    expected = tokens * model.num_layers * 5.0 * model.num_heads * 2048  # 5·a·s per token (with dropout)
    assert float(unfused.memory.activations_bytes[0] - fused.memory.activations_bytes[0]) == pytest.approx(expected)
    # Selective recompute redoes the attention core: no scores are stored between passes.
    selective = make_table(dp=32, mbs=2, recompute=1)
    gap = estimate(model, a100, _work("unfused"), selective).memory.activations_bytes[0] \
        - estimate(model, a100, _work("fused"), selective).memory.activations_bytes[0]
    assert float(gap) == 0.0


def test_scores_bytes_follow_korthikanti():
    model = make_model()
    assert float(attention_scores_bytes_per_token(model, 2048, 1)) == 5.0 * model.num_heads * 2048
    assert float(attention_scores_bytes_per_token(model, 2048, 4)) == 5.0 * model.num_heads * 2048 / 4
    no_dropout = make_model(dropout=False)
    assert float(attention_scores_bytes_per_token(no_dropout, 2048, 1)) == 2.0 * model.num_heads * 2048


def test_pytorch_stack_uses_its_own_fp8_fraction():
    gpu = load_cluster("dgx-h100", num_nodes=1).gpu
    eff = gpu.efficiency
    assert "fp8" in eff.stack_gemm_peak_frac["pytorch"]
    te = analytical_rates(gpu, "fp8")
    pt = analytical_rates(gpu, "fp8", kernel_stack="pytorch")
    assert te.gemm_flops_per_s / pt.gemm_flops_per_s == pytest.approx(
        eff.gemm_peak_frac["fp8"] / eff.stack_gemm_peak_frac["pytorch"]["fp8"])
    assert "pytorch GEMMs" in pt.source and "fused attention" in te.source


# -- job rules ------------------------------------------------------------------------------------
def test_engine_default_attention_and_rules():
    model = load_model("llama-3.1-8b")
    assert TrainingJob(model=model, seq_len=4096, global_batch=8).attention_kernel == "fused"
    # torchtitan 0.2.2 and 0.3.0 wrap SDPA in sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True)
    assert TrainingJob(model=model, seq_len=4096, global_batch=8, engine="torchtitan").attention_kernel == "fused"
    assert TrainingJob(model=model, seq_len=4096, global_batch=8, engine="torchtitan",
                       attention="flash").attention_kernel == "flash"
    with pytest.raises(ValueError, match="not available with engine torchtitan"):
        TrainingJob(model=model, seq_len=4096, global_batch=8, engine="torchtitan", attention="unfused")


def test_unfused_attention_rejects_context_parallel():
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100", num_nodes=1)
    job = TrainingJob(model=model, seq_len=8192, global_batch=8, attention="unfused")
    space = enumerate_space(job, cluster, engine_rules("megatron"), {"cp": [2]})
    assert len(space.table) == 0
    assert any("flash-family" in reason for reason in space.rejected)


def test_cli_attention_flag_reaches_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    args = ["plan", "llama-3.1-8b", "--gpu", "a100-sxm-80gb", "--gpus", "8", "--seq-len", "2048",
            "--global-batch", "64", "--attention", "unfused", "--cp", "1", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert '"attention": "unfused"' in out.read_text()
    bad = CliRunner().invoke(app, args[:-2] + ["--engine", "torchtitan"])
    assert bad.exit_code == 2 and "not available with engine torchtitan" in bad.output


# -- ring latency and ZeRO-3 gathers --------------------------------------------------------------
def test_ring_all_gather_latency_is_linear_in_the_group(a100):
    intra = max(a100.intra_domain_latency_s, collectives.RING_BULK_NVLINK_STEP_S)
    inter = max(a100.inter_node_latency_s, collectives.RING_BULK_NETWORK_STEP_S)
    # 32 ranks over 4 nodes: 31 steps, 3 of which cross the network.
    expected = collectives.RING_BULK_BASE_S + 28 * intra + 3 * inter
    for kind in ("all_gather", "reduce_scatter"):
        assert float(collective_latency_s(kind, 32, 1, a100)) == pytest.approx(expected, rel=1e-12)
    # The latency is the size-independent part of the collective's time.
    t1 = float(collective_time_s("all_gather", SIZE, 32, 1, a100))
    t2 = float(collective_time_s("all_gather", 2 * SIZE, 32, 1, a100))
    assert 2 * t1 - t2 == pytest.approx(expected, rel=1e-9)


def test_small_ring_collectives_run_on_the_ll_protocol(a100):
    # NCCL tuning.cc, Ring/LL: 6.6 us base, 0.6 us per NVLink step, 2.7 us per network step;
    # 32 ranks over 4 nodes take 28 NVLink and 3 network steps.
    ll = 6.6e-6 + 28 * 0.6e-6 + 3 * 2.7e-6
    assert float(collective_latency_s("all_gather", 32, 1, a100, "ll")) == pytest.approx(ll, rel=1e-12)
    simple = float(collective_latency_s("all_gather", 32, 1, a100))
    assert simple > 3 * ll
    nic = a100.nic_bytes_per_s_per_gpu * a100.gpu.efficiency.nic_frac
    nvlink = a100.gpu.nvlink_bytes_per_s * a100.gpu.efficiency.nvlink_frac

    def bandwidth_s(size):  # k = 8 members per node over NVLink, S/8 per member across 4 nodes
        return 7 / 8 * size / nvlink + 3 / 4 * (size / 8) / nic

    for kind in ("all_gather", "reduce_scatter"):
        # A 64 KiB gather (a bias vector): LL, at a quarter of the bus bandwidth across nodes.
        small = 64 * 1024
        assert float(collective_time_s(kind, small, 32, 1, a100)) == pytest.approx(4 * bandwidth_s(small) + ll,
                                                                                   rel=1e-12)
        # 1 GiB: Simple, whose bandwidth wins over LL's latency saving.
        big = 2**30
        assert float(collective_time_s(kind, big, 32, 1, a100)) == pytest.approx(bandwidth_s(big) + simple, rel=1e-12)
    # NCCL picks the faster of the two: the time never exceeds Simple's.
    sizes = np.logspace(3, 10, 50)
    simple_times = np.array([bandwidth_s(s) + simple for s in sizes])
    assert np.all(collective_time_s("all_gather", sizes, 32, 1, a100) <= simple_times * (1 + 1e-12))


def test_per_tensor_gathers_of_vectors_pay_ll_latency(a100):
    model = make_model()  # GPT: 4 matrices and 8 vectors (4 biases, 2 LayerNorms' weight and bias) per layer
    assert model.layer_vector_tensors() == 8
    table = make_table(dp=32, mbs=1, zero=3)
    params = float(model.num_layers * model.layer_params())
    sizes = (np.array([params]), np.array([model.layer_params()]), np.array([10.0]), np.array([1.0]))
    rates = analytical_rates(a100.gpu, "bf16", "fused")
    no_copies = _work(recipe=dataclasses.replace(DEEPSPEED_MIXED, gather_copies_per_rank=False))
    all_simple = dp_exposed_s(no_copies, table, a100, rates, *sizes, model.num_layers, model.layer_param_tensors())
    vectors_ll = dp_exposed_s(no_copies, table, a100, rates, *sizes, model.num_layers, model.layer_param_tensors(),
                              model.layer_vector_tensors())
    saved_per_vector = float(collective_latency_s("all_gather", 32, 1, a100)
                             - collective_latency_s("all_gather", 32, 1, a100, "ll"))
    # Two gather passes per micro-batch, each with 8 vector gathers per layer.
    assert float(all_simple[0] - vectors_ll[0]) == pytest.approx(2 * model.num_layers * 8 * saved_per_vector, rel=1e-9)


def test_all_reduce_latency_stays_logarithmic(a100):
    expected = 2 * (a100.intra_domain_latency_s * np.log2(8) + a100.inter_node_latency_s * np.log2(4))
    assert float(collective_latency_s("all_reduce", 32, 1, a100)) == pytest.approx(expected, rel=1e-12)


def test_parameter_tensors_per_layer():
    assert make_model().layer_param_tensors() == 12  # GPT: 4 matrices, 4 biases, 2 LayerNorms (w, b)
    llama = load_model("llama-3.1-8b")
    assert llama.layer_param_tensors() == 6  # 4 matrices (fused QKV, out, fused gate+up, down), 2 RMSNorms
    assert llama.largest_layer_tensor_params() == 2 * 14336 * 4096


def test_per_tensor_gathers_pay_one_latency_each(a100):
    model = make_model()
    table = make_table(dp=32, mbs=1, zero=3)
    group_latency = float(collective_latency_s("all_gather", 32, 1, a100))
    params = float(model.num_layers * model.layer_params())
    sizes = (np.array([params]), np.array([model.layer_params()]), np.array([10.0]), np.array([1.0]))
    rates = analytical_rates(a100.gpu, "bf16", "fused")
    no_copies = _work(recipe=dataclasses.replace(DEEPSPEED_MIXED, gather_copies_per_rank=False))
    per_tensor = dp_exposed_s(no_copies, table, a100, rates, *sizes, model.num_layers, model.layer_param_tensors())
    per_layer = dp_exposed_s(no_copies, table, a100, rates, *sizes, model.num_layers, 1)
    # Two gather passes per micro-batch, not hidden under compute (DeepSpeed recipe): the gap is
    # 2 x (collectives per pass with tensors - without) x latency.
    extra = 2 * model.num_layers * (model.layer_param_tensors() - 1) * group_latency
    assert float(per_tensor[0] - per_layer[0]) == pytest.approx(extra, rel=1e-9)
    # FSDP gathers layer by layer under compute: a 10 s stage hides everything but the first layer.
    hidden = dp_exposed_s(_work(recipe=FSDP2_MIXED), table, a100, rates, *sizes, model.num_layers, 12)
    assert float(hidden[0]) < float(per_layer[0])


def test_list_output_gathers_pay_one_copy_per_rank(a100):
    """DeepSpeed's 2021 ZeRO-3 gathers into a list of per-rank views: each gather of each tensor
    launches one copy kernel per rank, and the gathered bytes cross HBM once more (read + write)."""
    model = make_model()
    table = make_table(dp=32, mbs=1, zero=3)
    rates = analytical_rates(a100.gpu, "bf16", "fused")
    params = float(model.num_layers * model.layer_params())
    sizes = (np.array([params]), np.array([model.layer_params()]), np.array([10.0]), np.array([1.0]))
    tensors = model.num_layers * model.layer_param_tensors()
    with_copies = dp_exposed_s(_work(), table, a100, rates, *sizes, model.num_layers, model.layer_param_tensors())
    no_copies = dp_exposed_s(_work(recipe=dataclasses.replace(DEEPSPEED_MIXED, gather_copies_per_rank=False)),
                             table, a100, rates, *sizes, model.num_layers, model.layer_param_tensors())
    gathered_bytes = params * DEEPSPEED_MIXED.param_gather_bytes
    per_gather = 32 * tensors * rates.kernel_overhead_s + 2 * gathered_bytes / rates.memory_bytes_per_s
    assert float(with_copies[0] - no_copies[0]) == pytest.approx(2 * per_gather, rel=1e-9)  # 2 gather passes


def test_deepspeed_zero3_slows_down_as_the_group_grows():
    model = load_model("megatron-gpt-174.6b")
    job = TrainingJob(model=model, seq_len=2048, global_batch=1536, engine="deepspeed", attention="unfused")
    per_gpu = []
    for gpus in (384, 768, 1536):
        cluster = quick_cluster("a100-sxm-80gb", gpus)
        space = enumerate_space(job, cluster, engine_rules("deepspeed"),
                                {"tp": [1], "pp": [1], "zero": [3], "recompute": [2], "mbs": [1536 // gpus]})
        est = estimate(model, cluster, job.workload(), space.table)
        per_gpu.append(float(est.tokens_per_s_per_gpu[0]))
    # Work per GPU halves at each step, but the per-tensor gather latency grows with the ring.
    assert per_gpu[0] > per_gpu[1] > per_gpu[2]


def test_unknown_attention_kernel_in_rates_is_rejected(a100):
    with pytest.raises(ValueError, match="attention kernel"):
        analytical_rates(a100.gpu, "bf16", "magic")
