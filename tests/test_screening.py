"""Screening (cost_models/screening.py): the memory a row requires is the breakdown's, bit for bit, and the step-time
bound never passes the step the full estimate prices, so a search that keeps its best rows and times only the rows
whose bound may rank returns what timing every row returns (test_search_memory checks whole searches)."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.cost_models.estimate import estimate, shared_terms
from paraplan.cost_models.screening import (
    layer_bound_terms,
    screen_rows,
    stage_holdings,
    stage_memory_floor_bytes,
    step_lower_bound_s,
)
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner import search_blocks
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import search
from paraplan.planner.space import enumerate_space

# (model, GPUs, job options, fixed axes): dense and MoE layouts (expert overlap, offload, every recompute mode),
# torchtitan with DualPipeV (rows without a bound), DeepSpeed's ZeRO stages.
CASES = {
    "dense megatron": ("llama-3.1-8b", 16, {"seq_len": 4096, "global_batch": 64}, None),
    "moe megatron": ("mixtral-8x7b", 32, {"seq_len": 4096, "global_batch": 128, "precision": "fp8"},
                     {"zero": [1], "cp": [1]}),
    "moe torchtitan": ("qwen3-30b-a3b", 16, {"seq_len": 4096, "global_batch": 64, "engine": "torchtitan"},
                       {"cp": [1]}),
    "dense deepspeed": ("llama-3.1-8b", 16, {"seq_len": 4096, "global_batch": 64, "engine": "deepspeed"}, None),
}


def _space(name):
    model, num_gpus, options, fixed = CASES[name]
    job = TrainingJob(model=load_model(model), **options)
    cluster = quick_cluster("h100-sxm", num_gpus)
    return job, cluster, enumerate_space(job, cluster, engine_rules(job.engine), fixed).table


@pytest.mark.parametrize("name", CASES)
def test_screened_memory_is_the_breakdowns_and_the_bounds_never_pass_the_numbers(name):
    job, cluster, table = _space(name)
    work = job.workload()
    full = estimate(job.model, cluster, work, table)
    shared = shared_terms(job.model, cluster, work, table)
    screened = screen_rows(shared, table, slice(0, len(table)))
    np.testing.assert_array_equal(screened.required_bytes, full.memory.required_bytes)
    np.testing.assert_array_equal(np.broadcast_to(screened.host_bytes, (len(table),)), full.memory.host_bytes)
    holdings = stage_holdings(shared)  # what the ranks hold, per stage combination (not torchtitan's: per row)
    assert (holdings is None) == (job.engine == "torchtitan")
    if holdings is not None:
        by_stage = screen_rows(shared, table, np.arange(len(table)), holdings)
        np.testing.assert_array_equal(by_stage.required_bytes, full.memory.required_bytes)
    floor = stage_memory_floor_bytes(shared)[np.arange(len(table)) if shared.stage_of_row is None
                                             else shared.stage_of_row]
    assert np.all(floor <= full.memory.required_bytes * (1 + 1e-12))
    assert np.median(floor / full.memory.required_bytes) > 0.25  # not vacuous
    bound = step_lower_bound_s(shared, layer_bound_terms(shared), screened, np.arange(len(table)))
    bounded = ~np.isnan(bound)
    assert np.all(bound[bounded] <= full.step_time_s[bounded] * (1 + 1e-12))
    # Only DualPipe schedules go without a bound, and where one exists it is most of the step.
    np.testing.assert_array_equal(~bounded, table.pp_schedule > 0)
    assert np.median(bound[bounded] / full.step_time_s[bounded]) > 0.8


def test_a_search_keeping_its_best_rows_times_few_of_the_fitting_ones(monkeypatch):
    """Mixtral on 64 H100: about 139,000 rows fit, and the bound leaves a few thousand to time."""
    job = TrainingJob(model=load_model("mixtral-8x7b"), seq_len=4096, global_batch=256)
    cluster = quick_cluster("h100-sxm", 64)
    timed = []
    price = search_blocks.block_estimates

    def counted(shared, block, subset=None):
        timed.append(len(block.table))
        return price(shared, block, subset)
    monkeypatch.setattr(search_blocks, "block_estimates", counted)
    kept = search(job, cluster, keep=5)
    assert kept.fitting > 100_000
    assert sum(timed) < 0.1 * kept.fitting
