"""Full recompute under PyTorch's non-reentrant checkpoint (torchtitan) stops at the last saved
tensor, the down-projection input; Megatron's and DeepSpeed's reentrant checkpoints rerun the layer."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_model, make_table

from paraplan.cost_models.compute import analytical_rates, gemm_time_s
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.layer import layer_times
from paraplan.cost_models.recipes import FSDP2_MIXED
from paraplan.cost_models.table import Workload
from paraplan.hardware_profiles import load_cluster
from paraplan.planner.engines import ENGINES

SEQ, MBS = 2048, 2


@pytest.fixture(scope="module")
def setup():
    model = make_model(num_layers=8)
    cluster = load_cluster("dgx-h100", num_nodes=1)
    work = Workload(seq_len=SEQ, global_batch=16, precision="bf16", recipe=FSDP2_MIXED, attention="flash",
                    kernel_stack="pytorch")
    return model, cluster, work


def test_engines_declare_which_checkpoint_they_use():
    assert {name: rules.recompute_stops_early for name, rules in ENGINES.items()} == {
        "megatron": False, "deepspeed": False, "torchtitan": True}


def test_early_stop_skips_exactly_the_down_projection(setup):
    model, cluster, work = setup
    table = make_table(dp=8, mbs=MBS, tp=[1, 2], sp=[0, 1], recompute=2)
    rates = analytical_rates(cluster.gpu, "bf16", "flash", "pytorch")
    rerun = layer_times(model, work, table, rates, cluster)
    stops = layer_times(model, dataclasses.replace(work, recompute_stops_early=True), table, rates, cluster)
    assert rerun.recompute_s == pytest.approx(rerun.forward_compute_s, rel=1e-12)
    tokens = MBS * SEQ
    down = gemm_time_s(tokens, model.hidden_size, model.ffn_size / table.tp, rates)
    assert rerun.recompute_s - stops.recompute_s == pytest.approx(down, rel=1e-12)
    # The recomputed forward repeats one TP collective of two when it stops before the down projection.
    per_collective = rerun.tp_comm_s / 6.0
    assert stops.tp_comm_s == pytest.approx(5.0 * per_collective, rel=1e-12)
    assert stops.tp_comm_s[0] == rerun.tp_comm_s[0] == 0.0  # tp = 1: no collectives at all


def test_hfu_counts_the_skipped_gemm_as_not_executed(setup):
    model, cluster, work = setup
    table = make_table(dp=8, mbs=MBS, recompute=2)
    rerun = estimate(model, cluster, work, table)
    stops = estimate(model, cluster, dataclasses.replace(work, recompute_stops_early=True), table)
    per_token_model = model.model_flops_per_token(SEQ, work.flops_convention)
    recompute_rerun = rerun.hfu / rerun.mfu * per_token_model - per_token_model
    recompute_stops = stops.hfu / stops.mfu * per_token_model - per_token_model
    skipped = model.num_layers * 2.0 * model.hidden_size * model.ffn_size
    assert float(recompute_rerun[0] - recompute_stops[0]) == pytest.approx(skipped, rel=1e-9)
    assert stops.step_time_s[0] < rerun.step_time_s[0]
