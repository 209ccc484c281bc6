"""Figures of the placement optimizers (README "Placement").

Run: python bench/placement.py [experts-scale|experts-small|ranks|stages|all]
Each section prints what it measured: gains over the baselines, solver status, gap and wall time.
"""

from __future__ import annotations

import sys
import time

from paraplan.cost_models.routing import zipf_routing
from paraplan.planner.placement.expert_input import summary
from paraplan.planner.placement.expert_placement import make_instance, place_experts
from paraplan.planner.placement.solver import SolverConfig


def experts(num_experts: int, ep: int, layers: int, skew: float, replicas: int, limit_s: float) -> None:
    """Expert placement of a zipf-skewed router (DeepSeek-V3 shape: 256 experts, 58 MoE layers)."""
    stats = zipf_routing(layers, num_experts, skew, tokens_per_layer=4096 * 1024 * 8, seed=0)
    started = time.perf_counter()
    placed = place_experts(make_instance(stats, ep, ranks_per_domain=8, replicas=replicas),
                           SolverConfig(time_limit_s=limit_s))
    wall = time.perf_counter() - started
    s = summary(placed)
    statuses = [x.status for x in placed.load_stats] + [x.status for x in placed.traffic_stats if x]
    print(f"experts {num_experts} x ep {ep} x {layers} layers, zipf:{skew}, replicas {replicas}, "
          f"limit {limit_s:g} s per layer and phase: wall {wall:.1f} s")
    print(f"  busiest rank (sum over layers): contiguous {s['baseline_max_rank_tokens']:.0f} -> placed "
          f"{s['placed_max_rank_tokens']:.0f} ({100 * s['max_load_reduction_frac']:.1f}% less; ideal "
          f"{s['ideal_max_rank_tokens']:.0f})")
    print(f"  inter-layer cross-GPU tokens {100 * s['cross_gpu_reduction_frac']:.1f}% less, cross-domain "
          f"{100 * s['cross_domain_reduction_frac']:.1f}% less")
    print(f"  solves: {statuses.count('optimal')} optimal, {statuses.count('feasible')} feasible, "
          f"{statuses.count('heuristic')} heuristic of {len(statuses)}; worst gap {100 * s['max_gap_frac']:.2f}%")


def main(section: str) -> None:
    if section in ("experts-small", "all"):
        experts(64, 16, 8, 1.2, 0, 2.0)
        experts(64, 16, 8, 1.2, 16, 2.0)
    if section in ("experts-scale", "all"):
        experts(256, 64, 58, 1.2, 0, 2.0)
        experts(256, 64, 58, 1.2, 64, 2.0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
