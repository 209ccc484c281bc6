"""The MoE cost model: hand-derived all-to-all volumes and expert memory, exact metamorphic relations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import assert_bad_input, make_table
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.collectives import all_to_all_time_s, collective_latency_s
from paraplan.cost_models.compute import analytical_rates
from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.layer import COMM_SM_FRAC, layer_times
from paraplan.cost_models.memory import layer_activation_bytes_per_token, stored_layer_bytes
from paraplan.cost_models.moe import expert_imbalance, moe_activation_bytes_per_token, moe_block_times
from paraplan.cost_models.stages import stage_layout
from paraplan.measurements.routing import RoutingStats
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob

SEQ = 4096


def _work(model, imbalance=1.0, **kw):
    return TrainingJob(model=model, seq_len=SEQ, global_batch=64, expert_imbalance=imbalance, **kw).workload()


def _rates(cluster):
    return analytical_rates(cluster.gpu, "bf16")


def _links(cluster):
    eff = cluster.gpu.efficiency
    return cluster.gpu.nvlink_bytes_per_s * eff.nvlink_frac, cluster.nic_bytes_per_s_per_gpu * eff.nic_frac


def test_all_to_all_inside_and_across_nvlink_domains(h100x16):
    nvlink, nic = _links(h100x16)
    size = 1e9
    inside = all_to_all_time_s(size, 8, 1, h100x16) - collective_latency_s("all_to_all", 8, 1, h100x16)
    assert inside == pytest.approx(7 / 8 * size / nvlink, rel=1e-12)
    # 16 ranks over two 8-GPU nodes: 7/16 of each rank's bytes stay on NVLink, 8/16 leave over its NIC.
    across = all_to_all_time_s(size, 16, 1, h100x16) - collective_latency_s("all_to_all", 16, 1, h100x16)
    assert across == pytest.approx(max(7 / 16 * size / nvlink, 8 / 16 * size / nic), rel=1e-12)
    assert all_to_all_time_s(size, 1, 1, h100x16) == 0.0


def test_dispatch_and_combine_volume_by_hand(mixtral, h100x16):
    """Four all-to-alls per MoE layer (dispatch, combine; forward and backward), each carrying the k
    copies of every routed token: 2 x 4096 tokens x 4096 hidden x 2 bytes = 64 MiB per rank."""
    t = make_table(ep=8, dp=16)
    moe = moe_block_times(mixtral, _work(mixtral), t, _rates(h100x16), h100x16)
    sent = 2 * SEQ * 4096 * 2
    assert sent == 64 * 2**20
    assert moe.expert_comm_s[0] == pytest.approx(4 * all_to_all_time_s(sent, 8, 1, h100x16), rel=1e-12)


def test_ep_one_has_no_all_to_all_and_cp_one_no_ring(mixtral, h100x16):
    lt = layer_times(mixtral, _work(mixtral), make_table(ep=[1, 2], dp=16), _rates(h100x16), h100x16)
    assert lt.ep_comm_s[0] == 0.0 and lt.ep_comm_s[1] > 0.0
    assert np.all(lt.cp_comm_s == 0.0)


def test_doubling_ep_halves_expert_weights_per_gpu(mixtral):
    layout = stage_layout(mixtral, 1, 1, 1, np.array([2, 4, 8]))
    routed = 32 * 8 * 3 * 4096 * 14336  # layers x experts x gated MLP
    assert layout.first_expert_params.tolist() == [routed / 2, routed / 4, routed / 8]
    # Everything else stays whole on the GPU (tp = 1): the model minus its routed experts.
    assert float(layout.first_params) == mixtral.total_params() - routed


def test_expert_states_shard_over_their_own_data_parallel_group(mixtral, h100x16):
    """Distributed optimizer: the 12 bytes of fp32 states shard over edp = tp·dp·cp / (ep·etp)."""
    t = make_table(dp=16, ep=[1, 8], zero=1)
    est = estimate(mixtral, h100x16, _work(mixtral), t)
    routed = 32 * 8 * 3 * 4096 * 14336
    dense = mixtral.total_params() - routed
    expected = [dense * 12 / 16 + routed * 12 / 16, dense * 12 / 16 + routed / 8 * 12 / 2]
    assert est.memory.optimizer_bytes.tolist() == pytest.approx(expected, rel=1e-12)


def test_moe_activation_bytes_by_hand(mixtral):
    """Per token, tp = etp = 1, bf16: each of the k = 2 copies keeps its permuted input (2h), the
    gated up output (2·2f), the activation output (2f) and the expert output (2h); plus fp32
    router probabilities (4 x 8 experts)."""
    h, f = 4096, 14336
    per_copy = 2 * h + 4 * f + 2 * f + 2 * h
    assert moe_activation_bytes_per_token(mixtral, 1, 1, 2.0) == 2 * per_copy + 4 * 8


def test_doubling_cp_halves_stored_activations(mixtral):
    work = _work(mixtral)
    stored = stored_layer_bytes(mixtral, work, make_table(cp=[1, 2, 4], dp=4))
    assert stored[0] == pytest.approx(2 * stored[1], rel=1e-12) == pytest.approx(4 * stored[2], rel=1e-12)


def test_modules_recompute_drops_what_it_reruns():
    model = load_model("deepseek-v3")
    none, modules = layer_activation_bytes_per_token(model, 1, 0, np.array([0, 3]))
    a, moe_frac = model.num_heads, model.num_moe_layers / model.num_layers
    qkv = a * (2 * model.qk_head_dim + model.v_head_dim)
    rerun = 2 * 2 * model.hidden_size + 2 * qkv + moe_frac * model.experts_per_token * 2 * model.expert_ffn_size
    assert none - modules == pytest.approx(rerun, rel=1e-12)


def test_balanced_router_noise_and_routing_statistics(mixtral):
    t = make_table(ep=[1, 8], dp=16)
    copies = np.array([8192.0, 8192.0])
    noise = expert_imbalance(_work(mixtral, imbalance=None), t, copies)
    assert noise[0] == 1.0
    assert noise[1] == pytest.approx(1 + math.sqrt(2 * math.log(8)) * math.sqrt((1 - 1 / 8) / 8192), rel=1e-12)
    # Measured routing, loads 4, 2, 1, 1, 1, 1, 1, 1 in both layers: with ep = 2 rank 0 holds 8 of 12
    # (8 / 6 = 4/3 over the mean); with ep = 8 the hottest expert's rank holds 4 against a mean of 1.5.
    stats = RoutingStats(tokens_per_expert=np.array([[4.0, 2, 1, 1, 1, 1, 1, 1]] * 2))
    routed = expert_imbalance(_work(mixtral, imbalance=None, routing=stats), make_table(ep=[2, 8], dp=16), copies)
    assert routed.tolist() == pytest.approx([4 / 3, 8 / 3])


def test_capacity_factor_pads_every_rank_to_capacity(mixtral, h100x16):
    """Token dropping padded to capacity: every rank processes capacity_factor x the balanced share, whatever
    the router or the routing statistics say; at 1.0 it is exactly the force-balanced dropless cost."""
    t, copies = make_table(ep=[1, 8], dp=16), np.array([8192.0, 8192.0])
    stats = RoutingStats(tokens_per_expert=np.array([[4.0, 2, 1, 1, 1, 1, 1, 1]] * 2))
    capped = _work(mixtral, imbalance=None, routing=stats, capacity_factor=1.25)
    assert expert_imbalance(capped, t, copies).tolist() == [1.25, 1.25]
    one = moe_block_times(mixtral, _work(mixtral, imbalance=None, capacity_factor=1.0), t, _rates(h100x16), h100x16)
    balanced = moe_block_times(mixtral, _work(mixtral, 1.0), t, _rates(h100x16), h100x16)
    assert one.forward_compute_s.tolist() == balanced.forward_compute_s.tolist()
    assert one.expert_comm_s.tolist() == balanced.expert_comm_s.tolist()


def test_imbalance_scales_the_slowest_rank(mixtral, h100x16):
    """The busiest rank receives imbalance x the mean copies: the bandwidth part of its four
    all-to-alls scales by it, their latency does not."""
    t = make_table(ep=8, dp=16)
    balanced = moe_block_times(mixtral, _work(mixtral, 1.0), t, _rates(h100x16), h100x16)
    skewed = moe_block_times(mixtral, _work(mixtral, 1.5), t, _rates(h100x16), h100x16)
    latency = 4 * collective_latency_s("all_to_all", 8, 1, h100x16)
    assert skewed.expert_comm_s[0] == pytest.approx(1.5 * (balanced.expert_comm_s[0] - latency) + latency, rel=1e-12)
    assert skewed.forward_compute_s[0] > balanced.forward_compute_s[0]


def test_expert_overlap_hides_the_all_to_all_behind_compute(mixtral, h100x16):
    t = make_table(ep=8, dp=16, ep_overlap=[0, 1])
    lt = layer_times(mixtral, _work(mixtral), t, _rates(h100x16), h100x16)
    compute = lt.forward_compute_s[1] + lt.backward_compute_s[1] + lt.recompute_s[1]
    exposed = lt.ep_comm_s[0]
    assert exposed < compute  # NVLink all-to-all of one layer is shorter than its compute here
    assert lt.ep_comm_s[1] == pytest.approx(COMM_SM_FRAC * exposed, rel=1e-12)


def test_plan_and_evaluate_an_moe_model():
    runner = CliRunner()
    result = runner.invoke(app, ["plan", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2", "--seq-len",
                                 "4096", "--global-batch", "256", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "ep" in result.output and "EP all-to-all" in result.output
    result = runner.invoke(app, ["evaluate", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2", "--seq-len",
                                 "4096", "--global-batch", "256", "--tp", "1", "--pp", "1", "--ep", "3"])
    assert result.exit_code == 2 and "ep does not divide the routed experts" in result.output
    assert "Traceback" not in result.output


def test_cli_moe_job_options(tmp_path):
    runner = CliRunner()
    base = ["mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2", "--seq-len", "4096", "--global-batch", "256",
            "--tp", "1", "--pp", "1", "--ep", "8", "--zero", "1"]
    step = {}
    for flags in (["--capacity-factor", "1.0"], ["--expert-imbalance", "1.0"], ["--expert-imbalance", "1.5"]):
        path = tmp_path / f"{flags[0][2:]}-{flags[1]}.json"
        result = runner.invoke(app, ["evaluate", *base, *flags, "--json", str(path)])
        assert result.exit_code == 0, result.output
        document = json.loads(path.read_text())["plans"][0]
        step[tuple(flags)] = document["estimate"]["step_time_s"]
        assert document["job"].get("capacity_factor") == (1.0 if flags[0] == "--capacity-factor" else None)
    # Padded to a capacity of the balanced share costs what force-balanced routing costs; skew costs more.
    assert step[("--capacity-factor", "1.0")] == step[("--expert-imbalance", "1.0")]
    assert step[("--expert-imbalance", "1.5")] > step[("--expert-imbalance", "1.0")]
    bad = tmp_path / "routing.csv"
    bad.write_text("layer,expert,tokens\n0,0,abc\n")
    for flags, needle in ((["--capacity-factor", "0"], "capacity factor"), (["--expert-imbalance", "0.5"], ">= 1"),
                          (["--routing", str(bad)], "routing.csv"),
                          (["--expert-imbalance", "1.2", "--routing", str(bad)], "not both")):
        assert_bad_input(runner.invoke(app, ["evaluate", *base, *flags]), needle)
    dense = ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "8"]
    assert_bad_input(runner.invoke(app, ["plan", *dense, "--capacity-factor", "1.0"]), "apply to MoE models")
