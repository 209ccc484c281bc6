"""Rank placement (CP-SAT): which physical node runs each logical node of a plan.

Ranks keep Megatron's order tp-cp-dp-pp and torchrun's numbering (rank = node_rank · gpus_per_node
+ local_rank), so GPUs inside a node are interchangeable (one NVSwitch domain) and the decision is
the host order: logical node s (node_rank s) runs on physical node π(s). Spare nodes may stay idle.

Cost: each axis's groups form rings (tp, cp, dp; pp is a chain, a ring with virtual stages) over
logical nodes; all groups run at once, so an axis costs what its slowest ring link makes it cost.
The per-axis time at a link speed is the cost model's own exposed term on a uniform cluster at that
speed (plan_costs), so predicted step = constant + Σ_axis max_{edges} time_axis(link(π(s), π(t))).
Baseline: the identity (Megatron's default order on hosts as the scheduler lists them).
Heuristic (hint and fallback): pairwise-swap descent from the baseline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paraplan.planner.placement.solver import SolverConfig, SolveStats, run_cp_sat

if TYPE_CHECKING:  # annotations only: OR-Tools loads where a solver runs
    from ortools.sat.python import cp_model

TIME_QUANTUM_S = 1e-6
"""One integer cost unit: a microsecond, below the α of any inter-node collective, so rounding never
reorders placements that differ by a real transfer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankInstance:
    """Logical nodes, physical nodes and what each axis costs on each node pair."""

    num_slots: int
    """Logical nodes of the plan (node_rank 0 .. num_slots − 1)."""
    edges: dict[str, tuple[tuple[int, int], ...]]
    """Per axis, the logical-node pairs its rings or chains use (axes inside one node have none)."""
    pair_cost: dict[str, np.ndarray]
    """Per axis with edges, (nodes, nodes) integer cost in TIME_QUANTUM_S of its slowest link being (p, q)."""
    constant_s: float
    """Step time outside the placement-dependent terms, seconds."""
    nodes: tuple[int, ...] | None = None
    """Topology index of each instance node (rank_instance.candidate_nodes); None = the same numbering."""
    exact_pool: bool = True
    """Whether the candidate nodes are known to hold an optimal placement of the whole topology."""

    @property
    def num_nodes(self) -> int:
        """Physical nodes available."""
        return next(iter(self.pair_cost.values())).shape[0] if self.pair_cost else self.num_slots


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPlacement:
    """The answer."""

    node_of_slot: tuple[int, ...]
    """Physical node of each logical node (the host order)."""
    baseline_step_s: float
    """Predicted step time with the identity order, seconds."""
    placed_step_s: float
    """Predicted step time with ``node_of_slot``, seconds."""
    stats: SolveStats
    """Objective and bound in seconds of placement-dependent step time."""
    candidates: int = 0
    """Physical nodes the solver chose from (the candidate pool)."""
    exact_pool: bool = True
    """Whether that pool holds an optimal placement of the whole topology."""


def cost_of(instance: RankInstance, node_of_slot: Sequence[int]) -> int:
    """Σ_axis max over its edges of the pair cost, in TIME_QUANTUM_S."""
    total = 0
    for axis, edges in instance.edges.items():
        cost = instance.pair_cost[axis]
        total += max(int(cost[node_of_slot[s], node_of_slot[t]]) for s, t in edges)
    return total


def step_s(instance: RankInstance, node_of_slot: Sequence[int]) -> float:
    """Predicted step time of a host order, seconds."""
    return instance.constant_s + cost_of(instance, node_of_slot) * TIME_QUANTUM_S


def swap_descent(instance: RankInstance, start: tuple[int, ...]) -> tuple[int, ...]:
    """Best-improvement pairwise swaps (slot with slot, or slot with an idle node) until none helps."""
    current, best = list(start), cost_of(instance, start)
    while True:
        improved = None
        idle = [n for n in range(instance.num_nodes) if n not in current]
        for i in range(instance.num_slots):
            for j in list(range(i + 1, instance.num_slots)) + [-1 - k for k in range(len(idle))]:
                trial = list(current)
                if j >= 0:
                    trial[i], trial[j] = trial[j], trial[i]
                else:
                    trial[i] = idle[-1 - j]
                value = cost_of(instance, trial)
                if value < best:
                    best, improved = value, trial
        if improved is None:
            return tuple(current)
        current = improved


