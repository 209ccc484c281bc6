"""Expert placement (CP-SAT): experts of each MoE layer onto EP ranks.

Per layer, lexicographically: (1) minimise the tokens on the busiest rank; (2) keeping that
maximum, minimise the co-activated tokens that leave their GPU plus those that leave their NVLink
domain on the way from the previous layer (counted once more). The layers are solved in order, each
given the previous layer's answer, so the traffic term stays linear (a layer-by-layer decomposition;
the reported gap is that of each layer's conditioned problem).

Optional hot-expert replicas: ``replicas`` extra expert copies per layer, spread evenly over ranks;
a replicated expert's tokens may split in any proportion among its copies (a capacity-aware router).
With replicas the traffic phase is skipped (the split makes it non-linear).

Baseline: Megatron's contiguous layout. Heuristic (hint and fallback): ``expert_layout.greedy_share``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paraplan.errors import InputError
from paraplan.measurements.routing import RoutingStats
from paraplan.planner.placement.expert_budget import CallBound, LayerOutcome, call_bound, layer_config, layer_outcome
from paraplan.planner.placement.expert_layout import (
    LayoutCost,
    affinity_cost,
    contiguous_share,
    greedy_share,
    layout_cost,
    slots_per_rank,
)
from paraplan.planner.placement.solver import SolverConfig, SolveStats, run_cp_sat

if TYPE_CHECKING:  # annotations only: OR-Tools loads where a solver runs
    from ortools.sat.python import cp_model

    # CP-SAT variables by (expert, rank).
    VarMap = dict[tuple[int, int], cp_model.IntVar]

Progress = Callable[[int, int], None]
"""Called after each layer with (layers placed, layers in all)."""

LOAD_RESOLUTION = 1_000_000
"""Integer units per layer's busiest-possible load: token counts above this are scaled down so that
one unit is a millionth of a layer's routings, far below a router's run-to-run noise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertInstance:
    """One placement problem: integer loads, the EP group and its NVLink domains."""

    load: np.ndarray
    """(layers, experts) token-routings per expert, integers in units of ``quantum_tokens``."""
    coactivation: np.ndarray | None
    """(layers − 1, experts, experts) co-activated tokens in units of ``quantum_tokens``, or None."""
    quantum_tokens: float
    """Token-routings per integer unit."""
    ep: int
    """Expert-parallel ranks."""
    ranks_per_domain: int
    """EP ranks that share an NVLink domain (ranks r // ranks_per_domain alike)."""
    replicas: int = 0
    """Extra expert copies per layer (a multiple of ep, so every rank holds as many)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPlacement:
    """The answer: shares per layer, what they cost, and how each solve went."""

    shares: np.ndarray
    """(layers, experts, ep): fraction of expert e's tokens served by rank r."""
    baseline: LayoutCost
    """Cost of the contiguous layout."""
    optimized: LayoutCost
    """Cost of ``shares``."""
    load_stats: tuple[SolveStats, ...]
    """Per layer, phase 1 (busiest-rank tokens, in token-routings)."""
    traffic_stats: tuple[SolveStats | None, ...]
    """Per layer, phase 2 (cross-GPU + cross-domain tokens); None where not solved."""
    outcomes: tuple[LayerOutcome, ...]
    """Per layer: proven optimal, stopped without a proof, or greedy (the budget was spent before it)."""
    bound: CallBound
    """The whole call: objectives and proven bounds summed over layers, the outcomes counted, its wall time."""

    def experts_on_ranks(self) -> list[list[list[int]]]:
        """Layer → rank → the experts it holds."""
        return [[[int(e) for e in np.nonzero(layer[:, r])[0]] for r in range(layer.shape[1])] for layer in self.shares]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSolve:
    """How one layer was placed."""

    share: np.ndarray
    """(experts, ep): fraction of expert e's tokens served by rank r."""
    load: SolveStats
    """Phase 1 (busiest-rank tokens), in token-routings."""
    traffic: SolveStats | None
    """Phase 2 (cross-GPU + cross-domain tokens), in token-routings; None where not solved."""
    outcome: LayerOutcome
    """Proven optimal, stopped without a proof, or greedy."""


