"""Expert placement: brute-force optima on small layers, hand-derived answers, bounds on larger ones."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paraplan.errors import InputError
from paraplan.measurements.routing import RoutingStats, zipf_routing
from paraplan.planner.placement import expert_placement
from paraplan.planner.placement.expert_layout import affinity_cost, contiguous_share, greedy_share, layout_cost
from paraplan.planner.placement.expert_placement import make_instance, place_experts, solve_load
from paraplan.planner.placement.solver import SolverConfig

# Small instances solve in well under a second; the limit only caps a loaded CI machine, where a short
# limit turned a proven optimum into "feasible".
FAST = SolverConfig(time_limit_s=60.0)


def _layouts(experts: int, ep: int):
    """Every assignment of experts to ranks with experts / ep on each rank, as (experts, ep) shares."""
    slots = experts // ep
    for labels in set(itertools.permutations(np.repeat(np.arange(ep), slots))):
        share = np.zeros((experts, ep))
        share[np.arange(experts), labels] = 1.0
        yield share


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_busiest_rank_matches_brute_force_on_8_experts_4_ranks(seed):
    load = np.random.default_rng(seed).integers(1, 100, size=8)
    best = min(float((load @ share).max()) for share in _layouts(8, 4))
    share, stats = solve_load(load, 4, 0, FAST)
    assert stats.status == "optimal"
    assert stats.objective == best == float((load @ share).max())
    assert stats.bound == best and stats.gap_frac == 0.0
    assert share.sum(axis=0).tolist() == [2.0] * 4 and share.sum(axis=1).tolist() == [1.0] * 8


def test_lexicographic_traffic_matches_brute_force():
    rng = np.random.default_rng(7)
    load = rng.integers(1, 50, size=(2, 6)).astype(float)
    coact = rng.integers(0, 20, size=(1, 6, 6)).astype(float)
    stats = RoutingStats(tokens_per_expert=load, coactivation=coact)
    placed = place_experts(make_instance(stats, ep=3, ranks_per_domain=2), FAST)
    first = placed.shares[0]
    cost = affinity_cost(coact[0], first, 2)
    best = min((float((load[1] @ s).max()), float((cost * s).sum())) for s in _layouts(6, 3))
    assert (placed.load_stats[1].objective, placed.traffic_stats[1].objective) == best
    assert placed.traffic_stats[1].status == "optimal"
    assert placed.traffic_stats[0] is None  # layer 0 has no previous layer


def test_hand_derived_four_experts_on_two_ranks():
    # Loads 4, 3, 2, 1: contiguous puts 4 + 3 on rank 0; the optimum pairs 4 + 1 and 3 + 2.
    stats = RoutingStats(tokens_per_expert=np.array([[4.0, 3.0, 2.0, 1.0]]))
    placed = place_experts(make_instance(stats, ep=2, ranks_per_domain=1), FAST)
    assert placed.baseline.max_rank_tokens.tolist() == [7.0]
    assert placed.optimized.max_rank_tokens.tolist() == [5.0]
    assert sorted(sorted(r) for r in placed.experts_on_ranks()[0]) == [[0, 3], [1, 2]]


def test_replicas_split_a_hot_expert():
    # 9, 1, 1, 1 on 2 ranks: without copies the hot expert's rank carries 9 + 1 = 10; two extra
    # copies (3 slots per rank) let its tokens split so each rank carries the mean, 6.
    stats = RoutingStats(tokens_per_expert=np.array([[9.0, 1.0, 1.0, 1.0]]))
    plain = place_experts(make_instance(stats, ep=2, ranks_per_domain=1), FAST)
    copies = place_experts(make_instance(stats, ep=2, ranks_per_domain=1, replicas=2), FAST)
    assert plain.optimized.max_rank_tokens.tolist() == [10.0]
    assert copies.optimized.max_rank_tokens.tolist() == [6.0]
    assert copies.shares[0].sum(axis=1) == pytest.approx([1.0] * 4)
    assert ((copies.shares[0] > 0).sum(axis=0) == 3).all()


def test_affinity_keeps_coactivated_experts_together():
    # Every token of layer-0 expert 0 goes to layer-1 expert 1 and vice versa: contiguous sends
    # all 20 across GPUs (and domains, one rank per domain); the optimum sends none.
    stats = RoutingStats(tokens_per_expert=np.array([[10.0, 10.0], [10.0, 10.0]]),
                         coactivation=np.array([[[0.0, 10.0], [10.0, 0.0]]]))
    placed = place_experts(make_instance(stats, ep=2, ranks_per_domain=1), FAST)
    assert placed.baseline.cross_gpu_tokens.tolist() == [20.0]
    assert placed.baseline.cross_domain_tokens.tolist() == [20.0]
    assert placed.optimized.cross_gpu_tokens.tolist() == [0.0]
    assert placed.optimized.cross_domain_tokens.tolist() == [0.0]


def test_same_domain_counts_gpu_but_not_domain_crossings():
    shares = np.stack([contiguous_share(2, 2), contiguous_share(2, 2)])
    cost = layout_cost(np.ones((2, 2)), np.array([[[0.0, 6.0], [0.0, 0.0]]]), shares, ranks_per_domain=2)
    assert cost.cross_gpu_tokens.tolist() == [6.0] and cost.cross_domain_tokens.tolist() == [0.0]


def test_larger_instance_is_feasible_and_above_its_bound():
    stats = zipf_routing(2, 64, 1.0, 1e5, seed=3)
    instance = make_instance(stats, ep=16, ranks_per_domain=8)
    placed = place_experts(instance, SolverConfig(time_limit_s=2.0))
    for layer, share in enumerate(placed.shares):
        assert (share.sum(axis=0) == 4).all() and (share.sum(axis=1) == 1).all()
        load = instance.load[layer]
        greedy = float((load @ greedy_share(load.astype(float), 16, 0)).max())
        got = placed.load_stats[layer]
        assert got.bound <= got.objective <= greedy + 1e-6
    assert (placed.optimized.max_rank_tokens <= placed.baseline.max_rank_tokens).all()
    assert (placed.optimized.cross_domain_tokens < placed.baseline.cross_domain_tokens).all()


def test_falls_back_to_the_heuristic_when_the_solver_finds_nothing(monkeypatch):
    real = expert_placement.run_cp_sat
    monkeypatch.setattr(expert_placement, "run_cp_sat", lambda model, config, **kw: (real(model, config)[0], None))
    load = np.array([17, 13, 10, 6, 6, 1, 2, 1])  # greedy reaches 30, above the bound of 28
    share, stats = solve_load(load, 2, 0, FAST)
    assert stats.status == "heuristic"
    assert np.array_equal(share.sum(axis=0), [4.0, 4.0])
    assert stats.objective == float((load @ share).max()) == 30.0 and stats.bound == 28.0


def test_bad_sizes_are_input_errors():
    stats = RoutingStats(tokens_per_expert=np.ones((1, 6)))
    with pytest.raises(InputError, match=r"--ep 4 must divide the 6 experts; choose one of \[1, 2, 3, 6\]"):
        make_instance(stats, ep=4, ranks_per_domain=1)
    with pytest.raises(InputError, match="multiple of ep = 3"):
        make_instance(stats, ep=3, ranks_per_domain=1, replicas=2)


@pytest.mark.parametrize("experts, ep, replicas", [(3, 3, 3), (4, 2, 2), (4, 4, 8), (6, 6, 24)])
def test_replicas_of_weightless_experts_fill_every_rank(experts, ep, replicas):
    # A layer of zero tokens ties every piece: the heuristic once filled rank 0 twice and then found no rank
    # free of the expert it was placing (min() of an empty sequence).
    for load in (np.zeros(experts), np.ones(experts)):
        share = greedy_share(load, ep, replicas)
        held = share > 0
        assert (held.sum(axis=0) == (experts + replicas) // ep).all()
        assert share.sum(axis=1) == pytest.approx([1.0] * experts)
    stats = RoutingStats(tokens_per_expert=np.zeros((2, experts)))
    placed = place_experts(make_instance(stats, ep=ep, ranks_per_domain=1, replicas=replicas), FAST)
    assert placed.optimized.max_rank_tokens.tolist() == [0.0, 0.0]


def test_more_replicas_than_ranks_can_hold_are_input_errors():
    # 4 experts on 2 ranks hold at most one copy of each expert per rank: 4 extra copies at most.
    stats = RoutingStats(tokens_per_expert=np.ones((1, 4)))
    make_instance(stats, ep=2, ranks_per_domain=1, replicas=4)
    with pytest.raises(InputError, match=r"--replicas 6 .* at most 4 \(one copy of an expert per rank\)"):
        make_instance(stats, ep=2, ranks_per_domain=1, replicas=6)
    with pytest.raises(InputError, match=r"--replicas 1 .* at most 0"):
        make_instance(stats, ep=1, ranks_per_domain=1, replicas=1)
