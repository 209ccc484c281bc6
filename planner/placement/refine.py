"""``plan --place`` (and any search on a topology file): refine the search's top plans by placement, then re-rank.

Each plan is placed on the topology: on one GPU type its nodes go to hosts (CP-SAT) and its layers to pipeline
stages (MILP); on several types a typed pipeline chooses each stage's GPU type. The plans come back ordered by
the placed step time, and one ``PlacementRow`` per plan says what placement found, for the CLI to print.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.choices import Objective
from paraplan.errors import InputError, ParameterError
from paraplan.hardware_profiles import Catalog, ClusterSpec
from paraplan.hardware_profiles.topology import Topology, uniform_topology
from paraplan.hardware_profiles.topology_file import is_topology_file, topology_from_file
from paraplan.planner.placement.apply import mixed_plan, partition_plan, place_plan
from paraplan.planner.placement.mixed_gpus import stage_blocks
from paraplan.planner.placement.solver import SolverConfig
from paraplan.planner.plan import config_at
from paraplan.planner.search import SearchResult

PLAN_PLACE_TIME_LIMIT_S = 5.0
"""Solver time per plan and optimizer for 'paraplan plan --place' (the top plans are refined in turn)."""
MAX_TYPED_PIPELINE_SCAN = 100_000
"""Ranked plans scanned for typed-pipeline candidates on a mixed cluster (a vectorised mask; bounds the work
on searches that rank millions of plans)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementRow:
    """What placement found for one plan (one row of ``plan --place``'s table)."""

    rank: int
    """The plan's rank in the search."""
    search_step_s: float
    """The search's predicted step time."""
    placed_step_s: float
    """The step time on the placed hosts or typed pipeline (the search's where nothing could be placed)."""
    stage_layers: tuple[int, ...] | None
    """Layers per pipeline chunk after placement; None where the plan kept the search's."""
    hosts_status: str | None = None
    """One GPU type: the rank placement's solver status."""
    slowest_stage_s: tuple[float, float] | None = None
    """One GPU type, pp > 1: the slowest stage's time per micro-batch with even layers, then partitioned."""
    split_status: str | None = None
    """The stage partition's solver status."""
    stage_types: tuple[str, ...] = ()
    """Several GPU types: each stage's GPU type in the typed pipeline."""
    typed_status: str | None = None
    """The typed pipeline's solver status."""
    pipeline_step_s: tuple[float, float] | None = None
    """Typed pipeline time per step: placed, and with the naive (even) split."""
    fast_only: tuple[str, float | None] | None = None
    """The fastest type alone: its name and its pipeline time per step (None where it cannot hold the plan)."""
    as_searched: tuple[str, str] | None = None
    """Several GPU types but no typed pipeline runs the plan: the weakest type (whose pace every GPU keeps) and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementReport:
    """The refined plan documents, best first, and what placement found for each plan it refined."""

    documents: list[dict[str, Any]]
    """The plan documents after placement, re-ranked by the placed step time when ranking by throughput."""
    rows: list[PlacementRow]
    """One per plan refined, in the search's order."""
    topology: Topology
    """The topology placed on."""
    moves: list[tuple[int, int]]
    """(search rank, placed rank) of each plan re-ranking moved."""


def search_cluster(path: Path, nodes: int | None, gpus: int | None, catalog: Catalog | None = None) -> ClusterSpec:
    """What 'paraplan plan' searches on for a topology file: its weakest GPU type on every node and its slowest
    inter-node link on every link (a plan uses every node, so its rings cross the slowest link somewhere;
    placement then finds where, and re-ranks the top plans by the placed step time)."""
    if nodes is not None or gpus is not None:
        raise ParameterError("{path} lists its own nodes; drop {nodes}/{gpus}", path=path)
    topology = topology_from_file(path, catalog=catalog)
    return topology.nominal_cluster(topology.slowest_link_bytes_per_s(), node=topology.weakest_node())


