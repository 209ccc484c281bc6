"""Layer-to-stage partition (PuLP MILP): contiguous layers per pipeline stage minimising the slowest
stage under each stage's memory limit.

CBC proves its answer optimal when it can. When it stops without a proof (its time limit, or a
stop on a loaded machine), the exact dynamic program over contiguous splits (``exact_split``,
O(stages x layers^2) with numpy) settles the answer and its proof. The MILP stays the solver
because it is the formulation later constraints extend; the program is its certificate.

The first stage also runs the embedding, the last the output layer, the loss and any MTP layers;
each layer has its own time and memory (dense and MoE layers differ), and each stage its own speed
and memory (a stage on another GPU type). Baseline: Megatron's split (even, or edge-accounted when
only that divides; otherwise as even as possible). The baseline is the warm start and the fallback.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paraplan.planner.placement.solver import SolverConfig, SolveStats

if TYPE_CHECKING:  # annotations only: PuLP loads where a partition is solved
    import pulp


@dataclass(frozen=True, slots=True, kw_only=True)
class StageInstance:
    """Per-layer costs in model order and per-stage limits."""

    layer_time_s: np.ndarray
    """(layers,) forward + backward (+ recompute, TP/CP comm) of each decoder layer per micro-batch, seconds."""
    layer_state_bytes: np.ndarray
    """(layers,) weights, gradients and optimizer state of each layer on one GPU, bytes."""
    layer_activation_bytes: np.ndarray
    """(layers,) activations each layer keeps per micro-batch in flight, bytes."""
    first_extra_s: float
    """Embedding time per micro-batch on the first stage, seconds."""
    last_extra_s: float
    """Output layer, loss and MTP layers per micro-batch on the last stage, seconds."""
    first_extra_bytes: float
    """Embedding states on the first stage, bytes."""
    last_extra_bytes: float
    """Output-layer states, logits and MTP states on the last stage, bytes."""
    in_flight: np.ndarray
    """(stages,) micro-batches whose activations stage s holds at its peak (1F1B: pp − s)."""
    capacity_bytes: np.ndarray
    """(stages,) memory each stage's GPU may use, bytes."""
    time_scale: np.ndarray
    """(stages,) seconds on stage s per second of ``layer_time_s`` (1 = the reference GPU)."""
    equal_middle: bool = False
    """Require equal layers on the middle stages: the splits Megatron's --decoder-first/last-pipeline-num-layers
    (and torchtitan's first/last-stage-less-layers) can express."""

    @property
    def num_layers(self) -> int:
        """Decoder layers."""
        return len(self.layer_time_s)

    @property
    def num_stages(self) -> int:
        """Pipeline stages."""
        return len(self.capacity_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePartition:
    """The answer and the baseline it beats."""

    stage_layers: tuple[int, ...]
    """Decoder layers per stage, in stage order."""
    slowest_s: float
    """Slowest stage's time per micro-batch, seconds."""
    baseline_layers: tuple[int, ...]
    """Megatron's split."""
    baseline_slowest_s: float
    """Its slowest stage, seconds."""
    baseline_fits: bool
    """Whether the baseline respects every stage's memory."""
    stats: SolveStats
    """Objective and bound in seconds (slowest stage per micro-batch)."""


def stage_times(instance: StageInstance, layers: Sequence[int]) -> np.ndarray:
    """Per-stage time per micro-batch of a split, seconds."""
    bounds = np.cumsum([0, *layers])
    times = np.array([instance.layer_time_s[bounds[s]:bounds[s + 1]].sum() for s in range(len(layers))])
    times[0] += instance.first_extra_s
    times[-1] += instance.last_extra_s
    return times * instance.time_scale


def stage_bytes(instance: StageInstance, layers: Sequence[int]) -> np.ndarray:
    """Per-stage peak memory of a split, bytes."""
    bounds = np.cumsum([0, *layers])
    used = np.array([instance.layer_state_bytes[bounds[s]:bounds[s + 1]].sum()
                     + instance.in_flight[s] * instance.layer_activation_bytes[bounds[s]:bounds[s + 1]].sum()
                     for s in range(len(layers))])
    used[0] += instance.first_extra_bytes
    used[-1] += instance.last_extra_bytes
    return used


def fits(instance: StageInstance, layers: Sequence[int]) -> bool:
    """Every stage within its memory."""
    return bool((stage_bytes(instance, layers) <= instance.capacity_bytes).all())


def baseline_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """Even; else edge-accounted (one layer fewer on the first and last stage); else as even as possible."""
    if num_layers % stages == 0:
        return (num_layers // stages,) * stages
    if stages > 1 and (num_layers + 2) % stages == 0 and (num_layers + 2) // stages > 1:
        per = (num_layers + 2) // stages
        return (per - 1, *([per] * (stages - 2)), per - 1)
    base, extra = divmod(num_layers, stages)
    return tuple(base + (1 if 0 < s <= extra else 0) for s in range(stages))  # edges keep the smaller share


def brute_force(instance: StageInstance) -> tuple[tuple[int, ...], float] | None:
    """The best split by enumerating every composition into non-empty stages (small instances)."""
    best = None
    for cuts in itertools.combinations(range(1, instance.num_layers), instance.num_stages - 1):
        layers = tuple(np.diff([0, *cuts, instance.num_layers]).tolist())
        if instance.equal_middle and len(set(layers[1:-1])) > 1:
            continue
        if fits(instance, layers):
            slowest = float(stage_times(instance, layers).max())
            if best is None or slowest < best[1] - 1e-15:
                best = (layers, slowest)
    return best


def exact_split(instance: StageInstance) -> tuple[tuple[int, ...], float] | None:
    """The best split exactly (None when no split fits): a min-max dynamic program over contiguous
    segments, best[s, j] = min over i < j of max(best[s - 1, i], time of layers i..j on stage s),
    where the segment fits stage s's memory. With ``equal_middle`` the splits are enumerated
    instead (first and middle sizes fix the last)."""
    if instance.equal_middle and instance.num_stages > 3:
        return _exact_equal_middle(instance)
    layers, stages = instance.num_layers, instance.num_stages
    time_sum = np.concatenate([[0.0], np.cumsum(instance.layer_time_s)])
    state_sum = np.concatenate([[0.0], np.cumsum(instance.layer_state_bytes)])
    act_sum = np.concatenate([[0.0], np.cumsum(instance.layer_activation_bytes)])
    start, end = np.meshgrid(np.arange(layers + 1), np.arange(layers + 1), indexing="ij")
    nonempty = start < end
    best = np.full(layers + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((stages, layers + 1), dtype=np.int64)
    for s in range(stages):
        extra_s = (instance.first_extra_s if s == 0 else 0.0) + (instance.last_extra_s if s == stages - 1 else 0.0)
        extra_b = (instance.first_extra_bytes if s == 0 else 0.0) \
            + (instance.last_extra_bytes if s == stages - 1 else 0.0)
        seconds = instance.time_scale[s] * (time_sum[end] - time_sum[start] + extra_s)
        used = state_sum[end] - state_sum[start] + instance.in_flight[s] * (act_sum[end] - act_sum[start]) + extra_b
        cost = np.where(nonempty & (used <= instance.capacity_bytes[s]), np.maximum(best[:, None], seconds), np.inf)
        choice[s] = cost.argmin(axis=0)
        best = cost.min(axis=0)
    if not np.isfinite(best[layers]):
        return None
    cuts, j = [], layers
    for s in range(stages - 1, -1, -1):
        i = int(choice[s, j])
        cuts.append(j - i)
        j = i
    split = tuple(reversed(cuts))
    return split, float(stage_times(instance, split).max())


def _exact_equal_middle(instance: StageInstance) -> tuple[tuple[int, ...], float] | None:
    """Every split with equal middle stages: first f, middles m each, the rest last."""
    layers, middles = instance.num_layers, instance.num_stages - 2
    best = None
    for middle in range(1, (layers - 2) // middles + 1):
        for first in range(1, layers - middles * middle):
            split = (first, *([middle] * middles), layers - first - middles * middle)
            if fits(instance, split):
                slowest = float(stage_times(instance, split).max())
                if best is None or slowest < best[1]:
                    best = (split, slowest)
    return best


def _milp(instance: StageInstance, relax: bool) -> tuple[pulp.LpProblem, dict[tuple[int, int], pulp.LpVariable]]:
    """Cumulative formulation: before[l, s] = 1 when layer l sits on stage s or earlier. It is monotone
    in both indices, so every solution is contiguous, and its LP relaxation is far tighter than one
    binary per (layer, stage) with index constraints."""
    import pulp  # PuLP loads where a partition is solved: start-up time of every other command
    layers, stages = instance.num_layers, instance.num_stages
    kind = pulp.LpContinuous if relax else pulp.LpBinary
    problem = pulp.LpProblem("stage_partition", pulp.LpMinimize)
    before = {(layer, s): pulp.LpVariable(f"before_l{layer}_s{s}", 0, 1, kind)
              for layer in range(layers) for s in range(stages - 1)}

    def cum(layer: int, s: int) -> int | pulp.LpVariable:
        return 0 if s < 0 else 1 if s == stages - 1 else before[layer, s]

    y = {(layer, s): cum(layer, s) - cum(layer, s - 1) for layer in range(layers) for s in range(stages)}
    slowest = pulp.LpVariable("slowest_stage_s", 0)
    problem += slowest
    for (layer, s), var in before.items():
        if layer + 1 < layers:
            problem += before[layer + 1, s] <= var, f"contiguous_l{layer}_s{s}"
        if s + 1 < stages - 1:
            problem += var <= before[layer, s + 1], f"cumulative_l{layer}_s{s}"
    for s in range(stages):
        problem += pulp.lpSum(y[layer, s] for layer in range(layers)) >= 1, f"nonempty_s{s}"
        work = pulp.lpSum(float(instance.layer_time_s[layer]) * y[layer, s] for layer in range(layers))
        extra = (instance.first_extra_s if s == 0 else 0.0) + (instance.last_extra_s if s == stages - 1 else 0.0)
        problem += float(instance.time_scale[s]) * (work + extra) <= slowest, f"time_s{s}"
        memory = pulp.lpSum(float(instance.layer_state_bytes[layer] + instance.in_flight[s]
                                  * instance.layer_activation_bytes[layer]) * y[layer, s] for layer in range(layers))
        fixed = (instance.first_extra_bytes if s == 0 else 0.0) \
            + (instance.last_extra_bytes if s == stages - 1 else 0.0)
        problem += memory + fixed <= float(instance.capacity_bytes[s]), f"memory_s{s}"
        if instance.equal_middle and 1 <= s < stages - 2:
            problem += (pulp.lpSum(y[layer, s] for layer in range(layers))
                        == pulp.lpSum(y[layer, s + 1] for layer in range(layers)), f"equal_middle_s{s}")
    return problem, before


def partition(instance: StageInstance, config: SolverConfig) -> StagePartition:
    """Solve the MILP; the baseline is the warm start and the answer when CBC finds nothing in time."""
    import pulp  # PuLP loads where a partition is solved: start-up time of every other command
    config = config.started()
    base = baseline_split(instance.num_layers, instance.num_stages)
    base_slowest = float(stage_times(instance, base).max())
    problem, before = _milp(instance, relax=False)
    starts = np.repeat(np.arange(instance.num_stages), base)
    for (layer, s), var in before.items():
        var.setInitialValue(int(starts[layer] <= s))
    solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=config.remaining_s(), gapRel=config.relative_gap_frac or None,
                               threads=config.num_workers, warmStart=fits(instance, base),
                               options=[f"randomSeed {config.seed + 1}"])
    problem.solve(solver)
    wall = float(problem.solutionTime)
    if problem.sol_status != pulp.LpSolutionOptimal:
        certified = _certified(instance, base, base_slowest, wall)
        if certified is not None:
            return certified
    bound = _relaxation_bound(instance)
    if problem.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        stats = SolveStats(status="heuristic", objective=base_slowest, bound=min(bound, base_slowest), wall_s=wall)
        return StagePartition(stage_layers=base, slowest_s=base_slowest, baseline_layers=base,
                              baseline_slowest_s=base_slowest, baseline_fits=fits(instance, base), stats=stats)
    # Stage of layer l = how many cumulative indicators are still 0 for it.
    chosen = [sum(before[layer, s].value() < 0.5 for s in range(instance.num_stages - 1))
              for layer in range(instance.num_layers)]
    layers = tuple(int(n) for n in np.bincount(chosen, minlength=instance.num_stages))
    slowest = float(stage_times(instance, layers).max())
    optimal = problem.sol_status == pulp.LpSolutionOptimal
    # CBC proves optimality within gapRel; otherwise the LP relaxation is the bound we can state.
    proven = slowest * (1.0 - config.relative_gap_frac) if optimal else 0.0
    stats = SolveStats(status="optimal" if optimal else "feasible", objective=slowest,
                       bound=min(max(proven, bound), slowest), wall_s=wall)
    return StagePartition(stage_layers=layers, slowest_s=slowest, baseline_layers=base, baseline_slowest_s=base_slowest,
                          baseline_fits=fits(instance, base), stats=stats)


def _certified(instance: StageInstance, base: tuple[int, ...], base_slowest: float,
               wall_s: float) -> StagePartition | None:
    """The exact program's answer, proven, where CBC stopped without a proof (None: nothing fits)."""
    exact = exact_split(instance)
    if exact is None:
        return None
    layers, slowest = exact
    stats = SolveStats(status="optimal", objective=slowest, bound=slowest, wall_s=wall_s)
    return StagePartition(stage_layers=layers, slowest_s=slowest, baseline_layers=base, baseline_slowest_s=base_slowest,
                          baseline_fits=fits(instance, base), stats=stats)


def _relaxation_bound(instance: StageInstance) -> float:
    """The LP relaxation's optimum: a proven lower bound on the slowest stage."""
    import pulp  # PuLP loads where a partition is solved: start-up time of every other command
    problem, _ = _milp(instance, relax=True)
    problem.solve(pulp.PULP_CBC_CMD(msg=False))
    return float(pulp.value(problem.objective)) if problem.status == pulp.LpStatusOptimal else 0.0

