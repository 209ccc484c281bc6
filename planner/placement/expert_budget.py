"""One time budget for a whole expert-placement call, shared over its layers; and the bound the call reached.

``paraplan experts`` on a DeepSeek-V3 shape (58 MoE layers of 256 experts) ran for minutes when every
layer had a limit of its own. Here ``SolverConfig.time_limit_s`` covers the whole call: each layer gets an
equal share of the time still left (so a layer that proves its optimum early leaves its time to the rest),
and once that share is too short to do better than the heuristic, the layers left take the greedy layout
(``expert_layout.greedy_share``) without the solver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from paraplan.planner.placement.solver import SolverConfig, SolveStats

MIN_LAYER_S = 0.1
"""The least time (seconds) worth a solver call for one layer: below it CP-SAT returns its hint (the greedy
layout) even on small layers. A layer whose equal share is shorter still gets this much while the call has it
left; once the call has less, the layers left take the greedy layout. A large layer may overrun its share
building its models (a 256-expert x 64-rank phase took 0.4 to 0.9 s on a busy 2-core machine); the layers after
it share what is then left, so the call ends at most one layer's overrun past its budget."""

LayerOutcome = Literal["optimal", "limit", "greedy"]
"""optimal: every phase the layer ran was proven optimal; limit: the solver ran and returned its best answer
without a proof (its share of the budget ran out, or with replicas the only stated bound is the mean rank);
greedy: the budget was spent before the layer, whose layout is the greedy heuristic's, not the solver's."""


def layer_time_s(remaining_s: float, layers_left: int) -> float:
    """Seconds the next layer may take, of the ``remaining_s`` the call has left for the ``layers_left`` layers
    still to place (this one included): an equal share, at least MIN_LAYER_S, never more than is left; 0 (the
    greedy layout) once less than MIN_LAYER_S is left. Greedy layers are therefore always the last ones."""
    if layers_left < 1:
        raise ValueError(f"layers left must be >= 1, got {layers_left}")
    if remaining_s < MIN_LAYER_S:
        return 0.0
    return max(remaining_s / layers_left, MIN_LAYER_S)


def layer_config(call: SolverConfig, layers_left: int, now: float) -> SolverConfig | None:
    """The next layer's solver config, its deadline ``now`` plus ``layer_time_s`` of the time the call has left,
    or None when that is 0 (the layer takes the greedy layout). ``call`` has its deadline set
    (``SolverConfig.started``)."""
    if call.deadline is None:
        raise ValueError("the call's config needs its deadline: pass config.started()")
    share_s = layer_time_s(call.deadline - now, layers_left)
    return None if share_s == 0 else replace(call, deadline=now + share_s)


def layer_outcome(load: SolveStats, traffic: SolveStats | None, solved: bool) -> LayerOutcome:
    """How one layer was placed: ``solved`` says whether the solver ran on it (False: the budget was spent)."""
    if not solved:
        return "greedy"
    statuses = (load.status,) + (() if traffic is None else (traffic.status,))
    return "optimal" if all(status == "optimal" for status in statuses) else "limit"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallBound:
    """What a whole call reached: objectives and proven bounds summed over layers, and how each layer ended."""

    layers_optimal: int
    """Layers whose every phase was proven optimal."""
    layers_at_limit: int
    """Layers the solver returned without a proof (see ``LayerOutcome``)."""
    layers_greedy: int
    """Layers placed by the greedy heuristic because the budget was spent before them."""
    max_rank_tokens: float
    """Phase 1 objective: token-routings on the busiest EP rank, summed over layers."""
    max_rank_bound_tokens: float
    """Proven lower bound on ``max_rank_tokens`` (the sum of the layers' bounds; a greedy layer states the
    load bound of ``expert_placement.load_bound``)."""
    traffic_tokens: float
    """Phase 2 objective: cross-GPU plus cross-domain token-routings into each layer given the layer before it
    (a domain crossing counts twice), summed over the layers whose traffic phase ran."""
    traffic_bound_tokens: float
    """Proven lower bound on ``traffic_tokens`` (each layer's bound is conditioned on the layer before it)."""
    time_limit_s: float
    """The budget of the whole call, seconds."""
    wall_s: float
    """Wall time of the whole call, model building and the greedy layers included, seconds."""

    @property
    def max_rank_gap_frac(self) -> float:
        """(objective − bound) / objective of the busiest-rank sum; 0 when proven or the objective is 0."""
        return _gap(self.max_rank_tokens, self.max_rank_bound_tokens)

    @property
    def traffic_gap_frac(self) -> float:
        """(objective − bound) / objective of the traffic sum; 0 when proven or the objective is 0."""
        return _gap(self.traffic_tokens, self.traffic_bound_tokens)


def call_bound(load_stats: Sequence[SolveStats], traffic_stats: Sequence[SolveStats | None],
               outcomes: Sequence[LayerOutcome], *, time_limit_s: float, wall_s: float) -> CallBound:
    """The sums and counts of :class:`CallBound` from the per-layer statistics (in token-routings)."""
    traffic = [stats for stats in traffic_stats if stats is not None]
    return CallBound(
        layers_optimal=outcomes.count("optimal"), layers_at_limit=outcomes.count("limit"),
        layers_greedy=outcomes.count("greedy"),
        max_rank_tokens=sum(s.objective for s in load_stats), max_rank_bound_tokens=sum(s.bound for s in load_stats),
        traffic_tokens=sum(s.objective for s in traffic), traffic_bound_tokens=sum(s.bound for s in traffic),
        time_limit_s=time_limit_s, wall_s=wall_s)


def _gap(objective: float, bound: float) -> float:
    return max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