def placement_topology(cluster: str | None, spec: ClusterSpec, catalog: Catalog | None = None) -> Topology:
    """The topology 'paraplan plan' places on: the topology file, else the uniform topology of ``spec``."""
    try:
        return topology_from_file(Path(cluster), catalog=catalog) if cluster and is_topology_file(Path(cluster)) \
            else uniform_topology(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def refine(documents: list[dict[str, Any]], topology: Topology, objective: Objective = "throughput",
           keep: int | None = None) -> PlacementReport:
    """Place ranks and partition stages of each plan, or choose stage GPU types on a mixed cluster. Ranked by
    throughput, the plans come back in the order of their placed step time (``placement_reranked``), the first
    ``keep`` of them."""
    config = SolverConfig(time_limit_s=PLAN_PLACE_TIME_LIMIT_S)
    pairs = [_refine_one(document, topology, config) for document in documents]
    refined, rows = [out for out, _ in pairs], [row for _, row in pairs]
    if objective != "throughput":
        return PlacementReport(documents=refined, rows=rows, topology=topology, moves=[])
    reranked = placement_reranked(refined, on_mixed=len(topology.gpu_types) > 1)[:keep]
    moves = [(d["placement"]["search_rank"], d["rank"]) for d in reranked
             if d["placement"].get("search_rank", d["rank"]) != d["rank"]]
    return PlacementReport(documents=reranked, rows=rows, topology=topology, moves=moves)


def typed_pipeline_rows(topology: Topology, result: SearchResult, skip: int, limit: int) -> list[tuple[int, int]]:
    """(search rank, table row) of the best ``limit`` plans after the first ``skip`` that a typed pipeline
    can run on a mixed-GPU topology (pp >= 2, one chunk per rank, stages of whole nodes that every type
    holds a whole number of); none on a topology of one type. The search prefers layouts no typed pipeline
    can run (pp = 1, vpp > 1): these run beside its top plans so placement compares whole steps of both."""
    if len(topology.gpu_types) < 2:
        return []
    ranked = np.asarray(result.ranked)[skip:skip + MAX_TYPED_PIPELINE_SCAN]
    positions = np.flatnonzero((result.table.pp[ranked] >= 2) & (result.table.vpp[ranked] == 1))
    rows = []
    for position in positions:
        row = int(ranked[position])
        try:
            stage_blocks(topology, config_at(result.table, row))
        except InputError:
            continue
        rows.append((skip + int(position) + 1, row))
        if len(rows) == limit:
            break
    return rows


def placed_step_s(document: dict[str, Any], on_mixed: bool) -> float | None:
    """The plan's step after placement: its placed hosts' (``rank_placement``) or its typed pipeline's
    whole step (``mixed_gpus``). On a mixed cluster a plan no typed pipeline runs keeps the search's step:
    every GPU waits for the weakest type, the type the search priced it on. None where nothing placed it."""
    placement = document["placement"]
    if "rank_placement" in placement:
        return float(placement["rank_placement"]["step_time_s_after"])
    if "placed_step_time_s" in placement.get("mixed_gpus", {}):
        return float(placement["mixed_gpus"]["placed_step_time_s"])
    return float(document["estimate"]["step_time_s"]) if on_mixed else None


def placement_reranked(documents: list[dict[str, Any]], on_mixed: bool = False) -> list[dict[str, Any]]:
    """The documents ordered by their placed step time (``placed_step_s``), each with its new ``rank`` and
    its search rank in ``placement.search_rank``; unchanged when a plan has no placed time."""
    placed = [placed_step_s(d, on_mixed) for d in documents]
    if any(step is None for step in placed):
        return documents
    order = sorted(range(len(documents)), key=lambda i: (placed[i], documents[i]["rank"]))
    out = []
    for new_rank, index in enumerate(order, start=1):
        document = copy.deepcopy(documents[index])
        document["placement"]["search_rank"] = document["rank"]
        document["rank"] = new_rank
        out.append(document)
    return out


def _refine_one(document: dict[str, Any], topology: Topology,
                config: SolverConfig) -> tuple[dict[str, Any], PlacementRow]:
    """One plan placed: its document and its row."""
    if len(topology.gpu_types) > 1:
        return _typed_pipeline(document, topology, config)
    search_step_s = document["estimate"]["step_time_s"]
    placed, out = place_plan(document, topology, config)
    staged = partition_plan(out, topology, config)
    if staged is None:
        return out, PlacementRow(rank=document["rank"], search_step_s=search_step_s,
                                 placed_step_s=placed.placed_step_s, hosts_status=placed.stats.status,
                                 stage_layers=_layers(out["placement"]["stage_layers"]))
    split, out = staged
    return out, PlacementRow(rank=document["rank"], search_step_s=search_step_s, placed_step_s=placed.placed_step_s,
                             stage_layers=tuple(split.stage_layers), hosts_status=placed.stats.status,
                             slowest_stage_s=(split.baseline_slowest_s, split.slowest_s),
                             split_status=split.stats.status)


def _typed_pipeline(document: dict[str, Any], topology: Topology,
                    config: SolverConfig) -> tuple[dict[str, Any], PlacementRow]:
    """One plan on a topology of several GPU types: a typed pipeline, or the search's plan where none runs it."""
    step_s = document["estimate"]["step_time_s"]
    try:
        mixed, out = mixed_plan(document, topology, config)
    except InputError as exc:
        parallel = document["config"]
        why = f"pp = {parallel['pp']}, vpp = {parallel['vpp']}; a typed pipeline needs pp >= 2, vpp = 1" \
            if parallel["pp"] < 2 or parallel["vpp"] > 1 else str(exc)
        return document, PlacementRow(rank=document["rank"], search_step_s=step_s, placed_step_s=step_s,
                                      stage_layers=None, as_searched=(topology.weakest_node().gpu.name, why))
    return out, PlacementRow(
        rank=document["rank"], search_step_s=step_s, placed_step_s=out["placement"]["mixed_gpus"]["placed_step_time_s"],
        stage_layers=tuple(mixed.stage_layers), stage_types=tuple(mixed.stage_types), typed_status=mixed.stats.status,
        pipeline_step_s=(mixed.step_s, mixed.naive_step_s), fast_only=(mixed.fast_only_type, mixed.fast_only_step_s))


def _layers(layers: list[int] | None) -> tuple[int, ...] | None:
    return None if layers is None else tuple(layers)