def brute_force(instance: RankInstance) -> tuple[tuple[int, ...], int]:
    """The optimum by enumerating every injective host order (small instances only)."""
    return min(((order, cost_of(instance, order))
                for order in itertools.permutations(range(instance.num_nodes), instance.num_slots)),
               key=lambda pair: pair[1])


def _build(instance: RankInstance) -> tuple[cp_model.CpModel, dict[tuple[int, int], cp_model.IntVar]]:
    """The CP-SAT model: x[s, n] = logical node s runs on physical node n, each slot on one node, each node
    hosting at most one slot; the objective is the sum of the axes' slowest links (_axis_max)."""
    from ortools.sat.python import cp_model  # imported where a solver runs: start-up time
    model = cp_model.CpModel()
    slots, nodes = instance.num_slots, instance.num_nodes
    x = {(s, n): model.new_bool_var(f"x_s{s}_n{n}") for s in range(slots) for n in range(nodes)}
    for s in range(slots):
        model.add_exactly_one(x[s, n] for n in range(nodes))
    for n in range(nodes):
        model.add_at_most_one(x[s, n] for s in range(slots))
    objective = []
    for axis, edges in instance.edges.items():
        objective.append(_axis_max(model, axis, edges, instance.pair_cost[axis], x, nodes))
    model.minimize(sum(objective))
    return model, x


def _axis_max(model: cp_model.CpModel, axis: str, edges: tuple[tuple[int, int], ...], cost: np.ndarray,
              x: dict[tuple[int, int], cp_model.IntVar], nodes: int) -> cp_model.LinearExprT:
    """The axis's max edge cost as c_0 + Σ_k (c_k − c_{k−1})·above[k]; above[k] is forced to 1 when an
    edge lands on a node pair costing c_k or more."""
    off_diagonal = cost[~np.eye(nodes, dtype=bool)]
    levels = sorted(set(off_diagonal.tolist()))
    above = [model.new_bool_var(f"above_{axis}_k{k}") for k in range(len(levels))]
    model.add(above[0] == 1)
    for k in range(1, len(levels)):
        model.add_implication(above[k], above[k - 1])
    for s, t in edges:
        for p, q in itertools.permutations(range(nodes), 2):  # p == q cannot happen: one slot per node
            k = levels.index(int(cost[p, q]))
            if k > 0:
                model.add_bool_or([x[s, p].Not(), x[t, q].Not(), above[k]])
    return levels[0] + sum((levels[k] - levels[k - 1]) * above[k] for k in range(1, len(levels)))


def place_ranks(instance: RankInstance, config: SolverConfig) -> RankPlacement:
    """Solve the host order; fall back to the swap-descent order when the solver finds nothing in time."""
    config = config.started()
    identity = tuple(range(instance.num_slots))
    heuristic = swap_descent(instance, identity)
    model, x = _build(instance)
    for (s, n), var in x.items():
        model.add_hint(var, int(heuristic[s] == n))
    solver, status = run_cp_sat(model, config)
    if status is None:
        order, stats = heuristic, SolveStats(status="heuristic",
                                             objective=cost_of(instance, heuristic) * TIME_QUANTUM_S, bound=0.0,
                                             wall_s=solver.wall_time)
    else:
        order = tuple(next(n for n in range(instance.num_nodes) if solver.value(x[s, n]))
                      for s in range(instance.num_slots))
        objective = cost_of(instance, order)
        stats = SolveStats(status=status, objective=objective * TIME_QUANTUM_S,
                           bound=min(objective, solver.best_objective_bound) * TIME_QUANTUM_S, wall_s=solver.wall_time)
    if cost_of(instance, order) >= cost_of(instance, identity):
        order = identity  # no gain: keep the scheduler's order rather than an equal-cost shuffle
    physical = order if instance.nodes is None else tuple(instance.nodes[n] for n in order)
    return RankPlacement(node_of_slot=physical, baseline_step_s=step_s(instance, identity),
                         placed_step_s=step_s(instance, order), stats=stats,
                         candidates=instance.num_nodes, exact_pool=instance.exact_pool)