def make_instance(stats: RoutingStats, ep: int, ranks_per_domain: int, replicas: int = 0) -> ExpertInstance:
    """The integer instance of ``stats`` on ``ep`` ranks; InputError for impossible sizes."""
    experts = stats.num_experts
    if ep < 1 or experts % ep:
        divisors = [d for d in range(1, experts + 1) if experts % d == 0]
        raise InputError(f"--ep {ep} must divide the {experts} experts; choose one of {divisors}")
    if replicas < 0 or replicas % ep:
        raise InputError(f"--replicas {replicas} must be a non-negative multiple of ep = {ep} so every rank "
                         "holds as many experts")
    if replicas > experts * (ep - 1):
        raise InputError(f"--replicas {replicas} is more than the {experts} experts on {ep} ranks can hold: at "
                         f"most {experts * (ep - 1)} (one copy of an expert per rank)")
    if ranks_per_domain < 1:
        raise InputError(f"--ranks-per-domain must be a positive integer, got {ranks_per_domain}")
    quantum = max(1.0, float(stats.tokens_per_expert.sum(axis=1).max()) / LOAD_RESOLUTION)
    coact = None if stats.coactivation is None else np.rint(stats.coactivation / quantum).astype(np.int64)
    return ExpertInstance(load=np.rint(stats.tokens_per_expert / quantum).astype(np.int64), coactivation=coact,
                          quantum_tokens=quantum, ep=ep, ranks_per_domain=ranks_per_domain, replicas=replicas)


def _variables(model: cp_model.CpModel, load: np.ndarray, ep: int,
               replicable: np.ndarray) -> tuple[VarMap, VarMap, cp_model.IntVar]:
    """x[e, r]: rank r holds a copy of expert e; y[e, r]: its tokens there, only for replicable experts."""
    experts = len(load)
    x = {(e, r): model.new_bool_var(f"x_e{e}_r{r}") for e in range(experts) for r in range(ep)}
    y = {(e, r): model.new_int_var(0, int(load[e]), f"y_e{e}_r{r}") for e in np.nonzero(replicable)[0].tolist()
         for r in range(ep)}
    max_load = model.new_int_var(0, int(load.sum()), "max_rank_load")
    return x, y, max_load


def _constraints(model: cp_model.CpModel, load: np.ndarray, x: VarMap, y: VarMap, max_load: cp_model.IntVar, ep: int,
                 slots: int) -> None:
    """Every expert on one rank (a replicable one on at least one, its tokens split among its copies), every rank
    holding ``slots`` copies, and ``max_load`` at least each rank's tokens."""
    experts = len(load)
    for e in range(experts):
        copies = sum(x[e, r] for r in range(ep))
        if (e, 0) not in y:
            model.add(copies == 1)
            continue
        model.add(copies >= 1)
        model.add(sum(y[e, r] for r in range(ep)) == int(load[e]))
        for r in range(ep):
            model.add(y[e, r] <= int(load[e]) * x[e, r])
    for r in range(ep):
        model.add(sum(x[e, r] for e in range(experts)) == slots)
        served = sum(y[e, r] if (e, r) in y else int(load[e]) * x[e, r] for e in range(experts))
        model.add(max_load >= served)


def _hint(model: cp_model.CpModel, load: np.ndarray, x: VarMap, y: VarMap, max_load: cp_model.IntVar,
          share: np.ndarray) -> None:
    """A complete hint (every variable), which CP-SAT checks and keeps as its first solution."""
    for (e, r), var in x.items():
        model.add_hint(var, int(share[e, r] > 0))
    tokens = integer_split(load, share)
    for (e, r), var in y.items():
        model.add_hint(var, int(tokens[e, r]))
    model.add_hint(max_load, int(tokens.sum(axis=0).max()))


