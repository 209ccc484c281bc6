"""Where expert placement gets its numbers: a routing CSV, a synthetic skew, or a plan's MoE shape;
and the expert-map document it writes (``paraplan experts --json``, the exporters' expert map file)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from paraplan.errors import InputError
from paraplan.measurements.routing import RoutingStats, parse_skew, read_routing_csv, zipf_routing
from paraplan.planner.json_schema import validate_own
from paraplan.planner.placement.expert_budget import CallBound
from paraplan.planner.placement.expert_placement import ExpertInstance, ExpertPlacement
from paraplan.planner.placement.solver import SolverConfig, SolveStats
from paraplan.planner.plan import plan_schema

EXPERT_MAP_VERSION = 1
DEFAULT_TOKENS_PER_LAYER = 1_000_000
"""Token-routings per MoE layer of a synthetic skew when no plan says how many a step routes
(only ratios are reported, so the scale only sets the integer resolution)."""


def routing_input(routing: Path | None, skew: str | None, *, num_layers: int | None, num_experts: int | None,
                  tokens_per_layer: float = DEFAULT_TOKENS_PER_LAYER, seed: int = 0) -> RoutingStats:
    """Routing statistics from exactly one of a CSV file or a ``zipf:S`` skew (which needs the sizes)."""
    if (routing is None) == (skew is None):
        raise InputError("give exactly one of --routing FILE (a routing CSV) or --skew zipf:S")
    if routing is not None:
        stats = read_routing_csv(routing)
        if num_experts is not None and stats.num_experts != num_experts:
            raise InputError(f"{routing} has {stats.num_experts} experts per layer but the plan's model has "
                             f"{num_experts}; use the routing file of that model")
        return stats
    assert skew is not None  # exactly one of the two was given (checked above)
    exponent = parse_skew(skew)
    if not num_layers or not num_experts or num_layers < 1 or num_experts < 1:
        raise InputError("--skew needs the MoE size: --experts E and --layers L (or --plan PLAN.json of an MoE model)")
    return zipf_routing(num_layers, num_experts, exponent, tokens_per_layer, seed)


def moe_shape_of_plan(document: dict[str, Any]) -> tuple[int, int, int, float]:
    """(ep, experts, MoE layers, token-routings per layer per step) of a plan document."""
    shape, config, job = document["model"].get("shape", {}), document["config"], document["job"]
    experts, layers = int(shape.get("num_experts", 0)), len(shape.get("moe_layers", ()))
    if experts == 0 or layers == 0:
        raise InputError(f"plan model {document['model']['name']!r} has no MoE layers; expert placement needs an "
                         "MoE model (or --ep N with --routing/--skew alone)")
    tokens = float(job["seq_len"] * job["global_batch"] * shape.get("experts_per_token", 1))
    return int(config.get("ep", 1)), experts, layers, tokens


def expert_map_document(placement: ExpertPlacement, instance: ExpertInstance, stats: RoutingStats,
                        config: SolverConfig) -> dict[str, Any]:
    """The expert map file: which experts each EP rank holds per MoE layer, token shares, and the figures."""
    base = placement.baseline
    layers = []
    for layer, ranks in enumerate(placement.experts_on_ranks()):
        share, traffic = placement.shares[layer], placement.traffic_stats[layer]
        layers.append({
            "layer": layer, "ranks": ranks,
            "token_share": [[round(float(share[e, r]), 6) for e in experts] for r, experts in enumerate(ranks)],
            "load": _stats(placement.load_stats[layer]),
            "traffic": None if traffic is None else _stats(traffic), "outcome": placement.outcomes[layer],
        })
    return {
        "schema_version": EXPERT_MAP_VERSION, "source": stats.source, "ep": instance.ep,
        "num_experts": stats.num_experts, "replicas": instance.replicas,
        "ranks_per_domain": instance.ranks_per_domain,
        "solver": {"time_limit_s": config.time_limit_s, "relative_gap_frac": config.relative_gap_frac,
                   "num_workers": config.num_workers, "seed": config.seed},
        "summary": summary(placement), "bound": bound_document(placement.bound),
        "baseline": {"max_rank_tokens": base.max_rank_tokens.tolist(),
                     "cross_gpu_tokens": base.cross_gpu_tokens.tolist()},
        "layers": layers,
    }


def summary(placement: ExpertPlacement) -> dict[str, float]:
    """Totals over layers: busiest-rank tokens and crossing tokens, contiguous vs placed, and the solves."""
    base, opt = placement.baseline, placement.optimized
    gaps = [s.gap_frac for s in placement.load_stats] + [s.gap_frac for s in placement.traffic_stats if s]
    return {
        "baseline_max_rank_tokens": float(base.max_rank_tokens.sum()),
        "placed_max_rank_tokens": float(opt.max_rank_tokens.sum()),
        "ideal_max_rank_tokens": float(opt.mean_rank_tokens.sum()),
        "max_load_reduction_frac": _reduction(base.max_rank_tokens.sum(), opt.max_rank_tokens.sum()),
        "baseline_cross_gpu_tokens": float(base.cross_gpu_tokens.sum()),
        "placed_cross_gpu_tokens": float(opt.cross_gpu_tokens.sum()),
        "cross_gpu_reduction_frac": _reduction(base.cross_gpu_tokens.sum(), opt.cross_gpu_tokens.sum()),
        "baseline_cross_domain_tokens": float(base.cross_domain_tokens.sum()),
        "placed_cross_domain_tokens": float(opt.cross_domain_tokens.sum()),
        "cross_domain_reduction_frac": _reduction(base.cross_domain_tokens.sum(), opt.cross_domain_tokens.sum()),
        "solves_optimal": float(sum(s.status == "optimal" for s in placement.load_stats + tuple(
            s for s in placement.traffic_stats if s))),
        "solves_total": float(len(placement.load_stats) + sum(1 for s in placement.traffic_stats if s)),
        "max_gap_frac": float(max(gaps)),
        "solver_wall_s": float(sum(s.wall_s for s in placement.load_stats)
                               + sum(s.wall_s for s in placement.traffic_stats if s)),
    }


def bound_document(bound: CallBound) -> dict[str, Any]:
    """The bound a call reached, as plain data: the layers by outcome, each phase's objective, proven bound and
    gap summed over layers (token-routings), the budget and the wall time (seconds)."""
    return {
        "layers_optimal": bound.layers_optimal, "layers_at_limit": bound.layers_at_limit,
        "layers_greedy": bound.layers_greedy,
        "max_rank_tokens": bound.max_rank_tokens, "max_rank_bound_tokens": bound.max_rank_bound_tokens,
        "max_rank_gap_frac": bound.max_rank_gap_frac,
        "traffic_tokens": bound.traffic_tokens, "traffic_bound_tokens": bound.traffic_bound_tokens,
        "traffic_gap_frac": bound.traffic_gap_frac,
        "time_limit_s": bound.time_limit_s, "wall_s": bound.wall_s,
    }


def _reduction(before: float, after: float) -> float:
    return float(1.0 - after / before) if before > 0 else 0.0


def _stats(stats: SolveStats) -> dict[str, Any]:
    return {"status": stats.status, "objective": stats.objective, "bound": stats.bound,
            "gap_frac": stats.gap_frac, "wall_s": stats.wall_s}


def with_expert_placement(plan: dict[str, Any], expert_map: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``plan`` whose placement carries the expert map (validated against the plan schema)."""
    if expert_map["ep"] != plan["config"].get("ep", 1):
        raise InputError(f"the expert map is for ep = {expert_map['ep']} but the plan runs ep = "
                         f"{plan['config'].get('ep', 1)}; place with the plan's ep")
    check_layers(plan, len(expert_map["layers"]))
    out = copy.deepcopy(plan)
    out["placement"]["expert_placement"] = {
        "source": expert_map["source"], "ep": expert_map["ep"], "replicas": expert_map["replicas"],
        "layers": [layer["ranks"] for layer in expert_map["layers"]],
        "token_share": [layer["token_share"] for layer in expert_map["layers"]]}
    validate_own(out, plan_schema())
    return out


def check_layers(plan: dict[str, Any], num_layers: int) -> None:
    """InputError unless routing statistics of ``num_layers`` MoE layers match the plan's model."""
    moe_layers = len(plan["model"].get("shape", {}).get("moe_layers", ()))
    if num_layers != moe_layers:
        raise InputError(f"the routing statistics cover {num_layers} MoE layers but the plan's model has "
                         f"{moe_layers}; use routing statistics of that model")
