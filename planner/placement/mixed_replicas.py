"""Mixed GPU types across data-parallel replicas (CP-SAT): each replica (a whole pipeline of tp·cp·pp
GPUs) runs on one GPU type, and faster replicas take more micro-batches.

Replica r with m_r micro-batches of per-stage times t (its type's, Megatron's split) takes
m_r·max t + (Σ t − max t) (1F1B); the step waits for the slowest replica, then all-reduces gradients
(weighted by the tokens each replica saw). The integer program picks m_r ≥ 1 with Σ m_r = the
step's micro-batches to minimise the slowest replica. Baseline: an even split (Megatron's fixed
micro-batches per replica). Compared with the faster type alone (its replicas only).
Megatron and torchtitan take one micro-batch count for every replica, so the launch files cannot
express the uneven split; the plan JSON carries it for launchers of your own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.errors import InputError
from paraplan.hardware_profiles.topology import Topology
from paraplan.planner.job import ParallelConfig, TrainingJob
from paraplan.planner.placement.mixed_gpus import _cluster_of, pipeline_step_s
from paraplan.planner.placement.solver import SolverConfig, SolveStats, run_cp_sat
from paraplan.planner.placement.stage_costs import stage_instance
from paraplan.planner.placement.stage_partition import baseline_split, fits, stage_times

TIME_QUANTUM_S = 1e-6
"""One integer unit of replica time: a microsecond."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedReplicas:
    """Micro-batches per replica and the comparisons (seconds, pipeline part of the step)."""

    replica_types: tuple[str, ...]
    """GPU type of each data-parallel replica."""
    microbatches: tuple[int, ...]
    """Micro-batches each replica runs per step."""
    step_s: float
    """Slowest replica with the chosen split."""
    even_step_s: float
    """Slowest replica with an even split."""
    fast_only_step_s: float | None
    """The faster type's replicas alone taking every micro-batch (None if they do not fit)."""
    stats: SolveStats
    """Objective and bound in seconds (slowest replica)."""
    host_order: tuple[str, ...]
    """Host of each node rank: under Megatron's order node rank s·dp + r holds replica r's stage s, so
    replica r's nodes (listed together in the topology) fill those node ranks."""


def replica_types(topology: Topology, config: ParallelConfig) -> list[str]:
    """The GPU type of each replica: whole nodes per replica, types in node order."""
    per_node = topology.nodes[0].gpus_per_node
    replica_gpus = config.tp * config.cp * config.pp
    if replica_gpus % per_node or (config.tp * config.cp) % per_node:
        raise InputError(f"a data-parallel replica needs whole {per_node}-GPU nodes per stage (tp·cp a multiple of "
                         f"{per_node}) to run on one GPU type; got tp·cp = {config.tp * config.cp}")
    nodes_per_replica = replica_gpus // per_node
    if topology.num_nodes != nodes_per_replica * config.dp:
        raise InputError(f"dp = {config.dp} replicas of {nodes_per_replica} node(s) need "
                         f"{nodes_per_replica * config.dp} nodes; the topology has {topology.num_nodes}")
    names = [node.gpu.name for node in topology.nodes]
    types = [names[r * nodes_per_replica] for r in range(config.dp)]
    if any(len(set(names[r * nodes_per_replica:(r + 1) * nodes_per_replica])) > 1 for r in range(config.dp)):
        raise InputError("list each GPU type's nodes together so every replica's nodes share a type")
    return types


def mixed_replicas(job: TrainingJob, config: ParallelConfig, topology: Topology,
                   solver: SolverConfig) -> MixedReplicas:
    """Uneven micro-batches per replica; InputError when a replica cannot sit on one type."""
    from ortools.sat.python import cp_model  # imported where a solver runs: start-up time
    types = replica_types(topology, config)
    total = job.global_batch // config.mbs
    if total < config.dp:
        raise InputError(f"{total} micro-batches cannot give each of {config.dp} replicas one")
    stage_s = {gpu: _stage_times(job, config, topology, gpu) for gpu in set(types)}
    slope = {g: round(max(t) / TIME_QUANTUM_S) for g, t in stage_s.items()}  # per extra micro-batch
    offset = {g: round((sum(t) - max(t)) / TIME_QUANTUM_S) for g, t in stage_s.items()}  # fill and drain
    model = cp_model.CpModel()
    m = [model.new_int_var(1, total, f"microbatches_r{r}") for r in range(config.dp)]
    slowest = model.new_int_var(0, max(slope.values()) * total + max(offset.values()), "slowest_replica")
    model.add(sum(m) == total)
    for r, gpu in enumerate(types):
        model.add(slope[gpu] * m[r] + offset[gpu] <= slowest)
    model.minimize(slowest)
    even = _even(total, config.dp)
    for var, count in zip(m, even):
        model.add_hint(var, count)
    run, status = run_cp_sat(model, solver)
    chosen = even if status is None else tuple(int(run.value(v)) for v in m)

    def step(counts: Sequence[int]) -> float:
        return max(pipeline_step_s(stage_s[g], n) for g, n in zip(types, counts))

    objective = step(chosen)
    bound = objective if status == "optimal" else min(objective, run.best_objective_bound * TIME_QUANTUM_S)
    fast = min(stage_s, key=lambda g: max(stage_s[g]))
    fast_count = types.count(fast)
    fast_only = None if fast_count == 0 else max(pipeline_step_s(stage_s[fast], n) for n in _even(total, fast_count))
    return MixedReplicas(replica_types=tuple(types), microbatches=chosen, step_s=objective, even_step_s=step(even),
                         fast_only_step_s=fast_only,
                         stats=SolveStats(status=status or "heuristic", objective=objective, bound=bound,
                                          wall_s=run.wall_time),
                         host_order=tuple(_host_order(topology, config)))


def _host_order(topology: Topology, config: ParallelConfig) -> list[str]:
    per_stage = config.tp * config.cp // topology.nodes[0].gpus_per_node  # nodes of one replica's stage
    per_replica = per_stage * config.pp
    order = []
    for stage in range(config.pp):
        for replica in range(config.dp):
            first = replica * per_replica + stage * per_stage
            order += [topology.nodes[i].host for i in range(first, first + per_stage)]
    return order


def _even(total: int, replicas: int) -> tuple[int, ...]:
    base, extra = divmod(total, replicas)
    return tuple(base + (1 if r < extra else 0) for r in range(replicas))


def _stage_times(job: TrainingJob, config: ParallelConfig, topology: Topology, gpu: str) -> list[float]:
    cluster = _cluster_of(topology, gpu, config)
    instance = stage_instance(job, config, [cluster] * config.pp)
    split = baseline_split(instance.num_layers, config.pp)
    if not fits(instance, split):
        raise InputError(f"a replica on {gpu} does not fit its memory with tp={config.tp} pp={config.pp}; "
                         "use more pipeline stages or recompute")
    return [float(t) for t in np.asarray(stage_times(instance, split))]
