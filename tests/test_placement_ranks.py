"""Rank placement: brute-force optima on small clusters, zero loss on uniform ones, gains where links differ."""

from __future__ import annotations

import numpy as np
import pytest
from export_factory import make_plan_document

from paraplan.hardware_profiles import load_cluster, load_gpu
from paraplan.hardware_profiles.topology import NodeSpec, Topology, uniform_topology
from paraplan.planner.placement import rank_placement
from paraplan.planner.placement.plan_costs import axis_times, job_of_plan
from paraplan.planner.placement.rank_instance import rank_instance, slot_edges
from paraplan.planner.placement.rank_placement import brute_force, cost_of, place_ranks
from paraplan.planner.placement.solver import MIN_SOLVE_S, SolverConfig

# Small instances solve in well under a second; the limit only caps a loaded CI machine, where a short
# limit turned a proven optimum into "feasible".
FAST = SolverConfig(time_limit_s=60.0)
GPU = load_gpu("h100-sxm")


def topology(nics_gb: list[float], leaves: list[int] | None = None, over: tuple[float, ...] = (1.0,),
             measured: np.ndarray | None = None, per_node: int = 8) -> Topology:
    leaves = leaves or [0] * len(nics_gb)
    nodes = tuple(NodeSpec(host=f"n{i}", gpu=GPU, gpus_per_node=per_node, nic_bytes_per_s_per_gpu=nic * 1e9, leaf=leaf)
                  for i, (nic, leaf) in enumerate(zip(nics_gb, leaves)))
    return Topology(name="test", nodes=nodes, leaf_oversubscription=over, inter_node_latency_s=5e-6,
                    intra_domain_latency_s=2e-6, measured_bytes_per_s=measured)


def test_slot_edges_follow_megatron_order():
    # tp=8 fills a node; dp pairs neighbouring nodes, pp pairs nodes two apart.
    assert slot_edges(tp=8, cp=1, dp=2, pp=2, vpp=1, gpus_per_node=8) == {"dp": ((0, 1), (2, 3)),
                                                                          "pp": ((0, 2), (1, 3))}
    # tp=2, dp=8: each dp ring visits nodes 0 and 1 once; pp=1 has no edges.
    assert slot_edges(tp=2, cp=1, dp=8, pp=1, vpp=1, gpus_per_node=8) == {"dp": ((0, 1),)}
    # A 4-stage chain, closed into a ring by virtual stages.
    assert slot_edges(tp=8, cp=1, dp=1, pp=4, vpp=1, gpus_per_node=8)["pp"] == ((0, 1), (1, 2), (2, 3))
    assert slot_edges(tp=8, cp=1, dp=1, pp=4, vpp=2, gpus_per_node=8)["pp"] == ((0, 1), (0, 3), (1, 2), (2, 3))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_brute_force_on_small_clusters(seed):
    rng = np.random.default_rng(seed)
    nodes = 5  # one more than the plan needs: the solver may leave any node idle
    measured = rng.uniform(5e9, 40e9, size=(nodes, nodes))
    config = [{"tp": 4, "dp": 2, "pp": 2}, {"tp": 2, "dp": 4, "pp": 2}, {"tp": 4, "cp": 2, "dp": 2},
              {"tp": 4, "dp": 1, "pp": 4}][seed]
    document = make_plan_document(gpus_per_node=4, global_batch=64, **config)
    instance = rank_instance(document, topology([50.0] * nodes, measured=measured, per_node=4))
    placed = place_ranks(instance, FAST)
    _order, best = brute_force(instance)
    assert placed.stats.status == "optimal"
    assert cost_of(instance, placed.node_of_slot) == best
    assert placed.stats.objective == pytest.approx(best * 1e-6)
    assert placed.placed_step_s <= placed.baseline_step_s


