"""``paraplan experts`` and ``paraplan place``: parse, call the placement optimizers, render."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from paraplan.cli import render
from paraplan.errors import InputError
from paraplan.exporters.plan_input import read_plan_file
from paraplan.hardware_profiles import Catalog, ClusterSpec
from paraplan.hardware_profiles.topology import Topology, uniform_topology
from paraplan.hardware_profiles.topology_file import is_topology_file, load_topology, topology_from_file
from paraplan.hardware_profiles.units import BYTES_PER_GB
from paraplan.hardware_profiles.user_file import HARDWARE_ENV, resolve_catalog
from paraplan.planner.placement.apply import mixed_plan, partition_plan, place_plan
from paraplan.planner.placement.expert_input import (
    DEFAULT_TOKENS_PER_LAYER,
    check_layers,
    expert_map_document,
    moe_shape_of_plan,
    routing_input,
    with_expert_placement,
)
from paraplan.planner.placement.expert_placement import make_instance, place_experts
from paraplan.planner.placement.mixed_gpus import stage_blocks
from paraplan.planner.placement.solver import SolverConfig
from paraplan.planner.plan import SCHEMA_VERSION, config_at
from paraplan.planner.search import SearchResult

_PLACE = "Placement"
TimeLimitOpt = Annotated[float, typer.Option(help="Seconds per placement, building the model included (per layer for experts).",
                                             rich_help_panel=_PLACE)]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file.")]


def solver_config(time_limit: float) -> SolverConfig:
    """The solver settings of a command; InputError for a non-positive limit."""
    if not time_limit > 0:
        raise InputError(f"--time-limit expects positive seconds, got {time_limit}")
    return SolverConfig(time_limit_s=time_limit)


def experts(
    routing: Annotated[Path | None, typer.Option(help="Routing statistics CSV (layer,expert,next_expert,tokens).",
                                                 rich_help_panel=_PLACE)] = None,
    skew: Annotated[str | None, typer.Option(help="Synthetic skew instead of a file, e.g. zipf:1.2.",
                                             rich_help_panel=_PLACE)] = None,
    ep: Annotated[int | None, typer.Option(help="Expert-parallel ranks (default: the plan's ep).")] = None,
    plan: Annotated[Path | None, typer.Option(help="A plan file of an MoE model: ep, experts, layers.")] = None,
    experts_: Annotated[int | None, typer.Option("--experts", help="Routed experts per layer (with --skew).")] = None,
    layers: Annotated[int | None, typer.Option(help="MoE layers (with --skew).")] = None,
    replicas: Annotated[int, typer.Option(help="Extra copies of hot experts per layer (a multiple of ep).")] = 0,
    ranks_per_domain: Annotated[int, typer.Option(help="EP ranks per NVLink domain.")] = 8,
    time_limit: TimeLimitOpt = 10.0, json_path: JsonOpt = None, force: ForceOpt = False,
    plan_out: Annotated[Path | None, typer.Option(help="With --plan: write the plan file with its expert map "
                                                  "(exports then carry it in expert_map.json).")] = None,
) -> None:
    """Place the experts of each MoE layer on EP ranks: busiest rank first, then inter-layer traffic."""
    tokens, document = DEFAULT_TOKENS_PER_LAYER, None
    if plan_out is not None and plan is None:
        raise InputError("--plan-out writes the --plan file with its expert map; give --plan PLAN.json")
    if plan is not None:
        document = read_plan_file(plan).document
        plan_ep, experts_, layers, tokens = moe_shape_of_plan(document)
        ep = plan_ep if ep is None else ep
    if ep is None:
        raise InputError("say how many expert-parallel ranks with --ep N (or give --plan PLAN.json with ep > 1)")
    config = solver_config(time_limit)
    for path in (json_path, plan_out):
        if path is not None:
            render.check_writable(path, force)
    stats = routing_input(routing, skew, num_layers=layers, num_experts=experts_, tokens_per_layer=tokens)
    instance = make_instance(stats, ep, ranks_per_domain, replicas)
    if document is not None:
        check_layers(document, stats.num_layers)
    with render.working(render.make_console(stderr=True), f"placing {stats.num_experts} experts x "
                        f"{stats.num_layers} layers on {ep} ranks"):
        placed = place_experts(instance, config)
    expert_map = expert_map_document(placed, instance, stats, config)
    _expert_table(expert_map["summary"], f"{stats.num_experts} experts x {stats.num_layers} MoE layers on "
                  f"{ep} EP ranks ({stats.source}), {replicas} replicas")
    if json_path is not None:
        render.write_json(json_path, expert_map, force)
    if plan_out is not None:
        placed_plan = with_expert_placement(document, expert_map)
        render.write_json(plan_out, {"schema_version": SCHEMA_VERSION, "plans": [placed_plan]}, force)


def _expert_table(summary: dict[str, float], title: str) -> None:
    table = Table(title=title)
    for column in ("tokens, summed over layers", "contiguous", "placed", "reduction %"):
        table.add_column(column, justify="left" if column.startswith("tokens") else "right")
    for label, key in (("busiest EP rank", "max_rank"), ("cross-GPU (inter-layer)", "cross_gpu"),
                       ("cross-domain (inter-layer)", "cross_domain")):
        before, after = summary[f"baseline_{key}_tokens"], summary[f"placed_{key}_tokens"]
        reduction = summary["max_load_reduction_frac" if key == "max_rank" else f"{key}_reduction_frac"]
        table.add_row(label, render.count(before), render.count(after), render.percent(reduction))
    console = render.make_console()
    render.print_table(console, table)
    console.print(f"ideal (mean rank) {render.count(summary['ideal_max_rank_tokens'])}; solves optimal "
                  f"{summary['solves_optimal']:.0f}/{summary['solves_total']:.0f}, worst gap "
                  f"{render.percent(summary['max_gap_frac'])} %, solver time {summary['solver_wall_s']:.1f} s")


def place(
    plan_file: Annotated[Path, typer.Argument(help="A plan file from 'paraplan plan --json'.")],
    cluster: Annotated[str, typer.Option(help="Topology YAML (node_groups), cluster YAML or built-in cluster.",
                                         rich_help_panel=_PLACE)],
    nodes: Annotated[int | None, typer.Option(help="Nodes of a built-in cluster or cluster file.",
                                              rich_help_panel=_PLACE)] = None,
    bandwidth_matrix: Annotated[Path | None, typer.Option(help="Measured links: CSV src,dst,bus_gb_per_s.",
                                                          rich_help_panel=_PLACE)] = None,
    rank: Annotated[int | None, typer.Option(help="Which plan of the file, by rank (default: the best).")] = None,
    stages: Annotated[bool, typer.Option(help="Also partition layers over pipeline stages (pp > 1, vpp = 1).",
                                         rich_help_panel=_PLACE)] = True,
    time_limit: TimeLimitOpt = 10.0, json_path: JsonOpt = None, force: ForceOpt = False,
    hardware: Annotated[Path | None, typer.Option(
        "--hardware", help="Your hardware file (default $PARAPLAN_HARDWARE); needed when the plan's GPU or the "
                           "--cluster comes from one.", rich_help_panel=_PLACE)] = None,
) -> None:
    """Choose which host runs each node of a plan so the predicted step time is lowest."""
    document = read_plan_file(plan_file, rank).document
    catalog = resolve_catalog(hardware)
    check_plan_gpu(document, catalog, plan_file)
    topology = load_topology(cluster, nodes, bandwidth_matrix, catalog)
    config = solver_config(time_limit)
    if json_path is not None:
        render.check_writable(json_path, force)
    with render.working(render.make_console(stderr=True), f"placing {document['cluster']['num_gpus']} ranks"):
        placed, placed_document = place_plan(document, topology, config)
        staged = partition_plan(placed_document, topology, config) if stages else None
    console = render.make_console()
    table = Table(title=f"{document['model']['name']} plan rank {document['rank']} on {topology.name} "
                        f"({topology.num_nodes} nodes)")
    for column in ("node_rank", "host", "leaf", "NIC GB/s per GPU"):
        table.add_column(column, justify="right")
    for slot, node in enumerate(placed.node_of_slot):
        spec = topology.nodes[node]
        table.add_row(str(slot), spec.host, str(spec.leaf), f"{spec.nic_bytes_per_s_per_gpu / BYTES_PER_GB:g}")
    render.print_table(console, table)
    gain = 1.0 - placed.placed_step_s / placed.baseline_step_s
    s = placed.stats
    console.print(f"step time: default order {render.seconds(placed.baseline_step_s)} s -> placed "
                  f"{render.seconds(placed.placed_step_s)} s ({render.percent(gain)} % faster); solver {s.status}, "
                  f"gap {render.percent(s.gap_frac)} %, {s.wall_s:.2f} s")
    if placed.candidates < topology.num_nodes:
        console.print(f"chose among {placed.candidates} of {topology.num_nodes} nodes: "
                      + ("the default order's and up to one per logical node of each leaf/NIC/GPU class, which "
                         "holds an optimal placement" if placed.exact_pool else
                         "the default order's and the best-connected by measured bandwidth (not proven optimal "
                         "over the whole topology)"))
    if staged is not None:
        split, placed_document = staged
        console.print(f"layers per stage: even {list(split.baseline_layers)} slowest stage "
                      f"{render.seconds(split.baseline_slowest_s)} s -> "
                      f"{list(split.stage_layers)} {render.seconds(split.slowest_s)} s per micro-batch; solver "
                      f"{split.stats.status}, gap {render.percent(split.stats.gap_frac)} %")
    if json_path is not None:
        render.write_json(json_path, {"schema_version": SCHEMA_VERSION, "plans": [placed_document]}, force)


PLAN_PLACE_TIME_LIMIT_S = 5.0
"""Solver time per plan and optimizer for 'paraplan plan --place' (the top plans are refined in turn)."""
MAX_TYPED_PIPELINE_SCAN = 100_000
"""Ranked plans scanned for typed-pipeline candidates on a mixed cluster (a vectorised mask; bounds the work
on searches that rank millions of plans)."""


def check_plan_gpu(document: dict, catalog: Catalog, plan_file: Path) -> None:
    """A plan made with a user GPU can be placed only with that GPU's numbers: say where to get them."""
    gpu = document["cluster"]["gpu"]
    origin = document["provenance"].get("hardware", {}).get("origin")
    if gpu not in catalog.gpus and origin not in (None, "built-in"):
        raise InputError(f"{plan_file} was planned on GPU {gpu!r} from the user hardware file {origin}; pass "
                         f"--hardware {origin} (or set ${HARDWARE_ENV}) so placement can price it")


