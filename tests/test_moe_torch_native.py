"""torchtitan's eager MoE indexing (cost_models/moe_torch_native.py), with hand-derived values.

H100 SXM: HBM 3.35 TB/s at 0.8 achieved, kernel overhead 5.2 us (efficiency.yaml). Bytes per element of a routed
copy beyond moe.py's permute and unpermute: 28 forward, 34 backward (the module docstring lists each op)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import make_table

from paraplan.cost_models.compute import analytical_rates
from paraplan.cost_models.moe import moe_block_times
from paraplan.cost_models.moe_torch_native import eager_dispatch_s
from paraplan.hardware_profiles import load_cluster, load_gpu
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob

HBM = 3.35e12 * 0.8
OVERHEAD = 5.2e-6


def test_eager_indexing_by_hand() -> None:
    rates = analytical_rates(load_gpu("h100-sxm"), "bf16", "flash", "pytorch")
    got = eager_dispatch_s(np.array([32768.0]), 2048, True, "alltoall", rates)
    # 32,768 copies (4,096 tokens x top-8) x 2,048 values: 28 B forward, 34 B backward each.
    assert got.forward_s[0] == pytest.approx(32768 * 2048 * 28 / HBM + 7 * OVERHEAD, rel=1e-12)
    assert got.backward_s[0] == pytest.approx(32768 * 2048 * 34 / HBM + 9 * OVERHEAD, rel=1e-12)
    assert got.forward_s[0] == pytest.approx(0.7375e-3, rel=1e-3)  # 0.74 ms a block forward


@pytest.mark.parametrize(("eager", "dispatcher"), [(False, "alltoall"), (True, "deepep"), (False, "deepep")])
def test_compiled_deepep_and_fused_engines_pay_nothing(eager: bool, dispatcher: str) -> None:
    rates = analytical_rates(load_gpu("h100-sxm"), "bf16")
    got = eager_dispatch_s(np.array([1000.0, 2000.0]), 4096, eager, dispatcher, rates)
    assert np.all(got.forward_s == 0.0) and np.all(got.backward_s == 0.0)


def test_torchtitan_eager_moe_block_adds_exactly_the_indexing() -> None:
    """Qwen3-30B-A3B under torchtitan: the eager block's forward and backward exceed the same block with fused
    element-wise kernels by exactly the indexing of its routed copies (4,096 tokens x top-8, balanced)."""
    model = load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100", num_gpus=8)
    job = TrainingJob(model=model, seq_len=4096, global_batch=8, engine="torchtitan", expert_imbalance=1.0)
    eager = job.workload()
    assert eager.eager_elementwise
    fused = dataclasses.replace(eager, allocator="fused_kernels")
    t = make_table(ep=1, dp=8)
    rates = analytical_rates(cluster.gpu, "bf16", "flash", "pytorch")
    with_indexing = moe_block_times(model, eager, t, rates, cluster)
    without = moe_block_times(model, fused, t, rates, cluster)
    expected = eager_dispatch_s(np.array([4096.0 * 8]), 2048, True, "alltoall", rates)
    assert with_indexing.forward_compute_s[0] - without.forward_compute_s[0] == pytest.approx(expected.forward_s[0])
    assert with_indexing.backward_compute_s[0] - without.backward_compute_s[0] == pytest.approx(
        expected.backward_s[0])
    assert with_indexing.expert_comm_s[0] == without.expert_comm_s[0]