def test_zero_loss_and_the_plan_estimate_on_a_uniform_cluster():
    cluster = load_cluster("dgx-h100", num_nodes=4)
    document = make_plan_document(tp=8, dp=2, pp=2, global_batch=64)
    placed = place_ranks(rank_instance(document, uniform_topology(cluster)), FAST)
    job, config = job_of_plan(document)
    expected = axis_times(job, config, cluster).step_time_s
    assert placed.baseline_step_s == pytest.approx(expected, abs=5e-6)  # µs rounding of two axis terms
    assert placed.placed_step_s == pytest.approx(placed.baseline_step_s, abs=1e-12)
    assert placed.node_of_slot == (0, 1, 2, 3)


def test_gain_when_the_scheduler_interleaves_leaves():
    # Nodes 0, 2 on leaf 0 and 1, 3 on leaf 1 with 4:1 uplinks: the default order puts both dp rings
    # across the uplinks; the optimum keeps dp inside a leaf and sends the lighter pp traffic across.
    document = make_plan_document(tp=8, dp=2, pp=2, global_batch=64)
    instance = rank_instance(document, topology([50.0] * 4, [0, 1, 0, 1], (1.0, 4.0)))
    placed = place_ranks(instance, FAST)
    assert {tuple(sorted(placed.node_of_slot[s] for s in pair)) for pair in instance.edges["dp"]} == {(0, 2), (1, 3)}
    assert placed.placed_step_s < placed.baseline_step_s - 0.05


def test_gain_by_leaving_the_slow_nic_idle():
    document = make_plan_document(tp=8, dp=4, global_batch=64)
    instance = rank_instance(document, topology([50.0, 12.5, 50.0, 50.0, 50.0]))
    placed = place_ranks(instance, FAST)
    assert 1 not in placed.node_of_slot
    assert placed.placed_step_s < placed.baseline_step_s


def test_gain_by_avoiding_an_outlier_link():
    # A dp ring over 4 nodes uses links 0-1, 1-2, 2-3, 3-0; link 1-2 measured at a tenth.
    measured = np.full((4, 4), np.nan)
    measured[1, 2] = 4e9
    document = make_plan_document(tp=8, dp=4, global_batch=64)
    instance = rank_instance(document, topology([50.0] * 4, measured=measured))
    placed = place_ranks(instance, FAST)
    used = {tuple(sorted((placed.node_of_slot[s], placed.node_of_slot[t]))) for s, t in instance.edges["dp"]}
    assert (1, 2) not in used and len(used) == 4
    assert placed.placed_step_s < placed.baseline_step_s


def test_larger_cluster_is_feasible_and_above_its_bound():
    rng = np.random.default_rng(5)
    measured = rng.uniform(10e9, 40e9, size=(16, 16))
    document = make_plan_document(tp=8, dp=4, pp=4, global_batch=128)
    instance = rank_instance(document, topology([50.0] * 16, measured=measured))
    placed = place_ranks(instance, SolverConfig(time_limit_s=3.0))
    assert sorted(placed.node_of_slot) == list(range(16))
    assert placed.stats.bound <= placed.stats.objective + 1e-12
    assert placed.placed_step_s <= placed.baseline_step_s


def test_falls_back_to_swap_descent(monkeypatch):
    real = rank_placement.run_cp_sat
    monkeypatch.setattr(rank_placement, "run_cp_sat", lambda model, config: (real(model, config)[0], None))
    document = make_plan_document(tp=8, dp=2, pp=2, global_batch=64)
    instance = rank_instance(document, topology([50.0] * 4, [0, 1, 0, 1], (1.0, 4.0)))
    placed = place_ranks(instance, FAST)
    assert placed.stats.status == "heuristic"
    assert cost_of(instance, placed.node_of_slot) == brute_force(instance)[1]  # swaps find it here


