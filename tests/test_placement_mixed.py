"""Mixed GPU types along a pipeline and across data-parallel replicas: exhaustive checks on a small
model, gains over the naive split and the faster type alone, and clusters whose types cannot hold
whole stages or replicas."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import make_model

from paraplan.errors import InputError
from paraplan.hardware_profiles import load_gpu
from paraplan.hardware_profiles.topology import NodeSpec, Topology
from paraplan.planner.job import ParallelConfig, TrainingJob
from paraplan.planner.placement.mixed_gpus import _cluster_of, mixed_pipeline, pipeline_step_s, stage_blocks
from paraplan.planner.placement.mixed_replicas import _stage_times, mixed_replicas
from paraplan.planner.placement.solver import SolverConfig
from paraplan.planner.placement.stage_costs import stage_instance
from paraplan.planner.placement.stage_partition import brute_force

A100, H100 = load_gpu("a100-sxm-80gb"), load_gpu("h100-sxm")


def mixed(a100_nodes: int, h100_nodes: int) -> Topology:
    nodes = [NodeSpec(host=f"a{i}", gpu=A100, gpus_per_node=8, nic_bytes_per_s_per_gpu=25e9, leaf=0)
             for i in range(a100_nodes)]
    nodes += [NodeSpec(host=f"h{i}", gpu=H100, gpus_per_node=8, nic_bytes_per_s_per_gpu=50e9, leaf=0)
              for i in range(h100_nodes)]
    return Topology(name="mix", nodes=tuple(nodes), leaf_oversubscription=(1.0,), inter_node_latency_s=5e-6,
                    intra_domain_latency_s=2e-6)


JOB = TrainingJob(model=make_model(num_layers=12), seq_len=2048, global_batch=64)
CONFIG = ParallelConfig(tp=8, pp=4, dp=1)


def test_matches_exhaustive_search_over_type_orders_and_splits():
    topology = mixed(2, 2)
    placed = mixed_pipeline(JOB, CONFIG, topology, SolverConfig(time_limit_s=60.0))
    clusters = {gpu: _cluster_of(topology, gpu, CONFIG) for gpu in ("a100-sxm-80gb", "h100-sxm")}
    best = min(brute_force(stage_instance(JOB, CONFIG, [clusters[g] for g in order], clusters["h100-sxm"]))[1]
               for order in set(itertools.permutations(["a100-sxm-80gb"] * 2 + ["h100-sxm"] * 2)))
    assert placed.stats.objective == pytest.approx(best, rel=1e-9)
    assert placed.stats.status == "optimal" and placed.stats.bound <= placed.stats.objective
    assert sorted(placed.stage_types) == ["a100-sxm-80gb"] * 2 + ["h100-sxm"] * 2
    assert sum(placed.stage_layers) == 12


def test_beats_the_naive_split_and_the_fast_type_alone():
    placed = mixed_pipeline(JOB, CONFIG, mixed(2, 2), SolverConfig(time_limit_s=60.0))
    a100_layers = [n for gpu, n in zip(placed.stage_types, placed.stage_layers) if gpu == "a100-sxm-80gb"]
    h100_layers = [n for gpu, n in zip(placed.stage_types, placed.stage_layers) if gpu == "h100-sxm"]
    assert max(a100_layers) <= min(h100_layers)  # the slower GPUs get fewer layers
    assert placed.step_s < placed.naive_step_s
    assert placed.fast_only_type == "h100-sxm"
    # Two H100 nodes cannot hold tp=8 x pp=4: no fast-only figure for this cluster.
    assert placed.fast_only_step_s is None
    wide = mixed_pipeline(JOB, ParallelConfig(tp=8, pp=2, dp=2), mixed(2, 2), SolverConfig(time_limit_s=60.0))
    assert wide.fast_only_step_s is not None and wide.step_s < wide.fast_only_step_s
    assert np.isfinite(wide.naive_step_s)


def test_types_must_hold_whole_stages():
    assert stage_blocks(mixed(2, 2), CONFIG) == {"a100-sxm-80gb": 2, "h100-sxm": 2}
    with pytest.raises(InputError, match=r"do not split into pp = 2 stages of 2 node\(s\)"):
        stage_blocks(mixed(1, 3), ParallelConfig(tp=8, pp=2, dp=2))
    with pytest.raises(InputError, match="must fill whole 8-GPU nodes"):
        stage_blocks(mixed(2, 2), ParallelConfig(tp=4, pp=8, dp=1))


def test_replica_microbatches_match_brute_force_and_beat_even():
    topology = mixed(2, 2)
    config = ParallelConfig(tp=8, pp=1, dp=4)
    job = TrainingJob(model=make_model(num_layers=12), seq_len=2048, global_batch=16)
    placed = mixed_replicas(job, config, topology, SolverConfig(time_limit_s=60.0))
    times = {gpu: _stage_times(job, config, topology, gpu) for gpu in ("a100-sxm-80gb", "h100-sxm")}
    types = ["a100-sxm-80gb", "a100-sxm-80gb", "h100-sxm", "h100-sxm"]
    best = min(max(pipeline_step_s(times[g], n) for g, n in zip(types, counts))
               for counts in itertools.product(range(1, 14), repeat=4) if sum(counts) == 16)
    assert placed.step_s == pytest.approx(best, rel=1e-6)
    assert placed.stats.status == "optimal" and sum(placed.microbatches) == 16
    assert placed.microbatches[0] < placed.microbatches[2]  # H100 replicas take more
    assert placed.step_s < placed.even_step_s
    assert placed.host_order == ("a0", "a1", "h0", "h1")


def test_replica_host_order_follows_megatron_rank_order():
    # tp=8, pp=2, dp=2 on a0 a1 | h0 h1: replica 0 = a0 (stage 0) + a1 (stage 1); node ranks are
    # stage-major (s·dp + r): [a0, h0, a1, h1].
    job = TrainingJob(model=make_model(num_layers=12), seq_len=2048, global_batch=16)
    placed = mixed_replicas(job, ParallelConfig(tp=8, pp=2, dp=2), mixed(2, 2), SolverConfig(time_limit_s=60.0))
    assert placed.host_order == ("a0", "h0", "a1", "h1")
    assert placed.replica_types == ("a100-sxm-80gb", "h100-sxm")
    with pytest.raises(InputError, match="tp·cp a multiple of 8"):
        mixed_replicas(job, ParallelConfig(tp=4, pp=2, dp=4), mixed(2, 2), SolverConfig(time_limit_s=60.0))
