"""QK-norm (Qwen3, Gemma 3, OLMo 2): two more norms a layer, over every query and key element, priced in time and
kept in memory like the residual norms (cost_models/layer.py ``qk_norm_elements``, cost_models/memory.py).

Llama 3.1 8B's shapes with QK-norm switched on stand for a Qwen3-8B-like layer: q 4,096 and kv 1,024 wide, so the
norms touch q + kv = 5,120 elements a token on one GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import make_table

from paraplan.cost_models.compute import analytical_rates, memory_bound_time_s
from paraplan.cost_models.layer import (
    EAGER_NORM_BYTES,
    _eager_extra_bytes_per_token,
    _elementwise_bytes_per_token,
    eager_extra_kernels_per_layer,
    elementwise_kernels_per_layer,
    layer_times,
)
from paraplan.cost_models.memory import layer_activation_bytes_per_token
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob

LLAMA8B = load_model("llama-3.1-8b")
QK = dataclasses.replace(LLAMA8B, qk_norm=True)
QK_ELEMENTS = 4096 + 1024


def test_fused_qk_norms_read_and_write_each_query_and_key_element_once():
    for tp, sp in ((1, 0), (8, 1), (4, 0)):
        added = float(_elementwise_bytes_per_token(QK, tp, sp, "bf16") - _elementwise_bytes_per_token(LLAMA8B, tp, sp,
                                                                                                      "bf16"))
        assert added == pytest.approx(2 * 2 * QK_ELEMENTS / tp, rel=1e-12)  # 2 B read + 2 B write, TP-sharded heads
    assert (elementwise_kernels_per_layer(LLAMA8B), elementwise_kernels_per_layer(QK)) == (8, 10)


def test_eager_qk_norms_cost_what_an_eager_residual_norm_costs_per_element():
    # torchtitan's Qwen3 q_norm/k_norm are the nn.RMSNorm of its residual norms: (36 - 4) B more per element than
    # the fused kernel, and 5 more launches each.
    added = float(_eager_extra_bytes_per_token(QK, 1, 0) - _eager_extra_bytes_per_token(LLAMA8B, 1, 0))
    assert EAGER_NORM_BYTES == 36.0
    assert added == (36 - 4) * QK_ELEMENTS == 163_840
    assert (eager_extra_kernels_per_layer(LLAMA8B), eager_extra_kernels_per_layer(QK)) == (19, 29)


def test_models_without_qk_norm_and_mla_price_none():
    deepseek = load_model("deepseek-v3")  # MLA: its latent norms are not query/key norms
    assert not deepseek.qk_norm or deepseek.is_mla
    with_flag = dataclasses.replace(deepseek, qk_norm=True)
    assert float(_elementwise_bytes_per_token(with_flag, 1, 0, "bf16")) == float(
        _elementwise_bytes_per_token(deepseek, 1, 0, "bf16"))
    assert elementwise_kernels_per_layer(with_flag) == elementwise_kernels_per_layer(deepseek)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_qk_norm_inputs_are_kept_for_backward_unless_the_layer_reruns_them(tp):
    kept = 2.0 * QK_ELEMENTS / tp  # the 16-bit Q and K before the norm
    for recompute, added in ((0, kept), (1, kept), (3, kept), (2, 0.0)):
        with_qk = layer_activation_bytes_per_token(QK, tp, 1, recompute)
        without = layer_activation_bytes_per_token(LLAMA8B, tp, 1, recompute)
        assert float(with_qk - without) == pytest.approx(added, rel=1e-12), recompute


@pytest.mark.parametrize("compiled", [False, True])
def test_a_layer_is_slower_by_exactly_its_qk_norms(compiled):
    """Forward: the fused norms' bytes and launches (eager torchtitan: its extra bytes and launches too); backward
    prices element-wise work at twice the forward, as for every other norm."""
    cluster = load_cluster("dgx-h100", num_gpus=8)
    rates = analytical_rates(cluster.gpu, "bf16")
    table = make_table(dp=8, mbs=2)
    tokens = 2 * 4096
    times = {}
    for model in (LLAMA8B, QK):
        job = TrainingJob(model=model, seq_len=4096, global_batch=16, engine="torchtitan", compiled=compiled)
        times[model.qk_norm] = layer_times(model, job.workload(), table, rates, cluster)
    fused = memory_bound_time_s(np.array(tokens * 2.0 * 2.0 * QK_ELEMENTS), 2, rates) \
        - memory_bound_time_s(np.array(0.0), 0, rates)
    eager = 0.0 if compiled else float(memory_bound_time_s(np.array(tokens * 32.0 * QK_ELEMENTS), 10, rates))
    forward = float(times[True].forward_compute_s[0] - times[False].forward_compute_s[0])
    backward = float(times[True].backward_compute_s[0] - times[False].backward_compute_s[0])
    assert forward == pytest.approx(float(fused) + eager, rel=1e-9)
    assert backward == pytest.approx(2.0 * forward, rel=1e-9)
    assert forward > 0.0
