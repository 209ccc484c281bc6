"""Put an optimizer's answer into a plan document (validated against the plan schema)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from paraplan.hardware_profiles.topology import Topology
from paraplan.planner.json_schema import validate_own
from paraplan.planner.layout import rank_map
from paraplan.planner.placement.mixed_gpus import MixedPipeline, mixed_pipeline, stage_blocks, whole_step_s
from paraplan.planner.placement.plan_costs import job_of_plan
from paraplan.planner.placement.rank_instance import rank_instance
from paraplan.planner.placement.rank_placement import RankPlacement, place_ranks
from paraplan.planner.placement.solver import SolverConfig
from paraplan.planner.placement.stage_costs import stage_instance
from paraplan.planner.placement.stage_partition import StageInstance, StagePartition, partition
from paraplan.planner.plan import plan_schema


def place_plan(document: dict[str, Any], topology: Topology,
               config: SolverConfig) -> tuple[RankPlacement, dict[str, Any]]:
    """Rank placement of one plan on ``topology``: the answer and the plan document that carries it. The time
    limit covers building the instance (its candidate pool and link costs) as well as the solve."""
    config = config.started()
    placed = place_ranks(rank_instance(document, topology), config)
    return placed, with_rank_placement(document, topology, placed, config)


def with_rank_placement(document: dict[str, Any], topology: Topology, placed: RankPlacement,
                        config: SolverConfig) -> dict[str, Any]:
    """A copy of ``document`` with the explicit rank map, the host order and the placement figures."""
    out = copy.deepcopy(document)
    c, per_node = out["config"], out["cluster"]["gpus_per_node"]
    stats = placed.stats
    out["placement"]["rank_map"] = rank_map(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=c["pp"], gpus_per_node=per_node)
    out["placement"]["host_order"] = [topology.nodes[n].host for n in placed.node_of_slot]
    out["placement"]["rank_placement"] = {
        "topology": topology.name, "step_time_s_before": placed.baseline_step_s,
        "step_time_s_after": placed.placed_step_s, "status": stats.status, "objective_s": stats.objective,
        "bound_s": stats.bound, "gap_frac": stats.gap_frac, "wall_s": stats.wall_s,
        "time_limit_s": config.time_limit_s}
    validate_own(out, plan_schema())
    return out


def partition_plan(document: dict[str, Any], topology: Topology,
                   config: SolverConfig) -> tuple[StagePartition, dict[str, Any]] | None:
    """Uneven layers per stage for a pipelined plan (one chunk per rank) on the topology's GPU type,
    restricted to splits Megatron and torchtitan express (equal middle stages); None without pp > 1."""
    config = config.started()
    job, parallel = job_of_plan(document)
    if parallel.pp < 2 or parallel.vpp > 1:
        return None
    slots = parallel.num_gpus // document["cluster"]["gpus_per_node"]
    instance: StageInstance = stage_instance(job, parallel, [topology.nominal_cluster(num_nodes=slots)] * parallel.pp)
    result = partition(dataclasses.replace(instance, equal_middle=True), config)
    out = copy.deepcopy(document)
    out["placement"]["stage_layers"] = list(result.stage_layers)
    out["placement"]["stage_partition"] = {
        "stage_layers": list(result.stage_layers), "slowest_stage_s_even": result.baseline_slowest_s,
        "slowest_stage_s_placed": result.slowest_s, "status": result.stats.status,
        "gap_frac": result.stats.gap_frac}
    validate_own(out, plan_schema())
    return result, out


def mixed_plan(document: dict[str, Any], topology: Topology,
               config: SolverConfig) -> tuple[MixedPipeline, dict[str, Any]]:
    """A plan on a cluster of several GPU types: stage types and layers, the host order that puts each
    stage on its type's nodes, and the comparisons; InputError when the types cannot hold whole stages."""
    job, parallel = job_of_plan(document)
    searched = document["placement"].get("stage_layers")
    result = mixed_pipeline(job, parallel, topology, config, tuple(searched) if searched else None)
    stage_blocks(topology, parallel)  # validated by mixed_pipeline; each stage fills whole nodes
    block_nodes = parallel.tp * parallel.cp * parallel.dp // topology.nodes[0].gpus_per_node
    free = {gpu: [n.host for n in topology.nodes if n.gpu.name == gpu] for gpu in topology.gpu_types}
    hosts = [free[gpu].pop(0) for gpu in result.stage_types for _ in range(block_nodes)]
    out = copy.deepcopy(document)
    out["placement"]["host_order"] = hosts
    out["placement"]["stage_layers"] = list(result.stage_layers)  # one chunk per rank: every format expresses it
    out["placement"]["mixed_gpus"] = {
        "stage_types": list(result.stage_types), "stage_layers": list(result.stage_layers),
        "step_time_s": result.step_s, "naive_step_time_s": result.naive_step_s,
        "fast_only_step_time_s": result.fast_only_step_s, "weakest_type": result.weakest_type,
        "weakest_only_step_time_s": result.weakest_only_step_s,
        "placed_step_time_s": whole_step_s(document["estimate"]["step_time_s"], result),
        "status": result.stats.status,
        "gap_frac": result.stats.gap_frac}
    validate_own(out, plan_schema())
    return result, out