def integer_split(load: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Whole tokens per (expert, rank) summing exactly to each expert's load: floors of the shares, the
    remainder to the largest fractional parts (a hint whose rounding broke the sums would be infeasible)."""
    exact = share * load[:, None]
    tokens = np.floor(exact).astype(np.int64)
    for e in range(len(load)):
        missing = int(load[e] - tokens[e].sum())
        if missing > 0:
            order = np.argsort(-(exact[e] - tokens[e]) - (share[e] > 0))  # fractional parts, copies first
            tokens[e, order[:missing]] += 1
    return tokens


def _read(solver: cp_model.CpSolver, load: np.ndarray, x: VarMap, y: VarMap, ep: int) -> np.ndarray:
    """The solved layout as shares: a copy's tokens over its expert's (a weightless expert's copies split it
    evenly)."""
    share = np.zeros((len(load), ep))
    for (e, r), var in x.items():
        if (e, r) not in y:
            share[e, r] = solver.value(var)
        elif load[e] > 0:
            share[e, r] = solver.value(y[e, r]) / load[e]
        else:
            share[e, r] = solver.value(var) / max(1, sum(solver.value(x[e, s]) for s in range(ep)))
    return share


def _max_load(load: np.ndarray, share: np.ndarray) -> float:
    return float((load @ share).max())


def _rank0_first(share: np.ndarray, expert: int) -> np.ndarray:
    """Relabel ranks so that ``expert`` has a copy on rank 0 (ranks are interchangeable for load)."""
    rank = int(np.nonzero(share[expert])[0][0])
    order = list(range(share.shape[1]))
    order[0], order[rank] = order[rank], order[0]
    return share[:, order]


def load_bound(load: np.ndarray, ep: int, replicas: int) -> int:
    """A lower bound on the busiest rank: the mean rank, and without replicas the heaviest expert's
    rank, which also holds the slots − 1 lightest other experts."""
    mean = -(-int(load.sum()) // ep)
    if replicas:
        return mean
    ordered = np.sort(load)
    return max(mean, int(ordered[-1] + ordered[: slots_per_rank(len(load), ep, 0) - 1].sum()))


def greedy_load(load: np.ndarray, ep: int, replicas: int) -> tuple[np.ndarray, SolveStats]:
    """The greedy layout of one layer (the heaviest expert on rank 0), stated against ``load_bound``: proven
    optimal where it meets the bound, else ``heuristic`` with that bound."""
    share = _rank0_first(greedy_share(load.astype(float), ep, replicas), int(np.argmax(load)))
    objective, bound = _max_load(load, share), float(load_bound(load, ep, replicas))
    return share, SolveStats(status="optimal" if objective <= bound else "heuristic", objective=objective,
                             bound=min(bound, objective), wall_s=0.0)


def solve_load(load: np.ndarray, ep: int, replicas: int, config: SolverConfig) -> tuple[np.ndarray, SolveStats]:
    """Phase 1 of one layer: the layout with the fewest tokens on the busiest rank.

    With replicas, only experts heavier than an average copy (or copied by the heuristic) may get
    more than one copy: a lighter expert split over ranks cannot lower the busiest rank below the
    average it already fits under, and the restriction keeps 256 x 64 layers solvable. The bound
    stated is then the mean rank, which holds for the unrestricted problem too.
    """
    from ortools.sat.python import cp_model  # imported where a solver runs: start-up time
    slots = slots_per_rank(len(load), ep, replicas)
    heaviest = int(np.argmax(load))
    heuristic, greedy = greedy_load(load, ep, replicas)
    if greedy.status == "optimal":  # the heuristic meets the bound: proven, no search needed
        return heuristic, greedy
    replicable = ((load * ep * slots >= load.sum()) | ((heuristic > 0).sum(axis=1) > 1)) if replicas \
        else np.zeros(len(load), dtype=bool)
    trivial = load_bound(load, ep, replicas)
    model = cp_model.CpModel()
    x, y, max_load = _variables(model, load, ep, replicable)
    _constraints(model, load, x, y, max_load, ep, slots)
    model.add(x[heaviest, 0] == 1)  # symmetry: some rank holds the heaviest expert; call it rank 0
    model.minimize(max_load)
    _hint(model, load, x, y, max_load, heuristic)
    solver, status = run_cp_sat(model, config, keep_hint_feasible=replicas > 0)
    if status is None:
        return heuristic, SolveStats(status="heuristic", objective=_max_load(load, heuristic), bound=float(trivial),
                                     wall_s=solver.wall_time)
    share = _read(solver, load, x, y, ep)
    objective = _max_load(load, share)
    restricted = replicas > 0 and not replicable.all()
    bound = float(trivial) if restricted else max(float(trivial), float(solver.best_objective_bound))
    if restricted and objective > bound:
        status = "feasible"
    return share, SolveStats(status=status, objective=objective, bound=min(bound, objective), wall_s=solver.wall_time)


def solve_traffic(load: np.ndarray, cost: np.ndarray, max_load_cap: int, start: np.ndarray,
                  config: SolverConfig) -> tuple[np.ndarray, SolveStats]:
    """Phase 2 of one layer (no replicas): the fewest crossing tokens (``cost[e, r]`` if expert e goes
    to rank r) among layouts whose busiest rank carries at most ``max_load_cap``; ``start`` is feasible."""
    from ortools.sat.python import cp_model  # imported where a solver runs: start-up time
    ep = cost.shape[1]
    model = cp_model.CpModel()
    x, y, max_load = _variables(model, load, ep, np.zeros(len(load), dtype=bool))
    _constraints(model, load, x, y, max_load, ep, slots_per_rank(len(load), ep, 0))
    model.add(max_load <= max_load_cap)
    model.minimize(sum(int(cost[e, r]) * var for (e, r), var in x.items()))
    _hint(model, load, x, y, max_load, start)
    solver, status = run_cp_sat(model, config)
    start_cost = float((cost * start).sum())
    if status is None:
        return start, SolveStats(status="heuristic", objective=start_cost, bound=0.0, wall_s=solver.wall_time)
    share = _read(solver, load, x, y, ep)
    objective = float((cost * share).sum())
    return share, SolveStats(status=status, objective=objective, bound=min(objective, solver.best_objective_bound),
                             wall_s=solver.wall_time)


def place_experts(instance: ExpertInstance, config: SolverConfig, progress: Progress | None = None,
                  clock: Callable[[], float] = time.monotonic) -> ExpertPlacement:
    """Place every layer in order within one budget; costs are reported in token-routings.

    ``config.time_limit_s`` covers the whole call, model building included: each layer gets an equal share
    of the time left (``expert_budget.layer_config``), and once that share is too short the layers left take
    the greedy layout. ``progress(done, total)`` is called after each layer; ``clock`` is the time source
    (``time.monotonic``, which the solver's deadlines use too).
    """
    started = clock()
    call = config.started(started)
    budget_s = config.time_limit_s if config.deadline is None else config.remaining_s(started)  # an outer call's
    layers = instance.load.shape[0]
    placed: list[LayerSolve] = []
    for layer in range(layers):
        now = clock()
        share_config = layer_config(call, layers - layer, now)
        previous = placed[-1].share if placed else None
        placed.append(_greedy_layer(instance, layer) if share_config is None
                      else _solve_layer(instance, layer, previous, share_config, now))
        if progress is not None:
            progress(layer + 1, layers)
    return _placement(instance, placed, time_limit_s=budget_s, wall_s=clock() - started)


def _solve_layer(instance: ExpertInstance, layer: int, previous: np.ndarray | None, config: SolverConfig,
                 now: float) -> LayerSolve:
    """One layer by the solver within ``config``'s deadline: phase 1, then (given the previous layer and no
    replicas) phase 2, phase 1 taking at most half the layer's time."""
    load, q = instance.load[layer], instance.quantum_tokens
    traffic_phase = instance.coactivation is not None and previous is not None and instance.replicas == 0
    share, stats = solve_load(load, instance.ep, instance.replicas, config.share(2, now) if traffic_phase else config)
    traffic = None
    if traffic_phase:
        assert instance.coactivation is not None and previous is not None  # traffic_phase says so
        cost = np.rint(affinity_cost(instance.coactivation[layer - 1], previous, instance.ranks_per_domain))
        share, traffic = solve_traffic(load, cost.astype(np.int64), round(stats.objective), share, config)
    return LayerSolve(share=share, load=_scaled(stats, q), traffic=None if traffic is None else _scaled(traffic, q),
                      outcome=layer_outcome(stats, traffic, solved=True))


def _greedy_layer(instance: ExpertInstance, layer: int) -> LayerSolve:
    """One layer by the greedy heuristic alone (the budget is spent), stated against the load bound."""
    share, stats = greedy_load(instance.load[layer], instance.ep, instance.replicas)
    return LayerSolve(share=share, load=_scaled(stats, instance.quantum_tokens), traffic=None,
                      outcome=layer_outcome(stats, None, solved=False))


def _placement(instance: ExpertInstance, placed: list[LayerSolve], *, time_limit_s: float,
               wall_s: float) -> ExpertPlacement:
    """The answer of a call from its layers: the layouts, what they and the contiguous layout cost, the bound."""
    q, load, coact = instance.quantum_tokens, instance.load, instance.coactivation
    stacked = np.stack([layer.share for layer in placed])
    tokens = load * q
    coact_tokens = None if coact is None else coact * q
    baseline = np.broadcast_to(contiguous_share(load.shape[1], instance.ep), stacked.shape)
    load_stats = tuple(layer.load for layer in placed)
    traffic_stats = tuple(layer.traffic for layer in placed)
    outcomes = tuple(layer.outcome for layer in placed)
    return ExpertPlacement(
        shares=stacked, baseline=layout_cost(tokens, coact_tokens, baseline, instance.ranks_per_domain),
        optimized=layout_cost(tokens, coact_tokens, stacked, instance.ranks_per_domain),
        load_stats=load_stats, traffic_stats=traffic_stats, outcomes=outcomes,
        bound=call_bound(load_stats, traffic_stats, outcomes, time_limit_s=time_limit_s, wall_s=wall_s))


def _scaled(stats: SolveStats, quantum: float) -> SolveStats:
    return SolveStats(status=stats.status, objective=stats.objective * quantum, bound=stats.bound * quantum,
                      wall_s=stats.wall_s)
