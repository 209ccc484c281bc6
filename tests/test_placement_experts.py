"""Expert placement: brute-force optima on small layers, hand-derived answers, bounds on larger ones."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paraplan.errors import InputError
from paraplan.measurements.routing import RoutingStats, zipf_routing
from paraplan.planner.placement import expert_placement
from paraplan.planner.placement.expert_budget import MIN_LAYER_S, layer_time_s
from paraplan.planner.placement.expert_layout import affinity_cost, contiguous_share, greedy_share, layout_cost
from paraplan.planner.placement.expert_placement import greedy_load, make_instance, place_experts, solve_load
from paraplan.planner.placement.solver import SolverConfig, SolveStats

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


def test_a_layer_gets_an_equal_share_of_the_time_left():
    assert layer_time_s(10.0, 4) == 2.5
    assert layer_time_s(1.0, 1) == 1.0
    assert layer_time_s(0.25, 4) == MIN_LAYER_S  # too short a share is raised to the floor while the call has it
    assert layer_time_s(MIN_LAYER_S / 2, 1) == 0.0  # less than the floor left: the greedy layout
    assert layer_time_s(-1.0, 3) == 0.0  # overspent by a model build
    with pytest.raises(ValueError, match="layers left"):
        layer_time_s(1.0, 0)


class FakeClock:
    """A clock the fake solvers move: each spends the whole time it was given, plus ``overshoot_s`` (a model build
    running past its deadline)."""

    def __init__(self, overshoot_s: float = 0.0) -> None:
        self.now, self.overshoot_s = 100.0, overshoot_s
        self.given: list[tuple[str, float, float]] = []  # (phase, seconds given, seconds the call had left)

    def __call__(self) -> float:
        return self.now

    def spend(self, phase: str, config: SolverConfig, left_s: float) -> None:
        given = config.deadline - self.now
        self.given.append((phase, given, left_s))
        self.now += given + self.overshoot_s


def _fake_solvers(monkeypatch, clock: FakeClock, budget_s: float) -> None:
    start = clock.now

    def load(load, ep, replicas, config):
        clock.spend("load", config, start + budget_s - clock.now)
        share, stats = greedy_load(load, ep, replicas)
        return share, SolveStats(status="feasible", objective=stats.objective, bound=stats.bound, wall_s=0.0)

    def traffic(load, cost, cap, share, config):
        clock.spend("traffic", config, start + budget_s - clock.now)
        return share, SolveStats(status="optimal", objective=float((cost * share).sum()), bound=0.0, wall_s=0.0)

    monkeypatch.setattr(expert_placement, "solve_load", load)
    monkeypatch.setattr(expert_placement, "solve_traffic", traffic)


@pytest.mark.parametrize("overshoot_s", [0.0, 0.03])
def test_the_whole_call_shares_one_budget_and_the_rest_goes_greedy(monkeypatch, overshoot_s):
    # 20 layers in 1.05 s: an equal share (0.0525 s) is below the floor, so each solved layer gets 0.1 s of what is
    # left, until less than 0.1 s is left; the layers after that take the greedy layout without the solver.
    clock = FakeClock(overshoot_s)
    _fake_solvers(monkeypatch, clock, budget_s=1.05)
    stats = RoutingStats(tokens_per_expert=np.random.default_rng(0).integers(1, 100, size=(20, 8)).astype(float))
    instance = make_instance(stats, ep=4, ranks_per_domain=1)
    placed = place_experts(instance, SolverConfig(time_limit_s=1.05), clock=clock)
    solved = len(clock.given)
    assert solved == (10 if overshoot_s == 0 else 8)
    for layer, (_, given, left) in enumerate(clock.given):
        assert 0 < given <= left and given <= max(left / (20 - layer), MIN_LAYER_S) + 1e-12
    assert sum(given for _, given, _ in clock.given) <= 1.05
    assert placed.outcomes == ("limit",) * solved + ("greedy",) * (20 - solved)
    assert placed.bound.layers_at_limit == solved and placed.bound.layers_greedy == 20 - solved
    for layer in range(solved, 20):  # a greedy layer states the load bound it was checked against
        _, greedy = greedy_load(instance.load[layer], 4, 0)
        assert placed.load_stats[layer].bound == greedy.bound and placed.traffic_stats[layer] is None


def test_a_layer_gives_half_its_share_to_the_load_phase_and_the_rest_to_traffic(monkeypatch):
    clock = FakeClock()
    _fake_solvers(monkeypatch, clock, budget_s=3.0)
    placed = place_experts(make_instance(zipf_routing(3, 8, 1.0, 1e4, seed=1), ep=4, ranks_per_domain=2),
                           SolverConfig(time_limit_s=3.0), clock=clock)
    assert [(phase, given) for phase, given, _ in clock.given] == [
        ("load", 1.0), ("load", 0.5), ("traffic", 0.5), ("load", 0.5), ("traffic", 0.5)]
    assert placed.outcomes == ("limit",) * 3 and placed.bound.time_limit_s == 3.0 and placed.bound.wall_s == 3.0


def test_the_call_bound_is_the_brute_force_optimum_when_every_layer_is_proven():
    rng = np.random.default_rng(11)
    load = rng.integers(1, 100, size=(3, 6)).astype(float)
    coact = rng.integers(0, 20, size=(2, 6, 6)).astype(float)
    placed = place_experts(make_instance(RoutingStats(tokens_per_expert=load, coactivation=coact), ep=3,
                                         ranks_per_domain=2), FAST)
    best_load = sum(min(float((row @ s).max()) for s in _layouts(6, 3)) for row in load)
    best_traffic = 0.0
    for layer in (1, 2):  # each layer's traffic optimum given the layout placed before it, at its optimal load
        cost = affinity_cost(coact[layer - 1], placed.shares[layer - 1], 2)
        best_traffic += min((float((load[layer] @ s).max()), float((cost * s).sum())) for s in _layouts(6, 3))[1]
    bound = placed.bound
    assert placed.outcomes == ("optimal",) * 3 and bound.layers_optimal == 3
    assert bound.layers_at_limit == bound.layers_greedy == 0
    assert bound.max_rank_tokens == bound.max_rank_bound_tokens == best_load
    assert bound.traffic_tokens == bound.traffic_bound_tokens == best_traffic
    assert bound.max_rank_gap_frac == bound.traffic_gap_frac == 0.0


def test_progress_is_called_once_per_layer():
    calls: list[tuple[int, int]] = []
    stats = RoutingStats(tokens_per_expert=np.random.default_rng(2).integers(1, 50, size=(4, 4)).astype(float))
    place_experts(make_instance(stats, ep=2, ranks_per_domain=1), FAST, lambda done, total: calls.append((done, total)))
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_progress_counts_greedy_layers_too():
    # A budget below the floor: every layer takes the greedy layout, and each still reports its progress.
    calls: list[tuple[int, int]] = []
    placed = place_experts(make_instance(zipf_routing(3, 8, 1.0, 1e4), ep=4, ranks_per_domain=2),
                           SolverConfig(time_limit_s=MIN_LAYER_S / 2), lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    assert placed.outcomes == ("greedy",) * 3 and placed.traffic_stats == (None,) * 3


def test_layout_cost_counts_every_token_pair_that_crosses():
    # Fractional shares (replicas) against the definition, token pair by token pair; layout_cost once summed the
    # domain term over (expert, rank, rank, expert) in one einsum, 2.8 s per pair of 256 x 64 layers.
    rng = np.random.default_rng(5)
    shares = np.stack([greedy_share(rng.random(8), 4, 4) for _ in range(2)])
    coact = rng.random((1, 8, 8))
    cost = layout_cost(np.ones((2, 8)), coact, shares, ranks_per_domain=2)
    pairs = list(itertools.product(range(8), range(8), range(4), range(4)))
    same_gpu = sum(coact[0, i, j] * shares[0, i, r] * shares[1, j, s] for i, j, r, s in pairs if r == s)
    same_domain = sum(coact[0, i, j] * shares[0, i, r] * shares[1, j, s] for i, j, r, s in pairs if r // 2 == s // 2)
    assert cost.cross_gpu_tokens[0] == pytest.approx(coact.sum() - same_gpu, rel=1e-12)
    assert cost.cross_domain_tokens[0] == pytest.approx(coact.sum() - same_domain, rel=1e-12)