def search_cluster(path: Path, nodes: int | None, gpus: int | None, catalog: Catalog | None = None) -> ClusterSpec:
    """What 'paraplan plan' searches on for a topology file: its weakest GPU type on every node and its slowest
    inter-node link on every link (a plan uses every node, so its rings cross the slowest link somewhere;
    placement then finds where, and re-ranks the top plans by the placed step time)."""
    if nodes is not None or gpus is not None:
        raise InputError(f"{path} lists its own nodes; drop --nodes/--gpus")
    topology = topology_from_file(path, catalog=catalog)
    return topology.nominal_cluster(topology.slowest_link_bytes_per_s(), node=topology.weakest_node())


def placement_topology(cluster: str | None, spec: ClusterSpec, catalog: Catalog | None = None) -> Topology:
    """The topology 'paraplan plan' places on: the topology file, else the uniform topology of ``spec``."""
    try:
        return topology_from_file(Path(cluster), catalog=catalog) if cluster and is_topology_file(Path(cluster)) \
            else uniform_topology(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def refine(documents: list[dict], topology: Topology, objective: str = "throughput",
           keep: int | None = None) -> list[dict]:
    """'paraplan plan --place' (or a mixed-GPU topology): place ranks and partition stages of each plan,
    or choose stage GPU types on a mixed cluster; print one row per plan. Ranked by throughput, the plans
    come back in the order of their placed step time (placement_reranked), the first ``keep`` of them."""
    config = SolverConfig(time_limit_s=PLAN_PLACE_TIME_LIMIT_S)
    table = Table(title=f"placement on {topology.name} ({topology.num_nodes} nodes, {', '.join(topology.gpu_types)})")
    for column in ("#", "search step s", "placed step s", "layers per stage", "note"):
        table.add_column(column, justify="left" if column in ("layers per stage", "note") else "right")
    refined = []
    with render.working(render.make_console(stderr=True), f"placing {len(documents)} plans"):
        for document in documents:
            out, row = _refine_one(document, topology, config)
            refined.append(out)
            table.add_row(str(document["rank"]), render.seconds(document["estimate"]["step_time_s"]), *row)
    render.print_table(render.make_console(), table)
    if objective != "throughput":
        return refined
    reranked = placement_reranked(refined, on_mixed=len(topology.gpu_types) > 1)[:keep]
    moves = [f"#{d['placement']['search_rank']} -> #{d['rank']}" for d in reranked
             if d["placement"].get("search_rank", d["rank"]) != d["rank"]]
    if moves:
        render.make_console().print("re-ranked by the placed step time: " + ", ".join(moves)
                                    + " (the JSON and the export take the new #1)")
    return reranked


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


def placed_step_s(document: dict, on_mixed: bool) -> float | None:
    """The plan's step after placement: its placed hosts' (``rank_placement``) or its typed pipeline's
    whole step (``mixed_gpus``). On a mixed cluster a plan no typed pipeline runs keeps the search's step:
    every GPU waits for the weakest type, the type the search priced it on. None where nothing placed it."""
    placement = document["placement"]
    if "rank_placement" in placement:
        return placement["rank_placement"]["step_time_s_after"]
    if "placed_step_time_s" in placement.get("mixed_gpus", {}):
        return placement["mixed_gpus"]["placed_step_time_s"]
    return document["estimate"]["step_time_s"] if on_mixed else None


def placement_reranked(documents: list[dict], on_mixed: bool = False) -> list[dict]:
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


def _refine_one(document: dict, topology: Topology, config: SolverConfig) -> tuple[dict, list[str]]:
    if len(topology.gpu_types) > 1:
        try:
            mixed, out = mixed_plan(document, topology, config)
        except InputError as exc:
            parallel = document["config"]
            why = f"pp = {parallel['pp']}, vpp = {parallel['vpp']}; a typed pipeline needs pp >= 2, vpp = 1" \
                if parallel["pp"] < 2 or parallel["vpp"] > 1 else str(exc)
            return document, [render.seconds(document["estimate"]["step_time_s"]), "-",
                              f"every GPU at the {topology.weakest_node().gpu.name} pace, as searched ({why})"]
        fast = "-" if mixed.fast_only_step_s is None else render.seconds(mixed.fast_only_step_s)
        types = "/".join(gpu.split("-")[0] for gpu in mixed.stage_types)
        return out, [render.seconds(out["placement"]["mixed_gpus"]["placed_step_time_s"]), layers_text(mixed.stage_layers),
                     (f"stages on {types} ({mixed.stats.status}); pipeline time per step: placed "
                      f"{render.seconds(mixed.step_s)} s, naive split {render.seconds(mixed.naive_step_s)} s, "
                      f"{mixed.fast_only_type} only {fast} s")]
    placed, out = place_plan(document, topology, config)
    staged = partition_plan(out, topology, config)
    layers = out["placement"]["stage_layers"]
    note = f"hosts {placed.stats.status}"
    if staged is not None:
        split, out = staged
        layers = list(split.stage_layers)
        note += (f"; slowest stage {render.seconds(split.baseline_slowest_s)} -> {render.seconds(split.slowest_s)} s "
                 f"per micro-batch ({split.stats.status})")
    return out, [render.seconds(placed.placed_step_s), layers_text(layers), note]


def layers_text(layers) -> str:
    """Layers per chunk, runs of equal counts written once: [4, 4, 4, 3] -> '4 x3, 3'."""
    if layers is None:
        return "-"
    runs: list[list[int]] = []
    for count in layers:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ", ".join(f"{count} x{times}" if times > 1 else str(count) for count, times in runs)
