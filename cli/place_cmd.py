"""``paraplan experts`` and ``paraplan place``: parse, call the placement optimizers, render."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from paraplan.cli import render
from paraplan.errors import InputError
from paraplan.hardware_profiles.units import BYTES_PER_GB
from paraplan.hardware_profiles.user_file import HARDWARE_ENV, resolve_catalog
from paraplan.planner.plan import SCHEMA_VERSION

if TYPE_CHECKING:  # annotations only: placement loads when these commands run, not at every command's start-up
    from paraplan.hardware_profiles import Catalog
    from paraplan.planner.placement.expert_placement import ExpertInstance, ExpertPlacement
    from paraplan.planner.placement.solver import SolverConfig

_PLACE = "Placement"
TimeLimitOpt = Annotated[float, typer.Option(
    help="Seconds per placement, building the model included (per layer for experts).", rich_help_panel=_PLACE)]
ExpertTimeLimitOpt = Annotated[float, typer.Option(
    "--time-limit", help="Seconds for the whole call, building the models included: each MoE layer gets an equal "
                         "share of the time left; layers reached once it is spent take the greedy layout.",
    rich_help_panel=_PLACE)]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file.")]


def solver_config(time_limit: float) -> SolverConfig:
    """The solver settings of a command; InputError for a non-positive limit."""
    from paraplan.planner.placement.solver import SolverConfig

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
    time_limit: ExpertTimeLimitOpt = 60.0, json_path: JsonOpt = None, force: ForceOpt = False,
    plan_out: Annotated[Path | None, typer.Option(help="With --plan: write the plan file with its expert map "
                                                  "(exports then carry it in expert_map.json).")] = None,
) -> None:
    """Place the experts of each MoE layer on EP ranks: busiest rank first, then inter-layer traffic."""
    from paraplan.exporters.plan_input import read_plan_file
    from paraplan.planner.placement.expert_input import (
        DEFAULT_TOKENS_PER_LAYER,
        check_layers,
        expert_map_document,
        moe_shape_of_plan,
        routing_input,
        with_expert_placement,
    )
    from paraplan.planner.placement.expert_placement import make_instance

    tokens: float = DEFAULT_TOKENS_PER_LAYER
    document: dict[str, Any] | None = None
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
    placed = _place_with_progress(instance, config, f"MoE layers placed ({stats.num_experts} experts on {ep} EP ranks)")
    expert_map = expert_map_document(placed, instance, stats, config)
    _expert_table(expert_map, f"{stats.num_experts} experts x {stats.num_layers} MoE layers on "
                  f"{ep} EP ranks ({stats.source}), {replicas} replicas")
    if json_path is not None:
        render.write_json(json_path, expert_map, force)
    if plan_out is not None:
        assert document is not None  # --plan-out without --plan was refused above; --plan read the document
        placed_plan = with_expert_placement(document, expert_map)
        render.write_json(plan_out, {"schema_version": SCHEMA_VERSION, "plans": [placed_plan]}, force)


def _place_with_progress(instance: ExpertInstance, config: SolverConfig, description: str) -> ExpertPlacement:
    """Place the experts with a bar of the layers done on stderr (on a terminal; nothing when it is captured)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from paraplan.planner.placement.expert_placement import place_experts

    console = render.make_console(stderr=True)
    if not console.is_terminal:
        return place_experts(instance, config)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=instance.load.shape[0])
        return place_experts(instance, config, lambda done, total: bar.update(
            task, completed=done, total=total, refresh=True))


def _expert_table(expert_map: dict[str, Any], title: str) -> None:
    summary = expert_map["summary"]
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
    for line in bound_lines(expert_map["bound"], summary):
        console.print(line)


def bound_lines(bound: dict[str, Any], summary: dict[str, float]) -> list[str]:
    """What the call reached, in words: each phase's objective, proven bound and gap summed over layers, the
    layers by outcome, and whether the budget ran out."""
    lines = [f"bound reached: busiest rank {render.count(bound['max_rank_tokens'])} tokens, proven >= "
             f"{render.count(bound['max_rank_bound_tokens'])}, gap {render.percent(bound['max_rank_gap_frac'])} % "
             f"(ideal mean rank {render.count(summary['ideal_max_rank_tokens'])})"]
    if bound["traffic_tokens"] or bound["traffic_bound_tokens"]:
        lines.append(f"bound reached: inter-layer traffic {render.count(bound['traffic_tokens'])} tokens, proven "
                     f">= {render.count(bound['traffic_bound_tokens'])}, gap "
                     f"{render.percent(bound['traffic_gap_frac'])} %")
    lines.append(f"layers: {bound['layers_optimal']} optimal, {bound['layers_at_limit']} stopped unproven, "
                 f"{bound['layers_greedy']} greedy (worst layer gap {render.percent(summary['max_gap_frac'])} %); "
                 f"{bound['wall_s']:.1f} s of a {bound['time_limit_s']:g} s budget")
    if bound["layers_greedy"]:
        layers = bound["layers_optimal"] + bound["layers_at_limit"] + bound["layers_greedy"]
        lines.append(f"the {bound['time_limit_s']:g} s budget ran out: the last {bound['layers_greedy']} of {layers} "
                     "layers took the greedy layout without the solver (no traffic phase); a longer --time-limit "
                     "solves them")
    return lines


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
    from paraplan.exporters.plan_input import read_plan_file
    from paraplan.hardware_profiles.topology_file import load_topology
    from paraplan.planner.placement.apply import partition_plan, place_plan

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


def check_plan_gpu(document: dict, catalog: Catalog, plan_file: Path) -> None:
    """A plan made with a user GPU can be placed only with that GPU's numbers: say where to get them; and its
    GPU must run its precision (a plan file edited by hand may ask for fp4 on a Hopper)."""
    from paraplan.planner.placement.plan_costs import precision_error

    gpu = document["cluster"]["gpu"]
    origin = document["provenance"].get("hardware", {}).get("origin")
    if gpu not in catalog.gpus and origin not in (None, "built-in"):
        raise InputError(f"{plan_file} was planned on GPU {gpu!r} from the user hardware file {origin}; pass "
                         f"--hardware {origin} (or set ${HARDWARE_ENV}) so placement can price it")
    if gpu in catalog.gpus:
        problem = precision_error(catalog.gpus[gpu], document["job"]["precision"],
                                  document["job"].get("fp8_recipe", "tensorwise"))
        if problem:
            raise InputError(f"{plan_file}: {problem}")
