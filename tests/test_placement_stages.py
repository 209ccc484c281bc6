"""Stage partition: brute-force optima, hand-derived splits, memory limits, gains on real models."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import ParallelConfig, TrainingJob
from paraplan.planner.placement.solver import SolverConfig
from paraplan.planner.placement.stage_costs import stage_instance
from paraplan.planner.placement.stage_partition import (
    StageInstance,
    baseline_split,
    brute_force,
    exact_split,
    partition,
    stage_bytes,
    stage_times,
)

# Small instances solve in well under a second; the limit only caps a loaded CI machine, where a short
# limit turned a proven optimum into "feasible".
FAST = SolverConfig(time_limit_s=60.0)


def make_instance(times, *, stages: int, first_s: float = 0.0, last_s: float = 0.0, state=None, acts=None,
                  capacity=None, scale=None, equal_middle: bool = False) -> StageInstance:
    layers = len(times)
    return StageInstance(
        layer_time_s=np.asarray(times, dtype=float),
        layer_state_bytes=np.asarray(state if state is not None else np.zeros(layers), dtype=float),
        layer_activation_bytes=np.asarray(acts if acts is not None else np.zeros(layers), dtype=float),
        first_extra_s=first_s, last_extra_s=last_s, first_extra_bytes=0.0, last_extra_bytes=0.0,
        in_flight=np.arange(stages, 0, -1).astype(float),
        capacity_bytes=np.asarray(capacity if capacity is not None else np.full(stages, 1e18), dtype=float),
        time_scale=np.asarray(scale if scale is not None else np.ones(stages), dtype=float),
        equal_middle=equal_middle)


def test_hand_derived_heavy_last_stage():
    # Five 1 s layers on 2 stages, 2 s of output layer and loss on the last: the baseline (2, 3)
    # gives max(2, 3 + 2) = 5 s; (3, 2) gives max(3, 2 + 2) = 4 s.
    placed = partition(make_instance([1.0] * 5, stages=2, last_s=2.0), FAST)
    assert placed.baseline_layers == (2, 3) and placed.baseline_slowest_s == 5.0
    assert placed.stage_layers == (3, 2) and placed.slowest_s == 4.0
    assert placed.stats.status == "optimal" and placed.stats.bound == pytest.approx(4.0)


def test_memory_limit_binds():
    # Four 1 s layers of 10 bytes of state; the first stage may hold only 15 bytes: (1, 3), 3 s.
    placed = partition(make_instance([1.0] * 4, stages=2, state=[10.0] * 4, capacity=[15.0, 100.0]), FAST)
    assert placed.stage_layers == (1, 3) and placed.slowest_s == 3.0
    assert not placed.baseline_fits
    assert (stage_bytes(placed_instance := make_instance([1.0] * 4, stages=2, state=[10.0] * 4,
                                                         capacity=[15.0, 100.0]), placed.stage_layers)
            <= placed_instance.capacity_bytes).all()


def test_nothing_fits_falls_back_to_the_baseline():
    placed = partition(make_instance([1.0] * 4, stages=2, state=[10.0] * 4, capacity=[5.0, 5.0]), FAST)
    assert placed.stats.status == "heuristic" and placed.stage_layers == (2, 2) and not placed.baseline_fits


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_brute_force_on_mixed_dense_and_moe_layers(seed):
    rng = np.random.default_rng(seed)
    layers, stages = 11, 4
    moe = rng.random(layers) < 0.5  # MoE layers cost about twice a dense one, and more memory
    times = np.where(moe, 2.0, 1.0) * rng.uniform(0.9, 1.1, layers)
    state = np.where(moe, 30.0, 10.0)
    instance = make_instance(times, stages=stages, first_s=0.5, last_s=3.0, state=state, acts=np.full(layers, 2.0),
                             capacity=np.full(stages, 95.0), scale=rng.choice([1.0, 0.6], stages),
                             equal_middle=bool(seed % 2))
    expected = brute_force(instance)
    placed = partition(instance, FAST)
    assert expected is not None
    assert placed.slowest_s == pytest.approx(expected[1], rel=1e-9)
    assert placed.stats.bound <= placed.slowest_s + 1e-12
    assert stage_times(instance, placed.stage_layers).max() == pytest.approx(placed.slowest_s)


@pytest.mark.parametrize("seed", range(8))
def test_exact_program_matches_brute_force(seed):
    # The certificate used where CBC stops without a proof: same optimum as enumerating every split,
    # memory limits, per-stage speeds, edge work and equal middle stages included.
    rng = np.random.default_rng(100 + seed)
    layers, stages = int(rng.integers(5, 12)), int(rng.integers(2, 6))
    stages = min(stages, layers)
    instance = make_instance(rng.uniform(0.5, 2.0, layers), stages=stages, first_s=float(rng.uniform(0, 2)),
                             last_s=float(rng.uniform(0, 3)), state=rng.uniform(5, 30, layers),
                             acts=rng.uniform(0, 3, layers), capacity=rng.uniform(40, 120, stages),
                             scale=rng.choice([1.0, 0.6, 1.7], stages), equal_middle=bool(seed % 2))
    expected, exact = brute_force(instance), exact_split(instance)
    if expected is None:
        assert exact is None
        return
    assert exact is not None and exact[1] == pytest.approx(expected[1], rel=1e-12)
    assert sum(exact[0]) == layers and min(exact[0]) >= 1
    assert (stage_bytes(instance, exact[0]) <= instance.capacity_bytes).all()
    assert exact[1] == pytest.approx(stage_times(instance, exact[0]).max(), rel=1e-12)


def test_an_unproven_cbc_answer_is_settled_by_the_exact_program(monkeypatch):
    # CBC stopping without a proof (its time limit, or a stop on a loaded machine) must not leave a
    # small instance "feasible": the exact program proves the optimum (hand-derived: (3, 2), 4 s).
    import pulp
    real = pulp.LpProblem.solve

    def stopped(problem, solver=None, **kwargs):
        status = real(problem, solver, **kwargs)
        problem.sol_status = pulp.LpSolutionIntegerFeasible
        return status

    monkeypatch.setattr(pulp.LpProblem, "solve", stopped)
    placed = partition(make_instance([1.0] * 5, stages=2, last_s=2.0), FAST)
    assert placed.stage_layers == (3, 2) and placed.slowest_s == 4.0
    assert placed.stats.status == "optimal" and placed.stats.bound == 4.0


def test_baseline_split_follows_megatron():
    assert baseline_split(32, 4) == (8, 8, 8, 8)
    assert baseline_split(30, 4) == (7, 8, 8, 7)  # edge-accounted: (30 + 2) / 4 = 8, one fewer at the edges
    assert baseline_split(32, 5) == (6, 7, 7, 6, 6)  # neither divides: as even as possible


def test_gain_on_a_large_vocabulary_model_that_does_not_split_evenly():
    # Llama-3.1-8B (32 layers, 128k vocabulary) on 5 stages: the output layer and loss make the last
    # stage heavy; the partition moves layers off it.
    job = TrainingJob(model=load_model("llama-3.1-8b"), seq_len=4096, global_batch=64)
    cluster = load_cluster("dgx-h100", num_nodes=1)
    instance = stage_instance(job, ParallelConfig(tp=1, pp=5, dp=1), [cluster] * 5)
    placed = partition(instance, FAST)
    assert placed.stats.status == "optimal"
    assert placed.stage_layers[-1] < placed.baseline_layers[-1]
    assert placed.slowest_s < 0.9 * placed.baseline_slowest_s
    assert sum(placed.stage_layers) == 32


def test_uniform_split_is_kept_when_it_is_already_best():
    # No edge costs and identical layers: 8 layers on 4 stages stay 2 each.
    placed = partition(make_instance([1.0] * 8, stages=4), FAST)
    assert placed.stage_layers == (2, 2, 2, 2) and placed.slowest_s == placed.baseline_slowest_s == 2.0


def test_moe_models_cost_dense_and_moe_layers_apart():
    # DeepSeek-V3: 3 dense layers then 58 MoE layers, one MTP module on the last stage.
    model = load_model("deepseek-v3")
    job = TrainingJob(model=model, seq_len=4096, global_batch=1024)
    config = ParallelConfig(tp=1, pp=16, dp=64, ep=64, zero=1, recompute="full")
    instance = stage_instance(job, config, [load_cluster("dgx-h100", num_nodes=128)] * 16)
    times, states = instance.layer_time_s, instance.layer_state_bytes
    assert len(set(times[:3])) == 1 and len(set(times[3:])) == 1 and times[0] < times[3]
    assert states[0] < states[3]
    # The MTP module's 256 routed experts shard over ep = 64 like every MoE layer's: the last stage's
    # extras stay within a GPU (unsharded they alone would be about 72 GiB of states).
    assert instance.last_extra_bytes < 0.5 * instance.capacity_bytes[-1]
    assert instance.last_extra_s > times[3]  # output layer, loss and the MTP layer