def test_expert_all_to_all_is_an_axis_of_its_own():
    # ep=8 over 4-GPU nodes: each expert group spans two neighbouring nodes, all pairs talk.
    assert slot_edges(tp=1, cp=1, dp=16, pp=1, vpp=1, gpus_per_node=4, ep=8) == {
        "ep": ((0, 1), (2, 3)), "dp": ((0, 1), (0, 3), (1, 2), (2, 3))}
    assert "ep" not in slot_edges(tp=1, cp=1, dp=16, pp=1, vpp=1, gpus_per_node=8, ep=8)  # inside a node
    document = make_plan_document("mixtral-8x7b", tp=1, dp=16, ep=8, gpus_per_node=4, global_batch=64)
    measured = np.full((4, 4), np.nan)
    measured[0, 1] = measured[1, 0] = 2e9  # the link the default order gives to one expert group
    instance = rank_instance(document, topology([50.0] * 4, measured=measured, per_node=4))
    assert instance.pair_cost["ep"][0, 1] > instance.pair_cost["ep"][0, 2] > 0
    placed = place_ranks(instance, FAST)
    pairs = {tuple(sorted((placed.node_of_slot[s], placed.node_of_slot[t]))) for s, t in instance.edges["ep"]}
    assert (0, 1) not in pairs
    assert placed.placed_step_s < placed.baseline_step_s
    assert cost_of(instance, placed.node_of_slot) == brute_force(instance)[1]


def test_candidate_pool_holds_the_optimum_of_the_whole_topology(monkeypatch):
    # 22 nodes in 2 leaves (1:4 uplinks) with 25 and 50 GB/s NICs; the plan needs 4 nodes. Without measured
    # links nodes of one (leaf, NIC) class are interchangeable, so the pool keeps the default order's 4 and
    # at most 4 of each class: the brute-force optimum over the pool equals the one over all 22 nodes.
    from paraplan.planner.placement import rank_instance as module

    nics = [25.0, 50.0, 25.0, 50.0, 50.0, 50.0, 25.0, 50.0, 50.0, 25.0, 50.0] * 2
    leaves = [0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1] * 2
    topo = topology(nics, leaves, (1.0, 4.0))
    document = make_plan_document(tp=8, dp=2, pp=2, global_batch=64)
    pooled = rank_instance(document, topo)
    assert pooled.exact_pool and pooled.num_nodes < topo.num_nodes
    assert pooled.nodes[:4] == (0, 1, 2, 3)  # the default order comes first
    monkeypatch.setattr(module, "candidate_nodes", lambda t, slots: (tuple(range(t.num_nodes)), True))
    full = rank_instance(document, topo)
    assert full.num_nodes == 22
    assert brute_force(pooled)[1] == brute_force(full)[1]
    placed = place_ranks(pooled, FAST)
    assert placed.candidates == pooled.num_nodes
    # The answer names physical nodes: its cost over the whole topology is the optimum.
    assert cost_of(full, placed.node_of_slot) == brute_force(full)[1]


def test_measured_links_cap_the_pool():
    from paraplan.planner.placement.rank_instance import MEASURED_POOL_NODES, candidate_nodes

    n = MEASURED_POOL_NODES + 36
    measured = np.full((n, n), 20e9)
    measured[:, 70] = measured[70, :] = 40e9  # node 70 is the best connected
    pool, exact = candidate_nodes(topology([50.0] * n, measured=measured), 4)
    assert not exact and len(pool) == MEASURED_POOL_NODES
    assert pool[:4] == (0, 1, 2, 3) and pool[4] == 70


def test_the_time_limit_covers_model_building_too():
    # started() fixes the deadline where the call begins; what building the model spends is gone from the solve.
    config = SolverConfig(time_limit_s=10.0).started(now=100.0)
    assert config.deadline == 110.0
    assert config.remaining_s(now=103.5) == 6.5
    # An inner call keeps the outer deadline, and a call past its deadline still returns its warm start.
    assert config.started(now=105.0).deadline == 110.0
    assert config.remaining_s(now=200.0) == MIN_SOLVE_S
    # Parts share what is left: 4 s left over 2 parts gives the next part 2 s.
    assert config.share(2, now=106.0).remaining_s(now=106.0) == 2.0
    # Without a start the limit is the solver's own (a caller that never began a call).
    assert SolverConfig(time_limit_s=3.0).remaining_s() == 3.0
