"""Figures of the placement optimizers (README "Placement").

Run: python bench/placement.py [ranks|stages|mixed|experts-small|experts-scale|all]
Each section prints what it measured: gains over the baselines, solver status, gap and wall time.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from paraplan.hardware_profiles import load_cluster, load_gpu
from paraplan.hardware_profiles.topology import NodeSpec, Topology, uniform_topology
from paraplan.measurements.routing import zipf_routing
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import ParallelConfig, TrainingJob
from paraplan.planner.layout import stage_layers
from paraplan.planner.placement.expert_input import summary
from paraplan.planner.placement.expert_placement import make_instance, place_experts
from paraplan.planner.placement.mixed_gpus import mixed_pipeline
from paraplan.planner.placement.mixed_replicas import mixed_replicas
from paraplan.planner.placement.rank_instance import rank_instance
from paraplan.planner.placement.rank_placement import place_ranks
from paraplan.planner.placement.solver import SolverConfig
from paraplan.planner.placement.stage_costs import stage_instance
from paraplan.planner.placement.stage_partition import partition, stage_times
from paraplan.planner.plan import Plan, config_at, estimate_at, plan_to_json
from paraplan.planner.search import search


def experts(num_experts: int, ep: int, layers: int, skew: float, replicas: int, limit_s: float) -> None:
    """Expert placement of a zipf-skewed router (DeepSeek-V3 shape: 256 experts, 58 MoE layers); ``limit_s`` covers the
    whole call (the cases below give 2 s per layer and phase, as the figures in docs/placement.md were taken)."""
    stats = zipf_routing(layers, num_experts, skew, tokens_per_layer=4096 * 1024 * 8, seed=0)
    started = time.perf_counter()
    placed = place_experts(make_instance(stats, ep, ranks_per_domain=8, replicas=replicas),
                           SolverConfig(time_limit_s=limit_s))
    wall = time.perf_counter() - started
    s = summary(placed)
    statuses = [x.status for x in placed.load_stats] + [x.status for x in placed.traffic_stats if x]
    print(f"experts {num_experts} x ep {ep} x {layers} layers, zipf:{skew}, replicas {replicas}, "
          f"limit {limit_s:g} s for the whole call: wall {wall:.1f} s")
    print(f"  busiest rank (sum over layers): contiguous {s['baseline_max_rank_tokens']:.0f} -> placed "
          f"{s['placed_max_rank_tokens']:.0f} ({100 * s['max_load_reduction_frac']:.1f}% less; ideal "
          f"{s['ideal_max_rank_tokens']:.0f})")
    print(f"  inter-layer cross-GPU tokens {100 * s['cross_gpu_reduction_frac']:.1f}% less, cross-domain "
          f"{100 * s['cross_domain_reduction_frac']:.1f}% less")
    print(f"  solves: {statuses.count('optimal')} optimal, {statuses.count('feasible')} feasible, "
          f"{statuses.count('heuristic')} heuristic of {len(statuses)}; worst gap {100 * s['max_gap_frac']:.2f}%")


def plan_document(model: str, gpus: int, seq_len: int, batch: int, **fixed: int) -> dict:
    """The best plan of ``model`` on DGX H100 nodes with the given degrees fixed."""
    job = TrainingJob(model=load_model(model), seq_len=seq_len, global_batch=batch)
    cluster = load_cluster("dgx-h100", num_gpus=gpus)
    result = search(job, cluster, {axis: [value] for axis, value in fixed.items()})
    row = int(result.ranked[0])
    plan = Plan(job=job, cluster=cluster, config=config_at(result.table, row),
                estimate=estimate_at(result.estimates, row), fits=True, rank=1)
    return plan_to_json(plan, result.estimates.cost_model)


def h100_topology(nics_gb, leaves=None, over=(1.0,), measured=None) -> Topology:
    gpu = load_gpu("h100-sxm")
    leaves = leaves or [0] * len(nics_gb)
    nodes = tuple(NodeSpec(host=f"n{i}", gpu=gpu, gpus_per_node=8, nic_bytes_per_s_per_gpu=nic * 1e9, leaf=leaf)
                  for i, (nic, leaf) in enumerate(zip(nics_gb, leaves)))
    return Topology(name="bench", nodes=nodes, leaf_oversubscription=over, inter_node_latency_s=5e-6,
                    intra_domain_latency_s=2e-6, measured_bytes_per_s=measured)


def ranks(label: str, document: dict, topology: Topology, limit_s: float) -> None:
    placed = place_ranks(rank_instance(document, topology), SolverConfig(time_limit_s=limit_s))
    c = document["config"]
    gain = 1 - placed.placed_step_s / placed.baseline_step_s
    print(f"ranks {label}: {document['model']['name']} tp={c['tp']} pp={c['pp']} dp={c['dp']} on "
          f"{topology.num_nodes} nodes: default {placed.baseline_step_s:.4f} s -> placed {placed.placed_step_s:.4f} s "
          f"({100 * gain:.2f}% faster); {placed.stats.status}, gap {100 * placed.stats.gap_frac:.2f}%, "
          f"{placed.stats.wall_s:.2f} s")


def rank_figures() -> None:
    doc = plan_document("llama-3.1-70b", 64, 4096, 256, tp=8, pp=2, dp=4, vpp=1)
    ranks("uniform", doc, uniform_topology(load_cluster("dgx-h100", num_nodes=8)), 10.0)
    ranks("leaves interleaved 4:1", doc, h100_topology([50.0] * 8, [0, 1] * 4, (1.0, 4.0)), 10.0)
    ranks("one 12.5 GB/s NIC + 1 spare", doc, h100_topology([50.0] * 3 + [12.5] + [50.0] * 5), 10.0)
    rng = np.random.default_rng(0)
    measured = rng.uniform(36e9, 40e9, size=(8, 8))
    for a, b in ((0, 1), (2, 3), (5, 6)):
        measured[a, b] = measured[b, a] = 4e9
    ranks("measured, 3 outlier links", doc, h100_topology([50.0] * 8, measured=measured), 10.0)
    big = plan_document("llama-3.1-70b", 256, 4096, 512, tp=8, pp=4, dp=8, vpp=1)
    ranks("32 nodes, measured 10-40 GB/s", big, h100_topology([50.0] * 32,
                                                              measured=rng.uniform(10e9, 40e9, size=(32, 32))), 30.0)


def stage_figures() -> None:
    cases = [(model, ParallelConfig(tp=tp, pp=pp, dp=1), 8, 256) for model, tp, pp in (
        ("llama-3.1-8b", 1, 4), ("llama-3.1-8b", 1, 5), ("llama-3.1-8b", 1, 8), ("llama-3.1-70b", 8, 6),
        ("llama-3.1-70b", 8, 8))]
    cases.append(("deepseek-v3", ParallelConfig(tp=1, pp=16, dp=64, ep=64, zero=1, recompute="full"), 128, 1024))
    for model, config, nodes, batch in cases:
        tp, pp = config.tp, config.pp
        cluster = load_cluster("dgx-h100", num_nodes=nodes)
        job = TrainingJob(model=load_model(model), seq_len=4096, global_batch=batch)
        instance = stage_instance(job, config, [cluster] * pp)
        default = stage_layers(instance.num_layers, pp, 1)  # what 'paraplan plan' emits for this config
        default_s = float(stage_times(instance, default).max())
        for equal_middle in (False, True):
            result = partition(dataclasses.replace(instance, equal_middle=equal_middle), SolverConfig(time_limit_s=10))
            print(f"stages {model} tp={tp} pp={pp}{' (Megatron form)' if equal_middle else ''}: even "
                  f"{list(result.baseline_layers)} {1e3 * result.baseline_slowest_s:.1f} ms, paraplan default "
                  f"{default} {1e3 * default_s:.1f} ms -> "
                  f"{list(result.stage_layers)} {1e3 * result.slowest_s:.1f} ms per micro-batch "
                  f"({100 * (1 - result.slowest_s / result.baseline_slowest_s):.1f}% less); {result.stats.status}, "
                  f"gap {100 * result.stats.gap_frac:.2f}%, {result.stats.wall_s:.2f} s")


def _a100_h100_topology() -> Topology:
    """Four DGX A100 nodes (200 Gb/s NICs) and four DGX H100 nodes (400 Gb/s) on one leaf."""
    a100, h100 = load_gpu("a100-sxm-80gb"), load_gpu("h100-sxm")
    nodes = tuple(NodeSpec(host=f"a{i}", gpu=a100, gpus_per_node=8, nic_bytes_per_s_per_gpu=25e9, leaf=0)
                  for i in range(4))
    nodes += tuple(NodeSpec(host=f"h{i}", gpu=h100, gpus_per_node=8, nic_bytes_per_s_per_gpu=50e9, leaf=0)
                   for i in range(4))
    return Topology(name="32 A100 + 32 H100", nodes=nodes, leaf_oversubscription=(1.0,),
                    inter_node_latency_s=5e-6, intra_domain_latency_s=2e-6)


def mixed_figures() -> None:
    topology = _a100_h100_topology()
    job = TrainingJob(model=load_model("llama-3.1-70b"), seq_len=4096, global_batch=256)
    for config in (ParallelConfig(tp=8, pp=2, dp=4, zero=1, recompute="full"),
                   ParallelConfig(tp=8, pp=4, dp=2, zero=1, recompute="full")):
        started = time.perf_counter()
        r = mixed_pipeline(job, config, topology, SolverConfig(time_limit_s=20))
        fast = "n/a" if r.fast_only_step_s is None else f"{r.fast_only_step_s:.2f} s"
        print(f"mixed {topology.name}, llama-3.1-70b tp=8 pp={config.pp} dp={config.dp} zero=1 full recompute: stages "
              f"{'/'.join(t.split('-')[0] for t in r.stage_types)} layers {list(r.stage_layers)}: pipeline "
              f"{r.step_s:.2f} s vs naive even split {r.naive_step_s:.2f} s vs {r.fast_only_type} only {fast}; "
              f"{r.stats.status}, {time.perf_counter() - started:.1f} s")


def replica_figures() -> None:
    topology = _a100_h100_topology()
    job = TrainingJob(model=load_model("llama-3.1-70b"), seq_len=4096, global_batch=256)
    config = ParallelConfig(tp=8, pp=2, dp=4, zero=1, recompute="full")
    r = mixed_replicas(job, config, topology, SolverConfig(time_limit_s=10))
    print(f"replicas {topology.name}, llama-3.1-70b tp=8 pp=2 dp=4 zero=1 full recompute: micro-batches "
          f"{list(r.microbatches)} on {'/'.join(t.split('-')[0] for t in r.replica_types)}: {r.step_s:.2f} s vs even "
          f"{r.even_step_s:.2f} s vs H100 only {r.fast_only_step_s:.2f} s; {r.stats.status}, {r.stats.wall_s:.2f} s")


def main(section: str) -> None:
    if section in ("ranks", "all"):
        rank_figures()
    if section in ("stages", "all"):
        stage_figures()
    if section in ("mixed", "all"):
        mixed_figures()
        replica_figures()
    if section in ("experts-small", "all"):
        experts(64, 16, 8, 1.2, 0, 2.0 * 2 * 8)
        experts(64, 16, 8, 1.2, 16, 2.0 * 2 * 8)
        experts(256, 64, 4, 0.8, 0, 2.0 * 2 * 4)
    if section in ("experts-scale", "all"):
        experts(256, 64, 58, 1.2, 0, 2.0 * 2 * 58)
        experts(256, 64, 58, 1.2, 64, 2.0 * 2 * 58)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
